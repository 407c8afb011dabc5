//! The line format of `dlq export` and `dlq import`: one JSON object per dead letter, in
//! the shape `dlq show -o json` prints (export adds nothing that import does not read).
//!
//! Import reads a stream of JSON values (one per line as `export` writes them, or
//! pretty-printed as `show -o json` prints one), after an optional UTF-8 byte order mark.
//! Every value is parsed and checked before anything is written; the store then inserts
//! all rows or none (PostgreSQL in one transaction, SQLite in short batches that one last
//! transaction makes visible: `store/sqlite_import.rs`). A bad value names the line it
//! starts on and its field. The rules are the same whichever store the rows go to.
//!
//! A body may be tens of MiB, so the body fields are decoded as the parser reads them:
//! `body_base64` straight from the parser's string buffer into the one `Vec` the row
//! keeps, and a `body_text` given with it compared with that body in place. No field is
//! held as a JSON value or a second string; every other field is a `serde_json::Value`.

use crate::error::{DlqError, IoContext, Result};
use crate::model::{sha256_hex, token_operator, validate_id, HistoryEntry};
use crate::spell::{words, Cmd, Words};
use crate::store::NewDeadLetter;
use base64::Engine;
use chrono::{DateTime, Utc};
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::io::BufRead;
use std::rc::Rc;

mod export_line;
pub use export_line::write_export_line;

/// Longest accepted value: a 64 MiB body is ~86 MiB of base64.
pub const MAX_LINE_BYTES: usize = 96 * 1024 * 1024;

fn bad(line: usize, field: &str, msg: impl std::fmt::Display) -> DlqError {
    bad_words(line, field, words(msg.to_string()))
}

/// [`bad`], the message naming CLI things.
fn bad_words(line: usize, field: &str, msg: Words) -> DlqError {
    DlqError::usage(
        words(format!("line {line}: field {field}: "))
            .and(msg)
            .text(" (nothing was imported)"),
    )
}

/// Where the reader is, shared with [`Tracker`] while serde_json owns it.
#[derive(Default)]
struct Position {
    /// The current line (1-based).
    line: usize,
    /// Waiting for the first byte of the next value.
    between: bool,
    /// Line the current value starts on.
    start_line: usize,
    /// Bytes of the current value so far.
    value_bytes: usize,
}

/// Counts lines under the JSON stream reader: which line a value starts on (for errors
/// that are not syntax errors) and how long it is (bounded by [`MAX_LINE_BYTES`]).
struct Tracker<R> {
    inner: R,
    pos: Rc<RefCell<Position>>,
}

impl<R: BufRead> std::io::Read for Tracker<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        let mut p = self.pos.borrow_mut();
        for &b in &buf[..n] {
            if p.between && !matches!(b, b' ' | b'\t' | b'\r' | b'\n') {
                p.between = false;
                p.start_line = p.line;
                p.value_bytes = 0;
            }
            p.value_bytes += 1;
            if b == b'\n' {
                p.line += 1;
            }
        }
        if !p.between && p.value_bytes > MAX_LINE_BYTES {
            return Err(std::io::Error::other(format!(
                "line {}: a value longer than {} MiB; not a dead letter dlq can import",
                p.start_line,
                MAX_LINE_BYTES / (1024 * 1024)
            )));
        }
        Ok(n)
    }
}

/// Reads and validates every dead letter of the input.
pub fn read_lines<R: BufRead>(mut input: R) -> Result<Vec<NewDeadLetter>> {
    // A byte order mark, as some editors write one, is not part of the JSON.
    let start = input
        .fill_buf()
        .io_context(|| "cannot read the input (nothing was imported)".into())?;
    if start.starts_with(b"\xEF\xBB\xBF") {
        input.consume(3);
    }
    let pos = Rc::new(RefCell::new(Position {
        line: 1,
        between: true,
        ..Position::default()
    }));
    let tracker = Tracker {
        inner: input,
        pos: pos.clone(),
    };
    let mut rows = Vec::new();
    let values = serde_json::Deserializer::from_reader(tracker).into_iter::<Fields>();
    for value in values {
        let value = value.map_err(|e| {
            let p = pos.borrow();
            if e.is_data() {
                // A value that is not an object, or a field of the wrong type: serde says
                // which.
                DlqError::usage(format!(
                    "line {}: not a dead letter: {e} (nothing was imported)",
                    p.start_line
                ))
            } else if e.is_io() {
                DlqError::usage(format!("{e} (nothing was imported)"))
            } else if p.between {
                DlqError::usage(format!(
                    "line {}: not valid JSON: {e} (nothing was imported)",
                    e.line()
                ))
            } else {
                DlqError::usage(format!(
                    "line {}: not valid JSON: {e} (nothing was imported)",
                    p.start_line
                ))
            }
        })?;
        let line = {
            let mut p = pos.borrow_mut();
            p.between = true;
            p.start_line
        };
        rows.push(parse_object(line, value)?);
    }
    let mut seen = std::collections::HashSet::new();
    for r in &rows {
        if !seen.insert(r.id.as_str()) {
            return Err(bad(
                r.line,
                "id",
                format!("{:?} appears twice in the input", r.id),
            ));
        }
    }
    Ok(rows)
}

