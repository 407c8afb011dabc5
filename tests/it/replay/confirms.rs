//! What the broker's answer means: returns matched by `x-dead-letter-id`, nacks that are
//! certain failures and nacks that are uncertain, quorum queues as targets.

use super::*;
use crate::common::*;
use lapin::types::{AMQPValue, FieldTable};
use std::time::Duration;

#[test]
fn returns_are_matched_by_dead_letter_id_in_a_mixed_plan() {
    // Half the rows go to a queue that exists, half to one that does not. Returns and
    // confirms arrive interleaved; lapin hands a return to whichever confirm completes
    // next, so matching by arrival order credits them to the wrong rows.
    for b in BACKENDS {
        for round in 0..3 {
            let mut rabbit = Rabbit::new();
            let good = rabbit.queue("dlq_v2_mixed");
            let gone = unique("dlq_v2_missing");
            let db = TestDb::migrated(b);
            import_letters(
                &db,
                (0..600).map(|i| {
                    let q = if i % 2 == 0 { &good } else { &gone };
                    (format!("m{i:04}"), q.clone())
                }),
            );
            let plan = db.plan_file(&["--limit", "1000"]);
            let r = db.dlq(&[
                "replay",
                "--plan",
                plan.path().to_str().unwrap(),
                "--yes",
                "--workers",
                "2",
                "--batch-size",
                "300",
            ]);
            assert_eq!(r.code, 5, "{b:?} round {round}: {}", r.stderr);
            let got = per_id(&rabbit.drain(&good));
            for line in r.lines().iter().filter(|l| l.get("id").is_some()) {
                let id = line["id"].as_str().unwrap();
                let n: usize = id[1..].parse().unwrap();
                if n.is_multiple_of(2) {
                    assert_eq!(line["outcome"], "replayed", "{b:?} {line}");
                    assert_eq!(got.get(id), Some(&1), "{b:?} {id} delivered once");
                } else {
                    assert_eq!(line["outcome"], "publish_failed", "{b:?} {line}");
                    assert!(!got.contains_key(id));
                }
            }
            assert_eq!(got.len(), 300, "{b:?}");
            assert_eq!(
                db.ids(&["--state", "replayed", "--limit", "1000"]).len(),
                300
            );
            assert_eq!(
                db.ids(&["--state", "pending", "--limit", "1000"]).len(),
                300
            );
        }
    }
}

#[test]
fn a_nack_through_a_named_exchange_is_uncertain_and_never_replayed_again() {
    for b in BACKENDS {
        let mut rabbit = Rabbit::new();
        let (x, ok) = fanout_with_a_full_queue(&mut rabbit);
        let db = TestDb::migrated(b);
        let mut row = letter("f1", &ok, AMOUNT_BODY);
        row["exchange"] = x.clone().into();
        db.add(row);
        let r = db.dlq(&["replay", "f1", "--yes"]);
        assert_eq!(r.code, 6, "{b:?}: {}", r.all());
        let j = r.json();
        assert_eq!(j["outcome"], "uncertain");
        assert!(j["detail"].as_str().unwrap().contains("nack"), "{j}");
        assert_eq!(rabbit.drain(&ok).len(), 1, "the other queue holds it");
        let s = db.show("f1");
        assert_eq!(s["state"], "uncertain");
        assert!(s["replay_attempt_at"].is_string());
        assert!(s["last_replay_error"].as_str().unwrap().contains("nack"));
        // A second replay, and one after the lease is long gone, publish nothing.
        lapse_leases(&db);
        for args in [&["replay", "f1", "--yes"][..], &["claim", "f1"][..]] {
            let r = db.dlq(args);
            assert_eq!(r.code, 6, "{b:?} {args:?}: {}", r.all());
            assert_eq!(r.json()["outcome"], "uncertain");
        }
        assert_eq!(db.show("f1")["state"], "uncertain");
        assert_eq!(rabbit.drain(&ok).len(), 0, "no second copy");
        let plan = db.dlq(&["plan", "--state", "uncertain"]);
        assert_eq!(plan.code, 2, "{}", plan.all());
    }
}

