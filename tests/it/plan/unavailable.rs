//! A plan run that can go no further (its database gone, a claim that cannot be made)
//! once something was sent: it settles what it can and ends with its summary.

use super::*;
use crate::common::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[test]
fn a_database_cut_for_good_mid_plan_ends_with_the_summary_and_exit_6() {
    // Once broke: `dlq: error: database: connection lost`, exit 1, no summary.
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_v2_dbgone");
    let db = TestDb::migrated(Backend::Postgres);
    seed(&db, &q, 1000, "g");
    let plan = db.plan_file(&["--limit", "1000"]);
    // The database goes away for good when the broker's first confirm passes.
    let proxies = DbCutAtConfirm::start();
    let started = Instant::now();
    let r = proxies.run(
        &db,
        &[
            "replay",
            "--plan",
            plan.path().to_str().unwrap(),
            "--yes",
            "--rate",
            "200/s",
            "--connect-timeout",
            "1s",
            "--settle-timeout",
            "2s",
        ],
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(r.code, 6, "{}", r.all());
    let s = summary_of(&r);
    assert_eq!(s["stopped"], "unavailable", "{s}");
    assert_eq!(s["unavailable"], "database", "{s}");
    assert_eq!(
        s["counts"]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_u64().unwrap())
            .sum::<u64>(),
        1000
    );
    // One line for the rows whose doubt could not be written, not one per row.
    let not_recorded = r
        .stderr
        .lines()
        .filter(|l| l.contains("could not record"))
        .count();
    assert!(not_recorded <= 1, "{}", r.stderr);
    assert!(!r.stderr.contains("nothing was changed"), "{}", r.stderr);
    // Every item the run sent is uncertain (its attempt is recorded) or replayed.
    let delivered = per_id(&rabbit.drain(&q));
    assert!(!delivered.is_empty());
    for id in delivered.keys() {
        let state = db.show(id)["state"].clone();
        assert!(state == "uncertain" || state == "replayed", "{id}: {state}");
    }
}

#[test]
fn a_busy_sqlite_file_mid_plan_ends_with_the_summary_and_a_true_exit_code() {
    // Once broke: after three claim retries, "the database is locked ...; nothing was
    // changed, try again", exit 1, no summary, with 1,200 items already sent.
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_v2_busyplan");
    let db = TestDb::migrated(Backend::Sqlite);
    seed(&db, &q, 1000, "s");
    let plan = db.plan_file(&["--limit", "1000"]);
    let child = db
        .cmd()
        .args([
            "replay",
            "--plan",
            plan.path().to_str().unwrap(),
            "--yes",
            "--rate",
            "200/s",
        ])
        .args(["--lock-timeout", "300ms", "--settle-timeout", "2s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while db.scalar("SELECT count(*) FROM dead_letters WHERE replayed_at IS NOT NULL") == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "nothing replayed"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // Read its output meanwhile: a full pipe would stall the run, not the database.
    let output = std::thread::spawn(move || Run::from(child.wait_with_output().unwrap()));
    // Another writer holds the file's write lock for longer than the settle timeout.
    let url = db.url.clone();
    let locked = Arc::new(AtomicBool::new(false));
    let held = locked.clone();
    rt().block_on(async move {
        use sqlx::Connection;
        let mut c = sqlx::SqliteConnection::connect(&url).await.unwrap();
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut c)
            .await
            .unwrap();
        held.store(true, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(6)).await;
        sqlx::query("COMMIT").execute(&mut c).await.unwrap();
    });
    let r = output.join().unwrap();
    assert!(locked.load(Ordering::SeqCst));
    assert!(r.code == 3 || r.code == 6, "never 1: {}", r.all());
    let s = summary_of(&r);
    assert_eq!(s["stopped"], "unavailable", "{s}");
    assert!(!r.stderr.contains("nothing was changed"), "{}", r.stderr);
    assert!(r.stderr.contains("retrying"), "{}", r.stderr);
    for (id, n) in per_id(&rabbit.drain(&q)) {
        assert_eq!(n, 1, "{id} delivered twice");
    }
}

#[test]
fn a_claim_failing_in_one_worker_while_the_other_is_in_flight_still_ends_with_the_summary() {
    // Once broke: exit 1 and no summary, the other worker's published batch not yet counted.
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_r1_twoworkers");
    let db = TestDb::migrated(Backend::Postgres);
    for id in ["w1-a", "w1-b"] {
        db.add(letter(
            id,
            &q,
            format!("{{\"event_id\":\"evt-{id}\"}}").as_bytes(),
        ));
    }
    let plan = db.plan_file(&["--limit", "10"]);
    // The broker's ack is held back: the worker that publishes waits for its confirm.
    let amqp = Proxy::start("127.0.0.1:5672", OnServerBytes::Stall(BASIC_ACK.to_vec()));
    // Hold a row lock on one row, so that the other worker's claim fails (lock_timeout).
    let rt = rt();
    let (pool, tx) = rt.block_on(async {
        let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
        let mut tx = pool.begin().await.unwrap();
        sqlx::query("SELECT id FROM dead_letters WHERE id = 'w1-b' FOR UPDATE")
            .execute(&mut *tx)
            .await
            .unwrap();
        (pool, tx)
    });
    let started = Instant::now();
    let r = db.dlq_env(
        &[
            "--lock-timeout",
            "1s",
            "replay",
            "--plan",
            plan.path().to_str().unwrap(),
            "--yes",
            "--batch-size",
            "1",
            "--workers",
            "2",
            "--confirm-timeout",
            "3s",
        ],
        &[(
            "DLQ_AMQP_URL",
            &format!("amqp://guest:guest@{}/%2f", amqp.addr()),
        )],
    );
    rt.block_on(async {
        tx.rollback().await.unwrap();
        pool.close().await;
    });
    assert!(started.elapsed() < Duration::from_secs(60));
    // The message went out: it is in the queue, and its row is uncertain.
    let delivered = per_id(&rabbit.drain(&q));
    assert_eq!(delivered.get("w1-a"), Some(&1), "{}", r.all());
    assert_eq!(db.show("w1-a")["state"], "uncertain", "{}", r.all());
    // So the run must end with its summary and exit 6, never 1.
    assert_eq!(r.code, 6, "exit code once something was sent: {}", r.all());
    let s = summary_of(&r);
    assert_eq!(s["worst"], "uncertain", "{s}");
    assert_eq!(s["stopped"], "unavailable", "{s}");
    assert_eq!(s["unavailable"], "database", "{s}");
}
