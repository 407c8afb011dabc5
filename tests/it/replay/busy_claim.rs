//! A single replay on a busy SQLite file retries its claim like its mark (issue 26 item
//! 4; the plan's case is in tests/it/plan/unavailable.rs), bounded by the settle
//! timeout, and says what it did.

use crate::common::*;
use std::time::Duration;

/// Holds the file's write lock from before the replay starts for `ms`.
fn hold_write_lock(db: &TestDb, ms: u64) -> std::thread::JoinHandle<()> {
    let url = db.url.clone();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        rt().block_on(async move {
            use sqlx::Connection;
            let mut c = sqlx::SqliteConnection::connect(&url).await.unwrap();
            sqlx::query("BEGIN IMMEDIATE")
                .execute(&mut c)
                .await
                .unwrap();
            ready_tx.send(()).unwrap();
            tokio::time::sleep(Duration::from_millis(ms)).await;
            sqlx::query("COMMIT").execute(&mut c).await.unwrap();
        })
    });
    ready_rx.recv().unwrap();
    h
}

#[test]
fn a_single_replay_retries_its_claim_on_a_busy_file() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_busy_claim");
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("c1", &q, b"{\"n\":1}"));
    let h = hold_write_lock(&db, 1500);
    let r = db.dlq(&[
        "replay",
        "c1",
        "--yes",
        "--lock-timeout",
        "200ms",
        "--settle-timeout",
        "10s",
        "-v",
    ]);
    h.join().unwrap();
    assert_eq!(r.code, 0, "{}", r.all());
    assert!(
        r.stderr.contains("retrying"),
        "the claim was retried: {}",
        r.stderr
    );
    assert_eq!(db.show("c1")["state"], "replayed");
    assert_eq!(rabbit.drain(&q).len(), 1);
}

#[test]
fn a_single_replay_whose_claim_stays_busy_says_nothing_was_published() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_busy_claim_gone");
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("c2", &q, b"{\"n\":2}"));
    let h = hold_write_lock(&db, 5000);
    let r = db.dlq(&[
        "replay",
        "c2",
        "--yes",
        "--lock-timeout",
        "200ms",
        "--settle-timeout",
        "1s",
    ]);
    h.join().unwrap();
    assert_ne!(r.code, 0, "{}", r.all());
    assert!(r.stderr.contains("locked"), "{}", r.stderr);
    assert_eq!(db.show("c2")["state"], "pending");
    assert_eq!(rabbit.drain(&q).len(), 0, "nothing published");
}
