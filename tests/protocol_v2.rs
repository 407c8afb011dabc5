//! Replay protocol v2 against the real services: the attempt step and the `uncertain`
//! state, returns matched by `x-dead-letter-id`, nacks through a named exchange, one
//! token one publish, `--max-failures` windows, interrupted plans, marks retried while
//! the store is busy, `resolve`, and the upgrade of a v1 database.

mod common;
use common::*;
use lapin::types::{AMQPValue, FieldTable};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BODY: &[u8] = br#"{"event_id":"evt-1","amount":10}"#;

fn seed(db: &TestDb, rows: impl Iterator<Item = (String, String)>) {
    let mut lines = String::new();
    for (id, queue) in rows {
        let body = format!("{{\"event_id\":\"evt-{id}\"}}");
        lines.push_str(&letter(&id, &queue, body.as_bytes()).to_string());
        lines.push('\n');
    }
    let r = db.dlq_stdin(&["import", "-"], lines.as_bytes());
    assert_eq!(r.code, 0, "{}", r.all());
}

fn history_actions(s: &serde_json::Value) -> Vec<(String, String)> {
    s["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["action"].as_str().unwrap().to_string(),
                h["outcome"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Moves every lease into the past (time passing, on the database's terms).
fn lapse_leases(db: &TestDb) {
    db.sql(&[match db.backend {
        Backend::Postgres => "UPDATE dead_letters SET replay_claim_expires_at = now() - interval '1 second' WHERE replay_claim_expires_at IS NOT NULL",
        Backend::Sqlite => "UPDATE dead_letters SET replay_claim_expires_at = 1 WHERE replay_claim_expires_at IS NOT NULL",
    }]);
}

/// A fanout exchange bound to a queue that takes messages and one that refuses every
/// publish (max length 0, reject-publish): RabbitMQ nacks, one queue holds a copy.
fn fanout_with_a_full_queue(rabbit: &mut Rabbit) -> (String, String) {
    let ok = rabbit.queue("dlq_v2_fan_ok");
    let args = refusing_queue_args();
    let full = rabbit.queue_with("dlq_v2_fan_full", args);
    let x = rabbit.exchange_of("dlq_v2_fanout", lapin::ExchangeKind::Fanout);
    rabbit.bind(&ok, &x, "");
    rabbit.bind(&full, &x, "");
    (x, ok)
}

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
            seed(
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
fn a_plan_killed_midway_and_rerun_never_delivers_twice() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_v2_kill");
    let db = TestDb::migrated(Backend::Postgres);
    seed(&db, (0..3000).map(|i| (format!("k{i:04}"), q.clone())));
    let plan = db.plan_file(&["--limit", "5000"]);
    let path = plan.path().to_str().unwrap().to_string();
    let mut child = db
        .cmd()
        .args(["replay", "--plan", &path, "--yes", "--rate", "400/s"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    child.kill().unwrap();
    child.wait().unwrap();
    let first = per_id(&rabbit.drain(&q));
    assert!(!first.is_empty() && first.len() < 3000, "{}", first.len());
    lapse_leases(&db);
    let r = db.dlq(&["replay", "--plan", &path, "--yes"]);
    let second = per_id(&rabbit.drain(&q));
    for (id, n) in &second {
        assert_eq!(*n, 1, "{id} twice in the rerun");
        assert!(!first.contains_key(id), "{id} delivered by both runs");
    }
    // Whatever the killed run may have sent is uncertain, never pending or replayed again.
    let uncertain = db.ids(&["--state", "uncertain", "--limit", "5000"]);
    assert_eq!(
        r.code,
        if uncertain.is_empty() { 3 } else { 6 },
        "{}",
        r.stderr
    );
    for id in first.keys() {
        let s = db.show(id);
        assert!(
            s["state"] == "replayed" || s["state"] == "uncertain",
            "{id} was delivered but is {}",
            s["state"]
        );
    }
    assert_eq!(
        first.len() + second.len() + uncertain.len()
            - first.keys().filter(|k| uncertain.contains(k)).count(),
        3000 - db.ids(&["--state", "pending", "--limit", "5000"]).len(),
        "every row is accounted for"
    );
}

#[test]
fn one_hand_taken_token_publishes_at_most_once() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_v2_token");
    let db = TestDb::migrated(Backend::Postgres);
    db.add(letter("t1", &q, BODY));
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
    let mut row = letter("t2", &ok, BODY);
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
fn a_nack_through_a_named_exchange_is_uncertain_and_never_replayed_again() {
    for b in BACKENDS {
        let mut rabbit = Rabbit::new();
        let (x, ok) = fanout_with_a_full_queue(&mut rabbit);
        let db = TestDb::migrated(b);
        let mut row = letter("f1", &ok, BODY);
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
    db.add(letter("n1", &q, BODY));
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
    db.add(letter("n2", &q, BODY));
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
fn max_failures_attempts_at_most_n_plus_ten() {
    for b in BACKENDS {
        let db = TestDb::migrated(b);
        let gone = unique("dlq_v2_nowhere");
        seed(&db, (0..400).map(|i| (format!("x{i:04}"), gone.clone())));
        let plan = db.plan_file(&["--limit", "1000"]);
        let r = db.dlq(&[
            "replay",
            "--plan",
            plan.path().to_str().unwrap(),
            "--yes",
            "--max-failures",
            "3",
        ]);
        assert_eq!(r.code, 5, "{b:?}: {}", r.stderr);
        let attempts =
            db.scalar("SELECT count(*) FROM dead_letter_history WHERE action = 'attempt'");
        assert!((3..=13).contains(&attempts), "{b:?}: {attempts} attempted");
        let failed = r
            .lines()
            .iter()
            .filter(|l| l["outcome"] == "publish_failed")
            .count();
        assert!((3..=13).contains(&failed), "{b:?}: {failed}");
        let summary = r.lines().last().unwrap().clone();
        assert_eq!(summary["summary"]["stopped"], "max_failures");
    }
}

#[test]
fn an_interrupted_plan_that_sent_something_exits_with_its_worst_outcome() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_v2_int");
    // The broker takes the messages but its confirms never arrive.
    let proxy = Proxy::start("127.0.0.1:5672", OnServerBytes::Stall(BASIC_ACK.to_vec()));
    let db = TestDb::migrated(Backend::Sqlite);
    seed(&db, (0..50).map(|i| (format!("i{i:02}"), q.clone())));
    let plan = db.plan_file(&["--limit", "100"]);
    let child = db
        .cmd()
        .args([
            "replay",
            "--plan",
            plan.path().to_str().unwrap(),
            "--yes",
            "--confirm-timeout",
            "60s",
        ])
        .env(
            "DLQ_AMQP_URL",
            format!("amqp://guest:guest@{}/%2f", proxy.addr()),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while rabbit.count(&q) == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "never published"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    signal(&child, "INT");
    let r = Run::from(child.wait_with_output().unwrap());
    assert_eq!(r.code, 6, "not 130: something may be out: {}", r.all());
    assert!(!db
        .ids(&["--state", "uncertain", "--limit", "100"])
        .is_empty());
    // Once broke: `"worst": "interrupted"` beside exit 3.
    let summary = summary_of(&r);
    assert_eq!(summary["worst"], "uncertain", "{summary}");
}

#[test]
fn a_busy_store_delays_the_mark_but_never_turns_a_confirm_into_doubt() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_v2_busy");
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("b1", &q, BODY));
    // When the broker's ack passes the proxy, another writer takes the SQLite write lock
    // for 3 s (before dlq sees the ack); dlq waits at most 500 ms per try.
    let acked = Arc::new(AtomicBool::new(false));
    let proxy = Proxy::start(
        "127.0.0.1:5672",
        OnServerBytes::CutOther(BASIC_ACK.to_vec(), acked.clone()),
    );
    let url = db.url.clone();
    let locker = std::thread::spawn(move || {
        while !acked.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(2));
        }
        rt().block_on(async move {
            use sqlx::Connection;
            let mut c = sqlx::SqliteConnection::connect(&url).await.unwrap();
            sqlx::query("BEGIN IMMEDIATE")
                .execute(&mut c)
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_secs(3)).await;
            sqlx::query("COMMIT").execute(&mut c).await.unwrap();
        });
    });
    let r = db.dlq_env(
        &["replay", "b1", "--yes", "--lock-timeout", "500ms", "-v"],
        &[(
            "DLQ_AMQP_URL",
            &format!("amqp://guest:guest@{}/%2f", proxy.addr()),
        )],
    );
    locker.join().unwrap();
    assert_eq!(r.code, 0, "{}", r.all());
    assert!(
        r.stderr.contains("retrying"),
        "the mark was retried: {}",
        r.stderr
    );
    assert_eq!(db.show("b1")["state"], "replayed");
    assert_eq!(rabbit.drain(&q).len(), 1);
}

#[test]
fn resolve_both_ways_only_on_settled_uncertain_rows() {
    for b in BACKENDS {
        let mut rabbit = Rabbit::new();
        let (x, ok) = fanout_with_a_full_queue(&mut rabbit);
        let db = TestDb::migrated(b);
        for id in ["r1", "r2"] {
            let mut row = letter(id, &ok, BODY);
            row["exchange"] = x.clone().into();
            db.add(row);
            assert_eq!(db.dlq(&["replay", id, "--yes"]).code, 6);
        }
        db.add(letter("r3", &ok, BODY));
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
    db.add(letter("p1", &q, BODY));
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
    db.add(letter("s1", "q", BODY));
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
        db.add(letter("u1", "q", BODY));
        db.add(letter("u2", "q", BODY));
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

#[test]
fn leases_and_rates_have_bounds() {
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("l1", "q", BODY));
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
    db.add(letter("l2", "q", BODY));
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
    db.add(letter("q1", &q, BODY));
    let r = db.dlq(&["replay", "q1", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.all());
    let got = rabbit.drain(&q);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].body, BODY);
}

#[test]
fn the_come_back_check_pages_by_time_and_id() {
    // 2,500 dead letters share one dead_lettered_at: a page of 1,000 by time alone would
    // be read again and again; by (time, id) each is read once.
    use dlq::secret::SecretUrl;
    use dlq::store::{open, NewDeadLetter, StoreOptions};
    for b in BACKENDS {
        let db = TestDb::migrated(b);
        let at = chrono::Utc::now() - chrono::Duration::seconds(5);
        let rows: Vec<NewDeadLetter> = (0..2500)
            .map(|i| NewDeadLetter {
                line: i + 1,
                id: format!("c{i:05}"),
                body: b"{}".to_vec(),
                reason: "retries_exhausted".into(),
                headers_json: "{}".into(),
                event_id: Some(format!("e{i}")),
                dead_lettered_at: Some(at),
                ..Default::default()
            })
            .collect();
        let seen = rt().block_on(async {
            let store = open(&SecretUrl::new(db.url.clone()), &StoreOptions::default())
                .await
                .unwrap();
            store.import(rows, false).await.unwrap();
            let mut after = (at - chrono::Duration::seconds(1), String::new());
            let mut seen = Vec::new();
            loop {
                let page = store.dead_lettered_since(&after, 1000).await.unwrap();
                if page.is_empty() {
                    break;
                }
                let last = page.last().unwrap();
                after = (last.2, last.0.clone());
                seen.extend(page.into_iter().map(|p| p.0));
            }
            seen
        });
        assert_eq!(seen.len(), 2500, "{b:?}");
        let distinct: std::collections::HashSet<_> = seen.iter().collect();
        assert_eq!(distinct.len(), 2500, "{b:?}");
    }
}

#[test]
fn migrate_upgrades_a_v1_database_in_place() {
    for b in BACKENDS {
        let db = TestDb::new(b);
        // The v1 schema: the migrations that shipped before protocol v2.
        let dir = tempfile::tempdir().unwrap();
        let sub = match b {
            Backend::Postgres => "postgres",
            Backend::Sqlite => "sqlite",
        };
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("migrations")
            .join(sub);
        for f in std::fs::read_dir(&src).unwrap() {
            let f = f.unwrap();
            if f.file_name().to_string_lossy().starts_with("20261129") {
                std::fs::copy(f.path(), dir.path().join(f.file_name())).unwrap();
            }
        }
        let (past, future) = match b {
            Backend::Postgres => ("now() - interval '1 hour'", "now() + interval '1 hour'"),
            Backend::Sqlite => ("1000", "99999999999999"),
        };
        rt().block_on(async {
            let m = sqlx::migrate::Migrator::new(dir.path()).await.unwrap();
            match b {
                Backend::Postgres => {
                    let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
                    m.run(&pool).await.unwrap();
                    pool.close().await;
                }
                Backend::Sqlite => {
                    let pool = sqlx::SqlitePool::connect(&format!("{}?mode=rwc", db.url))
                        .await
                        .unwrap();
                    m.run(&pool).await.unwrap();
                    pool.close().await;
                }
            }
        });
        let body = match b {
            Backend::Postgres => "'\\x7b7d'::bytea",
            Backend::Sqlite => "X'7b7d'",
        };
        let ins = |id: &str, rest: &str| {
            format!("INSERT INTO dead_letters (id, body, reason, attempts, headers_json, replayed_at, replay_claim_owner, replay_claim_expires_at) VALUES ('{id}', {body}, 'retries_exhausted', 3, '{{}}', {rest})")
        };
        db.sql(&[
            &ins("v-pending", "NULL, NULL, NULL"),
            &ins("v-replayed", &format!("{past}, 'alice:aaaa', NULL")),
            &ins("v-in-flight", &format!("NULL, 'bob:bbbb', {future}")),
            &ins("v-lapsed", &format!("NULL, 'carol:cccc', {past}")),
            &ins("v-no-owner", &format!("NULL, NULL, {future}")),
        ]);
        let r = db.dlq(&["migrate"]);
        assert_eq!(r.code, 0, "{b:?}: {}", r.all());
        assert!(r.all().contains("protocol v2"), "{}", r.all());
        let state = |id: &str| db.show(id)["state"].as_str().unwrap().to_string();
        assert_eq!(state("v-pending"), "pending");
        assert_eq!(state("v-replayed"), "replayed");
        assert_eq!(
            state("v-in-flight"),
            "uncertain",
            "a v1 run may have sent it"
        );
        assert_eq!(state("v-lapsed"), "uncertain", "a v1 run may have sent it");
        assert!(db.show("v-lapsed")["last_replay_error"]
            .as_str()
            .unwrap()
            .contains("upgraded from protocol v1"));
        // Once broke: the live v1 claim (a lease until 2099 here: one hour) got the lease
        // end as its attempt time, and resolve refused it until then, though nobody holds
        // its token. Its attempt time is the upgrade's now, and it is resolvable at once.
        let s = db.show("v-in-flight");
        assert_eq!(s["settling"], "v1_claim", "{b:?}: {s}");
        assert_eq!(s["settling_until"], serde_json::Value::Null);
        let attempt =
            chrono::DateTime::parse_from_rfc3339(s["replay_attempt_at"].as_str().unwrap()).unwrap();
        let lease =
            chrono::DateTime::parse_from_rfc3339(s["replay_claim_expires_at"].as_str().unwrap())
                .unwrap();
        assert!(attempt < lease, "{b:?}: no invented attempt time: {s}");
        assert!(
            s["history"]
                .to_string()
                .contains("claimed by a tool older than this schema"),
            "{b:?}: {s}"
        );
        let table = db.dlq(&["-o", "table", "show", "v-in-flight"]).stdout;
        assert!(table.contains("tool older than this schema"), "{table}");
        assert!(table.contains("unknown, before"), "{table}");
        let r = db.dlq(&["replay", "v-in-flight", "--yes", "--routing-key", "nowhere"]);
        assert_eq!(r.code, 6, "{b:?}: a replay reports the doubt: {}", r.all());
        let r = db.dlq(&[
            "resolve",
            "v-in-flight",
            "--not-delivered",
            "--note",
            "checked",
        ]);
        assert_eq!(r.code, 0, "{b:?}: resolvable at once: {}", r.all());
        assert_eq!(state("v-in-flight"), "pending");
        // A worker's expiry with no owner is no lease: not "claimed by unknown".
        assert_eq!(state("v-no-owner"), "pending", "{b:?}");
        let table = db.dlq(&["-o", "table", "show", "v-no-owner"]).stdout;
        assert!(!table.contains("unknown until"), "{table}");
        assert_eq!(db.ids(&["--limit", "10"]).len(), 5, "no row lost");
        // A Python worker keeps writing its nine columns.
        db.sql(&[&ins("w-new", "NULL, NULL, NULL")]);
        assert_eq!(state("w-new"), "pending");
        lapse_leases(&db);
        let r = db.dlq(&["migrate"]);
        assert_eq!(r.code, 0, "again: {}", r.all());
    }
}
