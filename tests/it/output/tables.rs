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
    // Narrow: what cannot fit is said (here the kept columns alone are too wide for 80,
    // so each record is shown one field a line).
    let r = db.dlq_env(&["list", "-o", "table"], &[("COLUMNS", "80")]);
    assert!(r.stderr.contains("narrow terminal"), "{}", r.stderr);
}

/// Two dead letters whose error is long free text.
fn two_producers() -> TestDb {
    let db = TestDb::migrated(Backend::Sqlite);
    for (id, reason, producer) in [
        ("k-1", "poison_message", "billing"),
        ("k-2", "retries_exhausted", "orders"),
    ] {
        db.add(serde_json::json!({
            "id": id, "body_text": "{}", "reason": reason, "producer": producer,
            "schema_version": "17", "attempts": 3,
            "error": "timeout: inventory did not answer within 30 s after 5 attempts",
        }));
    }
    db
}

/// The header line of a table (the first line with a `┆` between titles).
fn header(stdout: &str) -> String {
    stdout
        .lines()
        .find(|l| l.contains('┆'))
        .unwrap_or_default()
        .to_string()
}

/// Once broke: at 120 columns `aggregate --by reason,producer` printed "REASON, PRODUCER
/// not shown" and rows of bare numbers (issue 25, item 1).
#[test]
fn aggregate_keeps_its_by_keys_at_80_and_120_columns() {
    let db = two_producers();
    for (columns, by) in [
        ("80", "reason,producer"),
        ("120", "reason,producer"),
        ("80", "reason,producer,schema_version"),
    ] {
        let r = db.dlq_env(
            &["aggregate", "--by", by, "-o", "table"],
            &[("COLUMNS", columns)],
        );
        assert_eq!(r.code, 0, "{}", r.all());
        let h = header(&r.stdout);
        for key in by.split(',') {
            assert!(
                h.contains(&key.to_uppercase()),
                "COLUMNS={columns} --by {by}: {key} missing:\n{}",
                r.all()
            );
        }
        assert!(h.contains("COUNT"), "COUNT goes last: {}", r.all());
        assert!(
            r.stdout.contains("poison_message") && r.stdout.contains("orders"),
            "{}",
            r.stdout
        );
        let width: usize = columns.parse().unwrap();
        assert!(
            r.stdout.lines().all(|l| l.chars().count() <= width),
            "{}",
            r.stdout
        );
    }
}

/// Once broke: `list` at 80 columns kept only ID, REASON and STATE, and at 120 wrapped
/// ERROR mid-word over many lines (issue 25, item 1).
#[test]
fn list_keeps_who_and_when_and_cuts_the_error() {
    let db = two_producers();
    for columns in ["80", "120"] {
        let r = db.dlq_env(&["list", "-o", "table"], &[("COLUMNS", columns)]);
        assert_eq!(r.code, 0, "{}", r.all());
        let h = header(&r.stdout);
        for key in [
            "ID",
            "DEAD-LETTERED",
            "REASON",
            "PRODUCER",
            "STATE",
            "ERROR",
        ] {
            assert!(
                h.contains(key),
                "COLUMNS={columns}: {key} missing:\n{}",
                r.all()
            );
        }
        // One line per record: the error is cut with an ellipsis, never wrapped.
        let rows: Vec<&str> = r.stdout.lines().filter(|l| l.contains("k-")).collect();
        assert_eq!(rows.len(), 2, "{}", r.stdout);
        assert!(rows.iter().all(|l| l.contains('…')), "{}", r.stdout);
        assert!(!r.stdout.contains("5 attempts"), "{}", r.stdout);
        let width: usize = columns.parse().unwrap();
        assert!(
            r.stdout.lines().all(|l| l.chars().count() <= width),
            "{}",
            r.stdout
        );
    }
    // A column filtered for is kept too.
    let r = db.dlq_env(
        &["list", "-o", "table", "--schema-version", "17"],
        &[("COLUMNS", "80")],
    );
    assert!(header(&r.stdout).contains("SCHEMA"), "{}", r.all());
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

/// `-o wide` at 80 columns: every column of `list` and `aggregate`, whole (nothing cut
/// with `…`), and no "narrow terminal" line.
#[test]
fn wide_shows_every_column_uncut_at_80_columns() {
    let db = two_producers();
    let long = format!("timeout: {}", "inventory did not answer ".repeat(10));
    db.sql(&[&format!(
        "UPDATE dead_letters SET error = '{long}' WHERE id = 'k-1'"
    )]);
    for env in [
        &[("COLUMNS", "80")][..],
        &[("COLUMNS", "80"), ("DLQ_OUTPUT", "wide")][..],
    ] {
        let args: &[&str] = match env.len() {
            1 => &["list", "-o", "wide"],
            _ => &["list"],
        };
        let r = db.dlq_env(args, env);
        assert_eq!(r.code, 0, "{}", r.all());
        let h = header(&r.stdout);
        for key in [
            "ID",
            "DEAD-LETTERED",
            "REASON",
            "PRODUCER",
            "SCHEMA",
            "ATTEMPTS",
            "STATE",
            "ERROR",
        ] {
            assert!(h.contains(key), "{key} missing:\n{}", r.all());
        }
        assert!(r.stdout.contains(long.trim_end()), "{}", r.stdout);
        assert!(!r.stdout.contains('…'), "{}", r.stdout);
        assert!(!r.stderr.contains("narrow terminal"), "{}", r.stderr);
    }
    let r = db.dlq_env(
        &[
            "aggregate",
            "--by",
            "reason,producer,schema_version",
            "-o",
            "wide",
        ],
        &[("COLUMNS", "80")],
    );
    assert_eq!(r.code, 0, "{}", r.all());
    let h = header(&r.stdout);
    for key in ["REASON", "PRODUCER", "SCHEMA_VERSION", "COUNT"] {
        assert!(h.contains(key), "{key} missing:\n{}", r.all());
    }
    assert!(!r.stdout.contains('…'), "{}", r.stdout);
    assert!(!r.stderr.contains("narrow terminal"), "{}", r.stderr);
}
