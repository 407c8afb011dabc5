//! A clustered broker: replays that survive the loss of a node. Each test starts a
//! throw-away 3-node RabbitMQ cluster on loopback (tests/cluster/cluster.sh: own node
//! names, ports, data directories, cookie and epmd; the system broker on 5672 is never
//! touched) and stops it afterwards. Run them alone with `cargo test --test cluster`.

mod common;
use common::*;
use lapin::types::{AMQPValue, FieldTable};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One cluster at a time: three nodes are heavy on a small machine.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

struct Cluster {
    dir: tempfile::TempDir,
    base: u16,
}

impl Cluster {
    fn script() -> String {
        format!("{}/tests/cluster/cluster.sh", env!("CARGO_MANIFEST_DIR"))
    }

    fn run(&self, args: &[&str]) -> std::process::Output {
        Command::new("bash")
            .arg(Self::script())
            .arg(args[0])
            .arg(self.dir.path())
            .args(&args[1..])
            .output()
            .unwrap()
    }

    fn up() -> Cluster {
        // A base port whose whole range (AMQP, distribution, CLI, epmd) is free.
        let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
        let mut base = 20000 + (std::process::id() % 200) as u16 * 100;
        while !(0..=3)
            .chain(100..=103)
            .chain(150..=159)
            .chain([200])
            .all(|o| free(base + o))
        {
            base += 300;
        }
        let c = Cluster {
            dir: tempfile::tempdir().unwrap(),
            base,
        };
        let out = c.run(&["up", &base.to_string()]);
        assert!(
            out.status.success(),
            "cluster up: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        c
    }

    fn url(&self, node: u16) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.base + node)
    }

    fn urls(&self) -> String {
        (0..3).map(|n| self.url(n)).collect::<Vec<_>>().join(",")
    }

    fn node(&self, cmd: &str, node: u16) {
        let out = self.run(&[cmd, &node.to_string()]);
        // A node that rejoins may report its start late; what the tests check is the
        // run and the queue, not the node's own answer.
        if !out.status.success() {
            eprintln!(
                "note: {cmd} {node}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.run(&["down"]);
    }
}

fn quorum_queue(rabbit: &mut Rabbit, prefix: &str) -> String {
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    args.insert("x-quorum-initial-group-size".into(), AMQPValue::LongInt(3));
    rabbit.queue_with(prefix, args)
}

fn seed(db: &TestDb, queue: &str, n: usize) {
    let mut lines = String::new();
    for i in 0..n {
        let id = format!("c{i:05}");
        let body = format!("{{\"event_id\":\"evt-{id}\"}}");
        lines.push_str(&letter(&id, queue, body.as_bytes()).to_string());
        lines.push('\n');
    }
    let r = db.dlq_stdin(&["import", "-"], lines.as_bytes());
    assert_eq!(r.code, 0, "{}", r.all());
}

fn plan_file(db: &TestDb) -> tempfile::NamedTempFile {
    let r = db.dlq(&["plan", "--limit", "100000"]);
    assert_eq!(r.code, 0, "{}", r.all());
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), &r.stdout).unwrap();
    f
}

fn replayed(db: &TestDb) -> i64 {
    db.scalar("SELECT count(*) FROM dead_letters WHERE replayed_at IS NOT NULL")
}

#[test]
fn a_plan_survives_the_loss_of_its_node_and_never_delivers_twice() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = Cluster::up();
    let mut rabbit = Rabbit::on(&cluster.url(1));
    let q = quorum_queue(&mut rabbit, "dlq_cluster_plan");
    let db = TestDb::migrated(Backend::Postgres);
    seed(&db, &q, 3000);
    let plan = plan_file(&db);
    let started = Instant::now();
    let child = db
        .cmd()
        .args([
            "replay",
            "--plan",
            plan.path().to_str().unwrap(),
            "--yes",
            "--rate",
            "400/s",
            "--connect-timeout",
            "3s",
            "--confirm-timeout",
            "5s",
        ])
        .env("DLQ_AMQP_URL", cluster.urls())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // dlq connects to the first node; kill it once the run is well under way.
    while replayed(&db) < 400 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the run never got going"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    cluster.node("kill", 0);
    let killed_at = started.elapsed();
    let r = Run::from(child.wait_with_output().unwrap());
    let took = started.elapsed();
    cluster.node("start", 0);
    let summary = r.lines().last().unwrap()["summary"].clone();
    assert!(
        summary["node_switches"].as_u64().unwrap() >= 1,
        "the run went on through another node: {summary}\n{}",
        r.stderr
    );
    assert!(
        r.stderr.contains("was lost"),
        "a line says so: {}",
        r.stderr
    );
    assert!(matches!(r.code, 0 | 5 | 6), "{}", r.stderr);

    let got = per_id(&rabbit.drain(&q));
    for (id, n) in &got {
        assert_eq!(*n, 1, "{id} delivered {n} times");
        let state = db.show(id)["state"].as_str().unwrap().to_string();
        assert!(
            state == "replayed" || state == "uncertain",
            "{id} was delivered but is {state}"
        );
    }
    for id in db.ids(&["--state", "replayed", "--limit", "5000"]) {
        assert!(
            got.contains_key(&id),
            "{id} is marked replayed but not in the queue"
        );
    }
    assert!(
        replayed(&db) > 2500,
        "most of the plan went through the other nodes: {}",
        replayed(&db)
    );
    eprintln!(
        "cluster plan: 3000 items at 400/s, node killed after {killed_at:?}, run took {took:?}, {} switches, {} replayed, {} uncertain",
        summary["node_switches"],
        replayed(&db),
        db.ids(&["--state", "uncertain", "--limit", "5000"]).len()
    );
}

