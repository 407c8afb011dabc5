//! `dlq replay ID` against real RabbitMQ and real databases: once and byte-identical,
//! dry runs, reviewed bodies, overrides, concurrency, leases, failures of the broker.

use super::*;
use crate::common::*;
use std::process::Stdio;
use std::time::{Duration, Instant};

#[test]
fn happy_path_publishes_once_byte_identical_then_not_replayed() {
    for b in BACKENDS {
        let mut rabbit = Rabbit::new();
        let q = rabbit.queue("dlq_happy");
        let db = TestDb::migrated(b);
        db.add(letter("d1", &q, BODY));
        let r = db.dlq(&["replay", "d1", "--yes"]);
        assert_eq!(r.code, 0, "{b:?}: {}", r.all());
        let j = r.json();
        assert_eq!(j["outcome"], "replayed");
        assert_eq!(j["id"], "d1");
        assert!(j["detail"].as_str().unwrap().contains("confirmed"));

        let got = rabbit.drain(&q);
        assert_eq!(got.len(), 1, "{b:?}");
        let m = &got[0];
        assert_eq!(m.body, BODY, "byte-identical body");
        assert_eq!(m.message_id.as_deref(), Some("evt-d1"));
        assert_eq!(m.delivery_mode, Some(2), "persistent");
        let h = &m.headers;
        assert_eq!(h["x-replayed-from-dlq"], "true");
        assert_eq!(h["x-dead-letter-reason"], "retries_exhausted");
        assert_eq!(h["x-dead-letter-id"], "d1");
        assert_eq!(h["x-replayed-by"], "tester");
        assert_eq!(h["tenant"], "acme", "original headers kept");
        for k in ["x-death", "x-delivery-count", "x-first-death-queue"] {
            assert!(!h.contains_key(k), "{k} must be stripped: {h:?}");
        }

        let s = db.show("d1");
        assert_eq!(s["state"], "replayed");
        assert!(s["replayed_at"].is_string());
        let actions: Vec<(&str, &str)> = s["history"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| {
                (
                    h["action"].as_str().unwrap(),
                    h["outcome"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            actions,
            vec![
                ("claim", "claimed"),
                ("attempt", "attempted"),
                ("replay", "replayed")
            ],
            "{b:?}"
        );
        for h in s["history"].as_array().unwrap() {
            assert_eq!(h["operator"], "tester");
            assert!(h["at"].is_string());
            assert!(h.get("token").is_none(), "tokens are never shown: {h}");
            let r = h["token_ref"].as_str().unwrap();
            assert!(
                r.len() == 12 && r.chars().all(|c| c.is_ascii_hexdigit()),
                "{h}"
            );
        }
        assert!(
            s["history"][1]["target"].as_str().unwrap().contains(&q),
            "{}",
            s["history"]
        );

        let again = db.dlq(&["replay", "d1", "--yes"]);
        assert_eq!(again.code, 3, "{}", again.all());
        assert_eq!(again.json()["outcome"], "not_replayed");
        assert!(
            again.json()["detail"]
                .as_str()
                .unwrap()
                .contains("already replayed"),
            "{}",
            again.stdout
        );
        assert_eq!(
            rabbit.drain(&q).len(),
            0,
            "nothing published the second time"
        );
    }
}

#[test]
fn replay_without_terminal_or_yes_refuses_and_claims_nothing() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_noyes");
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("d1", &q, BODY));
    let r = db.dlq(&["replay", "d1"]);
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(r.stderr.contains("--yes"));
    assert_eq!(db.show("d1")["state"], "pending");
    assert_eq!(db.show("d1")["history"], serde_json::json!([]));
    assert_eq!(rabbit.count(&q), 0);
}

#[test]
fn dry_run_shows_the_message_and_touches_nothing() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_dry");
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("d1", &q, BODY));
    let r = db.dlq(&["replay", "d1", "--dry-run"]);
    assert_eq!(r.code, 0, "{}", r.all());
    let j = r.json();
    assert_eq!(j["routing_key"], q.as_str());
    assert_eq!(j["exchange"], "");
    assert_eq!(j["headers"]["x-replayed-from-dlq"], "true");
    assert!(j["headers"].get("x-death").is_none());
    assert_eq!(j["body_text"], std::str::from_utf8(BODY).unwrap());
    assert_eq!(db.show("d1")["state"], "pending");
    assert_eq!(db.show("d1")["history"], serde_json::json!([]));
    assert_eq!(rabbit.count(&q), 0);
}