/// A text field: PostgreSQL cannot store U+0000 in text, so no store accepts one.
fn no_nul(line: usize, field: &str, s: &str) -> Result<()> {
    if s.contains('\0') {
        return Err(bad(
            line,
            field,
            "holds a NUL character (\\u0000), which no text field can hold",
        ));
    }
    Ok(())
}

fn opt_str(line: usize, obj: &Map<String, Value>, field: &str) -> Result<Option<String>> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => {
            no_nul(line, field, s)?;
            Ok(Some(s.clone()))
        }
        Some(other) => Err(bad(
            line,
            field,
            format!("expected a string or null, got {other}"),
        )),
    }
}

fn opt_time(line: usize, obj: &Map<String, Value>, field: &str) -> Result<Option<DateTime<Utc>>> {
    match opt_str(line, obj, field)? {
        None => Ok(None),
        Some(s) => DateTime::parse_from_rfc3339(&s)
            .map(|t| Some(t.with_timezone(&Utc)))
            .map_err(|e| bad(line, field, format!("{s:?} is not an RFC 3339 time: {e}"))),
    }
}

/// One input object: the body fields as read (see the module docs), the others as JSON.
#[derive(Default)]
struct Fields {
    obj: Map<String, Value>,
    /// `body_base64`: absent or null, else the decoded body or why it is not one.
    base64: Option<std::result::Result<Vec<u8>, String>>,
    text: Option<Text>,
    /// A body field given twice: the name.
    repeated: Option<&'static str>,
}

/// What became of `body_text`.
enum Text {
    /// Read before any `body_base64`: the body itself.
    Body(Vec<u8>),
    /// Compared with the body decoded from `body_base64` read before it.
    Same,
    Differs,
    NotAString,
}

impl<'de> Deserialize<'de> for Fields {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        // Anything but an object is a data error (see `read_lines`).
        d.deserialize_map(FieldsVisitor)
    }
}

struct FieldsVisitor;

impl<'de> Visitor<'de> for FieldsVisitor {
    type Value = Fields;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Fields, A::Error> {
        let mut f = Fields::default();
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "body_base64" => {
                    if f.base64.is_some() {
                        f.repeated = Some("body_base64");
                    }
                    f.base64 = map.next_value_seed(BodySeed::Base64)?.into_base64();
                }
                "body_text" => {
                    if f.text.is_some() {
                        f.repeated = Some("body_text");
                    }
                    let against = f.base64.as_ref().and_then(|b| b.as_ref().ok());
                    f.text = map.next_value_seed(BodySeed::Text(against))?.into_text();
                }
                _ => {
                    let value = map.next_value::<Value>()?;
                    f.obj.insert(key, value);
                }
            }
        }
        Ok(f)
    }
}

/// How to read one body field's value.
enum BodySeed<'b> {
    Base64,
    /// `body_text`, compared with this body when there is one.
    Text(Option<&'b Vec<u8>>),
}

/// One body field's value as read.
enum BodyValue {
    Null,
    NotAString,
    Base64(std::result::Result<Vec<u8>, String>),
    Text(Text),
}

impl BodyValue {
    fn into_base64(self) -> Option<std::result::Result<Vec<u8>, String>> {
        match self {
            BodyValue::Null => None,
            BodyValue::Base64(b) => Some(b),
            _ => Some(Err("expected a base64 string".into())),
        }
    }

    fn into_text(self) -> Option<Text> {
        match self {
            BodyValue::Null => None,
            BodyValue::Text(t) => Some(t),
            _ => Some(Text::NotAString),
        }
    }
}

