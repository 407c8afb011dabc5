//! Lock waits and writer contention: bounded, named and retryable.

use crate::common::*;
use std::time::{Duration, Instant};

#[test]
fn postgres_lock_waits_are_bounded_and_named() {
    let db = TestDb::migrated(Backend::Postgres);
    db.add(letter("d1", "q", SMALL_BODY));
    let url = db.url.clone();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (held_tx, held_rx) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        rt().block_on(async move {
            let pool = sqlx::PgPool::connect(&url).await.unwrap();
            let mut t = pool.begin().await.unwrap();
            sqlx::query("SELECT id FROM dead_letters WHERE id = 'd1' FOR UPDATE")
                .execute(&mut *t)
                .await
                .unwrap();
            held_tx.send(()).unwrap();
            let _ = rx.recv_timeout(Duration::from_secs(30));
            t.rollback().await.unwrap();
        })
    });
    held_rx.recv().unwrap();
    let started = Instant::now();
    let r = db.dlq(&["claim", "d1", "--lock-timeout", "1s"]);
    assert!(started.elapsed() < Duration::from_secs(8));
    assert_eq!(r.code, 1, "{}", r.all());
    assert!(r.stderr.contains("lock wait timed out"), "{}", r.stderr);
    tx.send(()).unwrap();
    holder.join().unwrap();
    assert_eq!(db.show("d1")["state"], "pending");
}

#[test]
fn sqlite_writer_contention_is_clear_and_retryable() {
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("d1", "q", SMALL_BODY));
    let hold = |ms: u64| {
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
    };
    let h = hold(4000);
    let r = db.dlq(&["claim", "d1", "--lock-timeout", "1s"]);
    assert_eq!(r.code, 1, "{}", r.all());
    assert!(
        r.stderr.contains("locked") && r.stderr.contains("try again"),
        "{}",
        r.stderr
    );
    h.join().unwrap();
    assert_eq!(db.show("d1")["state"], "pending", "no change");
    let h = hold(500);
    let r = db.dlq(&["claim", "d1", "--lock-timeout", "5s"]);
    assert_eq!(r.code, 0, "a shorter hold just waits: {}", r.all());
    h.join().unwrap();
}
