//! The triage commands: list, aggregate, show, export and import, discard and restore,
//! prune, content filters.

mod aggregate;
mod count_rights;
mod discard;
mod export;
mod filters;
mod import;
mod kept_counts;
mod list;
mod list_many;
mod prune;
mod show;
mod uncounted_rows;

use crate::common::*;
use serde_json::{json, Value};
use std::collections::BTreeSet;

/// A dead letter to import, with this body and these headers.
fn row(id: &str, body: &[u8], headers: Value) -> Value {
    json!({
        "id": id,
        "reason": "permanent_failure",
        "attempts": 1,
        "headers": headers,
        "source_queue": "q",
        "body_base64": b64(body),
    })
}

/// The IDs `list` prints for these filters, as a set.
fn ids(db: &TestDb, args: &[&str]) -> BTreeSet<String> {
    let mut a = vec!["--limit", "1000"];
    a.extend_from_slice(args);
    db.ids(&a).into_iter().collect()
}

fn set(v: &[&str]) -> BTreeSet<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// Raw JSON lines (serde_json keeps numbers as written, so the text is what was sent).
pub(crate) fn import_lines(db: &TestDb, lines: &[String]) -> Run {
    db.dlq_stdin(&["import", "-"], (lines.join("\n") + "\n").as_bytes())
}

/// Rows that every filter test uses: JSON bodies with nested fields, escapes, numbers and
/// lists; a text body; a body that is not UTF-8; a JSON array; a near miss.
fn seed_content(db: &TestDb) {
    let j1_body = br#"{"customer":{"id":"c-17","name":"O'Brien \"Bob\" 100%_off\\path"},"amount":1.10,"tags":["a","b"],"big":123456789012345678901234567890}"#;
    let lines = vec![
        r#"{"id":"j1","reason":"permanent_failure","attempts":1,"source_queue":"q","error":"ValueError: bad amount 100%_x","headers":{"x-customer-id":"c-17","n":123456789012345678901234567890,"dec":1.10,"list":["a", "b"],"flag":true,"pct":"50%_x","quote":"say \"hi\" \\o/"},"body_base64":"BODY"}"#
            .replace("BODY", &b64(j1_body)),
        row("j2", br#"{"customer":{"id":"c-170"},"amount":11}"#, json!({"x-customer-id": "c-170"})).to_string(),
        // The same customer, spelled with a JSON escape: the same value.
        row("j3", br#"{"customer":{"id":"c\u002d17"}}"#, json!({"x-customer-id": "c\u{2d}17"})).to_string(),
        // Keys spelled with escapes are the same keys.
        row("j4", br#"{"cust\u006fmer":{"\u0069d":"c-17"}}"#, json!({})).to_string(),
        row("t1", b"customer c-17 called about 100%_off", json!({})).to_string(),
        row("b1", b"\xff\xfe c-17 \x00\x80 %", json!({"list": ["a"]})).to_string(),
        row("arr", br#"[{"customer":{"id":"c-17"}}]"#, json!({"x-customer-id": ["c-17"]})).to_string(),
        row("pct", br#"{"customer":{"id":"c%17"},"k":"a_b"}"#, json!({"pct": "50%"})).to_string(),
    ];
    let r = import_lines(db, &lines);
    assert_eq!(r.code, 0, "{}", r.all());
    // A worker's row that no parser can read: filters must pass over it, never fail on it.
    let (headers, body) = match db.backend {
        Backend::Postgres => ("'{not json'", "'\\x7b226375'::bytea"),
        Backend::Sqlite => ("'{not json'", "X'7b226375'"),
    };
    db.sql(&[&format!(
        "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, error) \
         VALUES ('raw', {body}, 'poison_message', 1, {headers}, '  KeyError : customer')"
    )]);
}

/// Rows with everything an export must carry: odd bodies, header numbers, a claim, a
/// replayed row, a discarded one, history.
fn seed_for_export(db: &TestDb) {
    db.import_examples();
    seed_content(db);
    let lines = vec![
        r#"{"id":"n1","reason":"retries_exhausted","attempts":3,"headers":{"big":123456789012345678901234567890,"d":1.10,"neg":-0.0,"e":2.5e-3,"s":"x\u0000y"},"body_base64":"AAEC/w==","event_id":"evt-n1","producer":"p","schema_version":"9","source_queue":"q","exchange":"ex","routing_key":"rk","error":"E: x","dead_lettered_at":"2026-11-28T10:00:00.123Z"}"#.to_string(),
    ];
    assert_eq!(import_lines(db, &lines).code, 0);
    assert_eq!(db.dlq(&["claim", "n1"]).code, 0);
    assert_eq!(db.dlq(&["note", "j1", "ticket 1"]).code, 0);
    assert_eq!(db.dlq(&["discard", "j2", "--note", "bad", "--yes"]).code, 0);
    db.sql(&["UPDATE dead_letters SET replayed_at = dead_lettered_at WHERE id = 'j3'"]);
}

const LIST_KEYS: [&str; 20] = [
    "id",
    "reason",
    "attempts",
    "replayed_at",
    "replay_claim_owner",
    "replay_claim_expires_at",
    "last_replay_error",
    "event_id",
    "error",
    "producer",
    "schema_version",
    "source_queue",
    "exchange",
    "routing_key",
    "dead_lettered_at",
    "replay_attempt_at",
    "discarded_at",
    "discard_note",
    // Contract v3: the column of a revision (`dlq edit`).
    "revision_of",
    "state",
];
