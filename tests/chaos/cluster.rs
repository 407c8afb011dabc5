//! A clustered broker: replays that survive the loss of a node. Each test starts a
//! throw-away 3-node RabbitMQ cluster on loopback (tests/cluster/cluster.sh: own node
//! names, ports, data directories, cookie and epmd; the system broker on 5672 is never
//! touched) and stops it afterwards. Run them alone with `cargo test --test chaos cluster::`.

use crate::common::*;
use lapin::types::{AMQPValue, FieldTable};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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
    let _alone = crate::alone();
    let cluster = Cluster::up();
    let mut rabbit = Rabbit::on(&cluster.url(1));
    let q = quorum_queue(&mut rabbit, "dlq_cluster_plan");
    let db = TestDb::migrated(Backend::Postgres);
    seed(&db, &q, 3000);
    let plan = plan_file(&db);
    let started = Instant::now();
    let child = db.spawn_plan(
        &plan,
        &[
            "--rate",
            "400/s",
            "--connect-timeout",
            "3s",
            "--confirm-timeout",
            "5s",
        ],
        &[("DLQ_AMQP_URL", cluster.urls())],
    );
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
    let _alone = crate::alone();
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
    let _alone = crate::alone();
    let cluster = Cluster::up();
    // The queue's leader is on node 1 (declared there); dlq publishes through node 0.
    let mut leader_side = Rabbit::on(&cluster.url(1));
    let q = quorum_queue(&mut leader_side, "dlq_cluster_leader");
    let db = TestDb::migrated(Backend::Sqlite);
    seed(&db, &q, 2000);
    let plan = plan_file(&db);
    let started = Instant::now();
    let child = db.spawn_plan(
        &plan,
        &["--rate", "400/s"],
        &[("DLQ_AMQP_URL", cluster.urls())],
    );
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
    let _alone = crate::alone();
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

/// Waits until `queue` answers a passive declare through node 0: its node is back.
fn wait_until_up(cluster: &Cluster, queue: &str) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let r = Rabbit::on(&cluster.url(0));
        let passive = lapin::options::QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        let declared = r.block_on(r.channel().queue_declare(
            queue.into(),
            passive,
            FieldTable::default(),
        ));
        if declared.is_ok() {
            return;
        }
        assert!(Instant::now() < deadline, "{queue} never came back");
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The queue's leader node, as the cluster reports it.
fn leader_of(cluster: &Cluster, queue: &str) -> String {
    let out = cluster.run(&["ctl", "0", "list_queues", "name", "leader", "--quiet"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some(queue)).then(|| w.next().unwrap_or("").to_string())
        })
        .unwrap_or_default()
}