#[test]
fn a_single_replay_whose_node_fails_while_it_waits_for_the_confirm_is_never_released() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = Cluster::up();
    let mut rabbit = Rabbit::on(&cluster.url(1));
    let q = quorum_queue(&mut rabbit, "dlq_cluster_single");
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("s1", &q, br#"{"event_id":"evt-s1"}"#));
    // The broker's confirm is held back; the node then dies with the message unconfirmed.
    let proxy = Proxy::start(
        &format!("127.0.0.1:{}", cluster.base),
        OnServerBytes::Stall(BASIC_ACK.to_vec()),
    );
    let child = db
        .cmd()
        .args(["replay", "s1", "--yes", "--confirm-timeout", "20s"])
        .env(
            "DLQ_AMQP_URL",
            format!("amqp://guest:guest@{}/%2f,{}", proxy.addr(), cluster.url(2)),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let waited = Instant::now();
    while db.show("s1")["replay_attempt_at"].is_null() {
        assert!(
            waited.elapsed() < Duration::from_secs(30),
            "never attempted"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    cluster.node("kill", 0);
    proxy.cut.store(true, std::sync::atomic::Ordering::SeqCst);
    let r = Run::from(child.wait_with_output().unwrap());
    assert!(matches!(r.code, 0 | 6), "{}", r.all());
    let state = db.show("s1")["state"].as_str().unwrap().to_string();
    match r.code {
        0 => assert_eq!(state, "replayed"),
        _ => assert_eq!(state, "uncertain", "never released: {}", r.all()),
    }
    assert!(rabbit.drain(&q).len() <= 1);
}

#[test]
fn a_leader_that_moves_does_not_stall_the_run() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = Cluster::up();
    // The queue's leader is on node 1 (declared there); dlq publishes through node 0.
    let mut leader_side = Rabbit::on(&cluster.url(1));
    let q = quorum_queue(&mut leader_side, "dlq_cluster_leader");
    let db = TestDb::migrated(Backend::Sqlite);
    seed(&db, &q, 2000);
    let plan = plan_file(&db);
    let started = Instant::now();
    let child = db
        .cmd()
        .args([
            "replay",
            "--plan",
            plan.path().to_str().unwrap(),
            "--yes",
            "--rate",
            "400/s",
        ])
        .env("DLQ_AMQP_URL", cluster.urls())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    while replayed(&db) < 300 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the run never got going"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    cluster.node("stop", 1);
    let r = Run::from(child.wait_with_output().unwrap());
    let took = started.elapsed();
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(took < Duration::from_secs(60), "the run stalled: {took:?}");
    let drain_side = Rabbit::on(&cluster.url(0));
    let got = per_id(&drain_side.drain(&q));
    assert_eq!(got.len(), 2000);
    assert!(got.values().all(|n| *n == 1));
    eprintln!("leader moved: 2000 items at 400/s took {took:?}");
}

#[test]
fn capture_from_a_quorum_queue_survives_the_loss_of_its_node_and_stores_each_message_once() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = Cluster::up();
    let mut rabbit = Rabbit::on(&cluster.url(1));
    let q = quorum_queue(&mut rabbit, "dlq_cluster_capture");
    for i in 0..3000 {
        rabbit.publish_raw(&q, format!("{{\"event_id\":\"cap-{i:05}\"}}").as_bytes());
    }
    let waited = Instant::now();
    while rabbit.count(&q) < 3000 {
        assert!(
            waited.elapsed() < Duration::from_secs(60),
            "not all published"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let db = TestDb::migrated(Backend::Postgres);
    let child = db
        .cmd()
        .args([
            "capture",
            "--queue",
            &q,
            "--follow",
            "--batch",
            "50",
            "--connect-timeout",
            "3s",
        ])
        .env("DLQ_AMQP_URL", cluster.urls())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let rows = || db.scalar("SELECT count(*) FROM dead_letters");
    let started = Instant::now();
    while rows() < 500 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "capture never got going"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    cluster.node("kill", 0);
    while rows() < 3000 && started.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(200));
    }
    signal(&child, "TERM");
    let r = Run::from(child.wait_with_output().unwrap());
    assert_eq!(rows(), 3000, "every message stored: {}", r.stderr);
    let distinct = db.scalar("SELECT count(DISTINCT body) FROM dead_letters");
    assert_eq!(distinct, 3000, "each message once");
    assert_eq!(rabbit.count(&q), 0, "and acked");
    eprintln!(
        "cluster capture: 3000 messages, node killed, took {:?}",
        started.elapsed()
    );
}
