//! `edit --plan`: each item edited, a drifted item or one the program fails on refused,
//! a plan of the revisions that `replay --plan` runs, and the exit code of the worst.

use crate::common::*;

#[test]
fn edit_over_a_plan_with_a_drifted_item() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_rev_plan");
    for b in BACKENDS {
        let db = TestDb::migrated(b);
        for (id, body) in [
            ("p1", r#"{"amount": "1,50"}"#),
            ("p2", r#"{"amount": "2,50"}"#),
            ("p3", r#"{"other": 1}"#),
        ] {
            db.add(letter(id, &q, body.as_bytes()));
        }
        let plan = db.plan_file(&[]);
        let drift = match b {
            Backend::Postgres => "UPDATE dead_letters SET body = '\\x7b7d'::bytea WHERE id = 'p2'",
            Backend::Sqlite => "UPDATE dead_letters SET body = X'7B7D' WHERE id = 'p2'",
        };
        db.sql(&[drift]);
        let out = tempfile::NamedTempFile::new().unwrap();
        let p = plan.path().to_str().unwrap();
        let o = out.path().to_str().unwrap();
        let args = [
            "edit",
            "--plan",
            p,
            "--jq",
            r#".amount |= sub(",";".")"#,
            "--note",
            "n",
        ];
        let r = db.dlq(&args);
        assert_eq!(r.code, 2, "no terminal, no --yes: {}", r.all());
        let mut with_yes = args.to_vec();
        with_yes.extend(["--yes", "--plan-out", o]);
        let r = db.dlq(&with_yes);
        assert_eq!(
            r.code,
            3,
            "{b:?}: the worst item is not_edited: {}",
            r.all()
        );
        let lines = r.lines();
        assert_eq!(lines.len(), 4, "{}", r.stdout);
        let by: std::collections::HashMap<&str, &serde_json::Value> = lines[..3]
            .iter()
            .map(|l| (l["id"].as_str().unwrap(), l))
            .collect();
        assert_eq!(by["p1"]["outcome"], "edited");
        assert_eq!(by["p2"]["outcome"], "not_edited");
        assert!(
            by["p2"]["detail"]
                .as_str()
                .unwrap()
                .contains("changed since the plan"),
            "{}",
            by["p2"]
        );
        assert_eq!(by["p3"]["outcome"], "not_edited");
        assert!(
            by["p3"]["detail"]
                .as_str()
                .unwrap()
                .contains("jq program failed"),
            "{}",
            by["p3"]
        );
        let s = &lines[3]["summary"];
        assert_eq!(
            s["outcomes"],
            serde_json::json!({"edited": 1, "not_edited": 2}),
            "{s}"
        );
        assert_eq!(s["worst"], "not_edited");
        for id in ["p2", "p3"] {
            assert_eq!(
                db.show(id)["state"],
                "pending",
                "{b:?} {id}: left as it was"
            );
        }
        let rid = by["p1"]["revision_id"].as_str().unwrap().to_string();
        let new_plan: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(o).unwrap()).unwrap();
        assert_eq!(new_plan["items"][0]["id"], rid.as_str());
        assert_eq!(new_plan["count"], 1);
        // The new plan is one `replay --plan` runs: the revision goes out, once.
        let r = db.dlq(&["replay", "--plan", o, "--yes"]);
        assert_eq!(r.code, 0, "{b:?}: {}", r.all());
        let got = rabbit.drain(&q);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].body, br#"{"amount": "1.50"}"#);
        assert_eq!(
            got[0].message_id.as_deref(),
            Some("evt-p1"),
            "the same business event"
        );
    }
}
