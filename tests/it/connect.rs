//! Connections to the services: what AMQP URLs mean, refused ports and black holes
//! within the connect timeout, a blocked broker, read commands that never touch RabbitMQ.

use crate::common::*;
use std::time::{Duration, Instant};

/// A PostgreSQL port nobody listens on is reported as refused at once, as the broker's
/// is, not after the connect timeout as "timed out".
#[test]
fn a_refused_postgres_port_says_refused_before_the_connect_timeout() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let db = TestDb::new(Backend::Sqlite);
    let mut c = db.cmd();
    c.env(
        "DLQ_DATABASE_URL",
        format!("postgres://postgres:PWCANARY@127.0.0.1:{port}/x"),
    );
    let started = Instant::now();
    let r = Run::from(
        c.args(["list", "--connect-timeout", "30s"])
            .output()
            .unwrap(),
    );
    let took = started.elapsed();
    assert_eq!(r.code, 1, "{}", r.all());
    assert!(r.stderr.contains("refused"), "{}", r.stderr);
    // The context says which database, its password masked.
    assert!(
        r.stderr.contains(&format!(
            "opening postgres://postgres:***@127.0.0.1:{port}/x"
        )),
        "{}",
        r.stderr
    );
    assert!(!r.stderr.contains("PWCANARY"), "{}", r.stderr);
    // Well short of the 30 s connect timeout (what sqlx alone would wait).
    assert!(took < Duration::from_secs(20), "took {took:?}");
}

#[test]
fn amqp_urls_mean_what_they_say() {
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("d1", "q", SMALL_BODY));
    // An IPv6 literal is dialled as such (nothing listens on [::1] here), not as localhost.
    let r = db.dlq_env(
        &["replay", "d1", "--yes"],
        &[("DLQ_AMQP_URL", "amqp://guest:guest@[::1]:5672/%2f")],
    );
    assert_eq!(r.code, 5, "{}", r.all());
    assert!(
        r.json()["detail"].as_str().unwrap().contains("[::1]:5672"),
        "{}",
        r.stdout
    );
    db.add(letter("d2", "q", SMALL_BODY));
    let r = db.dlq_env(
        &["replay", "d2", "--yes"],
        &[("DLQ_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")],
    );
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(
        r.stderr.contains("empty vhost") && r.stderr.contains("%2f"),
        "{}",
        r.stderr
    );
    assert_eq!(
        db.show("d2")["history"],
        serde_json::json!([]),
        "nothing claimed on a usage error"
    );
}

#[test]
fn a_black_holed_database_or_broker_fails_within_the_connect_timeout() {
    let hole = Proxy::start("127.0.0.1:1", OnServerBytes::Blackhole);
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("d1", "q", SMALL_BODY));
    let started = Instant::now();
    let r = db.dlq_env(
        &["list", "--connect-timeout", "1s"],
        &[(
            "DLQ_DATABASE_URL",
            &format!("postgres://postgres@{}/x", hole.addr()),
        )],
    );
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(r.code, 1, "{}", r.all());
    assert!(r.stderr.contains("timed out"), "{}", r.stderr);

    let started = Instant::now();
    let r = db.dlq_env(
        &["replay", "d1", "--yes", "--connect-timeout", "1s"],
        &[(
            "DLQ_AMQP_URL",
            &format!("amqp://guest:guest@{}/%2f", hole.addr()),
        )],
    );
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(r.code, 5, "{}", r.all());
    assert!(
        r.json()["detail"]
            .as_str()
            .unwrap()
            .contains("timed out after 1s connecting"),
        "{}",
        r.stdout
    );
    assert_eq!(db.show("d1")["state"], "pending");
}

#[test]
fn a_blocked_connection_publishes_nothing() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_h_blocked");
    let proxy = Proxy::start(
        "127.0.0.1:5672",
        OnServerBytes::Inject(CONNECTION_OPEN_OK.to_vec(), connection_blocked_frame()),
    );
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("d1", &q, SMALL_BODY));
    let r = db.dlq_env(
        &["replay", "d1", "--yes"],
        &[(
            "DLQ_AMQP_URL",
            &format!("amqp://guest:guest@{}/%2f", proxy.addr()),
        )],
    );
    assert_eq!(r.code, 5, "{}", r.all());
    assert!(
        r.json()["detail"].as_str().unwrap().contains("blocked"),
        "{}",
        r.stdout
    );
    assert_eq!(rabbit.count(&q), 0);
    assert_eq!(db.show("d1")["state"], "pending");
}

#[test]
fn read_commands_never_connect_to_rabbitmq() {
    let proxy = Proxy::start("127.0.0.1:5672", OnServerBytes::Nothing);
    let db = TestDb::migrated(Backend::Sqlite);
    db.import_examples();
    let amqp = format!("amqp://guest:guest@{}/%2f", proxy.addr());
    let env = [("DLQ_AMQP_URL", amqp.as_str())];
    for args in [
        vec!["list"],
        vec!["aggregate", "--by", "reason"],
        vec!["show", "6ee0b5b6-0000-0000-0000-000000000000"],
    ] {
        let _ = db.dlq_env(&args, &env);
    }
    let first = db.dlq(&["list", "--limit", "1"]).json()[0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(db.dlq_env(&["show", &first], &env).code, 0);
    assert_eq!(
        proxy.connections.load(std::sync::atomic::Ordering::SeqCst),
        0
    );
}
