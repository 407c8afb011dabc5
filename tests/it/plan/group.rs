//! `dlq plan` and `dlq replay --plan`: frozen IDs and hashes, each item replayed once,
//! beside another operator, rates, `--max-failures`, kills and reruns.

use super::*;
use crate::common::*;
use std::collections::HashMap;
use std::process::Stdio;
use std::time::{Duration, Instant};

#[test]
fn plan_freezes_ids_and_hashes_and_refuses_a_mix() {
    for b in BACKENDS {
        let db = TestDb::migrated(b);
        db.import_examples();
        let (_, plan) = write_plan(&db, &["--reason", "retries_exhausted"]);
        assert_eq!(plan["count"], 9);
        let items = plan["items"].as_array().unwrap();
        assert_eq!(items.len(), 9);
        for it in items {
            let s = db.show(it["id"].as_str().unwrap());
            assert_eq!(it["sha256"], s["sha256"]);
            assert_eq!(s["reason"], "retries_exhausted");
        }
        assert_eq!(plan["filters"]["reason"], "retries_exhausted");
        assert_eq!(plan["mix"]["producer"]["inventory"], 9);
        assert!(plan["plan_id"].is_string());

        let r = db.dlq(&["plan", "--reason", "poison_message"]);
        assert_eq!(r.code, 2, "{}", r.all());
        assert!(
            r.stderr.contains("billing=12") && r.stderr.contains("--allow-mixed"),
            "{}",
            r.stderr
        );
        assert_eq!(r.stdout, "", "no plan printed");
        let (_, mixed) = write_plan(&db, &["--reason", "poison_message", "--allow-mixed"]);
        assert_eq!(mixed["count"], 14);
        let r = db.dlq(&["plan", "--reason", "nothing_like_this"]);
        assert_eq!(r.code, 2);
    }
}

#[test]
fn a_plan_of_200_replays_each_item_once_and_marks_all() {
    for b in BACKENDS {
        let mut rabbit = Rabbit::new();
        let q = rabbit.queue("dlq_plan200");
        let db = TestDb::migrated(b);
        seed(&db, &q, 200, "p");
        let (plan_file, plan) = write_plan(&db, &["--limit", "500"]);
        assert_eq!(plan["count"], 200);
        let r = replay_plan(&db, &plan_file, &["--batch-size", "64"]);
        assert_eq!(r.code, 0, "{b:?}: {}", r.all());
        let lines = r.lines();
        assert_eq!(lines.len(), 201, "one line per item and a summary");
        assert!(lines[..200]
            .iter()
            .all(|l| l["outcome"] == "replayed" && l["plan_id"] == plan["plan_id"]));
        assert_eq!(lines[200]["summary"]["counts"]["replayed"], 200);
        let msgs = rabbit.drain(&q);
        assert_eq!(msgs.len(), 200);
        assert!(per_id(&msgs).values().all(|n| *n == 1));
        assert_eq!(
            db.dlq(&["list", "--state", "replayed", "--limit", "1000"])
                .json()
                .as_array()
                .unwrap()
                .len(),
            200
        );
        let h = db.show("p0007")["history"].clone();
        assert!(
            h.as_array()
                .unwrap()
                .iter()
                .any(|e| e["plan_id"] == plan["plan_id"] && e["outcome"] == "replayed"),
            "{h}"
        );
        // Replaying the same plan again publishes nothing.
        let again = replay_plan(&db, &plan_file, &[]);
        assert_eq!(again.code, 3, "{}", again.stderr);
        assert_eq!(rabbit.count(&q), 0);
    }
}

