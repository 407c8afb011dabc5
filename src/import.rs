//! The line format of `dlq export` and `dlq import`: one JSON object per dead letter, in
//! the shape `dlq show -o json` prints (export adds nothing that import does not read).
//!
//! Import reads a stream of JSON values (one per line as `export` writes them, or
//! pretty-printed as `show -o json` prints one), after an optional UTF-8 byte order mark.
//! Every value is parsed and checked before anything is written; the store then inserts
//! all rows in one transaction. A bad value names the line it starts on and its field.
//! The rules are the same whichever store the rows go to.

use crate::error::{DlqError, IoContext, Result};
use crate::model::{sha256_hex, token_operator, validate_id, HistoryEntry};
use crate::store::NewDeadLetter;
use base64::Engine;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::{Map, Value};
use std::cell::RefCell;
use std::io::BufRead;
use std::rc::Rc;

/// Longest accepted value: a 64 MiB body is ~86 MiB of base64.
pub const MAX_LINE_BYTES: usize = 96 * 1024 * 1024;

fn bad(line: usize, field: &str, msg: impl std::fmt::Display) -> DlqError {
    DlqError::usage(format!(
        "line {line}: field {field}: {msg} (nothing was imported)"
    ))
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
    let values = serde_json::Deserializer::from_reader(tracker).into_iter::<Value>();
    for value in values {
        let value = value.map_err(|e| {
            let p = pos.borrow();
            if e.is_io() {
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
        let Value::Object(obj) = value else {
            return Err(DlqError::usage(format!(
                "line {line}: not a JSON object (nothing was imported)"
            )));
        };
        rows.push(parse_object(line, &obj)?);
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

fn body_of(line: usize, obj: &Map<String, Value>) -> Result<Vec<u8>> {
    let base64 = match obj.get("body_base64") {
        None | Some(Value::Null) => None,
        Some(Value::String(b64)) => Some(
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|e| bad(line, "body_base64", format!("not valid base64: {e}")))?,
        ),
        Some(_) => return Err(bad(line, "body_base64", "expected a base64 string")),
    };
    let text = match obj.get("body_text") {
        None | Some(Value::Null) => None,
        Some(Value::String(t)) => Some(t.clone().into_bytes()),
        Some(_) => return Err(bad(line, "body_text", "expected a string")),
    };
    match (base64, text) {
        (Some(b), Some(t)) if b != t => Err(bad(
            line,
            "body_text",
            "differs from body_base64; give one of them (or both, the same body)",
        )),
        (Some(b), _) => Ok(b),
        (None, Some(t)) => Ok(t),
        (None, None) => Err(bad(
            line,
            "body_base64",
            "missing (give body_base64 or body_text)",
        )),
    }
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

fn parse_object(line: usize, obj: &Map<String, Value>) -> Result<NewDeadLetter> {
    let id = opt_str(line, obj, "id")?.ok_or_else(|| bad(line, "id", "missing"))?;
    validate_id(&id).map_err(|e| bad(line, "id", e))?;
    let body = body_of(line, obj)?;
    if let Some(expected) = opt_str(line, obj, "sha256")? {
        let actual = sha256_hex(&body);
        if !expected.eq_ignore_ascii_case(&actual) {
            return Err(bad(
                line,
                "sha256",
                format!("the body hashes to {actual}, not {expected}"),
            ));
        }
    }
    let reason = opt_str(line, obj, "reason")?.ok_or_else(|| bad(line, "reason", "missing"))?;
    if reason.trim().is_empty() {
        return Err(bad(line, "reason", "empty"));
    }
    let attempts = match obj.get("attempts") {
        Some(Value::Number(n)) => n
            .as_i64()
            .filter(|a| *a >= 0 && *a <= i32::MAX as i64)
            .ok_or_else(|| {
                bad(
                    line,
                    "attempts",
                    format!("{n} is not a whole number from 0 to {}", i32::MAX),
                )
            })?,
        None | Some(Value::Null) => 0,
        Some(other) => {
            return Err(bad(
                line,
                "attempts",
                format!("expected a number, got {other}"),
            ))
        }
    };
    // Serialized again as compact JSON, numbers as written (serde_json keeps their text).
    let headers_json = match (obj.get("headers"), obj.get("headers_json")) {
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
    };
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
        history: history_of(line, obj)?,
    })
}

/// One line of `dlq export`: the row's own columns (not the derived values `show`
/// prints), headers as a JSON object when they are one (else `headers_json`, the stored
/// text), the body as base64 with its hash, and the history, oldest first.
#[derive(Serialize)]
struct ExportLine<'a> {
    id: &'a str,
    reason: &'a str,
    attempts: i64,
    replayed_at: Option<DateTime<Utc>>,
    replay_claim_owner: Option<&'a str>,
    replay_claim_expires_at: Option<DateTime<Utc>>,
    last_replay_error: Option<&'a str>,
    event_id: Option<&'a str>,
    error: Option<&'a str>,
    producer: Option<&'a str>,
    schema_version: Option<&'a str>,
    source_queue: Option<&'a str>,
    exchange: Option<&'a str>,
    routing_key: Option<&'a str>,
    dead_lettered_at: Option<DateTime<Utc>>,
    replay_attempt_at: Option<DateTime<Utc>>,
    discarded_at: Option<DateTime<Utc>>,
    discard_note: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    headers: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    headers_json: Option<&'a str>,
    body_base64: String,
    sha256: String,
    history: &'a [HistoryEntry],
}

/// The export line of a row (no newline).
pub fn export_line(r: &NewDeadLetter) -> String {
    let headers = match serde_json::from_str::<Value>(&r.headers_json) {
        Ok(v @ Value::Object(_)) => Some(v),
        _ => None,
    };
    let line = ExportLine {
        id: &r.id,
        reason: &r.reason,
        attempts: r.attempts,
        replayed_at: r.replayed_at,
        replay_claim_owner: r.replay_claim_owner.as_deref(),
        replay_claim_expires_at: r.replay_claim_expires_at,
        last_replay_error: r.last_replay_error.as_deref(),
        event_id: r.event_id.as_deref(),
        error: r.error.as_deref(),
        producer: r.producer.as_deref(),
        schema_version: r.schema_version.as_deref(),
        source_queue: r.source_queue.as_deref(),
        exchange: r.exchange.as_deref(),
        routing_key: r.routing_key.as_deref(),
        dead_lettered_at: r.dead_lettered_at,
        replay_attempt_at: r.replay_attempt_at,
        discarded_at: r.discarded_at,
        discard_note: r.discard_note.as_deref(),
        headers_json: headers.is_none().then_some(r.headers_json.as_str()),
        headers,
        body_base64: base64::engine::general_purpose::STANDARD.encode(&r.body),
        sha256: sha256_hex(&r.body),
        history: r.history.as_deref().unwrap_or_default(),
    };
    serde_json::to_string(&line).unwrap_or_default()
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
