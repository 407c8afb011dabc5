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

/// Plans every row (with these plan flags) and replays the plan on one worker, as JSON.
fn replay_plan_one_worker(db: &TestDb, plan_flags: &[&str]) -> Run {
    let plan = db.plan_file(plan_flags);
    let path = plan.path().to_str().unwrap();
    db.dlq(&[
        "replay",
        "--plan",
        path,
        "--yes",
        "--workers",
        "1",
        "-o",
        "json",
    ])
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

/// Once broke: a replay to a routing key no queue is bound for said `publish_failed (…
/// 312 NO_ROUTE …)` without the exchange, the routing key or what to do (issue 25, item 7).
#[test]
fn a_route_to_nowhere_names_the_exchange_the_routing_key_and_the_fix() {
    let db = TestDb::migrated(Backend::Sqlite);
    let key = unique("dlq_unbound_key");
    db.add(letter("nr1", &key, b"{}"));
    db.add(letter("nr2", &key, b"{}"));
    // A named exchange with no binding for the key.
    let r = db.dlq(&[
        "replay",
        "nr1",
        "--yes",
        "--exchange",
        "amq.direct",
        "-o",
        "table",
    ]);
    assert_eq!(r.code, 5, "{}", r.all());
    let line = r.stdout.trim();
    for shown in [
        "312 NO_ROUTE",
        &format!("no queue is bound for routing key \"{key}\" on exchange \"amq.direct\""),
        "check the queue's binding, or give --routing-key",
    ] {
        assert!(line.contains(shown), "no {shown:?} in {line}");
    }
    // The default exchange: no queue of that name.
    let j = db.dlq(&["replay", "nr2", "--yes", "-o", "json"]).json();
    assert_eq!(j["outcome"], "publish_failed");
    let detail = j["detail"].as_str().unwrap();
    assert!(
        detail.contains(&format!("no queue named \"{key}\" exists"))
            && detail.contains("give --routing-key"),
        "{detail}"
    );
    // The same words in the history, and the typed next step.
    assert!(
        last_detail(&db, "nr2").contains("no queue named"),
        "{}",
        last_detail(&db, "nr2")
    );
}

/// A missing exchange (the broker's 404 closes the channel) names the exchange, and a
/// single replay's one publish is certainly not published: `publish_failed`, the row
/// pending again. Once broke: it ended `uncertain` (exit 6), "may or may not have been
/// published", and the row waited for `dlq resolve` after a typo in `--exchange`.
#[test]
fn a_missing_exchange_is_named_and_a_single_replay_to_it_certainly_failed() {
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("ne1", "orders", b"{}"));
    let ex = unique("dlq_no_such_exchange");
    let r = db.dlq(&["replay", "ne1", "--yes", "--exchange", &ex, "-o", "json"]);
    assert_eq!(r.code, 5, "{}", r.all());
    let j = r.json();
    assert_eq!(j["outcome"], "publish_failed", "{}", r.all());
    let detail = j["detail"].as_str().unwrap().to_string();
    assert!(
        detail.contains(&format!(
            "exchange \"{ex}\" (routing key \"orders\") does not exist"
        )) && detail.contains("give --exchange")
            && detail.contains("nothing was published"),
        "{}",
        r.all()
    );
    let row = db.dlq(&["show", "ne1", "-o", "json"]).json();
    assert_eq!(row["state"], "pending", "{row}");
    assert!(
        row["last_replay_error"]
            .as_str()
            .is_some_and(|e| e.contains("does not exist")),
        "{row}"
    );
}

/// Two publishes to one missing exchange on one channel: the 404 was drawn by one of
/// them, and the exchange may have been deleted after the other was routed, so neither
/// is said to have certainly failed.
#[test]
fn two_unanswered_publishes_to_a_missing_exchange_stay_uncertain() {
    let db = TestDb::migrated(Backend::Sqlite);
    let ex = unique("dlq_missing_two");
    for id in ["two-1", "two-2"] {
        let mut l = letter(id, "orders", b"{}");
        l["exchange"] = serde_json::json!(ex);
        l["routing_key"] = serde_json::json!("k");
        db.add(l);
    }
    let r = replay_plan_one_worker(&db, &[]);
    assert_eq!(r.code, 6, "{}", r.all());
    let items: Vec<_> = r
        .lines()
        .into_iter()
        .filter(|l| l.get("id").is_some())
        .collect();
    assert_eq!(items.len(), 2, "{}", r.all());
    // (A publish lapin refused on the already closed channel was never sent: failed.)
    let refused = |l: &serde_json::Value| {
        l["detail"]
            .as_str()
            .is_some_and(|d| d.contains("refused it before routing"))
    };
    assert!(
        items.iter().any(|l| l["outcome"] == "uncertain"),
        "{}",
        r.all()
    );
    assert!(!items.iter().any(refused), "{}", r.all());
}

/// Once broke (review): the 404 of exchange `X'v2` was read as naming exchange `X` (a
/// text test: "no exchange 'X" is in "no exchange 'X'v2'"), and the publish to `X`,
/// which existed and routed it, was released: replayed again, its event went out twice.
#[test]
fn a_404_is_judged_by_the_exchange_it_names_exactly() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_404_exact");
    let ex = rabbit.exchange("dlq_404_exact");
    rabbit.bind(&q, &ex, "k");
    let db = TestDb::migrated(Backend::Sqlite);
    for (id, exchange) in [("ex-1", ex.clone()), ("ex-2", format!("{ex}'v2"))] {
        let mut l = letter(id, &q, b"{}");
        l["exchange"] = serde_json::json!(exchange);
        l["routing_key"] = serde_json::json!("k");
        db.add(l);
    }
    let r = replay_plan_one_worker(&db, &["--allow-mixed"]);
    let outcome = |id: &str| {
        r.lines()
            .into_iter()
            .find(|l| l["id"] == id)
            .map(|l| l["outcome"].as_str().unwrap_or_default().to_string())
            .unwrap_or_else(|| panic!("no line for {id}: {}", r.all()))
    };
    assert_eq!(rabbit.count(&q), 1, "routed once: {}", r.all());
    assert_ne!(outcome("ex-1"), "publish_failed", "{}", r.all());
    assert_ne!(
        db.dlq(&["show", "ex-1", "-o", "json"]).json()["state"],
        "pending"
    );
    assert_eq!(outcome("ex-2"), "publish_failed", "{}", r.all());
}

/// Once broke: a 404 on one publish closes the channel for every confirm still open, and
/// each of those items was told its own exchange "does not exist" (the default exchange
/// too), although one of them was in the queue: a false lead to `resolve --not-delivered`.
#[test]
fn a_missing_exchange_is_said_only_of_the_items_sent_to_it() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_mixed_404");
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("mix-a-1", &q, b"{}"));
    let ex = unique("dlq_missing_x");
    let mut b = letter("mix-b-2", &q, b"{}");
    b["exchange"] = serde_json::json!(ex);
    b["routing_key"] = serde_json::json!("k");
    db.add(b);
    let r = replay_plan_one_worker(&db, &["--allow-mixed"]);
    for line in r.lines().iter().filter(|l| l.get("id").is_some()) {
        let detail = line["detail"].as_str().unwrap_or_default();
        if line["id"] == "mix-a-1" {
            assert!(!detail.contains("does not exist"), "{line}");
        } else {
            assert!(
                detail.contains(&format!("exchange \"{ex}\"")) && detail.contains("does not exist"),
                "{line}"
            );
        }
    }
    assert!(!last_detail(&db, "mix-a-1").contains("does not exist"));
}