#[test]
fn a_nack_on_the_default_exchange_of_one_node_is_a_certain_failure() {
    let mut rabbit = Rabbit::new();
    let args = refusing_queue_args();
    let q = rabbit.queue_with("dlq_v2_full", args);
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("n1", &q, AMOUNT_BODY));
    let r = db.dlq(&["--broker-topology", "single", "replay", "n1", "--yes"]);
    assert_eq!(r.code, 5, "{}", r.all());
    let s = db.show("n1");
    assert_eq!(s["state"], "pending");
    assert!(s["replay_attempt_at"].is_null());
    let actions = history_actions(&s);
    assert_eq!(
        actions,
        vec![
            ("claim".into(), "claimed".into()),
            ("attempt".into(), "attempted".into()),
            ("release".into(), "publish_failed".into())
        ]
    );
}

/// A queue with `x-overflow: reject-publish-dlx` nacks a publish AND dead-letters the
/// message, so a nack is no proof that nothing went out: `--broker-topology single` says
/// the broker's queues drop what they refuse (docs/cluster.md), and without it such a nack
/// is uncertain. Once broke (review of the topology change): nothing said this, and a
/// release left the event both pending and in the dead-letter queue.
#[test]
fn a_nack_that_may_have_dead_lettered_the_message_is_uncertain_by_default() {
    let mut rabbit = Rabbit::new();
    let dead = rabbit.queue("dlq_v2_dlx_dead");
    let mut args = FieldTable::default();
    args.insert("x-max-length".into(), AMQPValue::LongLongInt(0));
    args.insert(
        "x-overflow".into(),
        AMQPValue::LongString("reject-publish-dlx".into()),
    );
    args.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString("".into()),
    );
    args.insert(
        "x-dead-letter-routing-key".into(),
        AMQPValue::LongString(dead.as_str().into()),
    );
    let target = rabbit.queue_with("dlq_v2_dlx_target", args);
    let db = TestDb::migrated(Backend::Postgres);
    db.add(letter("dlx-1", &target, b"{\"event_id\":\"evt-dlx-1\"}"));
    let r = db.dlq(&["replay", "dlx-1", "--yes"]);
    assert_eq!(r.code, 6, "{}", r.all());
    assert_eq!(db.show("dlx-1")["state"], "uncertain");
    // The message did go out, into the dead-letter queue: uncertain was the truth.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(rabbit.drain(&dead).len(), 1);
    let detail = r.json()["detail"].as_str().unwrap_or_default().to_string();
    assert!(detail.contains("--broker-topology single"), "{detail}");
}

#[test]
fn a_nack_on_the_default_exchange_in_a_cluster_is_uncertain() {
    // In a cluster, RabbitMQ nacks what it routed to a queue whose node went down, even
    // when that queue kept the message: with several node URLs no nack is certain.
    let mut rabbit = Rabbit::new();
    let args = refusing_queue_args();
    let q = rabbit.queue_with("dlq_v2_full_cluster", args);
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("n2", &q, AMOUNT_BODY));
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let urls = format!(" {AMQP}, amqp://guest:guest@127.0.0.1:{dead}/%2f");
    let r = db.dlq_env(&["replay", "n2", "--yes"], &[("DLQ_AMQP_URL", &urls)]);
    assert_eq!(r.code, 6, "{}", r.all());
    assert_eq!(db.show("n2")["state"], "uncertain");
}

#[test]
fn a_quorum_queue_is_a_replay_target() {
    let mut rabbit = Rabbit::new();
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    let q = rabbit.queue_with("dlq_v2_quorum", args);
    let db = TestDb::migrated(Backend::Postgres);
    db.add(letter("q1", &q, AMOUNT_BODY));
    let r = db.dlq(&["replay", "q1", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.all());
    let got = rabbit.drain(&q);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].body, AMOUNT_BODY);
}