impl<'de> DeserializeSeed<'de> for BodySeed<'_> {
    type Value = BodyValue;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<BodyValue, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for BodySeed<'_> {
    type Value = BodyValue;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a string or null")
    }

    /// The parser's own buffer: decoded or compared without a copy.
    fn visit_str<E: serde::de::Error>(self, s: &str) -> std::result::Result<BodyValue, E> {
        Ok(match self {
            BodySeed::Base64 => BodyValue::Base64(
                base64::engine::general_purpose::STANDARD
                    .decode(s)
                    .map_err(|e| format!("not valid base64: {e}")),
            ),
            BodySeed::Text(Some(body)) if body.as_slice() == s.as_bytes() => {
                BodyValue::Text(Text::Same)
            }
            BodySeed::Text(Some(_)) => BodyValue::Text(Text::Differs),
            BodySeed::Text(None) => BodyValue::Text(Text::Body(s.as_bytes().to_vec())),
        })
    }

    fn visit_string<E: serde::de::Error>(self, s: String) -> std::result::Result<BodyValue, E> {
        match self {
            BodySeed::Text(None) => Ok(BodyValue::Text(Text::Body(s.into_bytes()))),
            seed => seed.visit_str(&s),
        }
    }

    fn visit_unit<E: serde::de::Error>(self) -> std::result::Result<BodyValue, E> {
        Ok(BodyValue::Null)
    }

    fn visit_bool<E: serde::de::Error>(self, _: bool) -> std::result::Result<BodyValue, E> {
        Ok(BodyValue::NotAString)
    }

    fn visit_i64<E: serde::de::Error>(self, _: i64) -> std::result::Result<BodyValue, E> {
        Ok(BodyValue::NotAString)
    }

    fn visit_u64<E: serde::de::Error>(self, _: u64) -> std::result::Result<BodyValue, E> {
        Ok(BodyValue::NotAString)
    }

    fn visit_f64<E: serde::de::Error>(self, _: f64) -> std::result::Result<BodyValue, E> {
        Ok(BodyValue::NotAString)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<BodyValue, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(BodyValue::NotAString)
    }

    /// An object, or a number (`arbitrary_precision` hands numbers over as a map).
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<BodyValue, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(BodyValue::NotAString)
    }
}

fn body_of(line: usize, f: &mut Fields) -> Result<Vec<u8>> {
    if let Some(name) = f.repeated {
        return Err(bad(line, name, "appears twice"));
    }
    let base64 = match f.base64.take() {
        None => None,
        Some(Ok(b)) => Some(b),
        Some(Err(e)) => return Err(bad(line, "body_base64", e)),
    };
    match (base64, f.text.take()) {
        (_, Some(Text::NotAString)) => Err(bad(line, "body_text", "expected a string")),
        (Some(b), Some(Text::Body(t))) if b != t => Err(differs(line)),
        (Some(_), Some(Text::Differs)) => Err(differs(line)),
        (Some(b), _) => Ok(b),
        (None, Some(Text::Body(t))) => Ok(t),
        (None, _) => Err(bad(
            line,
            "body_base64",
            "missing (give body_base64 or body_text)",
        )),
    }
}

fn differs(line: usize) -> DlqError {
    bad(
        line,
        "body_text",
        "differs from body_base64; give one of them (or both, the same body)",
    )
}

fn history_of(line: usize, obj: &Map<String, Value>) -> Result<Option<Vec<HistoryEntry>>> {
    let entries = match obj.get("history") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(bad(line, "history", "expected an array")),
    };
    let mut out = Vec::with_capacity(entries.len());
    for (i, e) in entries.iter().enumerate() {
        let Value::Object(e) = e else {
            return Err(bad(line, &format!("history[{i}]"), "expected an object"));
        };
        let field = |name: &str| format!("history[{i}].{name}");
        let text = |name: &str| -> Result<Option<String>> {
            opt_str(line, e, name)
                .map_err(|_| bad(line, &field(name), "expected a string or null without NUL"))
        };
        let required = |name: &str| -> Result<String> {
            text(name)?
                .filter(|s| !s.trim().is_empty())
                .ok_or_else(|| bad(line, &field(name), "missing or empty"))
        };
        let at = required("at")?;
        let at = DateTime::parse_from_rfc3339(&at)
            .map(|t| t.with_timezone(&Utc))
            .map_err(|err| {
                bad(
                    line,
                    &field("at"),
                    format!("{at:?} is not an RFC 3339 time: {err}"),
                )
            })?;
        out.push(HistoryEntry {
            at,
            operator: required("operator")?,
            action: required("action")?,
            outcome: required("outcome")?,
            detail: text("detail")?,
            token_ref: text("token_ref")?,
            target: text("target")?,
            plan_id: text("plan_id")?,
        });
    }
    Ok(Some(out))
}