/// A cluster behind one address (the test Proxy as a load balancer, in front of node 0)
/// looks like one node to dlq. Node 1 is killed mid-plan: it leads the quorum queue
/// that half the plan goes to, and is home to a classic durable queue that takes the
/// other half (a queue whose node goes down is nacked, though it may keep what it
/// stored). No row is released that a queue holds once the node is back, nothing is
/// delivered twice, and each item ends replayed, uncertain, or pending and in no queue.
/// (With one URL such a nack released its row, as on one node: a duplicate to come.)
#[test]
fn a_cluster_behind_one_address_never_releases_what_its_queues_may_hold() {
    let _alone = crate::alone();
    let cluster = Cluster::up();
    let mut node1 = Rabbit::on(&cluster.url(1));
    let quorum = quorum_queue(&mut node1, "dlq_cluster_lb_quorum");
    let classic = node1.queue("dlq_cluster_lb_classic");
    assert!(
        leader_of(&cluster, &quorum).starts_with("dlqb@"),
        "declared on node 1, led there: {}",
        leader_of(&cluster, &quorum)
    );
    let lb = Proxy::start(
        &format!("127.0.0.1:{}", cluster.base),
        OnServerBytes::Nothing,
    );
    let db = TestDb::migrated(Backend::Postgres);
    let mut lines = String::new();
    for i in 0..2000 {
        let (id, q) = (format!("c{i:05}"), [&quorum, &classic][i % 2]);
        let body = format!("{{\"event_id\":\"evt-{id}\"}}");
        lines.push_str(&format!("{}\n", letter(&id, q, body.as_bytes())));
    }
    let r = db.dlq_stdin(&["import", "-"], lines.as_bytes());
    assert_eq!(r.code, 0, "{}", r.all());
    let plan = plan_file(&db);
    let started = Instant::now();
    let child = db.spawn_plan(
        &plan,
        &[
            "--rate",
            "400/s",
            "--connect-timeout",
            "3s",
            "--confirm-timeout",
            "5s",
        ],
        &[(
            "DLQ_AMQP_URL",
            format!("amqp://guest:guest@{}/%2f", lb.addr()),
        )],
    );
    while replayed(&db) < 300 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the run never got going"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    cluster.node("kill", 1);
    let r = Run::from(child.wait_with_output().unwrap());
    let took = started.elapsed();
    cluster.node("start", 1);
    let outcomes: Vec<String> = r
        .lines()
        .iter()
        .filter_map(|l| l["outcome"].as_str().map(str::to_string))
        .collect();
    let count = |o: &str| outcomes.iter().filter(|x| *x == o).count();
    let worst = match (count("uncertain"), count("publish_failed")) {
        (u, _) if u > 0 => 6,
        (_, f) if f > 0 => 5,
        _ => 0,
    };
    assert_eq!(
        r.code, worst,
        "the exit code is the worst item's: {}",
        r.stderr
    );

    // The node is back: what each queue holds now is what was delivered.
    wait_until_up(&cluster, &classic);
    wait_until_up(&cluster, &quorum);
    let drain = Rabbit::on(&cluster.url(0));
    let mut got = per_id(&drain.drain(&quorum));
    for (id, n) in per_id(&drain.drain(&classic)) {
        *got.entry(id).or_default() += n;
    }
    let listed = db
        .dlq(&["list", "--state", "all", "--limit", "5000"])
        .json();
    let states: std::collections::HashMap<String, String> = listed
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
    assert_eq!(states.len(), 2000);
    for (id, n) in &got {
        assert_eq!(*n, 1, "{id} delivered {n} times");
    }
    for (id, state) in &states {
        match state.as_str() {
            "replayed" => assert!(got.contains_key(id), "{id} replayed but in no queue"),
            "uncertain" => {}
            "pending" => assert!(
                !got.contains_key(id),
                "{id} is in a queue but pending: released although the queue holds it"
            ),
            other => panic!("{id} is {other}"),
        }
    }
    let mut why = std::collections::BTreeMap::<String, usize>::new();
    for l in r
        .lines()
        .iter()
        .filter(|l| l["outcome"].is_string() && l["outcome"] != "replayed")
    {
        let d: String = l["detail"]
            .as_str()
            .unwrap_or("")
            .chars()
            .take(90)
            .collect();
        *why.entry(format!("{}: {d}", l["outcome"])).or_default() += 1;
    }
    eprintln!(
        "cluster behind one address: 2000 items at 400/s, node 1 killed, run took {took:?}: {} replayed, {} uncertain, {} publish_failed; {} in the queues; {why:#?}",
        count("replayed"),
        count("uncertain"),
        count("publish_failed"),
        got.len()
    );
}

// How dlq knows the broker is one node. These use the system broker (one node) and no
// cluster: what they check is what dlq concludes from what it is told.

/// A queue that refuses every publish (reject-publish, max length 0) on the system node,
/// and a store holding `ids`, each to be replayed into it.
fn refusing_target(ids: &[&str]) -> (Rabbit, String, TestDb) {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue_with("dlq_topology_full", refusing_queue_args());
    let db = TestDb::migrated(Backend::Sqlite);
    for id in ids {
        db.add(letter(
            id,
            &q,
            format!("{{\"event_id\":\"evt-{id}\"}}").as_bytes(),
        ));
    }
    (rabbit, q, db)
}

