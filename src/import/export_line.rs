//! The writing side of the line format (the reader is in `import.rs`): one row, one line,
//! written straight into the output. `dlq export` writes millions of them, so nothing
//! is built that serde_json would only copy or scan again.

use crate::model::{HistoryEntry, Sha256Hex};
use crate::store::NewDeadLetter;
use base64::Engine;
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::Value;
use std::collections::BTreeMap;

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
    revision_of: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    headers: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    headers_json: Option<&'a str>,
    /// Base64 needs no JSON escape: written as it is (serde_json would look at every
    /// byte of it for one).
    body_base64: Box<RawValue>,
    sha256: &'a str,
    history: &'a [HistoryEntry],
    /// A time the source could not read (its column is null here): an import refuses the
    /// line rather than lose what that time meant (a replay, a discard).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    unreadable: &'a BTreeMap<String, String>,
}

/// Writes the export line of a row and its newline straight into `out` (no line held
/// apart: `dlq export` writes millions of them).
pub fn write_export_line(out: &mut impl std::io::Write, r: &NewDeadLetter) -> std::io::Result<()> {
    let sha256 = Sha256Hex::of(&r.body);
    let line = export_value(r, sha256.as_str())?;
    serde_json::to_writer(&mut *out, &line).map_err(std::io::Error::from)?;
    out.write_all(b"\n")
}

/// The body in base64 as a JSON string.
fn base64_json(body: &[u8]) -> std::io::Result<Box<RawValue>> {
    let mut json = String::with_capacity(body.len().div_ceil(3) * 4 + 2);
    json.push('"');
    base64::engine::general_purpose::STANDARD.encode_string(body, &mut json);
    json.push('"');
    RawValue::from_string(json).map_err(std::io::Error::from)
}

fn export_value<'a>(r: &'a NewDeadLetter, sha256: &'a str) -> std::io::Result<ExportLine<'a>> {
    let headers = match serde_json::from_str::<Value>(&r.headers_json) {
        Ok(v @ Value::Object(_)) => Some(v),
        _ => None,
    };
    Ok(ExportLine {
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
        revision_of: r.revision_of.as_deref(),
        headers_json: headers.is_none().then_some(r.headers_json.as_str()),
        headers,
        body_base64: base64_json(&r.body)?,
        sha256,
        history: r.history.as_deref().unwrap_or_default(),
        unreadable: &r.unreadable,
    })
}
