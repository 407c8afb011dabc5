//! A delivery → the row `dlq capture` inserts: where each column comes from (`x-death`,
//! properties, headers), kept apart from the consume loop so it can be read (and unit
//! tested) as one mapping. docs/capture.md lists each column's source.

use super::key::{capture_key, key_of, REDELIVERY_HEADERS};
use crate::broker::codec::headers_to_json;
use crate::store::{CapturedLetter, EventInContent, NewDeadLetter};
use chrono::{DateTime, Utc};
use lapin::types::{AMQPValue, FieldTable};
use lapin::BasicProperties;
use serde_json::{Map, Value};

/// Headers that may carry the consumer's error text, in the order they are looked at.
const ERROR_HEADERS: [&str; 3] = ["x-exception", "x-error", "x-exception-message"];

/// Maps an `x-death` reason to the dead letter's reason.
pub fn map_reason(x_death_reason: &str) -> String {
    match x_death_reason {
        "rejected" => "poison_message".into(),
        "delivery_limit" => "retries_exhausted".into(),
        other => other.to_string(),
    }
}

/// The first `x-death` entry: the most recent death, i.e. the queue the message was
/// dead-lettered from last.
fn first_death(headers: &FieldTable) -> Option<&FieldTable> {
    match headers.inner().get("x-death")? {
        AMQPValue::FieldArray(a) => match a.as_slice().first()? {
            AMQPValue::FieldTable(t) => Some(t),
            _ => None,
        },
        _ => None,
    }
}

fn text(v: &AMQPValue) -> Option<String> {
    match v {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_string()),
        _ => None,
    }
}

fn integer(v: &AMQPValue) -> Option<i64> {
    use AMQPValue as A;
    match v {
        A::ShortShortInt(i) => Some(*i as i64),
        A::ShortShortUInt(i) => Some(*i as i64),
        A::ShortInt(i) => Some(*i as i64),
        A::ShortUInt(i) => Some(*i as i64),
        A::LongInt(i) => Some(*i as i64),
        A::LongUInt(i) => Some(*i as i64),
        A::LongLongInt(i) => Some(*i),
        A::Timestamp(t) => i64::try_from(*t).ok(),
        A::LongString(_) | A::ShortString(_) => text(v)?.trim().parse().ok(),
        _ => None,
    }
}

/// PostgreSQL's TEXT cannot hold NUL: a derived column replaces it (the headers keep it).
fn derived_text(s: String) -> String {
    if s.contains('\0') {
        s.replace('\0', "\u{FFFD}")
    } else {
        s
    }
}

/// Deliveries a consumer took before the message died: the delivery count when the
/// message carries one (on a redelivery from a quorum dead-letter queue it would be that
/// queue's own count, so only on a first delivery), else one per rejection recorded in
/// x-death. Expired and overflowed messages were never consumed.
fn attempts_of(
    table: &FieldTable,
    death: Option<&FieldTable>,
    death_reason: Option<&str>,
    redelivered: bool,
) -> i64 {
    let delivery_count = table
        .inner()
        .get("x-delivery-count")
        .and_then(integer)
        .filter(|_| !redelivered);
    match (delivery_count, death_reason) {
        (Some(n), _) => n,
        (None, Some("rejected" | "delivery_limit")) => death
            .and_then(|d| d.inner().get("count"))
            .and_then(integer)
            .unwrap_or(1),
        _ => 0,
    }
    .clamp(0, i32::MAX as i64)
}

