//! The parking queue (`--park-queue`): where a message that cannot be stored goes, with a
//! header saying why, confirmed before the original is acked. The queue must exist: it is
//! checked (a passive declare, by its reply code) when the parking connection opens, and
//! again when a park fails, so the error names it instead of a bare return.

use super::key::capture_key;
use super::session::Held;
use super::{CaptureOptions, PARK_ERROR_HEADER, POSSIBLE_DUPLICATE_HEADER};
use crate::broker::codec::headers_to_json;
use crate::broker::connect::ConnectError;
use crate::broker::{OutgoingMessage, PublishResult, Publisher, PublisherOptions, Target};
use crate::error::{DlqError, Result};
use crate::spell::{words, Flag, Words};
use lapin::types::{AMQPValue, LongString};
use std::collections::{HashSet, VecDeque};

/// The messages this run parked, by capture key. A park is confirmed before its batch is
/// acked, and an ack may be lost with its connection: the message then comes back,
/// flagged redelivered, though the parking queue holds it already. It is parked again
/// all the same, marked ([`POSSIBLE_DUPLICATE_HEADER`]) and said: a redelivery cannot be
/// told from another message with the same key, and acking that one unparked would lose
/// it, while a second copy in the parking queue can be dropped by hand. Bounded: the
/// oldest keys are forgotten (such a message is parked again unmarked, as a rerun does).
#[derive(Default)]
pub(super) struct Parked {
    keys: HashSet<String>,
    order: VecDeque<String>,
}

impl Parked {
    /// Keys kept: about 100 bytes each.
    const KEEP: usize = 100_000;

    /// `h` was parked, confirmed.
    pub(super) fn remember(&mut self, h: &Held) {
        let key = key_of(h);
        if self.keys.insert(key.clone()) {
            self.order.push_back(key);
        }
        while self.order.len() > Self::KEEP {
            if let Some(old) = self.order.pop_front() {
                self.keys.remove(&old);
            }
        }
    }

    /// Whether `h` is a redelivery of a message this run parked (confirmed).
    pub(super) fn holds(&self, h: &Held) -> bool {
        h.redelivered && !self.keys.is_empty() && self.keys.contains(&key_of(h))
    }
}

/// Which park of a message this may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Copy {
    First,
    /// This run parked a message with its key before: a second copy, likely.
    MaybeSecond,
}

/// What identifies a held message across redeliveries (see [`capture_key`]).
fn key_of(h: &Held) -> String {
    let headers = h.properties.headers().as_ref().map(headers_to_json);
    capture_key(&h.body, &headers.unwrap_or_default(), &h.properties)
}

/// Opens the parking connection (to the first node that answers) and checks that the
/// parking queue exists.
pub(super) async fn connect(opts: &CaptureOptions, park: &str) -> Result<Publisher> {
    let publisher = connect_first(opts).await.map_err(|e| {
        DlqError::other(
            words("connecting for ")
                .flag(Flag::ParkQueue)
                .text(format!(" {park}: {e}")),
        )
    })?;
    if let Some(missing) = missing(&publisher, opts, park).await {
        publisher.close().await;
        return Err(missing);
    }
    Ok(publisher)
}

/// The error for a parking queue the broker says does not exist (`None` when it exists
/// or the broker did not say).
async fn missing(publisher: &Publisher, opts: &CaptureOptions, park: &str) -> Option<DlqError> {
    match publisher.queue_exists(park).await {
        Ok(false) => Some(DlqError::other(
            words(format!(
                "the park queue {park} does not exist (in this vhost): declare it, or give another "
            ))
            .flag(Flag::ParkQueue)
            .text(format!(
                "; every message not yet acked is still in {}",
                opts.queue
            )),
        )),
        _ => None,
    }
}

