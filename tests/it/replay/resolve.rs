//! `dlq resolve` of uncertain rows: both ways, only once settled, never while a replay may
//! still be publishing; uncertain rows outlive their lease.

use super::*;
use crate::common::*;

#[test]
fn resolve_both_ways_only_on_settled_uncertain_rows() {
    for b in BACKENDS {
        let mut rabbit = Rabbit::new();
        let (x, ok) = fanout_with_a_full_queue(&mut rabbit);
        let db = TestDb::migrated(b);
        for id in ["r1", "r2"] {
            let mut row = letter(id, &ok, AMOUNT_BODY);
            row["exchange"] = x.clone().into();
            db.add(row);
            assert_eq!(db.dlq(&["replay", id, "--yes"]).code, 6);
        }
        db.add(letter("r3", &ok, AMOUNT_BODY));
        // A pending row, an unknown one and a missing note are refused.
        let r = db.dlq(&["resolve", "r3", "--delivered", "--note", "checked"]);
        assert_eq!(r.code, 3, "{}", r.all());
        assert_eq!(r.json()["outcome"], "not_resolved");
        let r = db.dlq(&["resolve", "nosuch", "--delivered", "--note", "x"]);
        assert_eq!(r.code, 4, "{}", r.all());
        let r = db.dlq(&["resolve", "r1", "--delivered"]);
        assert_eq!(r.code, 2, "{}", r.all());
        let r = db.dlq(&[
            "resolve",
            "r1",
            "--delivered",
            "--not-delivered",
            "--note",
            "x",
        ]);
        assert_eq!(r.code, 2, "{}", r.all());

        let r = db.dlq(&[
            "resolve",
            "r1",
            "--delivered",
            "--note",
            "seen in orders-db",
        ]);
        assert_eq!(r.code, 0, "{b:?}: {}", r.all());
        let s = db.show("r1");
        assert_eq!(s["state"], "replayed");
        let last = s["history"].as_array().unwrap().last().unwrap().clone();
        assert_eq!(last["action"], "resolve");
        assert!(last["detail"]
            .as_str()
            .unwrap()
            .contains("seen in orders-db"));
        assert_eq!(last["operator"], "tester");

        let r = db.dlq(&[
            "resolve",
            "r2",
            "--not-delivered",
            "--note",
            "not in orders-db",
        ]);
        assert_eq!(r.code, 0, "{}", r.all());
        assert_eq!(db.show("r2")["state"], "pending");
        assert!(db.show("r2")["replay_attempt_at"].is_null());
        // Resolving again is refused: it is no longer uncertain.
        let r = db.dlq(&["resolve", "r2", "--not-delivered", "--note", "again"]);
        assert_eq!(r.code, 3, "{}", r.all());
        rabbit.drain(&ok);
        // Once pending again, a replay publishes it (the operator said it never arrived).
        let r = db.dlq(&[
            "replay",
            "r2",
            "--yes",
            "--exchange",
            "",
            "--routing-key",
            &ok,
        ]);
        assert_eq!(r.code, 0, "{}", r.all());
        assert_eq!(rabbit.drain(&ok).len(), 1);
    }
}

#[test]
fn resolve_refuses_while_a_replay_may_still_be_publishing() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_v2_inflight");
    let db = TestDb::migrated(Backend::Postgres);
    db.add(letter("p1", &q, AMOUNT_BODY));
    // An attempt whose process died before settling: the lease is still live.
    let token = db.dlq(&["claim", "p1", "--token-only", "-o", "table"]);
    assert_eq!(token.code, 0);
    db.sql(&["UPDATE dead_letters SET replay_attempt_at = now(), replay_claim_owner = 'ghost:1' WHERE id = 'p1'"]);
    // Uncertain at once, whatever its lease: its run may still settle it until the
    // lease ends, and nothing short of that end shows that run is gone.
    let s = db.show("p1");
    assert_eq!(s["state"], "uncertain", "an open attempt");
    assert_eq!(s["settling"], "running");
    let until = s["settling_until"].as_str().unwrap().to_string();
    assert_eq!(s["replay_claim_expires_at"].as_str().unwrap(), until);
    let r = db.dlq(&["resolve", "p1", "--not-delivered", "--note", "x"]);
    assert_eq!(r.code, 3, "{}", r.all());
    let detail = r.json()["detail"].as_str().unwrap().to_string();
    assert!(
        detail.contains("may still settle it until") && detail.contains(&until[..16]),
        "{detail}"
    );
    lapse_leases(&db);
    assert_eq!(db.show("p1")["state"], "uncertain");
    let r = db.dlq(&[
        "resolve",
        "--state",
        "uncertain",
        "--not-delivered",
        "--note",
        "batch",
        "--yes",
    ]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(r.lines()[0]["outcome"], "resolved");
    assert_eq!(db.show("p1")["state"], "pending");
}

#[test]
fn resolve_a_selection_needs_yes_without_a_terminal() {
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("s1", "q", AMOUNT_BODY));
    db.sql(&["UPDATE dead_letters SET replay_attempt_at = 1, replay_claim_owner = 'x:1', replay_claim_expires_at = 1"]);
    let r = db.dlq(&["resolve", "--not-delivered", "--note", "n"]);
    assert_eq!(r.code, 2, "{}", r.all());
    assert_eq!(db.show("s1")["state"], "uncertain");
    let r = db.dlq(&[
        "resolve",
        "--state",
        "pending",
        "--not-delivered",
        "--note",
        "n",
        "--yes",
    ]);
    assert_eq!(r.code, 2, "{}", r.all());
}

#[test]
fn an_uncertain_row_outlives_its_lease_in_list_and_aggregate() {
    for b in BACKENDS {
        let db = TestDb::migrated(b);
        db.add(letter("u1", "q", AMOUNT_BODY));
        db.add(letter("u2", "q", AMOUNT_BODY));
        let now = match b {
            Backend::Postgres => "now() - interval '1 hour'",
            Backend::Sqlite => "1",
        };
        db.sql(&[&format!(
            "UPDATE dead_letters SET replay_attempt_at = {now}, replay_claim_owner = 'x:1', replay_claim_expires_at = {now} WHERE id = 'u1'"
        )]);
        assert_eq!(db.ids(&["--state", "uncertain"]), vec!["u1"]);
        assert_eq!(db.ids(&["--state", "pending"]), vec!["u2"]);
        let mut both = db.ids(&["--state", "uncertain,pending"]);
        both.sort();
        assert_eq!(both, vec!["u1", "u2"]);
        let a = db.dlq(&["aggregate", "--by", "reason"]).json();
        assert_eq!(a[0]["uncertain"], 1, "{a}");
        assert_eq!(a[0]["pending"], 1, "{a}");
        assert_eq!(a[0]["discarded"], 0, "{a}");
        let l = db.dlq(&["list", "--state", "uncertain"]).json();
        assert_eq!(l[0]["state"], "uncertain");
        assert_eq!(l[0]["replay_claim_owner"], "x", "the operator part only");
        let r = db.dlq(&["list", "--state", "bogus"]);
        assert_eq!(r.code, 2);
    }
}
