//! The headers of a replayed message: the stored JSON headers back to AMQP field values,
//! without changing a number or a byte (docs/replay-protocol.md, "Header values"), minus
//! the broker's delivery bookkeeping, plus the replay's own.

use crate::publisher::DEAD_LETTER_ID_HEADER;
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};

/// Headers the broker added while delivering and dead-lettering; not part of the event.
fn is_delivery_bookkeeping(name: &str) -> bool {
    name == "x-death"
        || name == "x-delivery-count"
        || name.starts_with("x-first-death-")
        || name.starts_with("x-last-death-")
}

/// The headers of a replay: the originals minus the broker's bookkeeping, plus ours.
pub fn replay_headers(
    original: &serde_json::Map<String, serde_json::Value>,
    id: &str,
    reason: &str,
    operator: &str,
) -> serde_json::Map<String, serde_json::Value> {
    let mut out: serde_json::Map<String, serde_json::Value> = original
        .iter()
        .filter(|(k, _)| !is_delivery_bookkeeping(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    out.insert("x-replayed-from-dlq".into(), "true".into());
    out.insert("x-dead-letter-reason".into(), reason.into());
    out.insert(DEAD_LETTER_ID_HEADER.into(), id.into());
    out.insert("x-replayed-by".into(), operator.into());
    out
}

/// JSON headers to AMQP field values.
pub fn to_field_table(headers: &serde_json::Map<String, serde_json::Value>) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in headers {
        if let Ok(key) = ShortString::try_new(k.clone()) {
            t.insert(key, to_amqp(v));
        }
    }
    t
}

fn to_amqp(v: &serde_json::Value) -> AMQPValue {
    use serde_json::Value;
    match v {
        Value::Null => AMQPValue::Void,
        Value::Bool(b) => AMQPValue::Boolean(*b),
        Value::Number(n) => number_to_amqp(n),
        Value::String(s) => AMQPValue::LongString(LongString::from(s.clone())),
        Value::Array(a) => {
            let mut arr = FieldArray::default();
            for x in a {
                arr.push(to_amqp(x));
            }
            AMQPValue::FieldArray(arr)
        }
        Value::Object(m) => match (captured_bytes(m), m.get(crate::capture::TABLE_KEY)) {
            (Some(bytes), _) => AMQPValue::LongString(LongString::from(bytes)),
            (None, Some(Value::Object(inner))) if m.len() == 1 => {
                AMQPValue::FieldTable(to_field_table(inner))
            }
            _ => AMQPValue::FieldTable(to_field_table(m)),
        },
    }
}

/// Header bytes that were not UTF-8 when `dlq capture` stored them, as
/// `{"$bytes": "<base64>"}` (see [`crate::capture::amqp_to_json`]).
fn captured_bytes(m: &serde_json::Map<String, serde_json::Value>) -> Option<Vec<u8>> {
    use base64::Engine;
    match (m.len(), m.get(crate::capture::BYTES_KEY)) {
        (1, Some(serde_json::Value::String(b64))) => {
            base64::engine::general_purpose::STANDARD.decode(b64).ok()
        }
        _ => None,
    }
}

/// A header number as an AMQP field value, without changing it (docs/replay-protocol.md,
/// "Header values"): a whole number within 64 bits as a signed 64-bit integer; another
/// number that a double holds with the same significant digits as written as a double;
/// anything else (a whole number beyond 64 bits, more digits than a double keeps) as a
/// long string holding the number exactly as written.
fn number_to_amqp(n: &serde_json::Number) -> AMQPValue {
    let text = n.to_string();
    if let Some(i) = n.as_i64() {
        return AMQPValue::LongLongInt(i);
    }
    let whole = !text.contains(['.', 'e', 'E']);
    match text.parse::<f64>() {
        Ok(f)
            if !whole && f.is_finite() && significant(&text) == significant(&format!("{f:e}")) =>
        {
            AMQPValue::Double(f)
        }
        _ => AMQPValue::LongString(LongString::from(text)),
    }
}

/// A decimal number's sign, significant digits (no leading or trailing zeros) and the
/// power of ten of its first digit: `1.10` and `1.1e0` give the same.
fn significant(text: &str) -> (bool, String, i64) {
    let (negative, rest) = match text.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let (mantissa, exp) = match rest.split_once(['e', 'E']) {
        Some((m, e)) => (m, e.parse::<i64>().unwrap_or(0)),
        None => (rest, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let all = format!("{int}{frac}");
    let lead = all.len() - all.trim_start_matches('0').len();
    let digits = all
        .trim_start_matches('0')
        .trim_end_matches('0')
        .to_string();
    if digits.is_empty() {
        return (false, digits, 0);
    }
    (negative, digits, int.len() as i64 - lead as i64 + exp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_numbers_go_out_without_changing() {
        let v: serde_json::Value = serde_json::from_str(
            r#"[42, -7, 123456789012345678901234567890, 1.10, 2.5e-3, 0.1, 1e400,
                0.1000000000000000055511151231257827, 18446744073709551615, -0.0]"#,
        )
        .unwrap();
        let out: Vec<AMQPValue> = v.as_array().unwrap().iter().map(to_amqp).collect();
        let s = |x: &str| AMQPValue::LongString(LongString::from(x.to_string()));
        assert_eq!(
            out,
            vec![
                AMQPValue::LongLongInt(42),
                AMQPValue::LongLongInt(-7),
                s("123456789012345678901234567890"),
                AMQPValue::Double(1.1),
                AMQPValue::Double(0.0025),
                AMQPValue::Double(0.1),
                s("1e+400"),
                s("0.1000000000000000055511151231257827"),
                s("18446744073709551615"),
                AMQPValue::Double(-0.0),
            ]
        );
    }

    #[test]
    fn bookkeeping_headers_are_dropped_and_ours_added() {
        let orig: serde_json::Map<_, _> = serde_json::from_str(
            r#"{"x-death":[{}],"x-first-death-queue":"q","x-last-death-reason":"r",
                "x-delivery-count":3,"x-event-id":"e1","tenant":"acme"}"#,
        )
        .unwrap();
        let h = replay_headers(&orig, "id1", "retries_exhausted", "alice");
        let keys: Vec<&str> = h.keys().map(String::as_str).collect();
        assert!(!keys
            .iter()
            .any(|k| k.contains("death") || *k == "x-delivery-count"));
        assert_eq!(h["tenant"], "acme");
        assert_eq!(h["x-event-id"], "e1");
        assert_eq!(h["x-replayed-from-dlq"], "true");
        assert_eq!(h["x-dead-letter-id"], "id1");
        assert_eq!(h["x-replayed-by"], "alice");
        assert_eq!(h["x-dead-letter-reason"], "retries_exhausted");
    }

    #[test]
    fn captured_non_utf8_header_bytes_go_back_as_bytes() {
        let h: serde_json::Map<_, _> =
            serde_json::from_str(r#"{"raw":{"$bytes":"/wBB"},"t":{"$bytes":"x","other":1}}"#)
                .unwrap();
        let t = to_field_table(&h);
        match t.inner().get("raw") {
            Some(AMQPValue::LongString(s)) => assert_eq!(s.as_bytes(), &[0xff, 0x00, 0x41]),
            other => panic!("{other:?}"),
        }
        assert!(
            matches!(t.inner().get("t"), Some(AMQPValue::FieldTable(_))),
            "only a one-key object is bytes"
        );
    }
}
