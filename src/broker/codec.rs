//! The one header codec, both directions: AMQP field values as the JSON that `dlq capture`
//! stores ([`amqp_to_json`]), and the stored JSON back to field values for a replay
//! ([`to_field_table`]) without changing a number or a byte (docs/replay-protocol.md,
//! "Header values"). Both sides live here so that the escapes they share (`$bytes`,
//! `$table`) are spelled once.

use base64::Engine;
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use serde_json::{Map, Value};

/// The header that ties a published message to its row.
pub const DEAD_LETTER_ID_HEADER: &str = "x-dead-letter-id";

/// An AMQP header value as JSON: strings as strings, integers and floats as numbers,
/// timestamps as seconds since the epoch, decimals as numbers, tables as objects, arrays
/// as arrays, void as null. The one thing JSON cannot hold, bytes that are not UTF-8 (a
/// long string or a byte array), becomes `{"$bytes": "<base64>"}`; a replay sends it back
/// as those bytes.
pub fn amqp_to_json(v: &AMQPValue) -> Value {
    use AMQPValue as A;
    let float = |f: f64| {
        serde_json::Number::from_f64(f)
            .map(Value::Number)
            .unwrap_or_else(|| Value::String(f.to_string()))
    };
    let bytes = |b: &[u8]| match std::str::from_utf8(b) {
        Ok(s) => Value::String(s.to_string()),
        Err(_) => {
            let mut m = Map::new();
            m.insert(
                BYTES_KEY.into(),
                Value::String(base64::engine::general_purpose::STANDARD.encode(b)),
            );
            Value::Object(m)
        }
    };
    match v {
        A::Boolean(b) => Value::Bool(*b),
        A::ShortShortInt(i) => (*i).into(),
        A::ShortShortUInt(i) => (*i).into(),
        A::ShortInt(i) => (*i).into(),
        A::ShortUInt(i) => (*i).into(),
        A::LongInt(i) => (*i).into(),
        A::LongUInt(i) => (*i).into(),
        A::LongLongInt(i) => (*i).into(),
        // Through its shortest decimal form, so that 1.1f32 is 1.1, not 1.100000023841858.
        A::Float(f) => float(f.to_string().parse().unwrap_or(f64::NAN)),
        A::Double(f) => float(*f),
        A::DecimalValue(d) => float(
            format!("{}e-{}", d.value, d.scale)
                .parse()
                .unwrap_or(f64::NAN),
        ),
        A::ShortString(s) => Value::String(s.as_str().to_string()),
        A::LongString(s) => bytes(s.as_bytes()),
        A::ByteArray(b) => bytes(b.as_slice()),
        A::FieldArray(a) => Value::Array(a.as_slice().iter().map(amqp_to_json).collect()),
        A::Timestamp(t) => (*t).into(),
        A::FieldTable(t) => {
            // A table that looks like one of the escapes above is wrapped, so that
            // it cannot be read back as bytes.
            let m = headers_to_json(t);
            if m.len() == 1 && (m.contains_key(BYTES_KEY) || m.contains_key(TABLE_KEY)) {
                let mut wrapped = Map::new();
                wrapped.insert(TABLE_KEY.into(), Value::Object(m));
                Value::Object(wrapped)
            } else {
                Value::Object(m)
            }
        }
        A::Void => Value::Null,
    }
}

/// The key of the one-key object that holds non-UTF-8 header bytes (see [`amqp_to_json`]).
pub const BYTES_KEY: &str = "$bytes";

/// The key of the one-key object that wraps a header table whose only key is
/// [`BYTES_KEY`] or this one (see [`amqp_to_json`]).
pub const TABLE_KEY: &str = "$table";

/// AMQP headers as a JSON object, in the table's (sorted) key order.
pub fn headers_to_json(t: &FieldTable) -> Map<String, Value> {
    t.inner()
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), amqp_to_json(v)))
        .collect()
}

/// Stored headers as a consumer receives them from a replay, as JSON: through the field
/// table they are sent as (a number as the double it goes out as, a key given twice
/// once, its last).
pub fn as_delivered(headers_json: &str) -> String {
    let sent = to_field_table(&crate::model::parse_headers(headers_json));
    Value::Object(headers_to_json(&sent)).to_string()
}

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
        Value::Object(m) => match (captured_bytes(m), m.get(TABLE_KEY)) {
            (Some(bytes), _) => AMQPValue::LongString(LongString::from(bytes)),
            (None, Some(Value::Object(inner))) if m.len() == 1 => {
                AMQPValue::FieldTable(to_field_table(inner))
            }
            _ => AMQPValue::FieldTable(to_field_table(m)),
        },
    }
}

/// Header bytes that were not UTF-8 when `dlq capture` stored them, as
/// `{"$bytes": "<base64>"}` (see [`amqp_to_json`]).
fn captured_bytes(m: &serde_json::Map<String, serde_json::Value>) -> Option<Vec<u8>> {
    match (m.len(), m.get(BYTES_KEY)) {
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
