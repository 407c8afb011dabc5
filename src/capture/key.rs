//! Capture identity: what makes two deliveries the same message (a redelivery) and two
//! identical messages different ones. docs/capture.md says what the key covers and why.

use lapin::types::ShortString;
use lapin::BasicProperties;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// Headers the broker may change between two deliveries of one message: left out of the
/// capture key. (A quorum queue counts its redeliveries in `x-delivery-count`.)
pub(super) const REDELIVERY_HEADERS: [&str; 1] = ["x-delivery-count"];

/// What identifies a message across its redeliveries: `v1:`, the time of its first
/// `x-death` entry (ten digits of seconds, zeros without one), `:` and the SHA-256 over
/// its body, its headers except those the broker changes on redelivery
/// (`x-delivery-count`), which include `x-death` and so the time of each death, and its
/// `message_id`, `correlation_id`, `timestamp`, `type` and `app_id` properties, each part
/// length-prefixed.
pub fn capture_key(body: &[u8], headers: &Map<String, Value>, props: &BasicProperties) -> String {
    let stable: Map<String, Value> = headers
        .iter()
        .filter(|(k, _)| !REDELIVERY_HEADERS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    // Read as `to_letter` reads it from the AMQP table: a number, or a string of one.
    let died = headers
        .get("x-death")
        .and_then(|d| d.get(0))
        .and_then(|d| d.get("time"))
        .and_then(|t| t.as_i64().or_else(|| t.as_str()?.trim().parse().ok()));
    key_of(body, &canonical_json(&Value::Object(stable)), props, died)
}

/// [`capture_key`] from the headers already as canonical JSON, without the redelivery
/// headers.
pub(super) fn key_of(
    body: &[u8],
    stable_headers_json: &str,
    props: &BasicProperties,
    died: Option<i64>,
) -> String {
    let mut h = Sha256::new();
    let mut part = |b: &[u8]| {
        h.update((b.len() as u64).to_le_bytes());
        h.update(b);
    };
    part(b"dlq-capture-v1");
    part(body);
    part(stable_headers_json.as_bytes());
    let s = |v: &Option<ShortString>| v.as_ref().map(|s| s.as_str().to_string());
    for p in [
        s(props.message_id()),
        s(props.correlation_id()),
        props.timestamp().map(|t| t.to_string()),
        s(props.kind()),
        s(props.app_id()),
    ] {
        match p {
            Some(v) => part(format!("+{v}").as_bytes()),
            None => part(b"-"),
        }
    }
    // The death time first: keys of a queue's messages then mostly grow, and the index on
    // them takes new keys at its right edge rather than one random page per row.
    format!(
        "v1:{:010}:{}",
        died.unwrap_or(0).clamp(0, 9_999_999_999),
        hex::encode(h.finalize())
    )
}

/// JSON text with object keys sorted at every level, whatever order the map keeps.
pub(super) fn canonical_json(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let inner: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{}:{}", Value::String(k.clone()), canonical_json(&m[k])))
                .collect();
            format!("{{{}}}", inner.join(","))
        }
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(canonical_json).collect::<Vec<_>>().join(",")
        ),
        other => other.to_string(),
    }
}
