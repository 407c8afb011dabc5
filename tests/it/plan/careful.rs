//! Careful plan replays: `--canary`, `--ramp` and `--max-target-depth`, against a real
//! broker and the real binary (a test consumer plays the target's workers).

use crate::common::*;
use std::collections::HashMap;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

mod come_back;

/// `n` pending dead letters bound for `queue`, IDs `{prefix}0000`.., event `evt-{id}`.
fn seed(db: &TestDb, queue: &str, n: usize, prefix: &str) {
    let lines: String = (0..n)
        .map(|i| {
            let id = format!("{prefix}{i:04}");
            let body = format!("{{\"n\":{i}}}");
            format!("{}\n", letter(&id, queue, body.as_bytes()))
        })
        .collect();
    let r = db.dlq_stdin(&["import", "-"], lines.as_bytes());
    assert_eq!(r.code, 0, "{}", r.all());
}

fn args<'a>(plan: &'a tempfile::NamedTempFile, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["replay", "--plan", plan.path().to_str().unwrap(), "--yes"];
    a.extend_from_slice(extra);
    a
}

/// `dlq replay --plan` running in the background (JSON lines on stdout).
fn spawn(db: &TestDb, plan: &tempfile::NamedTempFile, extra: &[&str]) -> Child {
    db.cmd()
        .args(args(plan, extra))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn pending(db: &TestDb) -> usize {
    let r = db.dlq(&["list", "--state", "pending", "--limit", "100000"]);
    r.json().as_array().unwrap().len()
}

fn state_count(db: &TestDb, state: &str) -> usize {
    let r = db.dlq(&["list", "--state", state, "--limit", "100000"]);
    r.json().as_array().unwrap().len()
}

/// Polls `what` every 50 ms until it holds or `limit` passes.
fn until(limit: Duration, mut what: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if what() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    what()
}

/// The `x-dead-letter-id` of one message taken from `queue` (acked), if any.
fn take_one(rabbit: &Rabbit, queue: &str) -> Option<String> {
    use lapin::options::BasicGetOptions;
    use lapin::types::AMQPValue;
    let got = rabbit
        .block_on(
            rabbit
                .channel()
                .basic_get(queue.into(), BasicGetOptions { no_ack: true }),
        )
        .unwrap()?;
    let headers = got.delivery.properties.headers().clone().unwrap();
    match headers.inner().get("x-dead-letter-id") {
        Some(AMQPValue::LongString(s)) => Some(String::from_utf8_lossy(s.as_bytes()).into()),
        other => panic!("no x-dead-letter-id: {other:?}"),
    }
}

#[test]
fn a_healthy_canary_waits_then_the_run_completes() {
    for b in BACKENDS {
        let mut rabbit = Rabbit::new();
        let q = rabbit.queue("dlq_canary_ok");
        let db = TestDb::migrated(b);
        seed(&db, &q, 10, "h");
        let plan = db.plan_file(&[]);
        let r = db.dlq(&args(&plan, &["--canary", "2", "--canary-wait", "3s"]));
        assert_eq!(r.code, 0, "{b:?}: {}", r.all());
        let s = summary_of(&r);
        assert_eq!(s["counts"]["replayed"], 10, "{s}");
        assert_eq!(s["stopped"], serde_json::Value::Null);
        let canary = r
            .stderr
            .find("canary: 2 sent; watching 3s")
            .expect(&r.stderr);
        let passed = r.stderr.find("canary passed").expect(&r.stderr);
        assert!(canary < passed, "{}", r.stderr);
        let msgs = rabbit.drain(&q);
        assert_eq!(per_id(&msgs).len(), 10);
        assert!(per_id(&msgs).values().all(|n| *n == 1));
        // The canary went out first, the rest only after its wait (a lower bound on
        // the wait, by the messages' whole-second timestamps: not a speed).
        let first = msgs[..2]
            .iter()
            .map(|m| m.timestamp.unwrap())
            .max()
            .unwrap();
        let rest = msgs[2..]
            .iter()
            .map(|m| m.timestamp.unwrap())
            .min()
            .unwrap();
        assert!(
            rest >= first + 2,
            "the wait held the rest back: {first} {rest}"
        );
        assert_eq!(pending(&db), 0);
    }
}

#[test]
fn a_ramp_starts_at_its_first_rate_shared_by_its_workers() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_ramp");
    let db = TestDb::migrated(Backend::Postgres);
    seed(&db, &q, 200, "r");
    let plan = db.plan_file(&["--limit", "1000"]);
    let child = spawn(
        &db,
        &plan,
        &[
            "--ramp",
            "5/s..50/s:60s",
            "--workers",
            "2",
            "--max-failures",
            "5",
        ],
    );
    assert!(until(Duration::from_secs(20), || rabbit.count(&q) > 0));
    std::thread::sleep(Duration::from_secs(1));
    let in_a_second = rabbit.count(&q);
    // About 5 (the first rate): far from the 200 an unpaced run sends at once, and far
    // from the 50 of the last rate.
    assert!(
        (2..=15).contains(&in_a_second),
        "{in_a_second} in the ramp's first second"
    );
    signal(&child, "INT");
    let out = child.wait_with_output().unwrap();
    let r = Run::from(out);
    let s = summary_of(&r);
    assert_eq!(s["stopped"], "interrupted", "{}", r.all());
    assert_eq!(
        r.code,
        3,
        "some went out, the rest not reached: {}",
        r.all()
    );
    let sent = rabbit.drain(&q);
    assert_eq!(s["counts"]["replayed"], sent.len() as u64, "{s}");
    assert!(per_id(&sent).values().all(|n| *n == 1));
    assert_eq!(pending(&db), 200 - sent.len());
}

