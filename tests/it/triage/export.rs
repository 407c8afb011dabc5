//! `dlq export` and `import` round trips, byte for byte, between PostgreSQL and SQLite.

use super::*;
use crate::common::*;
use serde_json::Value;

#[test]
fn export_and_import_round_trip_byte_for_byte() {
    for b in BACKENDS {
        let a = TestDb::migrated(b);
        a.import_examples();
        let ids: Vec<String> = a.ids(&["--limit", "100"]);
        let mut export = String::new();
        for id in &ids {
            let s = a.dlq(&["show", id]);
            let v: serde_json::Value = s.json();
            export.push_str(&serde_json::to_string(&v).unwrap());
            export.push('\n');
        }
        let other = TestDb::migrated(if b == Backend::Postgres {
            Backend::Sqlite
        } else {
            Backend::Postgres
        });
        let r = other.dlq_stdin(&["import", "-"], export.as_bytes());
        assert_eq!(r.code, 0, "{}", r.stderr);
        assert_eq!(r.json()["imported"], 33);
        for id in &ids {
            let x = a.show(id);
            let y = other.show(id);
            for k in [
                "body_base64",
                "sha256",
                "headers",
                "reason",
                "attempts",
                "producer",
                "schema_version",
                "event_id",
                "dead_lettered_at",
                "source_queue",
                "error",
            ] {
                assert_eq!(x[k], y[k], "{k} of {id}");
            }
        }
    }
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

/// SQLite's export steps its statement on a thread of its own and hands rows over in
/// batches (of 256 rows, or sooner at 1 MiB of bodies); PostgreSQL streams through sqlx.
/// Every row comes once, in order, across the batch edges, with the filter's values
/// bound as for every other read.
#[test]
fn export_writes_every_row_once_in_order_across_batch_edges() {
    for b in BACKENDS {
        let db = TestDb::migrated(b);
        let insert = match b {
            Backend::Postgres => {
                "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, dead_lettered_at) \
                 SELECT 'e-' || lpad(g::text, 4, '0'), \
                        CASE WHEN g % 200 = 0 THEN decode(repeat('00', 700000), 'hex') ELSE 'small'::bytea END, \
                        CASE WHEN g % 2 = 0 THEN 'a' ELSE 'b' END, 1, '{}', \
                        timestamptz '2026-01-01T00:00:00Z' + g * interval '1 second' \
                 FROM generate_series(1, 600) g"
            }
            Backend::Sqlite => {
                "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 600) \
                 INSERT INTO dead_letters (id, body, reason, attempts, headers_json, dead_lettered_at) \
                 SELECT printf('e-%04d', n), \
                        CASE WHEN n % 200 = 0 THEN zeroblob(700000) ELSE CAST('small' AS BLOB) END, \
                        CASE WHEN n % 2 = 0 THEN 'a' ELSE 'b' END, 1, '{}', \
                        1767225600000000 + n * 1000000 \
                 FROM g"
            }
        };
        db.sql(&[insert]);
        let lines: Vec<Value> = db.dlq(&["export"]).lines();
        let ids: Vec<String> = lines
            .iter()
            .map(|l| l["id"].as_str().unwrap().into())
            .collect();
        let expected: Vec<String> = (1..=600).map(|n| format!("e-{n:04}")).collect();
        assert_eq!(ids, expected, "{b:?}");
        let big = lines.iter().find(|l| l["id"] == "e-0400").unwrap();
        assert_eq!(unb64(&big["body_base64"]), vec![0u8; 700_000], "{b:?}");

        let r = db.dlq(&["export", "--reason", "a"]);
        assert_eq!(r.code, 0, "{}", r.all());
        assert!(
            r.stderr.contains("exported 300 dead letters"),
            "{}",
            r.stderr
        );
        let ids: Vec<String> = r
            .lines()
            .iter()
            .map(|l| l["id"].as_str().unwrap().into())
            .collect();
        let expected: Vec<String> = (1..=300).map(|n| format!("e-{:04}", 2 * n)).collect();
        assert_eq!(ids, expected, "{b:?}");
    }
}

/// A row SQLite cannot read mid-export: the rows before it are written, then exit 1.
/// The bulk reader once dropped the rows of the batch it was gathering (up to 255).
#[test]
fn an_export_that_fails_on_a_row_writes_every_row_before_it() {
    let db = TestDb::migrated(Backend::Sqlite);
    db.sql(&[
        "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 300) \
         INSERT INTO dead_letters (id, body, reason, attempts, headers_json, dead_lettered_at) \
         SELECT printf('e-%04d', n), CAST('small' AS BLOB), 'a', 1, '{}', \
                1767225600000000 + n * 1000000 FROM g",
        // abs() of the smallest integer raises "integer overflow" when the row is read.
        "UPDATE dead_letters SET replayed_at = -9223372036854775808 WHERE id = 'e-0300'",
    ]);
    let r = db.dlq(&["export"]);
    assert_eq!(r.code, 1, "{}", r.all());
    // 298: SQLite orders ties on time by id in a small sorter, so it computes the failing
    // row before it hands out the one just before it (as it did through sqlx).
    assert_eq!(r.stdout.lines().count(), 298, "{}", r.stderr);
}

/// A body a worker stored as a number is refused, as every other read refuses it (the
/// bulk reader once exported it as its decimal text, so an import stored other bytes).
#[test]
fn an_export_refuses_a_body_stored_as_a_number() {
    let db = TestDb::migrated(Backend::Sqlite);
    db.sql(&[
        "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, dead_lettered_at) \
         VALUES ('r-1', 123, 'a', 1, '{}', 1767225600000000)",
    ]);
    let r = db.dlq(&["export"]);
    assert_eq!(r.code, 1, "{}", r.all());
    assert!(r.stdout.is_empty(), "{}", r.stdout);
}
