//! The identity rule (producer / schema_version / event_id) on rows written by workers'
//! own SQL, the hint SQLite's triggers agree with, and duplicate keys in a body.

use crate::common::*;

/// SQLite: rows written by workers' own SQL in ways the triggers must follow (`INSERT OR
/// REPLACE` over an existing row, an UPSERT that updates the headers, explicit wrong
/// identity values) end with the identity the rule gives, and `dlq` still replays them.
#[test]
fn sqlite_worker_replace_and_upsert_keep_the_identity_rule() {
    let mut rabbit = Rabbit::new();
    let queue = rabbit.queue("rf_sqlite");
    let db = TestDb::migrated(Backend::Sqlite);
    let ins = |id: &str, headers: &str, body: &str, extra: &str| {
        format!(
            "INSERT {extra} INTO dead_letters (id, body, reason, attempts, headers_json, source_queue, \
             eff_producer, eff_schema_version, eff_event_id) \
             VALUES ('{id}', CAST('{body}' AS BLOB), 'poison_message', 1, '{headers}', '{queue}', \
             'wrong-p', 'wrong-s', 'wrong-e')"
        )
    };
    db.sql(&[
        &ins("r1", "{}", r#"{"producer":"p1","event_id":"e1"}"#, ""),
        &ins(
            "r1",
            r#"{"x-producer":"hp"}"#,
            r#"{"event_id":"e2","schema_version":3}"#,
            "OR REPLACE",
        ),
        &ins("u1", "{}", r#"{"producer":"p1"}"#, ""),
        &format!(
            "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, source_queue) \
             VALUES ('u1', CAST('{{}}' AS BLOB), 'poison_message', 1, '{{\"x-event-id\":\"hu\"}}', '{queue}') \
             ON CONFLICT(id) DO UPDATE SET headers_json = excluded.headers_json"
        ),
    ]);
    let show = |id: &str| {
        let v = db.show(id);
        [
            v["producer"].clone(),
            v["schema_version"].clone(),
            v["event_id"].clone(),
        ]
    };
    assert_eq!(
        show("r1"),
        [
            serde_json::json!("hp"),
            serde_json::json!("3"),
            serde_json::json!("e2")
        ]
    );
    assert_eq!(
        show("u1"),
        [
            serde_json::json!("p1"),
            serde_json::Value::Null,
            serde_json::json!("hu")
        ]
    );
    assert_eq!(db.ids(&["--producer", "hp"]), vec!["r1".to_string()]);
    let r = db.dlq(&["replay", "r1", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.all());
    let got = rabbit.drain(&queue);
    assert_eq!(got.len(), 1);
    assert_eq!(
        got[0].body,
        br#"{"event_id":"e2","schema_version":3}"#.to_vec()
    );
    assert_eq!(got[0].message_id.as_deref(), Some("e2"));
}

/// The identity values `import` hands SQLite with each INSERT are meant to be what the
/// triggers derive, "so that they do not write the row a second time" (src/store/
/// identity.rs). A trigger added here records every row the identity trigger writes again.
/// Bodies SQLite's JSON read but dlq's did not (a duplicate key, a lone surrogate escape)
/// got no hint, and the whole row (body included) was written twice. Only the cost is at
/// stake: the trigger still sets the values the rule gives.
#[test]
fn sqlite_identity_hint_agrees_with_the_trigger_so_rows_are_written_once() {
    use base64::Engine;
    let db = TestDb::migrated(Backend::Sqlite);
    db.sql(&[
        "CREATE TABLE rewritten (id TEXT)",
        "CREATE TRIGGER review_rewritten AFTER UPDATE OF eff_producer, eff_schema_version, \
         eff_event_id ON dead_letters BEGIN INSERT INTO rewritten VALUES (NEW.id); END",
    ]);
    let deep = format!(
        r#"{{"producer":"p","x":{}1{}}}"#,
        "[".repeat(200),
        "]".repeat(200)
    );
    let cases: Vec<(&str, String)> = vec![
        (
            "plain",
            r#"{"producer":"p","schema_version":1.0,"event_id":-0}"#.into(),
        ),
        (
            "bigint",
            r#"{"event_id":123456789012345678901234567890,"schema_version":1E400}"#.into(),
        ),
        (
            "unicode",
            r#"{"producer":"caf\u00e9 \ud83d\ude00","event_id":"\u0000x"}"#.into(),
        ),
        ("dupkey", r#"{"producer":"a","producer":"b"}"#.into()),
        ("deep", deep),
        (
            "surrogate",
            r#"{"producer":"\ud800","event_id":"e"}"#.into(),
        ),
    ];
    let mut lines = String::new();
    for (id, b) in &cases {
        lines.push_str(
            &serde_json::json!({
                "id": id,
                "reason": "poison_message",
                "attempts": 1,
                "headers": {},
                "source_queue": "q",
                "body_base64": base64::engine::general_purpose::STANDARD.encode(b),
            })
            .to_string(),
        );
        lines.push('\n');
    }
    let r = db.dlq_stdin(&["import", "-"], lines.as_bytes());
    assert_eq!(r.code, 0, "{}", r.all());
    for (id, _) in &cases {
        eprintln!("{id}: {:?}", db.show(id)["producer"]);
    }
    let written_twice: Vec<String> = cases
        .iter()
        .map(|(id, _)| id.to_string())
        .filter(|id| db.scalar(&format!("SELECT count(*) FROM rewritten WHERE id = '{id}'")) > 0)
        .collect();
    // A key given twice now gets the first value from both. The one exception left, as
    // documented: a lone surrogate escape, which dlq's parser (like PostgreSQL) refuses
    // as JSON and SQLite reads; the trigger still sets the right values.
    assert_eq!(
        written_twice,
        ["surrogate"],
        "rows written a second time by the identity trigger (hint != trigger)"
    );
    assert_eq!(db.show("surrogate")["event_id"], "e");
    assert_eq!(db.show("dupkey")["producer"], "a");
}

/// One rule on both stores (docs/json-output.md): the event ID a replay publishes as
/// `message_id` must not depend on the store. A key given twice: the first counts on both
/// (PostgreSQL's `json ->` took the last, SQLite's JSON the first). A lone surrogate
/// escape (`"\ud800"`, not Unicode) is the documented exception: PostgreSQL (and dlq's
/// own parser) refuse the body as JSON, so it gives no value; SQLite reads it.
#[test]
fn body_identity_with_duplicate_keys_is_the_same_on_both_stores() {
    use base64::Engine;
    let cases = [
        ("dup", r#"{"event_id":"first","event_id":"second"}"#),
        (
            "nested",
            r#"{"x":{"event_id":"in"},"event_id":"top","event_id":"late"}"#,
        ),
        ("hdr", r#"{"producer":"b"}"#),
        ("sur", r#"{"producer":"\ud800","event_id":"e-sur"}"#),
    ];
    let mut seen = Vec::new();
    for backend in BACKENDS {
        let db = TestDb::migrated(backend);
        for (id, b) in cases {
            db.add(serde_json::json!({
                "id": id, "reason": "poison_message", "attempts": 1,
                "headers": {}, "source_queue": "q",
                "body_base64": base64::engine::general_purpose::STANDARD.encode(b),
            }));
        }
        // A worker's header map with a key given twice (import would keep one).
        db.sql(&[r#"UPDATE dead_letters SET headers_json = '{"x-producer":"h1","x-producer":"h2"}' WHERE id = 'hdr'"#]);
        let got: Vec<(serde_json::Value, serde_json::Value)> = cases
            .iter()
            .map(|(id, _)| {
                let v = db.show(id);
                (v["event_id"].clone(), v["producer"].clone())
            })
            .collect();
        seen.push(got);
    }
    let expected = |e: &str, p: &str| (serde_json::json!(e), serde_json::json!(p));
    for got in &seen {
        assert_eq!(
            got[0],
            (serde_json::json!("first"), serde_json::Value::Null)
        );
        assert_eq!(got[1], (serde_json::json!("top"), serde_json::Value::Null));
        assert_eq!(got[2], (serde_json::Value::Null, serde_json::json!("h1")));
    }
    // The exception, as documented: PostgreSQL none, SQLite the body's event_id.
    assert_eq!(
        seen[0][3].0,
        serde_json::Value::Null,
        "PostgreSQL: {:?}",
        seen[0][3]
    );
    assert_eq!(
        seen[1][3].0,
        expected("e-sur", "").0,
        "SQLite: {:?}",
        seen[1][3]
    );
}
