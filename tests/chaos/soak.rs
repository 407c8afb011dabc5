//! A bounded soak (about two minutes): workers inserting dead letters, `capture --follow`
//! moving a dead-letter queue into the store, two `replay --plan` runs of one plan and
//! single replays at once, with kill -9 of runs and of the capture and short cuts of the
//! database (a TCP proxy in front of PostgreSQL). Then, per `x-dead-letter-id` and per
//! captured message: nothing delivered twice, nothing marked replayed that was not
//! delivered, nothing delivered that is neither replayed nor uncertain, each captured
//! message stored once, and every finished run's exit code and items true to what it
//! delivered. Run it alone with `cargo test --test chaos soak::`.

use crate::common::*;
use std::collections::HashMap;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long the chaos lasts; the checks and the final runs come after it.
const CHAOS: Duration = Duration::from_secs(75);

/// Every replay's lease: short, so that once it has ended every open attempt shows
/// `uncertain` on any version of the state rule.
const LEASE: &str = "15s";

/// A small deterministic generator (no dependency; the seed is printed).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n.max(1)
    }
}

/// A run of `dlq replay` that finished (not killed), with what it said.
struct Finished {
    operator: String,
    code: i32,
    items: Vec<(String, String)>,
    /// A plan's summary said some items were not reached (they count as not replayed).
    not_reached: bool,
    stderr: String,
}

/// The exit code of an item outcome (docs/exit-codes.md).
fn code_of(outcome: &str) -> i32 {
    match outcome {
        "replayed" => 0,
        "not_replayed" => 3,
        "not_found" => 4,
        "publish_failed" => 5,
        "uncertain" => 6,
        "interrupted" => 130,
        other => panic!("unknown outcome {other}"),
    }
}

/// The worst of `outcomes` by the contract's order (uncertain > interrupted >
/// publish_failed > not_found > not_replayed > replayed), as an exit code.
fn worst(outcomes: impl Iterator<Item = String>) -> i32 {
    let rank = |c: i32| [0, 3, 4, 5, 130, 6].iter().position(|x| *x == c).unwrap();
    outcomes
        .map(|o| code_of(&o))
        .max_by_key(|c| rank(*c))
        .unwrap_or(0)
}

fn finished(operator: &str, child: Child) -> Finished {
    let r = Run::from(child.wait_with_output().unwrap());
    // A plan prints JSON lines, a single replay one (pretty) object.
    let values: Vec<serde_json::Value> = serde_json::Deserializer::from_str(&r.stdout)
        .into_iter()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("{operator}: {e}: {}", r.stdout));
    let items = values
        .iter()
        .filter_map(|l| {
            let (id, outcome) = (l["id"].as_str()?, l["outcome"].as_str()?);
            Some((id.to_string(), outcome.to_string()))
        })
        .collect();
    // A plan that stopped early counts the items it did not reach as not replayed.
    let not_reached = values
        .iter()
        .filter_map(|l| l["summary"]["not_reached"].as_u64())
        .any(|n| n > 0);
    Finished {
        operator: operator.to_string(),
        code: r.code,
        items,
        not_reached,
        stderr: r.stderr,
    }
}

struct Soak<'a> {
    db: &'a TestDb,
    /// The database URL through the proxy that the cuts go through.
    cut_url: String,
    target: String,
    runs: Mutex<Vec<Finished>>,
    killed: AtomicU64,
    /// The plans whose runs were killed, to run again at the end.
    killed_plans: Mutex<Vec<Vec<u8>>>,
}

impl Soak<'_> {
    fn replay(&self, operator: &str, args: &[&str]) -> Child {
        self.db
            .cmd()
            .args(["replay", "--yes", "--lease", LEASE])
            .args(["--confirm-timeout", "3s", "--connect-timeout", "2s"])
            .args(args)
            .env("DLQ_DATABASE_URL", &self.cut_url)
            .env("DLQ_OPERATOR", operator)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// One round: a plan of pending worker rows, run twice at once, and three single
    /// replays of pending rows; one of the plan runs is killed every other round.
    fn round(&self, k: u64, rng: &mut Lcg) {
        let plan = self
            .db
            .dlq(&["plan", "--reason", "retries_exhausted", "--limit", "150"]);
        if plan.code != 0 {
            return; // nothing pending yet
        }
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), &plan.stdout).unwrap();
        let path = file.path().to_str().unwrap();
        let pending = self.db.ids(&[
            "--state",
            "pending",
            "--reason",
            "retries_exhausted",
            "--limit",
            "40",
        ]);
        let (a, b) = (format!("plan-{k}-a"), format!("plan-{k}-b"));
        let mut children = vec![
            (
                a.clone(),
                self.replay(&a, &["--plan", path, "--rate", "30/s"]),
            ),
            (
                b.clone(),
                self.replay(&b, &["--plan", path, "--rate", "30/s"]),
            ),
        ];
        for i in 0..3 {
            if pending.is_empty() {
                break;
            }
            let id = &pending[rng.below(pending.len() as u64) as usize];
            let op = format!("single-{k}-{i}");
            children.push((op.clone(), self.replay(&op, &[id.as_str()])));
        }
        if k % 2 == 1 {
            std::thread::sleep(Duration::from_millis(500 + rng.below(2500)));
            signal(&children[0].1, "KILL");
            let (_, c) = children.remove(0);
            let _ = c.wait_with_output();
            self.killed.fetch_add(1, Ordering::SeqCst);
            self.killed_plans
                .lock()
                .unwrap()
                .push(plan.stdout.into_bytes());
        }
        for (op, c) in children {
            let f = finished(&op, c);
            self.runs.lock().unwrap().push(f);
        }
    }
}