fn parse_object(line: usize, mut fields: Fields) -> Result<NewDeadLetter> {
    let body = body_of(line, &mut fields);
    let obj = &fields.obj;
    let id = opt_str(line, obj, "id")?.ok_or_else(|| bad(line, "id", "missing"))?;
    validate_id(&id).map_err(|e| bad(line, "id", e))?;
    let body = body?;
    // The checks in the order a line's first error is reported.
    check_sha256(line, obj, &body)?;
    check_readable(line, obj)?;
    let reason = opt_str(line, obj, "reason")?.ok_or_else(|| bad(line, "reason", "missing"))?;
    if reason.trim().is_empty() {
        return Err(bad(line, "reason", "empty"));
    }
    let attempts = attempts_of(line, obj)?;
    let headers_json = headers_json_of(line, obj)?;
    Ok(NewDeadLetter {
        line,
        id,
        body,
        reason,
        attempts,
        headers_json,
        replayed_at: opt_time(line, obj, "replayed_at")?,
        // Exports carry the operator only; a token is never imported, so an imported
        // claim or attempt cannot be released or replayed by whoever knows that name.
        replay_claim_owner: opt_str(line, obj, "replay_claim_owner")?
            .map(|o| format!("{}:imported-{}", token_operator(&o), uuid::Uuid::new_v4())),
        replay_claim_expires_at: opt_time(line, obj, "replay_claim_expires_at")?,
        last_replay_error: opt_str(line, obj, "last_replay_error")?,
        event_id: opt_str(line, obj, "event_id")?,
        error: opt_str(line, obj, "error")?,
        producer: opt_str(line, obj, "producer")?,
        schema_version: opt_str(line, obj, "schema_version")?,
        source_queue: opt_str(line, obj, "source_queue")?,
        exchange: opt_str(line, obj, "exchange")?,
        routing_key: opt_str(line, obj, "routing_key")?,
        dead_lettered_at: opt_time(line, obj, "dead_lettered_at")?,
        replay_attempt_at: opt_time(line, obj, "replay_attempt_at")?,
        discarded_at: opt_time(line, obj, "discarded_at")?,
        discard_note: opt_str(line, obj, "discard_note")?,
        revision_of: opt_str(line, obj, "revision_of")?,
        history: history_of(line, obj)?,
        unreadable: BTreeMap::new(),
    })
}

/// A `sha256` given must be the body's.
fn check_sha256(line: usize, obj: &Map<String, Value>, body: &[u8]) -> Result<()> {
    if let Some(expected) = opt_str(line, obj, "sha256")? {
        let actual = sha256_hex(body);
        if !expected.eq_ignore_ascii_case(&actual) {
            return Err(bad(
                line,
                "sha256",
                format!("the body hashes to {actual}, not {expected}"),
            ));
        }
    }
    Ok(())
}

/// An exported row whose source held a value that is no time is refused, never
/// imported with that time lost.
fn check_readable(line: usize, obj: &Map<String, Value>) -> Result<()> {
    if let Some((col, stored)) = obj
        .get("unreadable")
        .and_then(Value::as_object)
        .and_then(|m| m.iter().next())
    {
        return Err(bad_words(
            line,
            "unreadable",
            words(format!(
                "the source database holds {stored} in {col}, which is no time: fix that row \
                 there ("
            ))
            .cmd(Cmd::Show)
            .text(" names it) and export it again"),
        ));
    }
    Ok(())
}

/// `attempts`: a whole number from 0 to `i32::MAX`, 0 when absent.
fn attempts_of(line: usize, obj: &Map<String, Value>) -> Result<i64> {
    match obj.get("attempts") {
        Some(Value::Number(n)) => n
            .as_i64()
            .filter(|a| *a >= 0 && *a <= i32::MAX as i64)
            .ok_or_else(|| {
                bad(
                    line,
                    "attempts",
                    format!("{n} is not a whole number from 0 to {}", i32::MAX),
                )
            }),
        None | Some(Value::Null) => Ok(0),
        Some(other) => Err(bad(
            line,
            "attempts",
            format!("expected a number, got {other}"),
        )),
    }
}

