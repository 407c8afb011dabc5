//! Hand-taken tokens (`dlq claim`, `replay --token`): one token, at most one publish;
//! leases and rates within bounds.

use super::lost_reply::{replay_through, Fault};
use super::*;
use crate::common::*;
use std::process::Stdio;

#[test]
fn one_hand_taken_token_publishes_at_most_once() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_v2_token");
    let db = TestDb::migrated(Backend::Postgres);
    db.add(letter("t1", &q, AMOUNT_BODY));
    let token = db.dlq(&["claim", "t1", "--token-only", "-o", "table"]);
    assert_eq!(token.code, 0, "{}", token.all());
    let token = token.stdout.trim().to_string();
    let children: Vec<_> = (0..8)
        .map(|_| {
            db.cmd()
                .args(["replay", "t1", "--token", &token, "--yes"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let runs: Vec<Run> = children
        .into_iter()
        .map(|c| Run::from(c.wait_with_output().unwrap()))
        .collect();
    assert_eq!(rabbit.drain(&q).len(), 1, "one token, one publish");
    assert_eq!(runs.iter().filter(|r| r.code == 0).count(), 1);
    // A loser that looks while the winner's attempt is open is told uncertain (6).
    for r in runs.iter().filter(|r| r.code != 0) {
        assert!(r.code == 3 || r.code == 6, "{}", r.all());
    }
    // The used token can do nothing more, not even release.
    let r = db.dlq(&["replay", "t1", "--token", &token, "--yes"]);
    assert_eq!(r.code, 3, "{}", r.all());
    let r = db.dlq(&["release", "t1", "--token", &token]);
    assert_eq!(r.code, 3, "{}", r.all());
    assert_eq!(rabbit.drain(&q).len(), 0);
}

#[test]
fn a_token_whose_replay_was_uncertain_cannot_publish_again() {
    let mut rabbit = Rabbit::new();
    let (x, ok) = fanout_with_a_full_queue(&mut rabbit);
    let db = TestDb::migrated(Backend::Sqlite);
    let mut row = letter("t2", &ok, AMOUNT_BODY);
    row["exchange"] = x.clone().into();
    db.add(row);
    let token = db.dlq(&["claim", "t2", "--token-only", "-o", "table"]);
    let token = token.stdout.trim().to_string();
    let r = db.dlq(&["replay", "t2", "--token", &token, "--yes"]);
    assert_eq!(r.code, 6, "{}", r.all());
    let r = db.dlq(&["replay", "t2", "--token", &token, "--yes"]);
    assert_eq!(r.code, 6, "{}", r.all());
    assert_eq!(r.json()["outcome"], "uncertain");
    assert_eq!(rabbit.drain(&ok).len(), 1, "published once");
}

#[test]
fn leases_and_rates_have_bounds() {
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("l1", "q", AMOUNT_BODY));
    for lease in ["100000y", "300000y", "25h"] {
        let r = db.dlq(&["claim", "l1", "--lease", lease]);
        assert_eq!(r.code, 2, "{lease}: {}", r.all());
        assert!(r.stderr.contains("24h"), "{}", r.stderr);
    }
    assert_eq!(db.show("l1")["state"], "pending");
    let r = db.dlq(&["claim", "l1", "--lease", "24h"]);
    assert_eq!(r.code, 0, "{}", r.all());
    let until =
        chrono::DateTime::parse_from_rfc3339(r.json()["expires_at"].as_str().unwrap()).unwrap();
    assert!(until.timestamp() - chrono::Utc::now().timestamp() > 23 * 3600);
    db.add(letter("l2", "q", AMOUNT_BODY));
    let plan = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(plan.path(), db.dlq(&["plan", "--allow-mixed"]).stdout).unwrap();
    for rate in ["1e-300/s", "0/s", "1e400/s", "0.001/m", "5000000/s", "x/s"] {
        let r = db.dlq(&[
            "replay",
            "--plan",
            plan.path().to_str().unwrap(),
            "--yes",
            "--rate",
            rate,
        ]);
        assert_eq!(r.code, 2, "{rate}: {}", r.all());
        assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
    }
    let r = db.dlq(&[
        "replay",
        "l2",
        "--yes",
        "--lease",
        "5s",
        "--confirm-timeout",
        "10s",
    ]);
    assert_eq!(r.code, 2, "{}", r.all());
}

/// Once broke (review of protocol v2): `release --token alice` turned an imported
/// uncertain row owned by "alice" pending.
/// `import` takes replay_claim_owner / replay_attempt_at as given, and
/// `show -o json` prints the owner as its operator part. A row imported in the shape
/// `show` prints is owned by the token "alice" (guessable), and `release --token alice`
/// turns an uncertain row pending.
#[test]
fn an_imported_uncertain_row_is_not_released_by_the_operator_name() {
    let db = TestDb::migrated(Backend::Sqlite);
    let row = serde_json::json!({
        "id": "imp1", "reason": "retries_exhausted", "attempts": 1, "headers": {},
        "body_base64": "e30=", "source_queue": "q",
        "replay_claim_owner": "alice",
        "replay_claim_expires_at": "2026-01-01T00:00:00Z",
        "replay_attempt_at": "2026-01-01T00:00:00Z",
        "last_replay_error": "no publisher confirm within 10s"
    });
    db.add(row);
    assert_eq!(state(&db, "imp1"), "uncertain");
    assert_eq!(db.show("imp1")["replay_claim_owner"], "alice");
    let r = db.dlq(&["release", "imp1", "--token", "alice"]);
    let after = state(&db, "imp1");
    assert!(
        r.code == 3 && after == "uncertain",
        "release --token alice: exit {}, state {after:?}: {}",
        r.code,
        r.all()
    );
}

/// Two holders of one hand-taken token both pass the claim; the one whose attempt finds
/// the row already attempted publishes nothing. Once broke: it reported `not_replayed`
/// (exit 3) although the rival's attempt left the row `uncertain` (review of issue 20).
#[test]
fn a_replay_beaten_to_the_attempt_reports_the_open_attempt_uncertain() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("rv_rival");
    let db = TestDb::migrated(Backend::Postgres);
    db.add(letter("r1", &q, br#"{"event_id":"evt-r1"}"#));
    let report = replay_through(&db, "r1", Fault::RivalAttempt);
    assert!(rabbit.drain(&q).is_empty(), "this run published nothing");
    assert_eq!(state(&db, "r1"), "uncertain");
    assert_eq!(
        report.outcome,
        dlq::Outcome::Uncertain,
        "{:?}",
        report.reason
    );
    assert!(
        matches!(report.reason, dlq::replay::Reason::AttemptedFirst(_)),
        "{:?}",
        report.reason
    );
}
