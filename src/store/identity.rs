//! The identity values (`eff_producer`, `eff_schema_version`, `eff_event_id`) as SQLite's
//! triggers derive them (migrations/sqlite/20261201000002), computed by `dlq` for the rows
//! it inserts. SQLite's AFTER INSERT trigger cannot change the row being inserted: when
//! it finds a value the row lacks, it writes the whole row a second time (for a 50 MiB
//! body, another copy of the record in memory and in the WAL). Given with the INSERT,
//! right values leave the trigger nothing to write. They are a hint only: the trigger
//! still derives them and overwrites a wrong one, so the database keeps the rule.

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

/// (producer, schema_version, event_id) of a row: the column, else the header, else the
/// top-level body field (a string its value, a number or boolean its JSON text).
pub(crate) fn identity_hint(
    columns: [Option<&str>; 3],
    headers_json: &str,
    body: &[u8],
) -> [Option<String>; 3] {
    let header_keys = ["x-producer", "x-schema-version", "x-event-id"];
    let from_headers = fields(headers_json.as_bytes(), &header_keys).unwrap_or_default();
    let from_body = body_fields(body).unwrap_or_default();
    std::array::from_fn(|i| {
        columns[i]
            .map(str::to_string)
            .or_else(|| from_headers[i].and_then(scalar))
            .or_else(|| from_body[i].and_then(scalar))
    })
}

/// Where a message's content names its event: the `x-event-id` header and the body's
/// top-level `event_id`, each as the store's rule reads it. Stored again with no
/// `event_id` column (as capture stores a message that names its event there), the
/// message is known by the first; a worker may take either.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventInContent {
    pub header: Option<String>,
    pub body: Option<String>,
}

impl EventInContent {
    /// Each as a store's TEXT keeps it: a NUL (PostgreSQL's TEXT holds none) becomes
    /// U+FFFD, as capture stores it.
    pub(crate) fn of(headers_json: &str, body: &[u8]) -> Self {
        let kept = |v: String| match v.contains('\0') {
            true => v.replace('\0', "\u{FFFD}"),
            false => v,
        };
        let header = fields(headers_json.as_bytes(), &["x-event-id", "", ""])
            .and_then(|[h, _, _]| h)
            .and_then(scalar)
            .map(kept);
        let body = body_fields(body)
            .and_then(|[_, _, e]| e)
            .and_then(scalar)
            .map(kept);
        EventInContent { header, body }
    }

    /// Each that is not `event`.
    pub fn other_than(self, event: Option<&str>) -> Self {
        let other = |v: Option<String>| v.filter(|v| Some(v.as_str()) != event);
        EventInContent {
            header: other(self.header),
            body: other(self.body),
        }
    }

    /// The IDs named, the header's first.
    pub fn ids(&self) -> impl Iterator<Item = &String> {
        self.header.iter().chain(self.body.iter())
    }
}

/// The first value of each of three keys of a JSON object, as written: SQLite's JSON
/// functions (and PostgreSQL's `json_each`, which the rule uses) take the first of keys
/// given twice; a struct derived by serde would refuse the whole object.
#[derive(Default)]
struct Fields<'a>([Option<&'a RawValue>; 3]);

struct FieldsSeed<'k>(&'k [&'k str; 3]);

impl<'de> DeserializeSeed<'de> for FieldsSeed<'_> {
    type Value = Fields<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Fields<'de>, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for FieldsSeed<'_> {
    type Value = Fields<'de>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Fields<'de>, M::Error> {
        let mut found = Fields::default();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match self.0.iter().position(|k| *k == key) {
                Some(i) if found.0[i].is_none() => found.0[i] = Some(map.next_value()?),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(found)
    }
}

fn fields<'a>(json: &'a [u8], keys: &[&str; 3]) -> Option<[Option<&'a RawValue>; 3]> {
    let mut de = serde_json::Deserializer::from_slice(json);
    let found = FieldsSeed(keys).deserialize(&mut de).ok()?;
    de.end().ok()?;
    Some(found.0)
}

/// The body's three fields when it is a JSON object. Other fields are skipped without
/// being kept.
fn body_fields(body: &[u8]) -> Option<[Option<&RawValue>; 3]> {
    let first = body
        .iter()
        .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))?;
    if *first != b'{' {
        return None;
    }
    fields(body, &["producer", "schema_version", "event_id"])
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
    fn the_event_in_a_header_and_in_a_body_each_as_the_rule_reads_it() {
        let of = |h: &str, b: &str| EventInContent::of(h, b.as_bytes());
        let both = of(
            r#"{"x-event-id":"h-1"}"#,
            r#"{"event_id":7,"n":{"event_id":"x"}}"#,
        );
        let want = |h: Option<&str>, b: Option<&str>| EventInContent {
            header: h.map(Into::into),
            body: b.map(Into::into),
        };
        assert_eq!(both, want(Some("h-1"), Some("7")));
        assert_eq!(both.clone().other_than(Some("7")), want(Some("h-1"), None));
        assert_eq!(both.ids().count(), 2);
        let none = of(r#"{"x-event-id":null}"#, r#"[{"event_id":"x"}]"#);
        assert_eq!(none, want(None, None));
        assert_eq!(of("not json", r#"{"event_id":"b"}"#), want(None, Some("b")));
    }

    #[test]
    fn a_key_given_twice_counts_once_its_first_value() {
        assert_eq!(
            hint(
                [None; 3],
                r#"{"x-producer":"h1","x-producer":"h2"}"#,
                r#"{"event_id":"e1","pad":[1,{"event_id":"in"}],"event_id":"e2"}"#
            ),
            some(["h1", "", "e1"])
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
