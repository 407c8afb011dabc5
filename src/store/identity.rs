//! The identity values (`eff_producer`, `eff_schema_version`, `eff_event_id`) as SQLite's
//! triggers derive them (migrations/sqlite/20261201000002), computed by `dlq` for the rows
//! it inserts. SQLite's AFTER INSERT trigger cannot change the row being inserted: when
//! it finds a value the row lacks, it writes the whole row a second time (for a 50 MiB
//! body, another copy of the record in memory and in the WAL). Given with the INSERT,
//! right values leave the trigger nothing to write. They are a hint only: the trigger
//! still derives them and overwrites a wrong one, so the database keeps the rule.

use serde::Deserialize;
use serde_json::value::RawValue;

/// (producer, schema_version, event_id) of a row: the column, else the header, else the
/// top-level body field (a string its value, a number or boolean its JSON text).
pub(crate) fn identity_hint(
    columns: [Option<&str>; 3],
    headers_json: &str,
    body: &[u8],
) -> [Option<String>; 3] {
    let headers = serde_json::from_str::<Headers>(headers_json).unwrap_or_default();
    let body = body_fields(body).unwrap_or_default();
    let from_headers = [headers.producer, headers.schema_version, headers.event_id];
    let from_body = [body.producer, body.schema_version, body.event_id];
    std::array::from_fn(|i| {
        columns[i]
            .map(str::to_string)
            .or_else(|| from_headers[i].and_then(scalar))
            .or_else(|| from_body[i].and_then(scalar))
    })
}

#[derive(Deserialize, Default)]
struct Headers<'a> {
    #[serde(borrow, default, rename = "x-producer")]
    producer: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "x-schema-version")]
    schema_version: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "x-event-id")]
    event_id: Option<&'a RawValue>,
}

#[derive(Deserialize, Default)]
struct Body<'a> {
    #[serde(borrow, default)]
    producer: Option<&'a RawValue>,
    #[serde(borrow, default)]
    schema_version: Option<&'a RawValue>,
    #[serde(borrow, default)]
    event_id: Option<&'a RawValue>,
}

/// The body's three fields when it is a JSON object (serde would also read a struct
/// from an array, by position). Other fields are skipped without being kept.
fn body_fields(body: &[u8]) -> Option<Body<'_>> {
    let first = body
        .iter()
        .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))?;
    if *first != b'{' {
        return None;
    }
    serde_json::from_slice(body).ok()
}

/// A string is its value; a number, true or false its JSON text as written; null, an
/// array or an object no value.
fn scalar(raw: &RawValue) -> Option<String> {
    let text = raw.get();
    match text.as_bytes().first()? {
        b'"' => serde_json::from_str(text).ok(),
        b't' | b'f' | b'-' | b'0'..=b'9' => Some(text.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hint(cols: [Option<&str>; 3], headers: &str, body: &str) -> [Option<String>; 3] {
        identity_hint(cols, headers, body.as_bytes())
    }

    fn some(v: [&str; 3]) -> [Option<String>; 3] {
        v.map(|s| (!s.is_empty()).then(|| s.to_string()))
    }

    #[test]
    fn column_then_header_then_body() {
        let body = r#"{"producer":"b","schema_version":"bv","event_id":"be"}"#;
        assert_eq!(
            hint([Some("c"), None, None], r#"{"x-schema-version":"h"}"#, body),
            some(["c", "h", "be"])
        );
        assert_eq!(
            hint([Some(""), None, None], "{}", body)[0],
            Some(String::new())
        );
    }

    #[test]
    fn numbers_and_booleans_keep_their_text_others_are_no_value() {
        assert_eq!(
            hint(
                [None; 3],
                r#"{"x-producer":true,"x-schema-version":1e2,"x-event-id":null}"#,
                r#"{"event_id":-7E+1,"producer":"not-this"}"#
            ),
            some(["true", "1e2", "-7E+1"])
        );
        assert_eq!(
            hint(
                [None; 3],
                r#"{"x-producer":[1],"x-schema-version":{"v":1}}"#,
                r#"{"producer":"caf\u00e9","schema_version":[2],"event_id":false}"#
            ),
            some(["café", "", "false"])
        );
    }

    #[test]
    fn bodies_that_are_no_json_object_give_nothing() {
        for body in [
            r#"["x","y","z"]"#,
            r#"{"producer":"x""#,
            "\u{feff}{}",
            "",
            "  ",
        ] {
            assert_eq!(
                hint([None; 3], "not json", body),
                [None, None, None],
                "{body}"
            );
        }
        let spaced = format!("{}{}", " \n".repeat(50), r#"{"producer":"p"}"#);
        assert_eq!(hint([None; 3], "{}", &spaced)[0].as_deref(), Some("p"));
        assert_eq!(
            identity_hint([None; 3], "{}", &[0xff, b'{', b'}']),
            [None, None, None]
        );
    }
}