#[test]
fn plan_run_alongside_another_operator_never_publishes_twice() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_plan_race");
    let db = TestDb::migrated(Backend::Postgres);
    seed(&db, &q, 200, "r");
    let (plan_file, _) = write_plan(&db, &["--limit", "500"]);
    let run = db
        .cmd()
        .args([
            "replay",
            "--plan",
            plan_file.path().to_str().unwrap(),
            "--yes",
            "--batch-size",
            "10",
            "--rate",
            "400/s",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Another operator replays every fifth item by hand meanwhile.
    let mut by_hand = 0;
    for i in (0..200).rev().step_by(5) {
        let r = db.dlq_env(
            &["replay", &format!("r{i:04}"), "--yes"],
            &[("DLQ_OPERATOR", "other")],
        );
        // 6: it looked while the other's attempt was open (uncertain until settled).
        assert!(matches!(r.code, 0 | 3 | 6), "{}", r.all());
        if r.code == 0 {
            by_hand += 1;
        }
    }
    let out = run.wait_with_output().unwrap();
    assert!(
        matches!(out.status.code(), Some(0) | Some(3) | Some(6)),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let msgs = rabbit.drain(&q);
    let counts = per_id(&msgs);
    assert_eq!(
        counts.len(),
        200,
        "every item published: {}",
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.contains("\"replayed\""))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(counts.values().all(|n| *n == 1), "no item published twice");
    assert!(by_hand > 0, "the other operator got some");
}

#[test]
fn an_item_whose_body_changed_is_skipped() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_plan_changed");
    let db = TestDb::migrated(Backend::Sqlite);
    seed(&db, &q, 3, "c");
    let (plan_file, _) = write_plan(&db, &[]);
    db.sql(&["UPDATE dead_letters SET body = X'7b7d' WHERE id = 'c0001'"]);
    let r = replay_plan(&db, &plan_file, &[]);
    assert_eq!(r.code, 3, "{}", r.all());
    let lines = r.lines();
    let c1 = lines.iter().find(|l| l["id"] == "c0001").unwrap();
    assert_eq!(c1["outcome"], "not_replayed");
    assert!(c1["detail"].as_str().unwrap().contains("sha256"));
    assert_eq!(rabbit.count(&q), 2);
    assert_eq!(db.show("c0001")["state"], "pending");
}

#[test]
fn a_plan_listing_an_id_twice_is_refused_and_replay_publishes_an_id_once() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_plan_twice");
    let db = TestDb::migrated(Backend::Sqlite);
    seed(&db, &q, 2, "t");
    let (plan_file, mut plan) = write_plan(&db, &[]);
    let first = plan["items"][0].clone();
    plan["items"].as_array_mut().unwrap().push(first);
    std::fs::write(plan_file.path(), plan.to_string()).unwrap();
    let r = replay_plan(&db, &plan_file, &[]);
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(r.stderr.contains("twice"), "{}", r.stderr);
    assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
    assert_eq!(rabbit.count(&q), 0, "nothing published");
    assert_eq!(db.show("t0000")["state"], "pending", "nothing claimed");

    // The library function itself replays an ID given twice once.
    let rt = rt();
    let reports = rt.block_on(async {
        let store = dlq::store::open(
            &dlq::secret::SecretUrl::new(db.url.clone()),
            &dlq::store::StoreOptions::default(),
        )
        .await
        .unwrap();
        let opts = dlq::publisher::PublisherOptions {
            connect_timeout: Duration::from_secs(5),
            confirm_timeout: Duration::from_secs(5),
            connection_name: "test".into(),
            tls: Default::default(),
            topology: Default::default(),
        };
        let amqp = dlq::secret::SecretUrl::new("amqp://guest:guest@127.0.0.1:5672/%2f");
        let mut broker = dlq::publisher::Broker::new(vec![amqp], opts, None);
        let item = dlq::replay::Item {
            id: "t0000".into(),
            expected_sha256: None,
        };
        let replay_opts = dlq::replay::ReplayOptions {
            operator: "tester".into(),
            lease: Duration::from_secs(60),
            token: None,
            exchange: None,
            routing_key: None,
            plan_id: None,
            ..Default::default()
        };
        let stop = std::sync::atomic::AtomicBool::new(false);
        let reports = dlq::replay::replay(
            store.as_ref(),
            &mut broker,
            &[item.clone(), item],
            &replay_opts,
            &stop,
        )
        .await
        .unwrap();
        broker.close().await;
        store.close().await;
        reports
    });
    assert_eq!(reports.len(), 1, "{reports:?}");
    assert_eq!(reports[0].outcome, dlq::model::Outcome::Replayed);
    assert_eq!(rabbit.count(&q), 1, "published once");
}

#[test]
fn rate_is_observed_in_the_message_timestamps() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_plan_rate");
    let db = TestDb::migrated(Backend::Sqlite);
    seed(&db, &q, 30, "t");
    let (plan_file, _) = write_plan(&db, &[]);
    let r = replay_plan(&db, &plan_file, &["--rate", "10/s"]);
    assert_eq!(r.code, 0, "{}", r.all());
    let msgs = rabbit.drain(&q);
    assert_eq!(msgs.len(), 30);
    let mut per_second: HashMap<u64, usize> = HashMap::new();
    for m in &msgs {
        *per_second.entry(m.timestamp.unwrap()).or_default() += 1;
    }
    let first = *per_second.keys().min().unwrap();
    let last = *per_second.keys().max().unwrap();
    assert!(
        last - first >= 2,
        "30 messages at 10/s span at least 2 whole seconds: {per_second:?}"
    );
    assert!(
        per_second.values().all(|n| *n <= 11),
        "at most ~10 per second: {per_second:?}"
    );
}

