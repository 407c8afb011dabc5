//! `dlq aggregate`: groups, counts, time buckets and bars, error classes, on both stores.

use super::*;
use crate::common::*;
use serde_json::{json, Value};

#[test]
fn aggregate_groups_counts_and_buckets() {
    for b in BACKENDS {
        let db = TestDb::migrated(b);
        db.import_examples();
        let a = db
            .dlq(&["aggregate", "--by", "reason,producer,schema_version"])
            .json();
        let groups = a.as_array().unwrap();
        assert_eq!(groups[0]["reason"], "poison_message");
        assert_eq!(groups[0]["producer"], "billing");
        assert_eq!(groups[0]["schema_version"], "3");
        assert_eq!(groups[0]["count"], 12);
        assert_eq!(groups[0]["pending"], 12);
        assert_eq!(groups[0]["first_seen"], "2026-11-28T22:10:00Z");
        assert_eq!(groups[0]["last_seen"], "2026-11-28T22:21:00Z");
        let counts: Vec<i64> = groups
            .iter()
            .map(|g| g["count"].as_i64().unwrap())
            .collect();
        assert!(
            counts.windows(2).all(|w| w[0] >= w[1]),
            "largest first: {counts:?}"
        );
        assert_eq!(counts.iter().sum::<i64>(), 33);
        for g in groups {
            for k in [
                "count",
                "pending",
                "claimed",
                "replayed",
                "first_seen",
                "last_seen",
            ] {
                assert!(g.get(k).is_some(), "{k}");
            }
        }
        let h = db
            .dlq(&["aggregate", "--by", "hour", "--reason", "retries_exhausted"])
            .json();
        assert_eq!(h[0]["hour"], "2026-11-28T23:00:00Z", "{b:?}: {h}");
        assert_eq!(h[0]["count"], 9);
        let d = db.dlq(&["aggregate", "--by", "day,source_queue"]).json();
        assert!(
            d.as_array()
                .unwrap()
                .iter()
                .any(|g| g["day"] == "2026-11-28T00:00:00Z"
                    && g["source_queue"] == "inventory.adjust"
                    && g["count"] == 9),
            "{d}"
        );
    }
}

#[test]
fn aggregate_by_hour_draws_bars_in_time_order() {
    let db = TestDb::migrated(Backend::Sqlite);
    db.import_examples();
    let r = db.dlq(&["aggregate", "--by", "hour", "-o", "table"]);
    let rows: Vec<&str> = r
        .stdout
        .lines()
        .filter(|l| l.contains("2026-11-2"))
        .collect();
    assert_eq!(rows.len(), 5, "{}", r.stdout);
    assert!(
        rows[0].contains("2026-11-27T10:00:00Z"),
        "oldest first: {}",
        rows[0]
    );
    let widest = rows.iter().max_by_key(|l| l.matches('█').count()).unwrap();
    assert!(
        widest.contains("2026-11-28T22:00:00Z") && widest.matches('█').count() == 30,
        "{widest}"
    );
    assert!(!r.stdout.contains('\u{1b}'));
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