#[test]
fn expect_sha256_replays_only_the_reviewed_body() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_sha");
    let db = TestDb::migrated(Backend::Postgres);
    db.add(letter("d1", &q, BODY));
    let sha = db.show("d1")["sha256"].as_str().unwrap().to_string();
    let wrong = "0".repeat(64);
    let r = db.dlq(&["replay", "d1", "--yes", "--expect-sha256", &wrong]);
    assert_eq!(r.code, 3, "{}", r.all());
    assert_eq!(r.json()["outcome"], "not_replayed");
    assert_eq!(rabbit.count(&q), 0);
    assert_eq!(db.show("d1")["state"], "pending", "claim released");
    let r = db.dlq(&["replay", "d1", "--yes", "--expect-sha256", &sha]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(rabbit.count(&q), 1);
}

#[test]
fn exchange_and_routing_key_overrides_and_missing_target() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_target");
    let x = rabbit.exchange("dlq_x");
    rabbit.bind(&q, &x, "rk.1");
    let db = TestDb::migrated(Backend::Sqlite);
    let mut l = letter("d1", "elsewhere", BODY);
    l["source_queue"] = serde_json::Value::Null;
    db.add(l);
    let r = db.dlq(&["replay", "d1", "--yes"]);
    assert_eq!(r.code, 2, "no target: {}", r.all());
    assert_eq!(
        db.show("d1")["history"],
        serde_json::json!([]),
        "nothing claimed"
    );
    let r = db.dlq(&[
        "replay",
        "d1",
        "--yes",
        "--exchange",
        &x,
        "--routing-key",
        "rk.1",
    ]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(rabbit.drain(&q).len(), 1);
}