#[test]
fn max_failures_stops_the_run() {
    let db = TestDb::migrated(Backend::Postgres);
    seed(&db, &unique("dlq_nowhere"), 10, "f");
    let (plan_file, _) = write_plan(&db, &[]);
    let r = replay_plan(
        &db,
        &plan_file,
        &["--batch-size", "1", "--workers", "1", "--max-failures", "3"],
    );
    assert_eq!(r.code, 5, "{}", r.all());
    let lines = r.lines();
    assert_eq!(lines.len(), 4, "three items and the summary: {}", r.stdout);
    let s = &lines[3]["summary"];
    assert_eq!(s["stopped"], "max_failures");
    assert_eq!(s["done"], 3);
    assert!(r.stderr.contains("3 failures"), "{}", r.stderr);
    assert_eq!(
        db.dlq(&["list", "--state", "pending"])
            .json()
            .as_array()
            .unwrap()
            .len(),
        10
    );
}

#[test]
fn a_replayed_event_coming_back_as_a_dead_letter_stops_the_run() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_plan_back");
    let db = TestDb::migrated(Backend::Postgres);
    seed(&db, &q, 10, "k");
    let (plan_file, _) = write_plan(&db, &[]);
    // The first item's event fails again as soon as it is replayed.
    db.sql(&[
        "CREATE FUNCTION k_back() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
              IF NEW.replayed_at IS NOT NULL AND OLD.replayed_at IS NULL AND NEW.id = 'k0000' THEN \
                INSERT INTO dead_letters (id, body, reason, attempts, headers_json, event_id) \
                VALUES ('k0000-again', NEW.body, 'retries_exhausted', 5, '{}', 'evt-k0000'); \
              END IF; RETURN NEW; END $$",
        "CREATE TRIGGER k_back AFTER UPDATE ON dead_letters FOR EACH ROW EXECUTE FUNCTION k_back()",
    ]);
    let r = replay_plan(&db, &plan_file, &["--batch-size", "2", "--workers", "1"]);
    let lines = r.lines();
    let s = &lines.last().unwrap()["summary"];
    assert_eq!(s["stopped"], "came_back", "{}", r.all());
    assert!(s["done"].as_u64().unwrap() < 10);
    assert!(
        r.stderr.contains("k0000-again") && r.stderr.contains("not fixed"),
        "{}",
        r.stderr
    );
    assert_eq!(rabbit.count(&q) as u64, s["done"].as_u64().unwrap());
}

