//! Discard and restore: rows set aside with a note, never claimed, planned or replayed,
//! and brought back; what each says of the state it leaves a row in.

use crate::common::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[test]
fn discard_and_restore_across_plan_replay_and_aggregate() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_discard");
    for b in BACKENDS {
        let db = TestDb::migrated(b);
        let lines: Vec<String> = ["d1", "d2", "d3"]
            .iter()
            .map(|id| {
                letter(id, &q, format!("{{\"event_id\":\"evt-{id}\"}}").as_bytes()).to_string()
            })
            .collect();
        let r = db.dlq_stdin(&["import", "-"], lines.join("\n").as_bytes());
        assert_eq!(r.code, 0, "{}", r.all());

        // A note is required, a selection needs --yes without a terminal.
        assert_eq!(db.dlq(&["discard", "d1"]).code, 2);
        assert_eq!(db.dlq(&["discard", "d1", "--note", "  ", "--yes"]).code, 2);
        let r = db.dlq(&["discard", "d1", "--note", "JIRA-7"]);
        assert_eq!(r.code, 2, "{}", r.all());
        assert!(r.stderr.contains("--yes"), "{}", r.stderr);
        assert_eq!(state(&db, "d1"), "pending", "{b:?}: nothing changed");

        let r = db.dlq(&["discard", "d1", "--note", "JIRA-7: bad batch", "--yes"]);
        assert_eq!(r.code, 0, "{}", r.all());
        assert_eq!(r.json()["outcome"], "discarded");
        let s = db.show("d1");
        assert_eq!(s["state"], "discarded");
        assert!(s["discarded_at"].is_string());
        assert_eq!(s["discard_note"], "JIRA-7: bad batch");
        assert_eq!(s["body_base64"], b64(b"{\"event_id\":\"evt-d1\"}"), "kept");

        // Counted in its own column; never planned, claimed or replayed.
        let agg = db.dlq(&["aggregate", "--by", "reason"]).json();
        assert_eq!(agg[0]["discarded"], 1, "{b:?} {agg}");
        assert_eq!(agg[0]["pending"], 2);
        let plan = db.dlq(&["plan"]).json();
        assert_eq!(plan["count"], 2, "{b:?}");
        assert!(!plan["items"].to_string().contains("\"d1\""));
        let r = db.dlq(&["replay", "d1", "--yes"]);
        assert_eq!(r.code, 3, "{}", r.all());
        assert!(
            r.json()["detail"].as_str().unwrap().contains("discarded"),
            "{}",
            r.stdout
        );
        assert_eq!(db.dlq(&["claim", "d1"]).code, 3);
        assert_eq!(rabbit.count(&q), 0, "nothing published");
        // Only a pending row can be discarded.
        let r = db.dlq(&["discard", "d1", "--note", "again", "--yes"]);
        assert_eq!(r.code, 3, "{}", r.all());
        assert_eq!(r.json()["outcome"], "not_discarded");
        assert_eq!(db.dlq(&["discard", "nope", "--note", "x", "--yes"]).code, 4);

        // Restore: pending again, and then it replays.
        assert_eq!(db.dlq(&["restore", "d1", "--yes"]).code, 2, "note required");
        let r = db.dlq(&["restore", "d1", "--note", "consumer fixed", "--yes"]);
        assert_eq!(r.code, 0, "{}", r.all());
        assert_eq!(r.json()["outcome"], "restored");
        let s = db.show("d1");
        assert_eq!(s["state"], "pending");
        assert!(s["discard_note"].is_null());
        let r = db.dlq(&["replay", "d1", "--yes"]);
        assert_eq!(r.code, 0, "{}", r.all());
        assert_eq!(rabbit.drain(&q).len(), 1);
        let r = db.dlq(&["restore", "d1", "--note", "x", "--yes"]);
        assert_eq!(r.code, 3, "{}", r.all());
        assert_eq!(r.json()["outcome"], "not_restored");
        assert_eq!(db.dlq(&["discard", "d1", "--note", "x", "--yes"]).code, 3);

        // A note; the history says who did what, and why.
        let r = db.dlq(&["note", "d1", "see INC-42"]);
        assert_eq!(r.code, 0, "{}", r.all());
        assert_eq!(r.json()["outcome"], "noted");
        assert_eq!(db.dlq(&["note", "nope", "x"]).code, 4);
        assert_eq!(db.dlq(&["note", "d1", " "]).code, 2);
        let h: Vec<(String, String, String)> = db.show("d1")["history"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["action"].as_str().unwrap().to_string(),
                    e["outcome"].as_str().unwrap().to_string(),
                    e["detail"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect();
        let has =
            |a: &str, o: &str, d: &str| h.iter().any(|(x, y, z)| x == a && y == o && z.contains(d));
        assert!(has("discard", "discarded", "JIRA-7: bad batch"), "{h:?}");
        assert!(has("restore", "restored", "consumer fixed"), "{h:?}");
        assert!(has("replay", "replayed", ""), "{h:?}");
        assert!(has("restore", "not_restored", "already replayed"), "{h:?}");
        assert!(has("note", "noted", "see INC-42"), "{h:?}");
        assert!(db.show("d1")["history"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["operator"] == "tester" && e["at"].is_string()));

        // By filters (pending only) and by plan.
        let r = db.dlq(&["discard", "--note", "x", "--yes"]);
        assert_eq!(r.code, 2, "no filter is not a selection: {}", r.all());
        let r = db.dlq(&[
            "discard",
            "--state",
            "replayed",
            "--reason",
            "retries_exhausted",
            "--note",
            "x",
            "--yes",
        ]);
        assert_eq!(r.code, 2, "{}", r.all());
        let r = db.dlq(&["discard", "--event-id", "evt-d2", "--note", "one", "--yes"]);
        assert_eq!(r.code, 0, "{}", r.all());
        assert_eq!(r.lines().len(), 1);
        assert_eq!(state(&db, "d2"), "discarded");
        let plan_file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(plan_file.path(), db.dlq(&["plan"]).stdout).unwrap();
        let p = plan_file.path().to_str().unwrap();
        let r = db.dlq(&["discard", "--plan", p, "--note", "by plan", "--yes"]);
        assert_eq!(r.code, 0, "{}", r.all());
        assert_eq!(state(&db, "d3"), "discarded");
        assert!(db.show("d3")["history"][0]["plan_id"].is_string());
        let r = db.dlq(&[
            "restore",
            "--reason",
            "retries_exhausted",
            "--note",
            "all back",
            "--yes",
        ]);
        assert_eq!(r.code, 0, "{}", r.all());
        assert_eq!(r.lines().len(), 2);
        assert_eq!(state(&db, "d2"), "pending");
        assert_eq!(state(&db, "d3"), "pending");
    }
}

/// A row discarded with a publish attempt open (imported so) is `uncertain` once
/// restored: `restore` says so, alone and in a selection (it said "pending again").
#[test]
fn restore_says_uncertain_for_a_row_with_an_open_attempt() {
    for b in BACKENDS {
        let db = TestDb::migrated(b);
        for (id, attempted) in [("u1", true), ("u2", true), ("p1", false)] {
            let mut row = letter(id, "dlq_restore_q", b"{}");
            row["discarded_at"] = "2026-11-30T10:00:00Z".into();
            row["discard_note"] = "set aside".into();
            if attempted {
                row["replay_attempt_at"] = "2026-11-30T09:00:00Z".into();
            }
            db.add(row);
        }
        let r = db.dlq(&["restore", "u1", "--note", "INC-9", "--yes"]);
        assert_eq!(r.code, 0, "{b:?}: {}", r.all());
        let j = r.json();
        assert_eq!(j["outcome"], "restored");
        let detail = j["detail"].as_str().unwrap();
        assert!(
            detail.contains("uncertain") && !detail.contains("pending again"),
            "{b:?}: {detail}"
        );
        assert!(detail.contains("dlq resolve u1"), "{detail}");
        assert_eq!(state(&db, "u1"), "uncertain", "{b:?}");
        let h = db.show("u1")["history"].clone();
        let last = h.as_array().unwrap().last().unwrap().clone();
        assert_eq!(last["action"], "restore");
        assert!(
            last["detail"].as_str().unwrap().contains("uncertain"),
            "{last}"
        );

        let r = db.dlq(&[
            "restore",
            "--reason",
            "retries_exhausted",
            "--note",
            "all back",
            "--yes",
        ]);
        assert_eq!(r.code, 0, "{b:?}: {}", r.all());
        let by_id: std::collections::HashMap<String, String> = r
            .lines()
            .iter()
            .map(|l| {
                (
                    l["id"].as_str().unwrap().into(),
                    l["detail"].as_str().unwrap().into(),
                )
            })
            .collect();
        assert!(
            by_id["u2"].starts_with("uncertain, not pending"),
            "{by_id:?}"
        );
        assert!(by_id["p1"].starts_with("pending again"), "{by_id:?}");
        assert!(r.stderr.contains("1 of these"), "{}", r.stderr);
        assert_eq!(state(&db, "u2"), "uncertain");
        assert_eq!(state(&db, "p1"), "pending");
    }
}

/// A restore that loses its database after its commit, while it reads why a row was left
/// discarded, still reports every row it restored, and exits with the refusal's code.
// Once broke: it exited 1 with the read's error; the restored row went unreported.
#[test]
fn a_restore_reports_what_it_restored_when_the_database_goes_after_its_commit() {
    let q = unique("dlq_restore_cut");
    let db = TestDb::migrated(Backend::Postgres);
    db.add(letter("plain", &q, b"{}"));
    db.add(letter("orig", &q, br#"{"n":1}"#));
    let r = db.dlq(&["discard", "plain", "--note", "JIRA-9", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.all());
    let r = db.dlq(&["edit", "orig", "--set", "n=2", "--note", "fix", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.all());
    // The read of why a row was left discarded comes after the restore's commit.
    let done = Arc::new(AtomicBool::new(false));
    let why = b"SELECT id, other, event FROM pairs\0".to_vec();
    let pg = Proxy::start(
        "127.0.0.1:5432",
        OnServerBytes::CutOnClientBytes(why, done.clone()),
    );
    let r = Run::from(
        db.cmd()
            .env("DLQ_DATABASE_URL", pg.db_url(&db))
            .args(["restore", "--state", "discarded", "--source-queue", &q])
            .args(["--note", "back", "--yes", "-o", "json"])
            .output()
            .unwrap(),
    );
    assert!(done.load(Ordering::SeqCst), "the read was cut: {}", r.all());
    assert_eq!(db.show("plain")["state"], "pending", "{}", r.all());
    let lines: Vec<serde_json::Value> = r
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let outcome = |id: &str| {
        lines
            .iter()
            .find(|l| l["id"] == id)
            .map(|l| l["outcome"].clone())
    };
    assert_eq!(outcome("plain"), Some("restored".into()), "{}", r.all());
    assert_eq!(outcome("orig"), Some("not_restored".into()), "{}", r.all());
    assert_eq!(r.code, 3, "{}", r.all());
}