/// The headers as stored: `headers` serialized again as compact JSON (numbers as
/// written: serde_json keeps their text), or the stored text `headers_json`.
fn headers_json_of(line: usize, obj: &Map<String, Value>) -> Result<String> {
    Ok(match (obj.get("headers"), obj.get("headers_json")) {
        (Some(Value::Object(h)), _) => Value::Object(h.clone()).to_string(),
        (Some(other), _) if !other.is_null() => {
            return Err(bad(line, "headers", "expected a JSON object"))
        }
        // The stored text, kept as it is (an export writes it where the headers a worker
        // stored are not a JSON object).
        (_, Some(Value::String(s))) => {
            no_nul(line, "headers_json", s)?;
            s.clone()
        }
        (_, Some(other)) if !other.is_null() => {
            return Err(bad(line, "headers_json", "expected a string"))
        }
        _ => "{}".to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_line_names_line_and_field() {
        let input = "{\"id\":\"a\",\"body_text\":\"x\",\"reason\":\"poison_message\"}\n\
                     {\"id\":\"b\",\"body_base64\":\"%%%\",\"reason\":\"poison_message\"}\n";
        let e = read_lines(input.as_bytes()).unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("body_base64"), "{e}");
    }

    #[test]
    fn sha256_is_checked_when_present() {
        let input = "{\"id\":\"a\",\"body_text\":\"x\",\"reason\":\"r\",\"sha256\":\"00\"}";
        let e = read_lines(input.as_bytes()).unwrap_err().to_string();
        assert!(e.contains("sha256"), "{e}");
    }

    #[test]
    fn pretty_values_a_bom_and_several_values_on_a_line() {
        let input = "\u{feff}{\n  \"id\": \"a\",\n  \"body_text\": \"x\",\n  \"reason\": \"r\"\n}\n\
                     {\"id\":\"b\",\"body_text\":\"y\",\"reason\":\"r\"} {\"id\":\"c\",\"body_text\":\"z\",\"reason\":\"r\"}\n\
                     \n{\"id\":\"d\",\"reason\":\"r\"}";
        let e = read_lines(input.as_bytes()).unwrap_err().to_string();
        assert!(e.starts_with("line 8: field body_base64"), "{e}");
        let (first, _) = input.rsplit_once("\n\n").unwrap();
        let rows = read_lines(first.as_bytes()).unwrap();
        let lines: Vec<usize> = rows.iter().map(|r| r.line).collect();
        assert_eq!(lines, [1, 6, 6]);
    }

    #[test]
    fn numbers_in_headers_are_kept_as_written() {
        let input = r#"{"id":"a","body_text":"x","reason":"r","headers":{"big":123456789012345678901234567890,"d":1.10,"e":-2.5e-3}}"#;
        let rows = read_lines(input.as_bytes()).unwrap();
        assert_eq!(
            rows[0].headers_json,
            r#"{"big":123456789012345678901234567890,"d":1.10,"e":-2.5e-3}"#
        );
    }

    #[test]
    fn body_text_and_base64_must_agree() {
        let same = r#"{"id":"a","body_text":"x","body_base64":"eA==","reason":"r"}"#;
        assert_eq!(read_lines(same.as_bytes()).unwrap()[0].body, b"x");
        let differ = r#"{"id":"a","body_text":"y","body_base64":"eA==","reason":"r"}"#;
        let e = read_lines(differ.as_bytes()).unwrap_err().to_string();
        assert!(e.contains("line 1: field body_text: differs"), "{e}");
    }

    #[test]
    fn a_nul_in_a_text_field_is_refused_by_name() {
        let input = "{\"id\":\"a\",\"body_text\":\"x\\u0000\",\"reason\":\"r\"}\n\
                     {\"id\":\"b\",\"body_text\":\"x\",\"reason\":\"r\",\"error\":\"a\\u0000b\"}";
        let e = read_lines(input.as_bytes()).unwrap_err().to_string();
        assert!(e.starts_with("line 2: field error: holds a NUL"), "{e}");
    }
}
