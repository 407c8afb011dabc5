//! Settling: a replay that has published may still mark its row until its lease ends, so
//! nothing short of that end lets `resolve` decide (docs/replay-protocol.md, "Settling").
//! Also: a busy store delays the mark but never turns a confirm into doubt.

use super::*;
use crate::common::*;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[test]
fn a_replay_killed_before_its_confirm_is_uncertain_to_an_immediate_rerun() {
    // Once broke: the rerun said not_replayed (exit 3) while the dead run's lease ran.
    for b in [Backend::Postgres, Backend::Sqlite] {
        let mut rabbit = Rabbit::new();
        let q = rabbit.queue("dlq_kill_single");
        let db = TestDb::migrated(b);
        db.add(letter("k1", &q, BODY));
        // The broker takes the message; its confirm never reaches dlq.
        let proxy = Proxy::start("127.0.0.1:5672", OnServerBytes::Stall(BASIC_ACK.to_vec()));
        let mut child = db
            .cmd()
            .args([
                "--connect-timeout",
                "2s",
                "replay",
                "k1",
                "--yes",
                "--confirm-timeout",
                "10s",
                "--lease",
                "20s",
            ])
            .env(
                "DLQ_AMQP_URL",
                format!("amqp://guest:guest@{}/%2f", proxy.addr()),
            )
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let started = Instant::now();
        while rabbit.count(&q) == 0 {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "never published"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // While the run lives, it may still settle the row: resolve waits, on both stores.
        let s = db.show("k1");
        assert_eq!(s["state"], "uncertain", "{b:?}: {s}");
        assert_eq!(s["settling"], "running", "{b:?}: {s}");
        let r = db.dlq(&["resolve", "k1", "--not-delivered", "--note", "too early"]);
        assert_eq!(r.code, 3, "{b:?}: the run is alive: {}", r.all());
        signal(&child, "KILL");
        child.wait().unwrap();
        let r = db.dlq(&["replay", "k1", "--yes"]);
        assert_eq!(r.code, 6, "{b:?}: {}", r.all());
        assert_eq!(r.json()["outcome"], "uncertain");
        let r = db.dlq(&["claim", "k1"]);
        assert_eq!(r.code, 6, "{b:?}: claim: {}", r.all());
        assert_eq!(db.ids(&["--state", "uncertain"]), vec!["k1"]);
        assert_eq!(rabbit.drain(&q).len(), 1, "{b:?}: published once");
        // Killed, it is no proof that the run is gone on either store: resolve waits for
        // the lease, and says until when.
        let s = db.show("k1");
        assert_eq!(s["settling"], "running", "{b:?}: {s}");
        let until = s["settling_until"].as_str().unwrap().to_string();
        let r = db.dlq(&["resolve", "k1", "--not-delivered", "--note", "checked"]);
        assert_eq!(r.code, 3, "{b:?}: {}", r.all());
        assert!(
            r.json()["detail"].as_str().unwrap().contains(&until[..16]),
            "{b:?}: {}",
            r.stdout
        );
        let table = db.dlq(&["-o", "table", "show", "k1"]).stdout;
        assert!(table.contains("settling until:"), "{b:?}: {table}");
        // Once the lease has ended, resolve decides.
        let started = Instant::now();
        while db.show("k1")["settling"] == "running" {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "{b:?}: lease never ended"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        assert_eq!(db.show("k1")["settling"], "ended", "{b:?}");
        let r = db.dlq(&["resolve", "k1", "--not-delivered", "--note", "checked"]);
        assert_eq!(r.code, 0, "{b:?}: {}", r.all());
        assert_eq!(db.show("k1")["state"], "pending", "{b:?}");
    }
}

/// A replay whose database goes away right after the broker's confirm, through proxies
/// of the test's own: `--settle-timeout` bounds the mark's retry.
fn replay_losing_the_database(
    rabbit: &mut Rabbit,
    db: &TestDb,
    settle: &str,
) -> (std::process::Child, String) {
    let q = rabbit.queue("dlq_dblost");
    db.add(letter("d1", &q, BODY));
    let proxies = DbCutAtConfirm::start();
    let child = proxies.spawn(
        db,
        &[
            "replay",
            "d1",
            "--yes",
            "--connect-timeout",
            "1s",
            "--lease",
            "5m",
            "--settle-timeout",
            settle,
        ],
    );
    // The proxies live as long as the test's process: leak them with the child.
    std::mem::forget(proxies);
    (child, q)
}

/// Reads stderr until a line containing `what`, within `within`; returns it.
fn stderr_line(child: &mut std::process::Child, what: &str, within: Duration) -> String {
    use std::io::BufRead;
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let end = Instant::now() + within;
    let mut seen = Vec::new();
    while let Ok(line) = rx.recv_timeout(end.saturating_duration_since(Instant::now())) {
        if line.contains(what) {
            return line;
        }
        seen.push(line);
    }
    panic!("no stderr line with {what:?} within {within:?}: {seen:?}");
}

#[test]
fn database_lost_after_the_confirm_is_uncertain_within_the_settle_timeout() {
    // Once broke: the mark was retried until the lease ended (5 minutes), in silence.
    let mut rabbit = Rabbit::new();
    let db = TestDb::migrated(Backend::Postgres);
    let started = Instant::now();
    let (mut child, q) = replay_losing_the_database(&mut rabbit, &db, "3s");
    let line = stderr_line(&mut child, "retrying", Duration::from_secs(5));
    assert!(
        line.contains("--settle-timeout 3s") && line.contains("Ctrl-C leaves them uncertain"),
        "{line}"
    );
    let out = child.wait_with_output().unwrap();
    let took = started.elapsed();
    assert_eq!(
        out.status.code(),
        Some(6),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(took < Duration::from_secs(15), "{took:?}");
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["outcome"], "uncertain");
    assert!(
        j["detail"].as_str().unwrap().contains("WAS published"),
        "{j}"
    );
    assert_eq!(rabbit.drain(&q).len(), 1, "published once");
    let s = db.show("d1");
    assert_eq!(s["replayed_at"], serde_json::Value::Null, "not marked");
    assert_eq!(
        s["state"], "uncertain",
        "an open attempt, whatever its lease"
    );
    assert_eq!(db.ids(&["--state", "uncertain"]), vec!["d1"]);
}

#[test]
fn interrupt_during_the_settle_wait_ends_it_at_once_as_uncertain() {
    let mut rabbit = Rabbit::new();
    let db = TestDb::migrated(Backend::Postgres);
    let (mut child, q) = replay_losing_the_database(&mut rabbit, &db, "60s");
    // A long settle timeout: only the signal can end the wait this soon.
    stderr_line(&mut child, "retrying", Duration::from_secs(5));
    let signalled = Instant::now();
    signal(&child, "INT");
    let out = child.wait_with_output().unwrap();
    assert!(
        signalled.elapsed() < Duration::from_secs(2),
        "{:?}",
        signalled.elapsed()
    );
    assert_eq!(
        out.status.code(),
        Some(6),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["outcome"], "uncertain", "{j}");
    assert_eq!(rabbit.drain(&q).len(), 1, "published once");
    assert_eq!(db.show("d1")["state"], "uncertain");
}

#[test]
fn database_back_before_the_lease_ends_gets_the_mark() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_dbback");
    let db = TestDb::migrated(Backend::Postgres);
    db.add(letter("d1", &q, BODY));
    let proxies = DbCutAtConfirm::start();
    // The database comes back two seconds after it went away.
    let cut = proxies.pg.cut.clone();
    let healer = std::thread::spawn(move || {
        while !cut.load(std::sync::atomic::Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_secs(2));
        cut.store(false, std::sync::atomic::Ordering::SeqCst);
    });
    let r = proxies.run(
        &db,
        &[
            "replay",
            "d1",
            "--yes",
            "--connect-timeout",
            "2s",
            "--lease",
            "30s",
            "-v",
        ],
    );
    healer.join().unwrap();
    assert_eq!(r.code, 0, "{}", r.all());
    assert!(r.stderr.contains("retrying"), "{}", r.stderr);
    assert_eq!(db.show("d1")["state"], "replayed");
    assert_eq!(rabbit.drain(&q).len(), 1);
}

#[test]
fn a_replay_still_retrying_its_mark_after_a_lost_connection_is_not_taken_for_gone() {
    // Once broke: its lost session freed its run lock, show said run_gone and resolve went ahead.
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_lockloss");
    let db = TestDb::migrated(Backend::Postgres);
    db.add(letter("lk-1", &q, b"{\"event_id\":\"evt-lk-1\"}"));
    // The replay's database connection is cut as the broker's confirm passes.
    let proxies = DbCutAtConfirm::start();
    let mut child = proxies.spawn(&db, &["--settle-timeout", "25s", "replay", "lk-1", "--yes"]);
    let pg = &proxies.pg;
    // Wait for the confirmed message to be in the queue and the database to be cut.
    let t0 = Instant::now();
    while !(rabbit.count(&q) == 1 && pg.cut.load(std::sync::atomic::Ordering::SeqCst)) {
        assert!(t0.elapsed() < Duration::from_secs(15), "no publish");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Time for PostgreSQL to end the cut session (and drop its advisory lock).
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the replay should still be retrying its mark"
    );
    let shown = db.show("lk-1");
    let resolve = db.dlq(&[
        "resolve",
        "lk-1",
        "--not-delivered",
        "--note",
        "the consumer has not seen it yet",
        "--yes",
    ]);
    let still_running = child.try_wait().unwrap().is_none();
    // The database comes back; the replay's mark retry reaches it.
    pg.cut.store(false, std::sync::atomic::Ordering::SeqCst);
    let out = child.wait_with_output().unwrap();
    let end = db.show("lk-1");
    let in_queue = rabbit.drain(&q).len();
    let report = format!(
        "show while the run lived: settling={} state={}; resolve (run alive: {still_running}): exit {} {}; replay: exit {:?} {} {}; final state {} with {in_queue} message(s) in the queue",
        shown["settling"],
        shown["state"],
        resolve.code,
        resolve.stdout.trim(),
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).trim(),
        String::from_utf8_lossy(&out.stderr).trim(),
        end["state"],
    );
    // Nothing short of the lease end shows the run gone: resolve waits, naming the time.
    assert_eq!(shown["state"], "uncertain", "{report}");
    assert_eq!(shown["settling"], "running", "{report}");
    let until = shown["settling_until"].as_str().unwrap();
    assert_eq!(
        resolve.code, 3,
        "resolve must wait while the run settles: {report}"
    );
    let detail = resolve.json()["detail"].as_str().unwrap().to_string();
    assert!(detail.contains(&until[..16]), "{detail}");
    // So the run's mark, once the database is back, settles it: one copy, replayed.
    assert_eq!(out.status.code(), Some(0), "{report}");
    assert_eq!(end["state"], "replayed", "{report}");
    assert_eq!(in_queue, 1, "{report}");
}

#[test]
fn a_busy_store_delays_the_mark_but_never_turns_a_confirm_into_doubt() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_v2_busy");
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("b1", &q, AMOUNT_BODY));
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
