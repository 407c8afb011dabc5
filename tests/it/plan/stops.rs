//! Plan runs that stop early (killed and rerun, interrupted, `--max-failures`) and the
//! come-back check that pages through the dead letters by time and ID.

use crate::common::*;
use std::process::Stdio;
use std::time::{Duration, Instant};

#[test]
fn a_plan_killed_midway_and_rerun_never_delivers_twice() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_v2_kill");
    let db = TestDb::migrated(Backend::Postgres);
    import_letters(&db, (0..3000).map(|i| (format!("k{i:04}"), q.clone())));
    let plan = db.plan_file(&["--limit", "5000"]);
    let path = plan.path().to_str().unwrap().to_string();
    let mut child = db
        .cmd()
        .args(["replay", "--plan", &path, "--yes", "--rate", "400/s"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    child.kill().unwrap();
    child.wait().unwrap();
    let first = per_id(&rabbit.drain(&q));
    assert!(!first.is_empty() && first.len() < 3000, "{}", first.len());
    lapse_leases(&db);
    let r = db.dlq(&["replay", "--plan", &path, "--yes"]);
    let second = per_id(&rabbit.drain(&q));
    for (id, n) in &second {
        assert_eq!(*n, 1, "{id} twice in the rerun");
        assert!(!first.contains_key(id), "{id} delivered by both runs");
    }
    // Whatever the killed run may have sent is uncertain, never pending or replayed again.
    let uncertain = db.ids(&["--state", "uncertain", "--limit", "5000"]);
    assert_eq!(
        r.code,
        if uncertain.is_empty() { 3 } else { 6 },
        "{}",
        r.stderr
    );
    for id in first.keys() {
        let s = db.show(id);
        assert!(
            s["state"] == "replayed" || s["state"] == "uncertain",
            "{id} was delivered but is {}",
            s["state"]
        );
    }
    assert_eq!(
        first.len() + second.len() + uncertain.len()
            - first.keys().filter(|k| uncertain.contains(k)).count(),
        3000 - db.ids(&["--state", "pending", "--limit", "5000"]).len(),
        "every row is accounted for"
    );
}

#[test]
fn max_failures_attempts_at_most_n_plus_ten() {
    for b in BACKENDS {
        let db = TestDb::migrated(b);
        let gone = unique("dlq_v2_nowhere");
        import_letters(&db, (0..400).map(|i| (format!("x{i:04}"), gone.clone())));
        let plan = db.plan_file(&["--limit", "1000"]);
        let r = db.dlq(&[
            "replay",
            "--plan",
            plan.path().to_str().unwrap(),
            "--yes",
            "--max-failures",
            "3",
        ]);
        assert_eq!(r.code, 5, "{b:?}: {}", r.stderr);
        let attempts =
            db.scalar("SELECT count(*) FROM dead_letter_history WHERE action = 'attempt'");
        assert!((3..=13).contains(&attempts), "{b:?}: {attempts} attempted");
        let failed = r
            .lines()
            .iter()
            .filter(|l| l["outcome"] == "publish_failed")
            .count();
        assert!((3..=13).contains(&failed), "{b:?}: {failed}");
        let summary = r.lines().last().unwrap().clone();
        assert_eq!(summary["summary"]["stopped"], "max_failures");
    }
}

#[test]
fn an_interrupted_plan_that_sent_something_exits_with_its_worst_outcome() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_v2_int");
    // The broker takes the messages but its confirms never arrive.
    let proxy = Proxy::start("127.0.0.1:5672", OnServerBytes::Stall(BASIC_ACK.to_vec()));
    let db = TestDb::migrated(Backend::Sqlite);
    import_letters(&db, (0..50).map(|i| (format!("i{i:02}"), q.clone())));
    let plan = db.plan_file(&["--limit", "100"]);
    let child = db
        .cmd()
        .args([
            "replay",
            "--plan",
            plan.path().to_str().unwrap(),
            "--yes",
            "--confirm-timeout",
            "60s",
        ])
        .env(
            "DLQ_AMQP_URL",
            format!("amqp://guest:guest@{}/%2f", proxy.addr()),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while rabbit.count(&q) == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "never published"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    signal(&child, "INT");
    let r = Run::from(child.wait_with_output().unwrap());
    assert_eq!(r.code, 6, "not 130: something may be out: {}", r.all());
    assert!(!db
        .ids(&["--state", "uncertain", "--limit", "100"])
        .is_empty());
    // Once broke: `"worst": "interrupted"` beside exit 3.
    let summary = summary_of(&r);
    assert_eq!(summary["worst"], "uncertain", "{summary}");
}

#[test]
fn the_come_back_check_pages_by_time_and_id() {
    // 2,500 dead letters share one dead_lettered_at: a page of 1,000 by time alone would
    // be read again and again; by (time, id) each is read once.
    use dlq::secret::SecretUrl;
    use dlq::store::{open, NewDeadLetter, OnExisting, StoreOptions};
    for b in BACKENDS {
        let db = TestDb::migrated(b);
        let at = chrono::Utc::now() - chrono::Duration::seconds(5);
        let rows: Vec<NewDeadLetter> = (0..2500)
            .map(|i| NewDeadLetter {
                line: i + 1,
                id: format!("c{i:05}"),
                body: b"{}".to_vec(),
                reason: "retries_exhausted".into(),
                headers_json: "{}".into(),
                event_id: Some(format!("e{i}")),
                dead_lettered_at: Some(at),
                ..Default::default()
            })
            .collect();
        let seen = rt().block_on(async {
            let store = open(&SecretUrl::new(db.url.clone()), &StoreOptions::default())
                .await
                .unwrap();
            store.import(rows, OnExisting::Refuse).await.unwrap();
            let mut after = (at - chrono::Duration::seconds(1), String::new());
            let mut seen = Vec::new();
            loop {
                let page = store.dead_lettered_since(&after, 1000).await.unwrap();
                if page.is_empty() {
                    break;
                }
                let last = page.last().unwrap();
                after = (last.at, last.id.clone());
                seen.extend(page.into_iter().map(|p| p.id));
            }
            seen
        });
        assert_eq!(seen.len(), 2500, "{b:?}");
        let distinct: std::collections::HashSet<_> = seen.iter().collect();
        assert_eq!(distinct.len(), 2500, "{b:?}");
    }
}
