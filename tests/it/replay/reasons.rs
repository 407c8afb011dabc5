//! Why an item ended as it did: the library reports a typed reason and next step and
//! spells no command; the CLI spells the commands, in its reports and in the history
//! the protocol writes for it.

use super::lost_reply::{replay_through, Fault};
use crate::common::*;
use dlq::replay::{NextStep, Reason};

fn last_detail(db: &TestDb, id: &str) -> String {
    let s = db.show(id);
    let h = s["history"].as_array().unwrap();
    h.last().unwrap()["detail"].as_str().unwrap().to_string()
}

/// A row with nowhere to go, replayed by the library as any caller would: the report
/// says why as a type, and the history written says it in words, with no CLI flag.
#[test]
fn the_library_reports_a_typed_reason_and_writes_no_command() {
    let db = TestDb::migrated(Backend::Sqlite);
    let mut l = letter("t1", "elsewhere", b"{}");
    l["source_queue"] = serde_json::Value::Null;
    db.add(l);
    let report = replay_through(&db, "t1", Fault::Nothing);
    assert_eq!(report.outcome, dlq::Outcome::NotReplayed);
    assert_eq!(report.reason, Reason::NoTarget);
    assert_eq!(report.reason.next("t1"), Some(NextStep::GiveTarget));
    assert_eq!(state(&db, "t1"), "pending", "released");
    let detail = last_detail(&db, "t1");
    assert!(detail.starts_with("no target"), "{detail}");
    assert!(
        !detail.contains("--") && !detail.contains("dlq "),
        "the library spelled a command: {detail}"
    );
}

/// A replay refused because a publish may be out: the CLI's report and the history
/// entry it had the protocol write say the same words, the command to type included.
#[test]
fn the_cli_spells_the_next_step_in_its_report_and_the_history() {
    for b in BACKENDS {
        let db = TestDb::migrated(b);
        let mut row = letter("u1", "reasons_q", b"{}");
        row["replay_claim_owner"] = "alice:v1".into();
        row["replay_claim_expires_at"] = "2020-01-01T00:05:00Z".into();
        row["replay_attempt_at"] = "2020-01-01T00:00:00Z".into();
        row["last_replay_error"] = "no publisher confirm within 10s".into();
        db.add(row);
        let r = db.dlq(&["replay", "u1", "--yes"]);
        assert_eq!(r.code, 6, "{b:?}: {}", r.all());
        let detail = r.json()["detail"].as_str().unwrap().to_string();
        assert!(
            detail.ends_with("check the consumers, then `dlq resolve`; nothing was published"),
            "{b:?}: {detail}"
        );
        assert_eq!(last_detail(&db, "u1"), detail, "{b:?}");
    }
}