/// Publishes one message to the parking queue, waiting for the broker's confirm.
pub(super) async fn park_one(
    opts: &CaptureOptions,
    park: &str,
    h: &Held,
    why: &str,
    copy: Copy,
    parker: &mut Option<Publisher>,
) -> Result<()> {
    let fail = |e: Words| {
        DlqError::other(
            words(format!(
                "a message from {} cannot be stored ({why}) and could not be parked in {park}: ",
                opts.queue
            ))
            .and(e)
            .text("; it is back in the queue, nothing was dropped"),
        )
    };
    if parker.as_ref().is_some_and(|p| !p.is_usable()) {
        if let Some(p) = parker.take() {
            p.close().await;
        }
    }
    if parker.is_none() {
        *parker = Some(connect(opts, park).await?);
    }
    let publisher = parker.as_ref().expect("set above");
    let mut headers = h.properties.headers().clone().unwrap_or_default();
    headers.insert(
        PARK_ERROR_HEADER.into(),
        AMQPValue::LongString(LongString::from(why.to_string())),
    );
    if copy == Copy::MaybeSecond {
        headers.insert(
            POSSIBLE_DUPLICATE_HEADER.into(),
            AMQPValue::LongString(LongString::from("true")),
        );
    }
    let msg = OutgoingMessage {
        body: &h.body,
        headers,
        message_id: h
            .properties
            .message_id()
            .as_ref()
            .map(|m| m.as_str().to_string()),
    };
    let target = Target {
        exchange: String::new(),
        routing_key: park.to_string(),
    };
    let sent = publisher.send("parked", &target, &msg).await;
    let settled = publisher
        .settle(vec![sent], &std::sync::atomic::AtomicBool::new(false))
        .await;
    let (e, doubt) = match settled.into_iter().next().map(|s| s.result) {
        Some(PublishResult::Confirmed) => return Ok(()),
        Some(PublishResult::Failed(e)) => (e, Doubt::NotParked),
        Some(PublishResult::Uncertain(e)) => (e, Doubt::MayBeParked),
        // The link itself stalled: asking it whether the queue exists would stall too.
        Some(PublishResult::Stalled(e)) => return Err(maybe_parked(opts, park, why, e)),
        None => ("no publish result".into(), Doubt::MayBeParked),
    };
    // Deleted since the check (a return of the park is one way to learn it): say that.
    match (missing(publisher, opts, park).await, doubt) {
        (Some(missing), _) => Err(missing),
        (None, Doubt::NotParked) => Err(fail(e)),
        (None, Doubt::MayBeParked) => Err(maybe_parked(opts, park, why, e)),
    }
}

/// Whether a park that was not confirmed may have reached the parking queue.
enum Doubt {
    NotParked,
    MayBeParked,
}

/// A park whose outcome is unknown: the message is still in the queue and may also be in
/// the parking queue, which a rerun would park it in again.
fn maybe_parked(opts: &CaptureOptions, park: &str, why: &str, e: Words) -> DlqError {
    DlqError::other(
        words(format!(
            "a message from {} cannot be stored ({why}) and may already be in {park}: ",
            opts.queue
        ))
        .and(e)
        .text(format!(
            "; it is also still in {}: look in {park} before running again, or the rerun parks it a second time",
            opts.queue
        )),
    )
}

async fn connect_first(opts: &CaptureOptions) -> std::result::Result<Publisher, ConnectError> {
    // The parking connection goes to the same node list as the consumer.
    let mut last = ConnectError::Setup(DlqError::usage("no AMQP URL given"));
    for url in &opts.urls {
        match Publisher::connect(
            url,
            PublisherOptions {
                connect_timeout: opts.connect.connect_timeout,
                confirm_timeout: opts.confirm_timeout,
                connection_name: format!("{} (parking)", opts.connect.connection_name),
                tls: opts.connect.tls.clone(),
                topology: opts.topology.for_nodes(opts.urls.len()),
            },
        )
        .await
        {
            Ok(p) => return Ok(p),
            Err(e) => last = e,
        }
    }
    Err(last)
}
