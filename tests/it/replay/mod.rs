//! `dlq replay` of one dead letter (by ID or hand-taken token): the claim, the attempt, the
//! publish with confirms, and how each outcome is settled and reported.

mod busy_claim;
mod confirms;
mod headers;
mod interrupts;
mod lost_reply;
mod publish_timeout;
mod reasons;
mod resolve;
mod settling;
mod single;
mod tokens;

use crate::common::*;

const BODY: &[u8] = b"{\"event_id\":\"evt-1\",\"sku\":\"s-1\",\"bytes\":\"\\u00e9\"}";

const AMOUNT_BODY: &[u8] = br#"{"event_id":"evt-1","amount":10}"#;

/// A fanout exchange bound to a queue that takes messages and one that refuses every
/// publish (max length 0, reject-publish): RabbitMQ nacks, one queue holds a copy.
fn fanout_with_a_full_queue(rabbit: &mut Rabbit) -> (String, String) {
    let ok = rabbit.queue("dlq_v2_fan_ok");
    let args = refusing_queue_args();
    let full = rabbit.queue_with("dlq_v2_fan_full", args);
    let x = rabbit.exchange_of("dlq_v2_fanout", lapin::ExchangeKind::Fanout);
    rabbit.bind(&ok, &x, "");
    rabbit.bind(&full, &x, "");
    (x, ok)
}
