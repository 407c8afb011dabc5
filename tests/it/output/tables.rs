//! Tables on a terminal: IDs never wrap at 80 columns, a huge body is cut.

use crate::common::*;

/// At 80 columns an ID is never wrapped (it can be copied whole); other columns give
/// way, and what cannot fit is said on stderr.
#[test]
fn ids_never_wrap_at_80_columns() {
    let db = TestDb::migrated(Backend::Sqlite);
    let id = "0192f3a4-5b6c-7d8e-9f00-112233445566";
    db.add(serde_json::json!({
        "id": id, "body_text": "{}", "reason": "retries_exhausted",
        "producer": "inventory-service", "schema_version": "17",
        "error": "timeout: inventory did not answer within 30 s after 5 attempts",
    }));
    for columns in ["80", "100", "40"] {
        let r = db.dlq_env(&["list", "-o", "table"], &[("COLUMNS", columns)]);
        assert_eq!(r.code, 0, "{}", r.all());
        assert!(
            r.stdout.lines().any(|l| l.contains(id)),
            "COLUMNS={columns}: the ID is not on one line:\n{}",
            r.stdout
        );
        let width: usize = columns.parse().unwrap();
        if width >= 80 {
            for l in r.stdout.lines() {
                assert!(l.chars().count() <= width, "COLUMNS={columns}: {l:?}");
            }
        }
    }
    // Wide enough: every column, nothing said.
    let r = db.dlq_env(&["list", "-o", "table"], &[("COLUMNS", "250")]);
    assert!(r.stdout.contains("ERROR") && r.stdout.contains("SCHEMA"));
    assert!(!r.stderr.contains("not shown"), "{}", r.stderr);
    // Narrow: columns left out, and said.
    let r = db.dlq_env(&["list", "-o", "table"], &[("COLUMNS", "80")]);
    assert!(r.stderr.contains("not shown"), "{}", r.stderr);
}

#[test]
fn a_50_mib_body_is_cut_in_the_table_view() {
    let db = TestDb::migrated(Backend::Sqlite);
    db.sql(&["INSERT INTO dead_letters (id, body, reason, attempts, headers_json) VALUES ('big', randomblob(52428800), 'poison_message', 1, '{}')"]);
    let r = db.dlq(&["show", "big", "-o", "table"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout.len() < 1_000_000,
        "{} bytes printed",
        r.stdout.len()
    );
    assert!(
        r.stdout.contains("52363264 more bytes not shown"),
        "{}",
        &r.stdout[r.stdout.len() - 300..]
    );
    let r = db.dlq(&["list"]);
    assert_eq!(r.json()[0]["id"], "big");
}