#[test]
fn sigkill_midway_leaves_no_unconfirmed_mark_and_a_rerun_completes() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_plan_kill");
    let db = TestDb::migrated(Backend::Sqlite);
    seed(&db, &q, 200, "z");
    let (plan_file, _) = write_plan(&db, &["--limit", "500"]);
    let plan_path = plan_file.path().to_str().unwrap().to_string();
    let mut child = db
        .cmd()
        .args([
            "replay",
            "--plan",
            &plan_path,
            "--yes",
            "--rate",
            "100/s",
            "--batch-size",
            "10",
            "--lease",
            "7s",
            "--connect-timeout",
            "1s",
            "--confirm-timeout",
            "2s",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Kill it as soon as some rows are marked (but long before all 200 are).
    let started = std::time::Instant::now();
    while db.scalar("SELECT count(*) FROM dead_letters WHERE replayed_at IS NOT NULL") == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "nothing was replayed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let first = per_id(&rabbit.drain(&q));
    let replayed: Vec<String> = db.ids(&["--state", "replayed", "--limit", "1000"]);
    assert!(
        !replayed.is_empty() && replayed.len() < 200,
        "killed midway: {}",
        replayed.len()
    );
    for id in &replayed {
        assert_eq!(
            first.get(id),
            Some(&1),
            "{id} is marked, so the broker confirmed it"
        );
    }
    std::thread::sleep(Duration::from_millis(7200)); // the killed run's leases lapse
    let r = db.dlq(&[
        "replay",
        "--plan",
        &plan_path,
        "--yes",
        "--lease",
        "10s",
        "--connect-timeout",
        "1s",
        "--confirm-timeout",
        "2s",
    ]);
    // What the killed run was publishing is uncertain (exit 6), the rest done.
    let uncertain = db.ids(&["--state", "uncertain", "--limit", "1000"]);
    let expected = if uncertain.is_empty() { 3 } else { 6 };
    assert_eq!(r.code, expected, "{}", r.stderr);
    let second = per_id(&rabbit.drain(&q));
    for id in replayed.iter().chain(&uncertain) {
        assert!(
            !second.contains_key(id),
            "{id} was (maybe) sent by the killed run and must not be republished"
        );
    }
    assert_eq!(
        db.dlq(&["list", "--state", "replayed", "--limit", "1000"])
            .json()
            .as_array()
            .unwrap()
            .len()
            + uncertain.len(),
        200
    );
}

#[test]
fn a_plan_killed_and_rerun_at_once_reports_every_open_attempt_uncertain() {
    // Once broke: the rerun said not_replayed ("a replay by tester is publishing it"),
    // exit 3, for rows the dead run may have delivered, and listed none as uncertain.
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_v2_kill_now");
    let db = TestDb::migrated(Backend::Postgres);
    seed(&db, &q, 400, "n");
    let plan = db.plan_file(&["--limit", "1000"]);
    let path = plan.path().to_str().unwrap().to_string();
    let mut child = db
        .cmd()
        .args([
            "--connect-timeout",
            "2s",
            "replay",
            "--plan",
            &path,
            "--yes",
            "--rate",
            "300/s",
            "--confirm-timeout",
            "2s",
            "--lease",
            // Long enough that a loaded machine still asks within it.
            "45s",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while rabbit.count(&q) < 50 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "never published"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    signal(&child, "KILL");
    child.wait().unwrap();
    let open = open_attempts(&db);
    assert!(!open.is_empty(), "killed mid-chunk");
    // A killed run is no proof that it is gone: resolve waits for its lease, naming the time.
    let s = db.show(&open[0]);
    assert_eq!(s["settling"], "running", "{s}");
    let until = s["settling_until"].as_str().unwrap().to_string();
    let r = db.dlq(&["resolve", &open[0], "--delivered", "--note", "too early"]);
    assert_eq!(r.code, 3, "{}", r.all());
    let detail = r.json()["detail"].as_str().unwrap().to_string();
    assert!(detail.contains(&until[..16]), "{detail}");
    let r = db.dlq(&["replay", "--plan", &path, "--yes"]);
    assert_eq!(r.code, 6, "{}", r.all());
    let lines = r.lines();
    for line in lines.iter().filter(|l| l.get("id").is_some()) {
        let id = line["id"].as_str().unwrap().to_string();
        if open.binary_search(&id).is_ok() {
            assert_eq!(line["outcome"], "uncertain", "{line}");
        }
    }
    let summary = &lines.last().unwrap()["summary"];
    assert_eq!(summary["worst"], "uncertain", "{summary}");
    let mut listed = db.ids(&["--state", "uncertain", "--limit", "1000"]);
    listed.sort();
    assert_eq!(listed, open, "every open attempt is listed uncertain");
    for (id, n) in per_id(&rabbit.drain(&q)) {
        assert_eq!(n, 1, "{id} delivered twice");
    }
    // Once the killed run's lease has ended, resolve decides.
    while db.show(&open[0])["settling"] == "running" {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "lease never ended"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let r = db.dlq(&[
        "resolve",
        &open[0],
        "--delivered",
        "--note",
        "seen by the consumer",
    ]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(db.show(&open[0])["state"], "replayed");
}

#[test]
fn worst_is_the_exit_code_after_sigterm_and_a_completed_run() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_v2_worst");
    let db = TestDb::migrated(Backend::Sqlite);
    seed(&db, &q, 300, "w");
    let plan = db.plan_file(&["--limit", "1000"]);
    let path = plan.path().to_str().unwrap().to_string();
    let child = db
        .cmd()
        .args(["replay", "--plan", &path, "--yes", "--rate", "100/s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while rabbit.count(&q) < 20 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "never published"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    signal(&child, "TERM");
    let r = Run::from(child.wait_with_output().unwrap());
    let s = summary_of(&r);
    assert_eq!(s["stopped"], "interrupted", "{s}");
    assert!(
        r.code == 3 || r.code == 6,
        "something went out: {}",
        r.all()
    );
    assert!(s["not_reached"].as_u64().unwrap() > 0, "{s}");
    // The rest, to the end: nothing stopped it.
    let r = db.dlq(&["replay", "--plan", &path, "--yes"]);
    let s = summary_of(&r);
    assert_eq!(s["stopped"], serde_json::Value::Null, "{s}");
    assert_ne!(r.code, 0, "the first run's items are not replayed again");
    for (id, n) in per_id(&rabbit.drain(&q)) {
        assert_eq!(n, 1, "{id} delivered twice");
    }
    seed(&db, &q, 3, "x");
    let fresh = db.plan_file(&["--limit", "10"]);
    let r = db.dlq(&["replay", "--plan", fresh.path().to_str().unwrap(), "--yes"]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(summary_of(&r)["worst"], "replayed");
}