#[test]
fn sixteen_concurrent_replays_publish_exactly_once() {
    for b in BACKENDS {
        let mut rabbit = Rabbit::new();
        let q = rabbit.queue("dlq_race");
        let db = TestDb::migrated(b);
        db.add(letter("race", &q, BODY));
        let children: Vec<_> = (0..16)
            .map(|i| {
                db.cmd()
                    .args(["replay", "race", "--yes"])
                    .env("DLQ_OPERATOR", format!("op{i}"))
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let codes: Vec<i32> = children
            .into_iter()
            .map(|c| c.wait_with_output().unwrap().status.code().unwrap())
            .collect();
        assert_eq!(
            codes.iter().filter(|c| **c == 0).count(),
            1,
            "{b:?}: {codes:?}"
        );
        // A loser that looks while the winner's attempt is open is told `uncertain` (6):
        // an open attempt is uncertain whatever its lease. Otherwise `not_replayed`.
        assert_eq!(
            codes.iter().filter(|c| **c == 3 || **c == 6).count(),
            15,
            "{b:?}: {codes:?}"
        );
        assert_eq!(rabbit.drain(&q).len(), 1, "{b:?}: one message");
    }
}

#[test]
fn leases_guard_claim_replay_release() {
    for b in BACKENDS {
        let mut rabbit = Rabbit::new();
        let q = rabbit.queue("dlq_lease");
        let db = TestDb::migrated(b);
        db.add(letter("d1", &q, BODY));
        let a = db.dlq_env(
            &["claim", "d1", "--lease", "5m"],
            &[("DLQ_OPERATOR", "alice")],
        );
        assert_eq!(a.code, 0, "{}", a.all());
        let aj = a.json();
        assert_eq!(aj["outcome"], "claimed");
        let token_a = aj["token"].as_str().unwrap().to_string();
        assert!(token_a.starts_with("alice:"));
        assert!(aj["expires_at"].is_string());

        // B cannot claim, replay or release it.
        let b_claim = db.dlq_env(&["claim", "d1"], &[("DLQ_OPERATOR", "bob")]);
        assert_eq!(b_claim.code, 3);
        assert_eq!(b_claim.json()["outcome"], "not_claimed");
        assert!(
            b_claim.json()["detail"].as_str().unwrap().contains("alice"),
            "{}",
            b_claim.stdout
        );
        let b_replay = db.dlq_env(&["replay", "d1", "--yes"], &[("DLQ_OPERATOR", "bob")]);
        assert_eq!(b_replay.code, 3, "{}", b_replay.all());
        assert!(b_replay.json()["detail"]
            .as_str()
            .unwrap()
            .contains("claimed by alice"));
        let b_release = db.dlq_env(
            &[
                "release",
                "d1",
                "--token",
                "bob:00000000-0000-4000-8000-000000000000",
            ],
            &[("DLQ_OPERATOR", "bob")],
        );
        assert_eq!(b_release.code, 3);
        assert_eq!(b_release.json()["outcome"], "not_released");
        let b_token_replay = db.dlq_env(
            &["replay", "d1", "--yes", "--token", "bob:x"],
            &[("DLQ_OPERATOR", "bob")],
        );
        assert_eq!(b_token_replay.code, 3);
        assert_eq!(rabbit.count(&q), 0);

        // A's token replays.
        let r = db.dlq_env(
            &["replay", "d1", "--yes", "--token", &token_a],
            &[("DLQ_OPERATOR", "alice")],
        );
        assert_eq!(r.code, 0, "{}", r.all());
        assert_eq!(rabbit.drain(&q).len(), 1);

        // A short lease lapses and B takes over; A's stale token can neither mark nor release.
        db.add(letter("d2", &q, BODY));
        let a = db
            .dlq_env(
                &["claim", "d2", "--lease", "1s"],
                &[("DLQ_OPERATOR", "alice")],
            )
            .json();
        let stale = a["token"].as_str().unwrap().to_string();
        std::thread::sleep(Duration::from_millis(1300));
        let bc = db.dlq_env(
            &["claim", "d2", "--lease", "5m"],
            &[("DLQ_OPERATOR", "bob")],
        );
        assert_eq!(bc.code, 0, "{}", bc.all());
        let token_b = bc.json()["token"].as_str().unwrap().to_string();
        let r = db.dlq_env(
            &["release", "d2", "--token", &stale],
            &[("DLQ_OPERATOR", "alice")],
        );
        assert_eq!(r.code, 3, "stale release: {}", r.all());
        let r = db.dlq_env(
            &["replay", "d2", "--yes", "--token", &stale],
            &[("DLQ_OPERATOR", "alice")],
        );
        assert_eq!(r.code, 3, "stale replay: {}", r.all());
        assert_eq!(rabbit.count(&q), 0);
        let s = db.show("d2");
        assert_eq!(s["state"], "claimed");
        assert_eq!(
            s["replay_claim_owner"], "bob",
            "the operator, never the token"
        );
        assert!(!db.dlq(&["show", "d2"]).stdout.contains(&token_b));
        let r = db.dlq_env(
            &["release", "d2", "--token", &token_b],
            &[("DLQ_OPERATOR", "bob")],
        );
        assert_eq!(r.code, 0, "{}", r.all());
        assert_eq!(r.json()["outcome"], "released");
        assert_eq!(db.show("d2")["state"], "pending");
        let r = db.dlq(&["claim", "nope"]);
        assert_eq!(r.code, 4);
        assert_eq!(r.json()["outcome"], "not_found");
        let r = db.dlq(&["release", "nope", "--token", "t"]);
        assert_eq!(r.code, 4);
    }
}

#[test]
fn unroutable_is_publish_failed_and_released() {
    for b in BACKENDS {
        let db = TestDb::migrated(b);
        let nowhere = unique("dlq_no_such_queue");
        db.add(letter("d1", &nowhere, BODY));
        let r = db.dlq(&["replay", "d1", "--yes"]);
        assert_eq!(r.code, 5, "{b:?}: {}", r.all());
        let j = r.json();
        assert_eq!(j["outcome"], "publish_failed");
        assert!(j["detail"].as_str().unwrap().contains("NO_ROUTE"), "{j}");
        let s = db.show("d1");
        assert_eq!(s["state"], "pending");
        assert_eq!(
            s["replay_claim_owner"],
            serde_json::Value::Null,
            "claim released"
        );
        assert!(s["last_replay_error"]
            .as_str()
            .unwrap()
            .contains("NO_ROUTE"));
    }
}

#[test]
fn nack_from_a_full_queue_is_publish_failed() {
    let mut rabbit = Rabbit::new();
    let args = refusing_queue_args();
    let q = rabbit.queue_with("dlq_full", args);
    let db = TestDb::migrated(Backend::Postgres);
    db.add(letter("d1", &q, BODY));
    // One node, said so: without it a nack is uncertain (tests/chaos/cluster.rs).
    let r = db.dlq_env(
        &["replay", "d1", "--yes"],
        &[("DLQ_BROKER_TOPOLOGY", "single")],
    );
    assert_eq!(r.code, 5, "{}", r.all());
    assert!(r.json()["detail"].as_str().unwrap().contains("nack"));
    assert_eq!(db.show("d1")["state"], "pending");
}

#[test]
fn broker_unreachable_wrong_password_missing_vhost_fail_fast_without_secrets() {
    let canary = "Canary-Pa55-7f3e";
    let db = TestDb::migrated(Backend::Sqlite);
    let dead_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    for (i, url) in [
        format!("amqp://guest:{canary}@127.0.0.1:{dead_port}/%2f"),
        format!("amqp://guest:{canary}@127.0.0.1:5672/%2f"),
        format!("amqp://guest:{canary}@127.0.0.1:5672/{}", unique("novhost")),
    ]
    .iter()
    .enumerate()
    {
        let id = format!("d{i}");
        db.add(letter(&id, "q", BODY));
        let started = Instant::now();
        let r = db.dlq_env(
            &["replay", &id, "--yes", "--connect-timeout", "3s", "-vv"],
            &[("DLQ_AMQP_URL", url)],
        );
        assert!(started.elapsed() < Duration::from_secs(20));
        assert_eq!(r.code, 5, "{url}: {}", r.all());
        assert_eq!(r.json()["outcome"], "publish_failed");
        assert!(!r.all().contains(canary), "password leaked: {}", r.all());
        let s = db.show(&id);
        assert_eq!(s["state"], "pending");
        assert!(!s.to_string().contains(canary));
    }
    // A malformed URL is a usage error and never echoes the password.
    db.add(letter("m", "q", BODY));
    let r = db.dlq_env(
        &["replay", "m", "--yes"],
        &[(
            "DLQ_AMQP_URL",
            &format!("amqp://guest:{canary}@127.0.0.1:notaport/%2f"),
        )],
    );
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(!r.all().contains(canary), "{}", r.all());
    let r = db.dlq_env(
        &["replay", "m", "--yes"],
        &[("DLQ_AMQP_URL", "amqp://guest@127.0.0.1:5672/%2f")],
    );
    assert_eq!(r.code, 2, "user without password: {}", r.all());
}

#[test]
fn verbose_and_dlq_log_show_each_protocol_step() {
    // On PostgreSQL sqlx logs its statements on the same thread, which is where a
    // per-layer EnvFilter used to drop dlq's own lines.
    for b in BACKENDS {
        let mut rabbit = Rabbit::new();
        let q = rabbit.queue("dlq_log");
        let db = TestDb::migrated(b);
        db.add(letter("d1", &q, BODY));
        db.add(letter("d2", &q, BODY));
        let runs = [
            db.dlq(&["-v", "replay", "d1", "--yes"]),
            db.dlq_env(&["replay", "d2", "--yes"], &[("DLQ_LOG", "dlq=debug")]),
        ];
        for r in runs {
            assert_eq!(r.code, 0, "{}", r.all());
            for step in [
                "claimed 1 of 1",
                "connected to RabbitMQ",
                "published 1: 1 confirmed",
                "marked 1 of 1 replayed",
            ] {
                assert!(
                    r.stderr.contains(step),
                    "{b:?}: {step:?} missing from:\n{}",
                    r.stderr
                );
            }
        }
        let quiet = db.dlq(&["replay", "d1", "--yes"]);
        assert_eq!(quiet.stderr, "", "no log lines without -v");
    }
}

#[test]
fn a_lease_that_lapses_before_publishing_is_not_used() {
    for b in BACKENDS {
        let mut rabbit = Rabbit::new();
        let q = rabbit.queue("dlq_lapse");
        let db = TestDb::migrated(b);
        db.add(letter("d1", &q, BODY));
        let claim = db.dlq(&["claim", "d1", "--lease", "2s"]);
        assert_eq!(claim.code, 0, "{}", claim.all());
        let token = claim.json()["token"].as_str().unwrap().to_string();
        // The lease is live when the replay starts and lapses while the broker answers.
        let slow = Proxy::start(
            "127.0.0.1:5672",
            OnServerBytes::Delay(Duration::from_secs(3)),
        );
        let url = format!("amqp://guest:guest@{}/%2f", slow.addr());
        let r = db.dlq_env(
            &["replay", "d1", "--yes", "--token", &token],
            &[("DLQ_AMQP_URL", &url)],
        );
        assert_eq!(r.code, 3, "{b:?}: {}", r.all());
        assert_eq!(r.json()["outcome"], "not_replayed");
        assert!(
            r.json()["detail"]
                .as_str()
                .unwrap()
                .contains("not attempted: the lease ends within"),
            "{}",
            r.stdout
        );
        assert_eq!(rabbit.count(&q), 0, "nothing was published");
        let s = db.show("d1");
        assert_eq!(s["replayed_at"], serde_json::Value::Null);
        let last = s["history"].as_array().unwrap().last().unwrap().clone();
        assert_eq!(last["outcome"], "not_replayed", "{last}");
    }
}

#[test]
fn connection_cut_before_the_confirm_is_uncertain_and_keeps_the_claim() {
    for b in BACKENDS {
        let mut rabbit = Rabbit::new();
        let q = rabbit.queue("dlq_cut");
        let proxy = Proxy::start("127.0.0.1:5672", OnServerBytes::Cut(BASIC_ACK.to_vec()));
        let db = TestDb::migrated(b);
        db.add(letter("d1", &q, BODY));
        let url = format!("amqp://guest:guest@{}/%2f", proxy.addr());
        let started = Instant::now();
        let r = db.dlq_env(
            &["replay", "d1", "--yes", "--confirm-timeout", "5s"],
            &[("DLQ_AMQP_URL", &url)],
        );
        assert!(started.elapsed() < Duration::from_secs(15));
        assert_eq!(r.code, 6, "{b:?}: {}", r.all());
        assert_eq!(r.json()["outcome"], "uncertain");
        let s = db.show("d1");
        assert_eq!(s["state"], "uncertain", "never pending: it may be out");
        assert_eq!(s["replayed_at"], serde_json::Value::Null, "not marked");
        assert!(
            s["last_replay_error"]
                .as_str()
                .unwrap()
                .contains("may or may not"),
            "{}",
            s["last_replay_error"]
        );
        assert_eq!(rabbit.drain(&q).len(), 1, "the broker did get it");
        // Nobody replays it again until an operator resolves it.
        let again = db.dlq(&["replay", "d1", "--yes"]);
        assert_eq!(again.code, 6, "{}", again.all());
        assert_eq!(rabbit.drain(&q).len(), 0);
    }
}

#[test]
fn broker_silent_after_publish_is_uncertain_within_the_timeout() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_stall");
    let proxy = Proxy::start("127.0.0.1:5672", OnServerBytes::Stall(BASIC_ACK.to_vec()));
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("d1", &q, BODY));
    let url = format!("amqp://guest:guest@{}/%2f", proxy.addr());
    let started = Instant::now();
    let r = db.dlq_env(
        &["replay", "d1", "--yes", "--confirm-timeout", "2s"],
        &[("DLQ_AMQP_URL", &url)],
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(r.code, 6, "{}", r.all());
    assert!(r.json()["detail"]
        .as_str()
        .unwrap()
        .contains("no publisher confirm"));
    assert_eq!(db.show("d1")["state"], "uncertain");
}

/// A `replay --token T` whose hand-taken lease is too short to outlive the confirm wait
/// publishes nothing and leaves the claim with its holder (it once released it).
#[test]
fn a_token_replay_refused_for_its_short_lease_leaves_the_claim_held() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_token_short");
    for b in BACKENDS {
        let db = TestDb::migrated(b);
        db.add(letter("s1", &q, BODY));
        let c = db.dlq(&["claim", "s1", "--lease", "8s"]);
        assert_eq!(c.code, 0, "{}", c.all());
        let token = c.json()["token"].as_str().unwrap().to_string();
        let r = db.dlq(&["replay", "s1", "--token", &token, "--yes"]);
        assert_eq!(r.code, 3, "{b:?}: {}", r.all());
        let j = r.json();
        assert_eq!(j["outcome"], "not_replayed");
        assert!(
            j["detail"].as_str().unwrap().contains("stays held"),
            "{b:?}: {j}"
        );
        assert!(!r.all().contains(&token), "the token is not printed");
        let s = db.show("s1");
        assert_eq!(s["state"], "claimed", "{b:?}: still held: {s}");
        assert_eq!(s["replay_claim_owner"], "tester");
        assert!(s["replay_attempt_at"].is_null());
        assert_eq!(rabbit.count(&q), 0, "nothing published");
        // The holder can still give it back.
        let r = db.dlq(&["release", "s1", "--token", &token]);
        assert_eq!(r.code, 0, "{b:?}: {}", r.all());
        assert_eq!(db.show("s1")["state"], "pending");
    }
}
