//! Dead letters as `import` takes them, bodies, and the small helpers many modules share.

use super::*;

/// A dead letter as JSON for `import`.
pub fn letter(id: &str, queue: &str, body: &[u8]) -> serde_json::Value {
    use base64::Engine;
    serde_json::json!({
        "id": id,
        "reason": "retries_exhausted",
        "attempts": 5,
        "headers": {"x-death": [{"count": 5}], "x-delivery-count": 5, "x-first-death-queue": queue, "tenant": "acme"},
        "producer": "inventory",
        "schema_version": "5",
        "event_id": format!("evt-{id}"),
        "source_queue": queue,
        "error": "timeout",
        "body_base64": base64::engine::general_purpose::STANDARD.encode(body),
    })
}

pub const MIB: usize = 1024 * 1024;

/// `len` incompressible bytes, different for every seed (so a mixed-up body shows).
pub fn noise(seed: u32, len: usize) -> Vec<u8> {
    let mut x: u32 = 0x9e37_79b9 ^ seed.wrapping_mul(0x85eb_ca6b);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 24) as u8
        })
        .collect()
}

pub fn b64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The bytes of a `body_base64` value.
pub fn unb64(v: &serde_json::Value) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(v.as_str().expect("body_base64 is a string"))
        .unwrap()
}

/// A small JSON body.
pub const SMALL_BODY: &[u8] = b"{\"event_id\":\"evt-h\"}";

/// Imports one dead letter per `(id, queue)`, each body `{"event_id":"evt-ID"}`.
pub fn import_letters(db: &TestDb, rows: impl Iterator<Item = (String, String)>) {
    let mut lines = String::new();
    for (id, queue) in rows {
        let body = format!("{{\"event_id\":\"evt-{id}\"}}");
        lines.push_str(&letter(&id, &queue, body.as_bytes()).to_string());
        lines.push('\n');
    }
    let r = db.dlq_stdin(&["import", "-"], lines.as_bytes());
    assert_eq!(r.code, 0, "{}", r.all());
}

/// The `(action, outcome)` pairs of a `show` report's history.
pub fn history_actions(s: &serde_json::Value) -> Vec<(String, String)> {
    s["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["action"].as_str().unwrap().to_string(),
                h["outcome"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Moves every lease into the past (time passing, on the database's terms).
pub fn lapse_leases(db: &TestDb) {
    db.sql(&[match db.backend {
        Backend::Postgres => "UPDATE dead_letters SET replay_claim_expires_at = now() - interval '1 second' WHERE replay_claim_expires_at IS NOT NULL",
        Backend::Sqlite => "UPDATE dead_letters SET replay_claim_expires_at = 1 WHERE replay_claim_expires_at IS NOT NULL",
    }]);
}

/// The state `show` gives a row.
pub fn state(db: &TestDb, id: &str) -> String {
    db.show(id)["state"].as_str().unwrap().to_string()
}