#[test]
fn a_soak_of_captures_replays_kills_and_cuts_keeps_every_promise() {
    let _alone = crate::alone();
    let seed = std::process::id() as u64;
    eprintln!("soak seed {seed}");
    let mut rabbit = Rabbit::new();
    let target = rabbit.queue("dlq_soak_target");
    let source = rabbit.queue("dlq_soak_dead");
    let db = TestDb::migrated(Backend::Postgres);
    let proxy = Proxy::start("127.0.0.1:5432", OnServerBytes::Nothing);
    let soak = Soak {
        db: &db,
        cut_url: db.url.replace("127.0.0.1:5432", &proxy.addr()),
        target: target.clone(),
        runs: Mutex::new(Vec::new()),
        killed: AtomicU64::new(0),
        killed_plans: Mutex::new(Vec::new()),
    };
    let done = AtomicBool::new(false);
    let started = Instant::now();
    let (inserted, published) = std::thread::scope(|s| {
        // Workers write dead letters as the Python workers do: the nine columns and the
        // source queue, nothing dlq derives.
        let inserter = s.spawn(|| {
            let mut n = 0u64;
            while !done.load(Ordering::SeqCst) {
                let rows: Vec<String> = (n..n + 3)
                    .map(|i| {
                        format!(
                            "('w{i:06}', convert_to('{{\"event_id\":\"evt-w{i:06}\"}}', 'UTF8'), \
                             'retries_exhausted', 3, '{{}}', '{}')",
                            soak.target
                        )
                    })
                    .collect();
                db.sql(&[&format!(
                    "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, source_queue) VALUES {}",
                    rows.join(", ")
                )]);
                n += 3;
                std::thread::sleep(Duration::from_millis(100));
            }
            n
        });
        // Messages arriving on the dead-letter queue that capture moves into the store.
        let publisher = s.spawn(|| {
            let rabbit = Rabbit::new();
            let mut n = 0u64;
            while !done.load(Ordering::SeqCst) {
                rabbit.publish_raw(&source, format!("cap-{n:06}").as_bytes());
                n += 1;
                std::thread::sleep(Duration::from_millis(40));
            }
            n
        });
        // capture --follow, killed with SIGKILL every few seconds and started again.
        s.spawn(|| {
            let mut rng = Lcg(seed ^ 0xcafe);
            while !done.load(Ordering::SeqCst) {
                let child = db
                    .cmd()
                    .args(["capture", "--queue", &source, "--follow", "--batch", "20"])
                    .args(["--reason", "captured", "--connect-timeout", "2s"])
                    .env("DLQ_DATABASE_URL", &soak.cut_url)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap();
                std::thread::sleep(Duration::from_millis(2000 + rng.below(4000)));
                signal(&child, "KILL");
                let _ = child.wait_with_output();
            }
        });
        // Short database cuts: every connection through the proxy dropped, new ones
        // refused, for about two seconds.
        s.spawn(|| {
            let mut rng = Lcg(seed ^ 0xbeef);
            while !done.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(6000 + rng.below(6000)));
                proxy.cut.store(true, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(800 + rng.below(1500)));
                proxy.cut.store(false, Ordering::SeqCst);
            }
        });
        // Whatever happens here, the other threads stop.
        struct Stop<'a>(&'a AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let _stop = Stop(&done);
        let mut rng = Lcg(seed);
        let mut k = 0;
        while started.elapsed() < CHAOS {
            soak.round(k, &mut rng);
            k += 1;
        }
        done.store(true, Ordering::SeqCst);
        (inserter.join().unwrap(), publisher.join().unwrap())
    });
    proxy.cut.store(false, Ordering::SeqCst);

    // Let every lease of the chaos end, then run the killed runs' plans again (what
    // they may have sent must report uncertain) and a plan of what is pending now.
    std::thread::sleep(Duration::from_secs(16));
    let plans = soak.killed_plans.lock().unwrap().clone();
    for (i, plan) in plans.iter().enumerate().rev().take(3) {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), plan).unwrap();
        let op = format!("rerun-{i}");
        let f = finished(
            &op,
            soak.replay(&op, &["--plan", file.path().to_str().unwrap()]),
        );
        soak.runs.lock().unwrap().push(f);
    }
    let last = db.plan_file(&["--reason", "retries_exhausted", "--limit", "100000"]);
    let f = finished(
        "final",
        soak.replay("final", &["--plan", last.path().to_str().unwrap()]),
    );
    assert_eq!(
        f.code, 0,
        "nothing is in the way of what is pending: {}",
        f.stderr
    );
    soak.runs.lock().unwrap().push(f);
    // The capture's last messages: a run without --follow empties the queue.
    let r = db.dlq(&["capture", "--queue", &source, "--reason", "captured"]);
    assert_eq!(r.code, 0, "{}", r.all());

    let delivered = rabbit.drain(&target);
    let mut by_id: HashMap<String, Vec<String>> = HashMap::new();
    for m in &delivered {
        let id = m.headers["x-dead-letter-id"].as_str().unwrap().to_string();
        let by = m.headers["x-replayed-by"].as_str().unwrap().to_string();
        by_id.entry(id).or_default().push(by);
    }
    for (id, by) in &by_id {
        assert_eq!(by.len(), 1, "{id} delivered {} times, by {by:?}", by.len());
    }
    let listed = db.dlq(&["list", "--state", "all", "--limit", "1000000"]);
    assert_eq!(listed.code, 0, "{}", listed.all());
    let states: HashMap<String, String> = listed
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["id"].as_str().unwrap().into(),
                l["state"].as_str().unwrap().into(),
            )
        })
        .collect();
    for (id, state) in &states {
        if state == "replayed" {
            assert!(
                by_id.contains_key(id),
                "{id} is marked replayed but was not delivered"
            );
        }
    }
    for id in by_id.keys() {
        let state = states.get(id).map(String::as_str).unwrap_or("(gone)");
        assert!(
            state == "replayed" || state == "uncertain",
            "{id} was delivered but is {state}"
        );
    }

    // Each run that finished: its exit code is its worst item's, and each item it
    // reports is what it did (by the x-replayed-by header of what was delivered).
    let runs = soak.runs.lock().unwrap();
    for run in runs.iter() {
        let sent = run
            .items
            .iter()
            .any(|(_, o)| o == "replayed" || o == "uncertain");
        if run.code == 1 {
            assert!(
                !sent,
                "{} exited 1 after sending: {}",
                run.operator, run.stderr
            );
        } else {
            // Once broke (this test, not dlq): a plan stopped by its database after
            // sending exits 3 for the items it did not reach, as the contract says.
            let unreached = run.not_reached.then(|| "not_replayed".to_string());
            let w = worst(run.items.iter().map(|(_, o)| o.clone()).chain(unreached));
            assert_eq!(
                run.code, w,
                "{}: exit code and items: {}",
                run.operator, run.stderr
            );
        }
        for (id, outcome) in &run.items {
            let by_run = by_id.get(id).is_some_and(|b| b.contains(&run.operator));
            match outcome.as_str() {
                "replayed" => assert!(
                    by_run,
                    "{}: {id} replayed but not delivered by it",
                    run.operator
                ),
                "uncertain" => {}
                _ => assert!(
                    !by_run,
                    "{}: {id} is {outcome} but it delivered it",
                    run.operator
                ),
            }
        }
    }

    // Capture: each message published to the dead-letter queue is one row.
    let rows = db.scalar("SELECT count(*) FROM dead_letters WHERE reason = 'captured'");
    let distinct =
        db.scalar("SELECT count(DISTINCT body) FROM dead_letters WHERE reason = 'captured'");
    assert_eq!(rows, distinct, "a captured message stored twice");
    assert_eq!(rows as u64, published, "every captured message stored once");
    assert_eq!(rabbit.count(&source), 0);
    let count = |s: &str| states.values().filter(|v| *v == s).count();
    let mut codes = std::collections::BTreeMap::<i32, usize>::new();
    for run in runs.iter() {
        *codes.entry(run.code).or_default() += 1;
    }
    eprintln!(
        "soak: {:?}, {inserted} rows inserted, {published} messages captured, {} runs finished (exit codes {codes:?}), {} killed, {} delivered; {} replayed, {} uncertain, {} pending",
        started.elapsed(),
        runs.len(),
        soak.killed.load(Ordering::SeqCst),
        delivered.len(),
        count("replayed"),
        count("uncertain"),
        count("pending"),
    );
}
