//! `dlq import`: JSON lines in the shape `dlq show -o json` prints.
//!
//! Every line is parsed and checked before anything is written; the store then inserts
//! all rows in one transaction. A bad line names its number and field.

use crate::error::{DlqError, Result};
use crate::model::{sha256_hex, token_operator, validate_id};
use crate::store::NewDeadLetter;
use base64::Engine;
use chrono::{DateTime, Utc};
use serde_json::{Map, Value};
use std::io::BufRead;

/// Longest accepted line: a 64 MiB body is ~86 MiB of base64.
pub const MAX_LINE_BYTES: usize = 96 * 1024 * 1024;

fn bad(line: usize, field: &str, msg: impl std::fmt::Display) -> DlqError {
    DlqError::usage(format!(
        "line {line}: field {field}: {msg} (nothing was imported)"
    ))
}

/// Reads and validates every line. Blank lines are skipped.
pub fn read_lines<R: BufRead>(mut input: R) -> Result<Vec<NewDeadLetter>> {
    let mut rows = Vec::new();
    let mut buf = Vec::new();
    let mut line = 0usize;
    loop {
        buf.clear();
        line += 1;
        let reader: &mut R = &mut input;
        let n =
            std::io::Read::take(reader, MAX_LINE_BYTES as u64 + 1).read_until(b'\n', &mut buf)?;
        if n == 0 {
            break;
        }
        if buf.len() > MAX_LINE_BYTES && !buf.ends_with(b"\n") {
            return Err(DlqError::usage(format!(
                "line {line}: longer than {} MiB; not a dead letter dlq can import (nothing was imported)",
                MAX_LINE_BYTES / (1024 * 1024)
            )));
        }
        let text = std::str::from_utf8(&buf).map_err(|_| {
            DlqError::usage(format!(
                "line {line}: not valid UTF-8 (nothing was imported)"
            ))
        })?;
        if text.trim().is_empty() {
            continue;
        }
        let value: Value = serde_json::from_str(text).map_err(|e| {
            DlqError::usage(format!(
                "line {line}: not a JSON object: {e} (nothing was imported)"
            ))
        })?;
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
                format!("{:?} appears twice in the file", r.id),
            ));
        }
    }
    Ok(rows)
}

fn opt_str(line: usize, obj: &Map<String, Value>, field: &str) -> Result<Option<String>> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
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

fn parse_object(line: usize, obj: &Map<String, Value>) -> Result<NewDeadLetter> {
    let id = opt_str(line, obj, "id")?.ok_or_else(|| bad(line, "id", "missing"))?;
    validate_id(&id).map_err(|e| bad(line, "id", e))?;
    let body = match (obj.get("body_base64"), obj.get("body_text")) {
        (Some(Value::String(b64)), _) => base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| bad(line, "body_base64", format!("not valid base64: {e}")))?,
        (Some(other), _) if !other.is_null() => {
            return Err(bad(line, "body_base64", "expected a base64 string"))
        }
        (_, Some(Value::String(t))) => t.clone().into_bytes(),
        _ => {
            return Err(bad(
                line,
                "body_base64",
                "missing (give body_base64 or body_text)",
            ))
        }
    };
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
    let headers_json = match (obj.get("headers"), obj.get("headers_json")) {
        (Some(Value::Object(h)), _) => Value::Object(h.clone()).to_string(),
        (Some(other), _) if !other.is_null() => {
            return Err(bad(line, "headers", "expected a JSON object"))
        }
        (_, Some(Value::String(s))) => match serde_json::from_str::<Value>(s) {
            Ok(Value::Object(_)) => s.clone(),
            _ => {
                return Err(bad(
                    line,
                    "headers_json",
                    "expected a string holding a JSON object",
                ))
            }
        },
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
}
