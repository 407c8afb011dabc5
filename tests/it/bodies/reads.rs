//! The read of a claimed body after the claim (`held`): a lease that lapses meanwhile, a
//! lost connection (read again), SIGTERM during the read.

use crate::common::*;
use std::process::Stdio;
use std::time::Duration;

/// (a) Replay A claims a large body with a short lease and its `held` read is held up
/// until the lease has lapsed; replay B then claims, publishes and marks the row. When
/// A's read completes, A must not publish it again (its attempt is token-guarded).
#[test]
fn a_lease_lapsing_during_the_body_read_never_publishes_twice() {
    let mut rabbit = Rabbit::new();
    let queue = rabbit.queue("rf_lapse");
    let db = TestDb::migrated(Backend::Postgres);
    let b = noise(11, 3 * MIB);
    db.add(letter("big", &queue, &b));
    let mut gate = SliceGate::close(&db, true);
    let a = db
        .cmd()
        .args([
            "replay",
            "big",
            "--yes",
            "--lease",
            "6s",
            "--confirm-timeout",
            "1s",
            "--connect-timeout",
            "1s",
            "--lock-timeout",
            "60s",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    gate.waiting("A");
    // A's lease lapses while it waits.
    std::thread::sleep(Duration::from_secs(7));
    let second = db.dlq(&["replay", "big", "--yes"]);
    gate.open();
    let a = a.wait_with_output().unwrap();
    let a = Run::from(a);
    eprintln!(
        "A: {} {}\nB: {} {}",
        a.code,
        a.all(),
        second.code,
        second.all()
    );
    assert_eq!(second.code, 0, "{}", second.all());
    assert_eq!(second.json()["outcome"], "replayed");
    assert_eq!(a.code, 3, "A: {}", a.all());
    let got = rabbit.drain(&queue);
    assert_eq!(got.len(), 1, "published {} times", got.len());
    assert!(got[0].body == b);
}

/// (c) A plan run whose `held` reads lose their connection (each backend reading a slice
/// is terminated): the reads are tried again, and every row is published once and marked
/// replayed; none is left claimed or with an open attempt. (It used to release the batch
/// and stop; a body that cannot be read at all still does, see big_bodies.rs.)
#[test]
fn a_plan_run_whose_body_read_loses_its_connection_reads_again() {
    let mut rabbit = Rabbit::new();
    let queue = rabbit.queue("rf_cut");
    let db = TestDb::migrated(Backend::Postgres);
    let small = noise(1, 1000);
    let big = noise(2, 3 * MIB);
    db.add(letter("a-small", &queue, &small));
    db.add(letter("b-big", &queue, &big));
    db.add(letter("c-big", &queue, &big));
    let r = db.dlq(&["plan", "--source-queue", &queue]);
    assert_eq!(r.code, 0, "{}", r.all());
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), &r.stdout).unwrap();
    // The plan's order: make sure a-small comes first.
    let order: Vec<String> = serde_json::from_str::<serde_json::Value>(&r.stdout)
        .ok()
        .and_then(|v| {
            v["items"].as_array().map(|a| {
                a.iter()
                    .map(|i| i["id"].as_str().unwrap_or_default().to_string())
                    .collect()
            })
        })
        .unwrap_or_default();
    eprintln!("plan order: {order:?}");
    let mut gate = SliceGate::close(&db, false);
    let child = db
        .cmd()
        .args([
            "replay",
            "--plan",
            f.path().to_str().unwrap(),
            "--yes",
            "--batch-size",
            "1",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pids = gate.waiting("the plan run");
    for pid in pids {
        gate.terminate(pid);
    }
    gate.open();
    let run = child.wait_with_output().unwrap();
    let run = Run::from(run);
    eprintln!("run: {} {}", run.code, run.all());
    let got = rabbit.drain(&queue);
    let counts = per_id(&got);
    for (id, n) in &counts {
        assert_eq!(*n, 1, "{id} published {n} times");
    }
    for m in &got {
        let id = m.headers["x-dead-letter-id"].as_str().unwrap();
        let want = if id == "a-small" { &small } else { &big };
        assert!(m.body == *want, "{id}: another body was published");
    }
    // Every row: replayed iff published, never left claimed or uncertain.
    for id in ["a-small", "b-big", "c-big"] {
        let replayed = db.scalar(&format!(
            "SELECT count(*) FROM dead_letters WHERE id = '{id}' AND replayed_at IS NOT NULL"
        ));
        assert_eq!(
            replayed,
            counts.get(id).copied().unwrap_or(0) as i64,
            "{id}: replayed mark vs published"
        );
        let stuck = db.scalar(&format!(
            "SELECT count(*) FROM dead_letters WHERE id = '{id}' AND replayed_at IS NULL \
             AND (replay_claim_owner IS NOT NULL OR replay_attempt_at IS NOT NULL)"
        ));
        assert_eq!(stuck, 0, "{id} left claimed/attempted: {}", run.all());
    }
    // A lost connection is transient: the read is tried again and the run completes.
    assert_eq!(run.code, 0, "{}", run.all());
    for id in ["a-small", "b-big", "c-big"] {
        assert_eq!(counts.get(id), Some(&1), "{id}: {}", run.all());
    }
}

/// SIGTERM while `held` reads a large body (after the claim, before anything is sent):
/// the row is released, nothing is published, and the run exits 130.
#[test]
fn sigterm_during_the_body_read_releases_and_publishes_nothing() {
    let mut rabbit = Rabbit::new();
    let queue = rabbit.queue("rf_term");
    let db = TestDb::migrated(Backend::Postgres);
    let b = noise(5, 3 * MIB);
    db.add(letter("big", &queue, &b));
    let mut gate = SliceGate::close(&db, false);
    let child = db
        .cmd()
        .args(["replay", "big", "--yes", "--lock-timeout", "60s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    gate.waiting("the replay");
    signal(&child, "TERM");
    std::thread::sleep(Duration::from_millis(300));
    gate.open();
    let out = child.wait_with_output().unwrap();
    let r = Run::from(out);
    eprintln!("{} {}", r.code, r.all());
    assert_eq!(rabbit.count(&queue), 0, "published after SIGTERM");
    assert_eq!(
        db.scalar(
            "SELECT count(*) FROM dead_letters WHERE id = 'big' AND replayed_at IS NULL \
             AND replay_claim_owner IS NULL AND replay_attempt_at IS NULL"
        ),
        1,
        "left claimed: {}",
        r.all()
    );
    assert_eq!(r.code, 130, "{}", r.all());
}

/// The connection that reads the claimed row's body is killed mid-read: `replay` used to
/// release the claim and exit 1 with a bare database error. A lost connection is
/// transient: the read is tried again (the row is still held by the lease) and the row
/// is published once. (A body that cannot be read at all is `not_replayed`: see
/// big_bodies.rs `a_body_that_cannot_be_read_whole_is_neither_published_nor_shown_cut`.)
#[test]
fn a_body_read_cut_by_a_lost_connection_is_read_again_and_published_once() {
    let mut rabbit = Rabbit::new();
    let queue = rabbit.queue("rf_doc");
    let db = TestDb::migrated(Backend::Postgres);
    db.add(letter("big", &queue, &noise(8, 3 * MIB)));
    let mut gate = SliceGate::close(&db, false);
    let child = db
        .cmd()
        .args(["replay", "big", "--yes", "--lock-timeout", "60s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    for pid in gate.waiting("the replay") {
        gate.terminate(pid);
    }
    gate.open();
    let out = child.wait_with_output().unwrap();
    let r = Run::from(out);
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(r.json()["outcome"], "replayed", "{}", r.all());
    assert_eq!(rabbit.drain(&queue).len(), 1);
    assert_eq!(
        db.scalar("SELECT count(*) FROM dead_letters WHERE replayed_at IS NOT NULL"),
        1
    );
}
