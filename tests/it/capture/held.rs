//! What capture holds when bodies are large: the prefetch the broker grants follows the
//! largest body seen, so the unacked messages stay within a byte budget; and every
//! message is still stored once and acked.

use super::*;
use crate::common::*;
use std::process::Stdio;

const MIB: usize = 1024 * 1024;

/// Dead-letters `n` distinct bodies of `size` bytes (at least 8), or `n` empty ones.
fn fill_large(dlx: &Dlx, n: usize, size: usize) {
    for i in 0..n {
        let mut body = vec![b'x'; size];
        if size > 0 {
            body[..8].copy_from_slice(format!("{i:08}").as_bytes());
        }
        dlx.publish(&body, BasicProperties::default());
    }
    dlx.refuse(n, false);
}

/// The prefetch of each consumer of `queue` in the default vhost, as the broker reports it.
fn prefetch_counts(queue: &str) -> Vec<u64> {
    let out = std::process::Command::new("rabbitmqctl")
        .args(["-q", "--no-table-headers", "list_consumers", "-p", "/"])
        .args(["queue_name", "prefetch_count"])
        .output()
        .expect("this test reads the consumer's prefetch with rabbitmqctl");
    assert!(out.status.success(), "rabbitmqctl: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .filter(|(q, _)| *q == queue)
        .map(|(_, n)| n.trim().parse().unwrap())
        .collect()
}

/// Starts a capture of the whole queue with `args`, into `db`.
fn spawn_capture(db: &TestDb, dlx: &Dlx, args: &[&str]) -> std::process::Child {
    db.cmd()
        .args(["capture", "--queue", &dlx.dlq])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The run ended well, stored each of the `n` messages once, and left the queue empty.
fn finished(child: std::process::Child, db: &TestDb, dlx: &Dlx, n: i64) {
    let out = Run::from(child.wait_with_output().unwrap());
    assert_eq!(out.code, 0, "{}", out.all());
    assert_eq!(out.json()["captured"], n, "{}", out.stdout);
    assert_exactly_once(db, n);
    assert_eq!(dlx.rabbit.count(&dlx.dlq), 0, "the queue is empty");
    assert_eq!(consumers(&dlx.rabbit, &dlx.dlq), 0, "no consumer left");
}

/// Once broke: the prefetch was `--batch` x 4 messages (2,000) whatever their size, so a
/// queue of large messages was pushed whole into the consumer's memory.
#[test]
fn large_bodies_lower_the_prefetch_the_broker_grants() {
    let db = TestDb::migrated(Backend::Postgres);
    let dlx = Dlx::new(&[], &[]);
    fill_large(&dlx, 40, 2 * MIB);
    let held = WritesHeld::on(&db);
    let child = spawn_capture(&db, &dlx, &[]);
    // Nothing is stored while the writes are held: all 40 end up delivered and unacked.
    wait_until("all 40 delivered", 60, || dlx.rabbit.count(&dlx.dlq) == 0);
    let prefetch = prefetch_counts(&dlx.dlq);
    held.release();
    // The default budget is 256 MiB: at most 128 bodies of 2 MiB.
    assert_eq!(prefetch.len(), 1, "one consumer: {prefetch:?}");
    assert!(prefetch[0] <= 128, "prefetch {prefetch:?}");
    finished(child, &db, &dlx, 40);
}

/// `--max-held-bytes` bounds what the broker hands over: with 16 MiB and bodies of 2 MiB,
/// at most 8 messages wait unacked (plus the one that showed their size).
#[test]
fn max_held_bytes_bounds_the_unacked_messages() {
    let db = TestDb::migrated(Backend::Postgres);
    let dlx = Dlx::new(&[], &[]);
    fill_large(&dlx, 40, 2 * MIB);
    let held = WritesHeld::on(&db);
    let child = spawn_capture(&db, &dlx, &["--max-held-bytes", "16MiB"]);
    wait_until("the first batches delivered", 60, || {
        waiting_for_a_lock(&db, "AND query LIKE 'INSERT INTO dead_letters%'") >= 1
    });
    // A while for the broker to hand over whatever the prefetch lets through.
    let mut least_ready = u32::MAX;
    for _ in 0..20 {
        least_ready = least_ready.min(dlx.rabbit.count(&dlx.dlq));
        std::thread::sleep(Duration::from_millis(100));
    }
    held.release();
    assert!(least_ready >= 40 - 9, "{} unacked", 40 - least_ready);
    finished(child, &db, &dlx, 40);
}

/// Once broke (before this was released): an empty first body was never "larger than any
/// before", so the first few-message prefetch stayed and small messages crawled.
#[test]
fn empty_bodies_get_the_whole_prefetch() {
    let db = TestDb::migrated(Backend::Postgres);
    let dlx = Dlx::new(&[], &[]);
    fill_large(&dlx, 40, 0);
    let held = WritesHeld::on(&db);
    let child = spawn_capture(&db, &dlx, &[]);
    wait_until("all 40 delivered", 60, || dlx.rabbit.count(&dlx.dlq) == 0);
    let prefetch = prefetch_counts(&dlx.dlq);
    held.release();
    assert_eq!(prefetch, vec![2000], "--batch 500 x 4");
    let out = Run::from(child.wait_with_output().unwrap());
    assert_eq!(out.json()["captured"], 40, "{}", out.all());
    assert_eq!(rows(&db), 40);
    assert_eq!(dlx.rabbit.count(&dlx.dlq), 0, "the queue is empty");
}
