//! Content filters (`--field`, ...) match exactly on both stores.

use super::*;
use crate::common::*;
use serde_json::json;

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

/// A filter value no row has (a typo) says on stderr which values exist, the most common
/// first with counts; stdout and the exit code are what they were.
#[test]
fn a_filter_value_that_matches_nothing_names_the_values_that_exist() {
    for backend in BACKENDS {
        let db = TestDb::migrated(backend);
        let mut lines = String::new();
        for (i, reason) in ["poison_message", "poison_message", "retries_exhausted"]
            .iter()
            .enumerate()
        {
            let mut l = letter(&format!("h{i}"), "orders.dlq", b"{}");
            l["reason"] = (*reason).into();
            lines.push_str(&format!("{l}\n"));
        }
        assert_eq!(db.dlq_stdin(&["import", "-"], lines.as_bytes()).code, 0);
        let r = db.dlq(&["list", "--reason", "poison"]);
        assert_eq!(r.code, 0, "{backend:?}: {}", r.all());
        assert_eq!(r.json(), serde_json::json!([]), "{backend:?}");
        assert!(
            r.stderr
                .contains("poison_message (2), retries_exhausted (1)"),
            "{backend:?}: {}",
            r.stderr
        );
        assert!(r.stderr.contains("--reason \"poison\""), "{}", r.stderr);
        let r = db.dlq(&["list", "--count", "--producer", "inventroy"]);
        assert_eq!(r.code, 0);
        assert!(r.stderr.contains("inventory (3)"), "{}", r.stderr);
        let r = db.dlq(&["aggregate", "--by", "reason", "--source-queue", "orders"]);
        assert_eq!(r.code, 0);
        assert_eq!(r.json(), serde_json::json!([]));
        assert!(r.stderr.contains("orders.dlq (3)"), "{}", r.stderr);
        let r = db.dlq(&["plan", "--schema-version", "6"]);
        assert_eq!(r.code, 2, "{}", r.all());
        assert!(r.stdout.is_empty());
        assert!(r.stderr.contains("5 (3)"), "{}", r.stderr);
        // Values that exist but select nothing together: no hint.
        let r = db.dlq(&[
            "list",
            "--reason",
            "retries_exhausted",
            "--state",
            "discarded",
        ]);
        assert_eq!(r.code, 0);
        assert!(r.stderr.is_empty(), "{}", r.stderr);
    }
}
