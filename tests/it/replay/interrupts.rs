//! Signals during a replay: SIGTERM before publishing releases the claim (exit 130);
//! SIGINT while waiting for the confirm is uncertain and recorded.

use crate::common::*;
use std::process::Stdio;
use std::time::{Duration, Instant};

#[test]
fn sigterm_before_publishing_releases_the_claim_and_exits_130() {
    let hole = Proxy::start("127.0.0.1:1", OnServerBytes::Blackhole);
    let db = TestDb::migrated(Backend::Postgres);
    db.add(letter("d1", "q", SMALL_BODY));
    let child = db
        .cmd()
        .args([
            "replay",
            "d1",
            "--yes",
            "--connect-timeout",
            "30s",
            "--lease",
            "5m",
        ])
        .env(
            "DLQ_AMQP_URL",
            format!("amqp://guest:guest@{}/%2f", hole.addr()),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        db.show("d1")["state"],
        "claimed",
        "claimed while the broker hangs"
    );
    let started = Instant::now();
    signal(&child, "TERM");
    let r = Run::from(child.wait_with_output().unwrap());
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(r.code, 130, "{}", r.all());
    assert_eq!(r.json()["outcome"], "interrupted");
    let s = db.show("d1");
    assert_eq!(s["state"], "pending", "claim released");
    assert!(s["history"]
        .as_array()
        .unwrap()
        .iter()
        .any(|h| h["outcome"] == "interrupted"));
}

#[test]
fn sigint_while_waiting_for_the_confirm_is_uncertain_and_recorded() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_h_int");
    let proxy = Proxy::start("127.0.0.1:5672", OnServerBytes::Stall(BASIC_ACK.to_vec()));
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("d1", &q, SMALL_BODY));
    let child = db
        .cmd()
        .args(["replay", "d1", "--yes", "--confirm-timeout", "60s"])
        .env(
            "DLQ_AMQP_URL",
            format!("amqp://guest:guest@{}/%2f", proxy.addr()),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Interrupt once the broker has the message and dlq waits for the confirm.
    let waited = Instant::now();
    while rabbit.count(&q) == 0 {
        assert!(
            waited.elapsed() < Duration::from_secs(20),
            "never published"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    signal(&child, "INT");
    let r = Run::from(child.wait_with_output().unwrap());
    assert_eq!(r.code, 6, "{}", r.all());
    let s = db.show("d1");
    assert_eq!(s["state"], "uncertain");
    assert_eq!(s["replayed_at"], serde_json::Value::Null);
    assert!(
        s["last_replay_error"]
            .as_str()
            .unwrap()
            .contains("interrupted"),
        "{s}"
    );
    assert!(s["history"]
        .as_array()
        .unwrap()
        .iter()
        .any(|h| h["outcome"] == "uncertain"));
    assert_eq!(rabbit.count(&q), 1, "it did reach the broker");
}
