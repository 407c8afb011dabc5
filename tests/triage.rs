//! Triage beyond replay: content filters, error classes, discard / restore / note,
//! export and import between the stores, plans bound to their database, and prune. Real
//! PostgreSQL, SQLite and RabbitMQ, the real binary.

mod common;
use common::*;
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
fn import_lines(db: &TestDb, lines: &[String]) -> Run {
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

#[test]
fn content_filters_match_exactly_on_both_stores() {
    for b in BACKENDS {
        let db = TestDb::migrated(b);
        seed_content(&db);
        let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
            // Bytes, not patterns: `%` and `_` are plain characters.
            (
                vec!["--grep", "c-17"],
                vec!["j1", "j2", "j4", "t1", "b1", "arr"],
            ),
            (vec!["--grep", "100%_off"], vec!["j1", "t1"]),
            (vec!["--grep", "%"], vec!["j1", "t1", "b1", "pct"]),
            (vec!["--grep", "a_b"], vec!["pct"]),
            (vec!["--grep", r#"\"Bob\""#], vec!["j1"]),
            (vec!["--grep", r#"\\path"#], vec!["j1"]),
            (vec!["--error-contains", "100%_x"], vec!["j1"]),
            (vec!["--error-contains", "%_"], vec!["j1"]),
            (vec!["--error-contains", "KeyError"], vec!["raw"]),
            // A dotted path into a JSON object body, compared as text.
            (vec!["--field", "customer.id=c-17"], vec!["j1", "j3", "j4"]),
            (vec!["--field", "customer.id=c%17"], vec!["pct"]),
            (vec!["--field", "customer.id=c_17"], vec![]),
            (
                vec!["--field", r#"customer.name=O'Brien "Bob" 100%_off\path"#],
                vec!["j1"],
            ),
            (vec!["--field", "amount=1.10"], vec!["j1"]),
            (vec!["--field", "amount=1.1"], vec![]),
            (vec!["--field", "amount=11"], vec!["j2"]),
            (
                vec!["--field", "big=123456789012345678901234567890"],
                vec!["j1"],
            ),
            (vec!["--field", r#"tags=["a","b"]"#], vec!["j1"]),
            (vec!["--field", r#"tags=[ "a", "b" ]"#], vec!["j1"]),
            (vec!["--field", r#"tags=["b","a"]"#], vec![]),
            (vec!["--field", "customer={}"], vec![]),
            (vec!["--field", "id=c-17"], vec![]),
            // Headers: strings unquoted, numbers as written, lists as JSON.
            (vec!["--header", "x-customer-id=c-17"], vec!["j1", "j3"]),
            (
                vec!["--header", "n=123456789012345678901234567890"],
                vec!["j1"],
            ),
            (vec!["--header", "dec=1.10"], vec!["j1"]),
            (vec!["--header", "dec=1.1"], vec![]),
            (vec!["--header", r#"list=["a","b"]"#], vec!["j1"]),
            (vec!["--header", r#"list=["a"]"#], vec!["b1"]),
            (vec!["--header", "list=a"], vec![]),
            (vec!["--header", r#"x-customer-id=["c-17"]"#], vec!["arr"]),
            (vec!["--header", "flag=true"], vec!["j1"]),
            (vec!["--header", "pct=50%"], vec!["pct"]),
            (vec!["--header", "pct=50%_x"], vec!["j1"]),
            (vec!["--header", r#"quote=say "hi" \o/"#], vec!["j1"]),
            // All must match.
            (
                vec![
                    "--header",
                    "x-customer-id=c-17",
                    "--field",
                    "customer.id=c-17",
                    "--grep",
                    "amount",
                ],
                vec!["j1"],
            ),
            (
                vec!["--header", "x-customer-id=c-17", "--header", "flag=true"],
                vec!["j1"],
            ),
        ];
        for (args, want) in &cases {
            assert_eq!(ids(&db, args), set(want), "{b:?} {args:?}");
        }
        // The same selection reaches aggregate, plan and export.
        let agg = db.dlq(&["aggregate", "--by", "reason", "--field", "customer.id=c-17"]);
        assert_eq!(agg.code, 0, "{}", agg.all());
        assert_eq!(agg.json()[0]["count"], 3, "{b:?}");
        let plan = db.dlq(&["plan", "--header", "x-customer-id=c-17"]);
        assert_eq!(plan.code, 0, "{}", plan.all());
        assert_eq!(plan.json()["count"], 2);
        assert_eq!(
            plan.json()["filters"]["headers"],
            json!([{"key": "x-customer-id", "value": "c-17"}])
        );
        let export = db.dlq(&["export", "--grep", "c-17"]);
        assert_eq!(export.code, 0, "{}", export.all());
        assert_eq!(export.lines().len(), 6, "{b:?}");
        // Bad filters are usage errors.
        for args in [
            vec!["list", "--grep", ""],
            vec!["list", "--error-contains", ""],
            vec!["list", "--header", "no-equals-sign"],
            vec!["list", "--header", "=x"],
            vec!["list", "--field", "customer..id=x"],
            vec!["list", "--field", "a\"b=x"],
        ] {
            let r = db.dlq(&args);
            assert_eq!(r.code, 2, "{b:?} {args:?}: {}", r.all());
            assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
        }
    }
}

#[test]
fn aggregate_by_error_class_on_both_stores() {
    for b in BACKENDS {
        let db = TestDb::migrated(b);
        let mut lines = Vec::new();
        for (i, e) in [
            Some("ValueError: bad amount"),
            Some("ValueError: could not convert"),
            Some("  KeyError :customer"),
            Some("timeout"),
            Some("Traceback (most recent call last):\n  File x"),
            Some(""),
            Some(": nothing before"),
            None,
        ]
        .iter()
        .enumerate()
        {
            let mut r = row(&format!("e{i}"), b"{}", json!({}));
            r["error"] = json!(e);
            lines.push(r.to_string());
        }
        let r = import_lines(&db, &lines);
        assert_eq!(r.code, 0, "{}", r.all());
        // A worker's INSERT gets its class too.
        db.sql(&[
            "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, error) \
             VALUES ('w1', 'x', 'poison_message', 1, '{}', 'ValueError:x')",
        ]);
        let r = db.dlq(&["aggregate", "--by", "error_class"]);
        assert_eq!(r.code, 0, "{}", r.all());
        let got: Vec<(Value, i64)> = r
            .json()
            .as_array()
            .unwrap()
            .iter()
            .map(|g| (g["error_class"].clone(), g["count"].as_i64().unwrap()))
            .collect();
        let count = |k: Value| got.iter().find(|(c, _)| *c == k).map(|(_, n)| *n);
        assert_eq!(count(json!("ValueError")), Some(3), "{b:?} {got:?}");
        assert_eq!(count(json!("KeyError")), Some(1), "{b:?} {got:?}");
        assert_eq!(count(json!("timeout")), Some(1));
        assert_eq!(count(json!("Traceback (most recent call last)")), Some(1));
        assert_eq!(count(Value::Null), Some(3), "{b:?}: empty, none, ': ...'");
        assert_eq!(got.len(), 5, "{b:?} {got:?}");
        let t = db.dlq(&["aggregate", "--by", "error_class,reason", "-o", "table"]);
        assert!(t.stdout.contains("ERROR_CLASS"), "{}", t.stdout);
        assert!(t.stdout.contains("(unknown)"), "{}", t.stdout);
    }
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

fn export(db: &TestDb) -> String {
    let r = db.dlq(&["export"]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert!(r.stderr.contains("exported"), "{}", r.stderr);
    r.stdout
}

#[test]
fn export_import_export_is_identical_from_postgres_to_sqlite_and_back() {
    let pg = TestDb::migrated(Backend::Postgres);
    seed_for_export(&pg);
    let e1 = export(&pg);
    let sq = TestDb::migrated(Backend::Sqlite);
    let r = sq.dlq_stdin(&["import", "-"], e1.as_bytes());
    assert_eq!(r.code, 0, "{}", r.all());
    let e2 = export(&sq);
    let pg2 = TestDb::migrated(Backend::Postgres);
    let r = pg2.dlq_stdin(&["import", "-"], e2.as_bytes());
    assert_eq!(r.code, 0, "{}", r.all());
    let e3 = export(&pg2);
    assert_eq!(e1.lines().count(), 33 + 9 + 1);
    for (a, b) in e1.lines().zip(e2.lines()) {
        assert_eq!(a, b, "PostgreSQL → SQLite");
    }
    assert_eq!(e1, e2);
    assert_eq!(e2, e3, "SQLite → PostgreSQL");

    // What the lines carry: raw columns, numbers as written, history, no token.
    let n1 = e1.lines().find(|l| l.contains("\"n1\"")).unwrap();
    assert!(
        n1.contains(r#""big":123456789012345678901234567890"#),
        "{n1}"
    );
    assert!(n1.contains(r#""d":1.10"#), "{n1}");
    assert!(n1.contains(r#""body_base64":"AAEC/w==""#), "{n1}");
    assert!(
        n1.contains(r#""dead_lettered_at":"2026-11-28T10:00:00.123Z""#),
        "{n1}"
    );
    assert!(n1.contains(r#""replay_claim_owner":"tester""#), "{n1}");
    assert!(
        !n1.contains("tester:"),
        "the claim token is never exported: {n1}"
    );
    let v: Value = serde_json::from_str(n1).unwrap();
    assert_eq!(v["history"][0]["action"], "claim");
    assert!(v["history"][0]["token_ref"].is_string());
    // Show agrees on every state and on the history, in every store.
    for id in ["n1", "j1", "j2", "j3", "b1", "raw"] {
        let (a, b, c) = (pg.show(id), sq.show(id), pg2.show(id));
        for k in ["state", "headers", "body_base64", "discard_note", "error"] {
            assert_eq!(a[k].to_string(), b[k].to_string(), "{id} {k}");
            assert_eq!(b[k].to_string(), c[k].to_string(), "{id} {k}");
        }
        // PostgreSQL keeps microseconds, SQLite and the export milliseconds.
        assert_eq!(b["history"], c["history"], "{id}");
        let actions = |s: &Value| {
            s["history"]
                .as_array()
                .unwrap()
                .iter()
                .map(|h| h["action"].clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(actions(&a), actions(&b), "{id}");
    }
    // A producer known only from the body stays only in the body.
    let bill = e1
        .lines()
        .find(|l| l.contains("evt-bill-0000") || l.contains("2e3f3208"))
        .unwrap();
    assert!(bill.contains(r#""producer":null"#), "{bill}");
    assert_eq!(
        pg2.show("2e3f3208-3f20-5e9c-9d48-a8ff92218f06")["producer"],
        "billing"
    );

    // Filters select what is exported; the rest stays.
    let r = pg.dlq(&["export", "--state", "discarded"]);
    assert_eq!(r.lines().len(), 1, "{}", r.all());
    // Import keeps its all-or-nothing rule and --skip-existing over an export.
    let r = sq.dlq_stdin(&["import", "-"], e1.as_bytes());
    assert_eq!(r.code, 2, "{}", r.all());
    let r = sq.dlq_stdin(&["import", "--skip-existing", "-"], e1.as_bytes());
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(r.json()["skipped_existing"], 43);
    assert_eq!(export(&sq), e2, "nothing changed");
}

#[test]
fn import_reads_show_output_and_refuses_what_it_cannot_keep() {
    for b in BACKENDS {
        let src = TestDb::migrated(b);
        seed_for_export(&src);
        let shown = src.dlq(&["show", "n1"]);
        assert!(
            shown.stdout.contains("123456789012345678901234567890")
                && shown.stdout.contains("1.10"),
            "show keeps numbers as written: {}",
            shown.stdout
        );
        let db = TestDb::migrated(b);
        // `show -o json` is pretty-printed over many lines, after a BOM.
        let mut input = b"\xEF\xBB\xBF".to_vec();
        input.extend_from_slice(shown.stdout.as_bytes());
        input.extend_from_slice(src.dlq(&["show", "j1"]).stdout.as_bytes());
        let r = db.dlq_stdin(&["import", "-"], &input);
        assert_eq!(r.code, 0, "{b:?}: {}", r.all());
        assert_eq!(r.json()["imported"], 2);
        assert_eq!(db.show("n1")["history"], src.show("n1")["history"]);
        assert_eq!(db.show("j1")["history"], src.show("j1")["history"]);
        assert_eq!(
            db.show("n1")["headers"].to_string(),
            src.show("n1")["headers"].to_string()
        );

        let refuse = |input: &str, expect: &str| {
            let r = db.dlq_stdin(&["import", "-"], input.as_bytes());
            assert_eq!(r.code, 2, "{b:?} {input}: {}", r.all());
            assert!(r.stderr.contains(expect), "{b:?}: {}", r.stderr);
            assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
        };
        let ok = r#"{"id":"g1","reason":"r","body_text":"x"}"#;
        // A NUL in a text field: the same per-line error on both stores.
        refuse(
            &format!(
                "{ok}\n{}\n",
                r#"{"id":"g2","reason":"r","body_text":"x","error":"a\u0000b"}"#
            ),
            "line 2: field error: holds a NUL",
        );
        refuse(
            &format!(
                "{ok}\n{}\n",
                r#"{"id":"g2","reason":"r\u0000","body_text":"x"}"#
            ),
            "line 2: field reason",
        );
        refuse(
            r#"{"id":"g3","reason":"r","body_text":"x","history":[{"at":"2026-01-01T00:00:00Z","operator":"a\u0000","action":"n","outcome":"o"}]}"#,
            "field history[0].operator",
        );
        refuse(
            r#"{"id":"g3","reason":"r","body_text":"x","body_base64":"eQ=="}"#,
            "line 1: field body_text: differs from body_base64",
        );
        refuse(
            &format!("{ok}\n{{\"id\": \"g4\",\n"),
            "line 2: not valid JSON",
        );
        assert_eq!(db.dlq(&["show", "g1"]).code, 4, "nothing imported");
        // A directory is named.
        let dir = tempfile::tempdir().unwrap();
        let r = db.dlq(&["import", dir.path().to_str().unwrap()]);
        assert_eq!(r.code, 2, "{}", r.all());
        assert!(
            r.stderr.contains(dir.path().to_str().unwrap()) && r.stderr.contains("directory"),
            "{}",
            r.stderr
        );
    }
}

fn write_plan(db: &TestDb, args: &[&str]) -> (tempfile::NamedTempFile, Run) {
    let mut a = vec!["plan"];
    a.extend_from_slice(args);
    let r = db.dlq(&a);
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), &r.stdout).unwrap();
    (f, r)
}

#[test]
fn plans_are_bound_to_their_database_sealed_and_say_when_cut() {
    let a = TestDb::migrated(Backend::Sqlite);
    let b = TestDb::migrated(Backend::Sqlite);
    let pg = TestDb::migrated(Backend::Postgres);
    for db in [&a, &b, &pg] {
        db.import_examples();
    }
    let (file, r) = write_plan(&a, &["--reason", "retries_exhausted", "--limit", "4"]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert!(
        r.stderr.contains(": 4 of 9 dead letters (raise --limit)"),
        "{}",
        r.stderr
    );
    let plan = r.json();
    assert_eq!(plan["matched"], 9);
    assert_eq!(plan["count"], 4);
    assert!(plan["database_id"].is_string());
    assert!(plan["digest"].is_string());
    let p = file.path().to_str().unwrap();
    // Another database, of either kind: refused before anything is claimed.
    for other in [&b, &pg] {
        for args in [
            vec!["replay", "--plan", p, "--yes"],
            vec![
                "resolve",
                "--plan",
                p,
                "--delivered",
                "--note",
                "x",
                "--yes",
            ],
            vec!["discard", "--plan", p, "--note", "x", "--yes"],
        ] {
            let r = other.dlq(&args);
            assert_eq!(r.code, 2, "{args:?}: {}", r.all());
            assert!(r.stderr.contains("another database"), "{}", r.stderr);
        }
        assert_eq!(
            other
                .dlq(&["list", "--state", "pending"])
                .json()
                .as_array()
                .unwrap()
                .len(),
            33
        );
    }
    // Edited plans: filters, an item, the count.
    let edit = |f: &dyn Fn(&mut Value)| {
        let mut v = plan.clone();
        f(&mut v);
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), v.to_string()).unwrap();
        let r = a.dlq(&[
            "discard",
            "--plan",
            file.path().to_str().unwrap(),
            "--note",
            "x",
            "--yes",
        ]);
        assert_eq!(r.code, 2, "{}", r.all());
        r.stderr
    };
    assert!(edit(&|v| v["filters"]["reason"] = json!("poison_message")).contains("edited"));
    assert!(edit(&|v| v["items"][0]["id"] = plan["items"][1]["id"].clone()).contains("twice"));
    let e = edit(&|v| {
        v["items"].as_array_mut().unwrap().pop();
    });
    assert!(e.contains("says 4 dead letters but lists 3"), "{e}");
    let e = edit(&|v| {
        v["items"].as_array_mut().unwrap().pop();
        v["count"] = json!(3);
    });
    assert!(e.contains("edited"), "{e}");
    assert!(edit(&|v| {
        v.as_object_mut().unwrap().remove("digest");
    })
    .contains("no digest"));
    // The plan itself still works where it was made.
    let r = a.dlq(&["discard", "--plan", p, "--note", "x", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.all());
    // --state is honoured or refused.
    let (_, r) = write_plan(&a, &["--state", "replayed"]);
    assert_eq!(r.code, 2, "{}", r.all());
}

/// Moves the settled times of rows `days` into the past.
fn age(db: &TestDb, ids: &[&str], days: i64) {
    let list = ids
        .iter()
        .map(|i| format!("'{i}'"))
        .collect::<Vec<_>>()
        .join(",");
    let shift = match db.backend {
        Backend::Postgres => format!("- interval '{days} days'"),
        Backend::Sqlite => format!("- {}", days * 86_400_000_000),
    };
    db.sql(&[&format!(
        "UPDATE dead_letters SET replayed_at = replayed_at {shift}, discarded_at = discarded_at {shift}, \
         dead_lettered_at = dead_lettered_at {shift} WHERE id IN ({list})"
    )]);
}

fn now_sql(db: &TestDb) -> &'static str {
    match db.backend {
        Backend::Postgres => "now()",
        Backend::Sqlite => {
            "(CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000)"
        }
    }
}

#[test]
fn prune_deletes_settled_rows_only_with_their_history() {
    for b in BACKENDS {
        let db = TestDb::migrated(b);
        let lines: Vec<String> = [
            "r-old", "r-new", "d-old", "d-new", "p-old", "c-old", "u-old", "d-other",
        ]
        .iter()
        .map(|id| {
            let mut r = row(id, b"{}", json!({}));
            if *id == "d-other" {
                r["reason"] = json!("poison_message");
            }
            r.to_string()
        })
        .collect();
        assert_eq!(import_lines(&db, &lines).code, 0);
        let now = now_sql(&db);
        db.sql(&[
            &format!("UPDATE dead_letters SET replayed_at = {now} WHERE id IN ('r-old', 'r-new')"),
            &format!(
                "UPDATE dead_letters SET replay_attempt_at = {now}, replay_claim_owner = 'x:y' WHERE id = 'u-old'"
            ),
        ]);
        for id in ["d-old", "d-new", "d-other"] {
            assert_eq!(db.dlq(&["discard", id, "--note", "old", "--yes"]).code, 0);
        }
        assert_eq!(db.dlq(&["claim", "c-old", "--lease", "1h"]).code, 0);
        assert_eq!(db.dlq(&["note", "r-old", "kept until pruned"]).code, 0);
        age(
            &db,
            &["r-old", "d-old", "p-old", "c-old", "u-old", "d-other"],
            40,
        );

        for state in [
            "pending",
            "claimed",
            "uncertain",
            "replayed,uncertain",
            "all",
        ] {
            let r = db.dlq(&["prune", "--older-than", "30d", "--state", state, "--yes"]);
            assert_eq!(r.code, 2, "{b:?} {state}: {}", r.all());
        }
        let r = db.dlq(&["prune", "--older-than", "30d", "--yes"]);
        assert_eq!(r.code, 2, "--state is required: {}", r.all());
        let r = db.dlq(&[
            "prune",
            "--older-than",
            "30d",
            "--state",
            "replayed,discarded",
            "--dry-run",
        ]);
        assert_eq!(r.code, 0, "{}", r.all());
        assert_eq!(r.json()["matched"], 3, "{b:?} {}", r.stdout);
        assert_eq!(r.json()["deleted"], 0);
        assert_eq!(
            db.scalar("SELECT count(*) FROM dead_letters"),
            8,
            "dry run deletes nothing"
        );
        let r = db.dlq(&[
            "prune",
            "--older-than",
            "30d",
            "--state",
            "replayed,discarded",
        ]);
        assert_eq!(r.code, 2, "no terminal, no --yes: {}", r.all());
        // Filters narrow it.
        let r = db.dlq(&[
            "prune",
            "--older-than",
            "30d",
            "--state",
            "discarded",
            "--reason",
            "poison_message",
            "--yes",
        ]);
        assert_eq!(r.code, 0, "{}", r.all());
        assert_eq!(r.json()["deleted"], 1);
        let r = db.dlq(&[
            "prune",
            "--older-than",
            "30d",
            "--state",
            "replayed,discarded",
            "--yes",
            "--batch-size",
            "2",
        ]);
        assert_eq!(r.code, 0, "{}", r.all());
        assert_eq!(r.json()["deleted"], 2, "{b:?} {}", r.stdout);
        let left = ids(&db, &[]);
        assert_eq!(
            left,
            set(&["r-new", "d-new", "p-old", "c-old", "u-old"]),
            "{b:?}"
        );
        assert_eq!(
            db.scalar("SELECT count(*) FROM dead_letter_history WHERE dead_letter_id IN ('r-old', 'd-old', 'd-other')"),
            0,
            "{b:?}: the history goes with the rows"
        );
        assert!(
            db.scalar("SELECT count(*) FROM dead_letter_history WHERE dead_letter_id = 'd-new'")
                > 0
        );
    }
}

#[test]
fn prune_lets_a_worker_insert_while_it_runs() {
    for b in BACKENDS {
        let db = TestDb::migrated(b);
        let n = 20_000;
        let settled = match b {
            Backend::Postgres => format!(
                "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, replayed_at) \
                 SELECT 'old-' || lpad(g::text, 6, '0'), '\\x7b7d'::bytea, 'retries_exhausted', 1, '{{}}', now() - interval '60 days' \
                 FROM generate_series(1, {n}) g"
            ),
            Backend::Sqlite => format!(
                "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < {n}) \
                 INSERT INTO dead_letters (id, body, reason, attempts, headers_json, replayed_at) \
                 SELECT 'old-' || printf('%06d', n), X'7b7d', 'retries_exhausted', 1, '{{}}', \
                 CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) - 5184000000 FROM g"
            ),
        };
        db.sql(&[&settled]);
        let child = db
            .cmd()
            .args([
                "prune",
                "--older-than",
                "30d",
                "--state",
                "replayed",
                "--yes",
                "--batch-size",
                "100",
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // A worker inserting new dead letters, one statement each, while prune runs; each
        // time, how many old rows are left. Inserts that go through while some, not all,
        // are deleted show that prune commits batch by batch, never holding the table.
        let (inserted, mid_run) = insert_while(&db, n, || child_running(&child));
        eprintln!("{b:?}: {inserted} inserts while prune ran, {mid_run} of them mid-deletion");
        let out = child.wait_with_output().unwrap();
        let r = Run::from(out);
        assert_eq!(r.code, 0, "{b:?}: {}", r.all());
        assert_eq!(r.json()["deleted"], n, "{b:?}");
        assert!(
            mid_run >= 3,
            "{b:?}: only {mid_run} inserts went through while prune was deleting"
        );
        let new_rows = db.scalar("SELECT count(*) FROM dead_letters WHERE id LIKE 'new-%'");
        assert_eq!(new_rows, inserted as i64, "{b:?}: every insert is kept");
        assert_eq!(
            db.scalar("SELECT count(*) FROM dead_letters WHERE id LIKE 'old-%'"),
            0
        );
    }
}

fn child_running(child: &std::process::Child) -> bool {
    std::path::Path::new(&format!("/proc/{}/stat", child.id())).exists()
        && std::fs::read_to_string(format!("/proc/{}/stat", child.id()))
            .map(|s| !s.contains(") Z "))
            .unwrap_or(false)
}

/// Inserts rows one by one on one connection while `running()` holds, and counts the old
/// rows left after each: (inserts, inserts made while 0 < left < `n`).
fn insert_while(db: &TestDb, n: i64, running: impl Fn() -> bool) -> (usize, usize) {
    macro_rules! run_loop {
        ($pool:expr, $blob:expr) => {{
            let pool = $pool;
            let (mut inserted, mut mid) = (0usize, 0usize);
            while running() && inserted < 1_000_000 {
                sqlx::query(&format!(
                    "INSERT INTO dead_letters (id, body, reason, attempts, headers_json) \
                     VALUES ('new-{inserted:07}', {}, 'retries_exhausted', 1, '{{}}')",
                    $blob
                ))
                .execute(&pool)
                .await
                .unwrap();
                inserted += 1;
                let left: i64 =
                    sqlx::query_scalar("SELECT count(*) FROM dead_letters WHERE id LIKE 'old-%'")
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                if left > 0 && left < n {
                    mid += 1;
                }
            }
            pool.close().await;
            (inserted, mid)
        }};
    }
    rt().block_on(async {
        match db.backend {
            Backend::Postgres => run_loop!(
                sqlx::PgPool::connect(&db.url).await.unwrap(),
                "'\\x7b7d'::bytea"
            ),
            Backend::Sqlite => {
                run_loop!(sqlx::SqlitePool::connect(&db.url).await.unwrap(), "X'7b7d'")
            }
        }
    })
}

#[test]
fn replayed_headers_keep_their_numbers() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_numbers");
    let db = TestDb::migrated(Backend::Postgres);
    let line = format!(
        r#"{{"id":"h1","reason":"retries_exhausted","attempts":1,"source_queue":"{q}","body_text":"{{}}","headers":{{"big":123456789012345678901234567890,"d":1.10,"i":42,"many":0.1000000000000000055511151231257827}}}}"#
    );
    assert_eq!(import_lines(&db, &[line]).code, 0);
    let shown = db.dlq(&["show", "h1"]).stdout;
    assert!(
        shown.contains("123456789012345678901234567890") && shown.contains("1.10"),
        "{shown}"
    );
    let dry = db.dlq(&["replay", "h1", "--dry-run"]);
    assert!(
        dry.stdout
            .contains(r#""big": 123456789012345678901234567890"#)
            && dry.stdout.contains(r#""d": 1.10"#),
        "{}",
        dry.stdout
    );
    let r = db.dlq(&["replay", "h1", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.all());
    let got = rabbit.drain(&q);
    assert_eq!(got.len(), 1);
    let h = &got[0].headers;
    // A number a double would round goes out as its exact text; the others as numbers.
    assert_eq!(h["big"], json!("123456789012345678901234567890"));
    assert_eq!(h["many"], json!("0.1000000000000000055511151231257827"));
    assert_eq!(h["d"].as_f64(), Some(1.1));
    assert_eq!(h["i"].as_i64(), Some(42));
}