/// The consumer's error text: the first of [`ERROR_HEADERS`] set, a string as it is,
/// any other value as JSON.
fn error_of(headers: &Map<String, Value>) -> Option<String> {
    ERROR_HEADERS
        .iter()
        .find_map(|h| headers.get(*h).filter(|v| !v.is_null()))
        .map(|v| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .map(derived_text)
}

/// A delivered message as the row `dlq capture` inserts (see the module docs and
/// docs/capture.md for each column's source).
pub fn to_letter(
    body: &[u8],
    props: &BasicProperties,
    redelivered: bool,
    reason_override: Option<&str>,
) -> CapturedLetter {
    let empty = FieldTable::default();
    let table = props.headers().as_ref().unwrap_or(&empty);
    let headers = headers_to_json(table);
    let death = first_death(table);
    let field = |name: &str| death.and_then(|d| d.inner().get(name));
    let death_reason = field("reason").and_then(text);
    let reason = match (reason_override, &death_reason) {
        (Some(r), _) => r.to_string(),
        (None, Some(r)) => derived_text(map_reason(r)),
        (None, None) => "unknown".to_string(),
    };
    let attempts = attempts_of(table, death, death_reason.as_deref(), redelivered);
    let routing_key = match field("routing-keys") {
        Some(AMQPValue::FieldArray(a)) => a.as_slice().first().and_then(text),
        _ => None,
    };
    let dead_lettered_at = field("time")
        .and_then(integer)
        .and_then(|secs| DateTime::<Utc>::from_timestamp(secs, 0));
    let error = error_of(&headers);
    let message_id = props.message_id().as_ref().map(|m| m.as_str().to_string());
    // Built from the (sorted) field table, the stored JSON is already canonical.
    let headers_json = Value::Object(headers).to_string();
    // dlq's one reading of the content (as the store's rule would find it), else the
    // message ID: set here, not left to the rule, which PostgreSQL's and SQLite's read
    // apart in odd JSON (an escape, a key twice, a body not all UTF-8).
    let event_id = EventInContent::of(&headers_json, body)
        .ids()
        .next()
        .cloned()
        .or(message_id)
        .map(derived_text);
    let key = if REDELIVERY_HEADERS
        .iter()
        .any(|h| table.inner().contains_key(*h))
    {
        capture_key(body, &headers_to_json(table), props)
    } else {
        key_of(body, &headers_json, props, field("time").and_then(integer))
    };
    CapturedLetter {
        row: NewDeadLetter {
            line: 0,
            // Time-ordered: new rows go to the right edge of the primary key's B-tree
            // instead of a random page each (a random UUID made each batch rewrite a page
            // per row).
            id: uuid::Uuid::now_v7().to_string(),
            body: body.to_vec(),
            reason,
            attempts,
            headers_json,
            event_id,
            error,
            source_queue: field("queue").and_then(text).map(derived_text),
            exchange: field("exchange")
                .and_then(text)
                .filter(|e| !e.is_empty())
                .map(derived_text),
            routing_key: routing_key.map(derived_text),
            dead_lettered_at,
            ..NewDeadLetter::default()
        },
        capture_key: key,
        redelivered,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::codec::amqp_to_json;
    use crate::capture::key::canonical_json;
    use lapin::types::{ByteArray, DecimalValue, FieldArray};

    fn t(pairs: Vec<(&str, AMQPValue)>) -> FieldTable {
        let mut t = FieldTable::default();
        for (k, v) in pairs {
            t.insert(k.into(), v);
        }
        t
    }

    fn ls(s: &str) -> AMQPValue {
        AMQPValue::LongString(s.into())
    }

    fn death(reason: &str, count: i64) -> AMQPValue {
        AMQPValue::FieldArray(FieldArray::from(vec![
            AMQPValue::FieldTable(t(vec![
                ("queue", ls("orders")),
                ("reason", ls(reason)),
                ("count", AMQPValue::LongLongInt(count)),
                ("exchange", ls("shop")),
                (
                    "routing-keys",
                    AMQPValue::FieldArray(FieldArray::from(vec![ls("orders.created")])),
                ),
                ("time", AMQPValue::Timestamp(1_800_000_000)),
            ])),
            AMQPValue::FieldTable(t(vec![("queue", ls("older")), ("reason", ls("expired"))])),
        ]))
    }

    #[test]
    fn header_values_as_json() {
        let j = |v: AMQPValue| amqp_to_json(&v);
        assert_eq!(j(AMQPValue::Float(1.1)), serde_json::json!(1.1));
        assert_eq!(
            j(AMQPValue::DecimalValue(DecimalValue {
                scale: 2,
                value: 1234
            })),
            serde_json::json!(12.34)
        );
        assert_eq!(j(AMQPValue::Timestamp(17)), serde_json::json!(17));
        assert_eq!(j(AMQPValue::ShortShortInt(-3)), serde_json::json!(-3));
        assert_eq!(j(AMQPValue::Void), Value::Null);
        assert_eq!(
            j(AMQPValue::ByteArray(ByteArray::from(vec![0xc3_u8, 0x28]))),
            serde_json::json!({"$bytes": "wyg="})
        );
        assert_eq!(j(ls("é")), serde_json::json!("é"));
        assert_eq!(j(AMQPValue::Double(f64::NAN)), serde_json::json!("NaN"));
    }

    #[test]
    fn reasons() {
        assert_eq!(map_reason("rejected"), "poison_message");
        assert_eq!(map_reason("delivery_limit"), "retries_exhausted");
        assert_eq!(map_reason("expired"), "expired");
        assert_eq!(map_reason("maxlen"), "maxlen");
    }

    #[test]
    fn a_delivery_as_a_row() {
        let props = BasicProperties::default()
            .with_message_id("m-1".into())
            .with_headers(t(vec![
                ("x-death", death("rejected", 4)),
                ("x-error", ls("KeyError: 'sku'\0")),
            ]));
        let c = to_letter(b"not json", &props, false, None);
        let r = &c.row;
        assert_eq!(r.reason, "poison_message");
        assert_eq!(r.attempts, 4, "one delivery per rejection");
        assert_eq!(r.source_queue.as_deref(), Some("orders"), "the first entry");
        assert_eq!(r.exchange.as_deref(), Some("shop"));
        assert_eq!(r.routing_key.as_deref(), Some("orders.created"));
        assert_eq!(r.dead_lettered_at.unwrap().timestamp(), 1_800_000_000);
        assert_eq!(r.error.as_deref(), Some("KeyError: 'sku'\u{FFFD}"));
        assert!(
            r.headers_json.contains("\\u0000"),
            "the headers keep the NUL"
        );
        assert_eq!(r.event_id.as_deref(), Some("m-1"));
        assert!(!c.redelivered);

        let over = to_letter(b"{}", &props, true, Some("permanent_failure"));
        assert_eq!(over.row.reason, "permanent_failure");
        assert!(over.redelivered);

        let with_event = to_letter(br#"{"event_id":"e-9"}"#, &props, false, None);
        assert_eq!(
            with_event.row.event_id.as_deref(),
            Some("e-9"),
            "the content's first"
        );

        let bare = to_letter(b"x", &BasicProperties::default(), false, None);
        assert_eq!(bare.row.reason, "unknown");
        assert_eq!(bare.row.attempts, 0);
        assert_eq!(bare.row.source_queue, None);
        assert_eq!(bare.row.dead_lettered_at, None, "the database's now()");
        assert_eq!(bare.row.headers_json, "{}");
    }

    #[test]
    fn expired_messages_were_never_consumed_and_delivery_count_wins_on_a_first_delivery() {
        let h = |extra: Vec<(&str, AMQPValue)>| {
            let mut v = vec![("x-death", death("expired", 1))];
            v.extend(extra);
            BasicProperties::default().with_headers(t(v))
        };
        assert_eq!(to_letter(b"", &h(vec![]), false, None).row.attempts, 0);
        let counted = h(vec![("x-delivery-count", AMQPValue::LongInt(6))]);
        assert_eq!(to_letter(b"", &counted, false, None).row.attempts, 6);
        assert_eq!(
            to_letter(b"", &counted, true, None).row.attempts,
            0,
            "on a redelivery the count may be the dead-letter queue's own"
        );
    }

    #[test]
    fn the_capture_key() {
        let headers = |count: Option<i32>| {
            let mut v = vec![("x-death", death("rejected", 1)), ("a", ls("1"))];
            if let Some(c) = count {
                v.push(("x-delivery-count", AMQPValue::LongInt(c)));
            }
            t(v)
        };
        let key = |body: &[u8], h: FieldTable, id: Option<&str>| {
            let mut p = BasicProperties::default().with_headers(h.clone());
            if let Some(id) = id {
                p = p.with_message_id(id.into());
            }
            capture_key(body, &headers_to_json(&h), &p)
        };
        let json = Value::Object(headers_to_json(&headers(None)));
        assert_eq!(
            json.to_string(),
            canonical_json(&json),
            "built from a field table, the JSON is canonical already"
        );
        let direct = to_letter(
            b"b",
            &BasicProperties::default().with_headers(headers(None)),
            false,
            None,
        );
        assert_eq!(direct.capture_key, key(b"b", headers(None), None));
        let k = key(b"b", headers(None), None);
        assert!(k.starts_with("v1:1800000000:") && k.len() == 78, "{k}");
        assert_eq!(k, key(b"b", headers(None), None), "stable");
        assert_eq!(
            k,
            key(b"b", headers(Some(3)), None),
            "a quorum queue's redelivery count is not part of it"
        );
        assert_ne!(k, key(b"c", headers(None), None));
        assert_ne!(k, key(b"b", headers(None), Some("m")));
        assert_ne!(k, key(b"b", t(vec![("a", ls("1"))]), None));
        // Length prefixes: moving bytes between parts changes the key.
        assert_ne!(
            key(b"ab", FieldTable::default(), None),
            key(b"a", FieldTable::default(), Some("b"))
        );
    }
}