#[test]
fn max_target_depth_holds_the_run_near_n_until_a_slow_consumer_drains_it() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_depth");
    let db = TestDb::migrated(Backend::Postgres);
    seed(&db, &q, 60, "d");
    let plan = db.plan_file(&[]);
    // A batch is at most N (10) items: one worker keeps the queue under N + 10.
    let mut child = spawn(&db, &plan, &["--max-target-depth", "10", "--workers", "1"]);
    assert!(until(Duration::from_secs(20), || rabbit.count(&q) >= 10));
    let mut deepest = 0;
    // No consumer: the run waits near N.
    until(Duration::from_secs(3), || {
        deepest = deepest.max(rabbit.count(&q));
        false
    });
    assert!((10..=20).contains(&deepest), "held near 10: {deepest}");
    assert!(child.try_wait().unwrap().is_none(), "still waiting");
    assert!(pending(&db) >= 40, "the rest is not even claimed");
    // A slow consumer: one message every 20 ms, until the run ends.
    let mut got: Vec<String> = Vec::new();
    let done = until(Duration::from_secs(60), || {
        deepest = deepest.max(rabbit.count(&q));
        got.extend(take_one(&rabbit, &q));
        std::thread::sleep(Duration::from_millis(20));
        child.try_wait().unwrap().is_some()
    });
    assert!(done, "the run completes once the consumer keeps up");
    got.extend(std::iter::from_fn(|| take_one(&rabbit, &q)));
    let r = Run::from(child.wait_with_output().unwrap());
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(summary_of(&r)["counts"]["replayed"], 60);
    assert!(deepest <= 20, "never deeper than N + one batch: {deepest}");
    let mut per: HashMap<String, usize> = HashMap::new();
    for id in got {
        *per.entry(id).or_default() += 1;
    }
    assert_eq!(per.len(), 60);
    assert!(per.values().all(|n| *n == 1), "every item exactly once");
    assert!(
        r.stderr.contains("more than --max-target-depth 10"),
        "{}",
        r.stderr
    );
}

#[test]
fn a_run_interrupted_while_it_waits_tells_what_went_out() {
    for wait in [
        &["--max-target-depth", "5", "--workers", "1"][..],
        &["--canary", "5", "--canary-wait", "60s"][..],
    ] {
        let mut rabbit = Rabbit::new();
        let q = rabbit.queue("dlq_wait_int");
        let db = TestDb::migrated(Backend::Postgres);
        seed(&db, &q, 30, "w");
        let plan = db.plan_file(&[]);
        let mut child = spawn(&db, &plan, wait);
        assert!(until(Duration::from_secs(20), || rabbit.count(&q) >= 5));
        // Waiting (depth or canary) when the signal comes.
        std::thread::sleep(Duration::from_millis(1500));
        assert!(
            child.try_wait().unwrap().is_none(),
            "{wait:?}: still waiting"
        );
        signal(&child, "INT");
        let r = Run::from(child.wait_with_output().unwrap());
        let s = summary_of(&r);
        assert_eq!(s["stopped"], "interrupted", "{wait:?}: {}", r.all());
        // Something went out: not 130 ("nothing was sent"), but the items not reached.
        assert_eq!(r.code, 3, "{wait:?}: {}", r.all());
        let sent = rabbit.drain(&q).len();
        assert_eq!(s["counts"]["replayed"], sent as u64, "{s}");
        assert_eq!(s["not_reached"], 30 - sent as u64, "{s}");
        assert_eq!(pending(&db), 30 - sent, "{wait:?}: the rest is pending");
        assert_eq!(
            state_count(&db, "claimed") + state_count(&db, "uncertain"),
            0
        );
    }
}