/// The default (nothing said about the broker) makes a nack through one URL `uncertain`:
/// one address may be a load balancer in front of a cluster (it once was publish_failed).
/// Said to be one node, by flag, variable or profile, the same nack is publish_failed.
#[test]
fn a_nack_through_one_url_is_certain_only_on_a_broker_said_to_be_one_node() {
    let (rabbit, q, db) = refusing_target(&["n1", "n2", "n3", "n4", "n5"]);
    let r = db.dlq(&["replay", "n1", "--yes"]);
    assert_eq!(r.code, 6, "{}", r.all());
    let j = r.json();
    assert_eq!(j["outcome"], "uncertain");
    let detail = j["detail"].as_str().unwrap();
    assert!(
        detail.contains("nack") && detail.contains("--broker-topology single"),
        "the detail says how to tell dlq: {detail}"
    );
    assert_eq!(db.show("n1")["state"], "uncertain");
    assert_eq!(db.ids(&["--state", "uncertain"]), vec!["n1".to_string()]);

    let r = db.dlq(&["--broker-topology", "cluster", "replay", "n2", "--yes"]);
    assert_eq!(r.code, 6, "{}", r.all());
    assert!(r.json()["detail"]
        .as_str()
        .unwrap()
        .contains("in a cluster"));

    let r = db.dlq_env(
        &["replay", "n3", "--yes"],
        &[("DLQ_BROKER_TOPOLOGY", "single")],
    );
    assert_eq!(r.code, 5, "{}", r.all());
    assert_eq!(db.show("n3")["state"], "pending");

    let xdg = tempfile::tempdir().unwrap();
    write_config(
        xdg.path(),
        "[profiles.local]\nbroker_topology = \"single\"\n",
    );
    let with_profile = |args: &[&str]| {
        let mut c = db.cmd();
        c.env("XDG_CONFIG_HOME", xdg.path());
        Run::from(c.args(args).output().unwrap())
    };
    let r = with_profile(&["--profile", "local", "replay", "n4", "--yes"]);
    assert_eq!(r.code, 5, "the profile's word: {}", r.all());
    assert_eq!(db.show("n4")["state"], "pending");
    let r = with_profile(&[
        "--profile",
        "local",
        "--broker-topology",
        "cluster",
        "replay",
        "n5",
        "--yes",
    ]);
    assert_eq!(r.code, 6, "a flag beats the profile: {}", r.all());
    assert_eq!(rabbit.count(&q), 0);
}

/// `single` with several node URLs contradicts itself and is refused before anything
/// is claimed: typed, a usage error (2); from a profile, a configuration error (1). A
/// bad value in a profile stops the commands that publish, not `list`.
#[test]
fn a_broker_topology_that_cannot_be_true_is_refused() {
    let (_rabbit, _q, db) = refusing_target(&["t1"]);
    let urls = format!("{AMQP},amqp://guest:guest@127.0.0.1:1/%2f");
    let r = db.dlq_env(
        &["--broker-topology", "single", "replay", "t1", "--yes"],
        &[("DLQ_AMQP_URL", &urls)],
    );
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(r.stderr.contains("several URLs"), "{}", r.stderr);
    assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
    let r = db.dlq(&["--broker-topology", "bogus", "list"]);
    assert_eq!(r.code, 2, "{}", r.all());

    let xdg = tempfile::tempdir().unwrap();
    let with_profile = |body: &str, args: &[&str]| {
        write_config(xdg.path(), body);
        let mut c = db.cmd();
        c.env("XDG_CONFIG_HOME", xdg.path())
            .env("DLQ_AMQP_URL", &urls);
        Run::from(c.args(args).output().unwrap())
    };
    let single = "[profiles.p]\nbroker_topology = \"single\"\n";
    let r = with_profile(single, &["--profile", "p", "replay", "t1", "--yes"]);
    assert_eq!(r.code, 1, "{}", r.all());
    assert!(r.stderr.contains("profile p"), "{}", r.stderr);
    let bogus = "[profiles.p]\nbroker_topology = \"bogus\"\n";
    let r = with_profile(bogus, &["--profile", "p", "replay", "t1", "--yes"]);
    assert_eq!(r.code, 1, "{}", r.all());
    assert!(r.stderr.contains("broker_topology"), "{}", r.stderr);
    let r = with_profile(bogus, &["--profile", "p", "list"]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(db.show("t1")["state"], "pending", "nothing was claimed");
}