#[test]
fn bad_careful_options_are_refused_with_exit_2() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_careful_bad");
    let db = TestDb::migrated(Backend::Sqlite);
    seed(&db, &q, 3, "b");
    let plan = db.plan_file(&[]);
    let cases: &[(&[&str], &str)] = &[
        (&["--ramp", "50/s..5/s"], "a ramp rises"),
        (&["--ramp", "0/s..5/s"], "greater than zero"),
        (&["--ramp", "5/x..10/s"], "expected N/s or N/m"),
        (&["--ramp", "5/s..10/s:0s"], "greater than zero"),
        (&["--ramp", "5/s..10/s:5parsecs"], "invalid duration"),
        (&["--ramp", "5/s"], "expected FROM..TO[:DURATION]"),
        (
            &["--ramp", "5/s..10/s", "--rate", "5/s"],
            "cannot be used with",
        ),
        (&["--canary", "0"], "--canary"),
        (
            &["--canary", "2", "--canary-wait", "soon"],
            "invalid duration",
        ),
        (&["--max-target-depth", "x"], "--max-target-depth"),
        (
            &["--max-target-depth", "5", "--exchange", "orders"],
            "named exchange",
        ),
    ];
    for (extra, says) in cases {
        let r = db.dlq(&args(&plan, extra));
        assert_eq!(r.code, 2, "{extra:?}: {}", r.all());
        let first = r.stderr.lines().next().unwrap_or_default();
        assert!(
            first.contains(says),
            "{extra:?}: one line saying {says:?}: {}",
            r.stderr
        );
    }
    // clap says what is missing on the line after its first.
    let r = db.dlq(&args(&plan, &["--canary-wait", "5s"]));
    assert_eq!(r.code, 2, "--canary-wait needs --canary: {}", r.all());
    assert!(r.stderr.contains("--canary <N>"), "{}", r.stderr);
    // Once broke: clap's `requires` let these through to a single replay, which
    // published b0000 ignoring them.
    for opt in [
        &["--canary", "2"][..],
        &["--ramp", "1/s..2/s"],
        &["--rate", "1/s"],
    ] {
        let mut a = vec!["replay", "b0000", "--yes"];
        a.extend_from_slice(opt);
        let r = db.dlq(&a);
        assert_eq!(r.code, 2, "{opt:?} needs --plan: {}", r.all());
        assert!(r.stderr.contains("give --plan FILE"), "{}", r.stderr);
    }
    // Items whose rows publish through a named exchange: not one queue.
    db.sql(&["UPDATE dead_letters SET exchange = 'orders' WHERE id = 'b0001'"]);
    let r = db.dlq(&args(&plan, &["--max-target-depth", "5"]));
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(
        r.stderr.contains("named exchange \"orders\""),
        "{}",
        r.stderr
    );
    // Several queues: not one queue either.
    db.sql(&["UPDATE dead_letters SET exchange = NULL, routing_key = 'other' WHERE id = 'b0001'"]);
    let r = db.dlq(&args(&plan, &["--max-target-depth", "5"]));
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(r.stderr.contains("several queues"), "{}", r.stderr);
    assert_eq!(rabbit.count(&q), 0);
    assert_eq!(pending(&db), 3, "nothing was claimed");
    // One queue that does not exist: the run cannot start (exit 1), nothing claimed.
    db.sql(&["UPDATE dead_letters SET routing_key = NULL, source_queue = 'dlq_no_such_queue'"]);
    let r = db.dlq(&args(&plan, &["--max-target-depth", "5"]));
    assert_eq!(r.code, 1, "{}", r.all());
    assert!(r.stderr.contains("does not exist"), "{}", r.stderr);
    assert_eq!(pending(&db), 3);
}
