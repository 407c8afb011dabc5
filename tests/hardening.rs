//! Secrets, TLS, timeouts, interrupts, contention and bad input.

mod common;
use common::*;
use std::process::Stdio;
use std::time::{Duration, Instant};

const CANARY: &str = "Canary-Pw-91c2e";
const BODY: &[u8] = b"{\"event_id\":\"evt-h\"}";

fn dead_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn assert_no_canary(r: &Run, what: &str) {
    assert!(
        !r.all().contains(CANARY),
        "{what}: password leaked:\n{}",
        r.all()
    );
}

#[test]
fn database_passwords_never_reach_any_output() {
    let db = TestDb::migrated(Backend::Postgres);
    let cases = [
        (
            format!("postgres://postgres:{CANARY}@127.0.0.1:{}/x", dead_port()),
            1,
        ),
        (
            format!(
                "postgres://postgres:{CANARY}@127.0.0.1:5432/{}",
                unique("nosuchdb")
            ),
            1,
        ),
        (
            format!("postgres://postgres:{CANARY}@127.0.0.1:notaport/x"),
            2,
        ),
        (
            format!("postgres://postgres:{CANARY}@127.0.0.1:5432/x?sslmode=bogus"),
            2,
        ),
    ];
    for (url, code) in &cases {
        for args in [vec!["list"], vec!["-vv", "show", "x"], vec!["claim", "x"]] {
            let r = db.dlq_env(
                &args,
                &[("DLQ_DATABASE_URL", url), ("DLQ_CONNECT_TIMEOUT", "3s")],
            );
            assert_eq!(r.code, *code, "{args:?} {}", r.all().replace(CANARY, "***"));
            assert_no_canary(&r, &format!("{args:?}"));
            assert_eq!(
                r.stderr
                    .lines()
                    .filter(|l| l.starts_with("dlq: error"))
                    .count(),
                1,
                "{}",
                r.stderr.replace(CANARY, "***")
            );
        }
    }
    // The right password in a URL works, and -vv logs nothing of it.
    let with_pw = db.url.replace("postgres@", &format!("postgres:{CANARY}@"));
    let r = db.dlq_env(&["-vv", "list"], &[("DLQ_DATABASE_URL", &with_pw)]);
    assert_eq!(r.code, 0, "{}", r.all().replace(CANARY, "***"));
    assert!(r.stderr.contains("SELECT"), "-vv shows SQL: {}", r.stderr);
    assert_no_canary(&r, "-vv list");
}

#[test]
fn broker_password_stays_out_of_verbose_logs_and_flags_warn() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_h_vv");
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("d1", &q, BODY));
    db.add(letter("d2", &q, BODY));
    let wrong = format!("amqp://guest:{CANARY}@127.0.0.1:5672/%2f");
    let r = db.dlq(&["-vv", "--amqp-url", &wrong, "replay", "d1", "--yes"]);
    assert_eq!(r.code, 5, "{}", r.all().replace(CANARY, "***"));
    assert_no_canary(&r, "-vv replay");
    assert!(r.stderr.contains("visible to other users"), "{}", r.stderr);
    // --amqp-url-file and --database-url-file: the URL never appears, the replay works.
    let dir = tempfile::tempdir().unwrap();
    let amqp_file = dir.path().join("amqp");
    std::fs::write(&amqp_file, format!("{AMQP}\n")).unwrap();
    let db_file = dir.path().join("db");
    std::fs::write(&db_file, &db.url).unwrap();
    let mut c = db.cmd();
    c.env_remove("DLQ_DATABASE_URL").env_remove("DLQ_AMQP_URL");
    let r = Run::from(
        c.args([
            "--amqp-url-file",
            amqp_file.to_str().unwrap(),
            "--database-url-file",
            db_file.to_str().unwrap(),
            "replay",
            "d2",
            "--yes",
        ])
        .output()
        .unwrap(),
    );
    assert_eq!(r.code, 0, "{}", r.all());
    assert!(!r.stderr.contains("visible to other users"));
    assert_eq!(rabbit.count(&q), 1);
}

#[test]
fn require_tls_refuses_plaintext_urls() {
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("d1", "q", BODY));
    let r = db.dlq(&["--require-tls", "replay", "d1", "--yes"]);
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(r.stderr.contains("amqps"), "{}", r.stderr);
    assert_eq!(
        db.dlq(&["--require-tls", "list"]).code,
        0,
        "SQLite is a local file"
    );
    let pg = TestDb::migrated(Backend::Postgres);
    let r = pg.dlq_env(&["list"], &[("DLQ_REQUIRE_TLS", "true")]);
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(r.stderr.contains("sslmode"), "{}", r.stderr);
    // sslmode is honoured: require encrypts; verify-full also checks the server's
    // certificate, which nothing here vouches for, so it is refused.
    let r = pg.dlq_env(
        &["list"],
        &[
            ("DLQ_REQUIRE_TLS", "1"),
            ("DLQ_DATABASE_URL", &format!("{}?sslmode=require", pg.url)),
        ],
    );
    assert_eq!(r.code, 0, "{}", r.all());
    let r = pg.dlq_env(
        &["list"],
        &[
            ("DLQ_REQUIRE_TLS", "yes"),
            (
                "DLQ_DATABASE_URL",
                &format!("{}?sslmode=verify-full", pg.url),
            ),
        ],
    );
    assert_eq!(r.code, 1, "{}", r.all());
    assert_eq!(db.show("d1")["state"], "pending");
}

/// A TLS endpoint of the tests' own in front of the plaintext broker.
fn tls_front() -> (u16, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "dlq test CA");
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();
    std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
    let certs = vec![leaf.der().clone()];
    let key =
        tokio_rustls::rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into());
    let config = tokio_rustls::rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
        tokio_rustls::rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        rt().block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let Ok(mut up) = tokio::net::TcpStream::connect("127.0.0.1:5672").await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut up).await;
                });
            }
        });
    });
    (port, dir)
}

#[test]
fn amqps_trusts_the_given_ca_file_and_refuses_an_unknown_one() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_h_tls");
    let (port, dir) = tls_front();
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("d1", &q, BODY));
    let url = format!("amqps://guest:guest@localhost:{port}/%2f");
    let r = db.dlq_env(
        &["replay", "d1", "--yes", "--connect-timeout", "5s"],
        &[("DLQ_AMQP_URL", &url)],
    );
    assert_eq!(r.code, 5, "an unknown CA is refused: {}", r.all());
    assert_eq!(rabbit.count(&q), 0);
    let ca = dir.path().join("ca.pem");
    let r = db.dlq_env(
        &[
            "--require-tls",
            "--amqp-ca-file",
            ca.to_str().unwrap(),
            "replay",
            "d1",
            "--yes",
        ],
        &[("DLQ_AMQP_URL", &url)],
    );
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(rabbit.drain(&q).len(), 1);
}

#[test]
fn amqp_urls_mean_what_they_say() {
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("d1", "q", BODY));
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
    db.add(letter("d2", "q", BODY));
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
fn postgres_lock_waits_are_bounded_and_named() {
    let db = TestDb::migrated(Backend::Postgres);
    db.add(letter("d1", "q", BODY));
    let url = db.url.clone();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (held_tx, held_rx) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        rt().block_on(async move {
            let pool = sqlx::PgPool::connect(&url).await.unwrap();
            let mut t = pool.begin().await.unwrap();
            sqlx::query("SELECT id FROM dead_letters WHERE id = 'd1' FOR UPDATE")
                .execute(&mut *t)
                .await
                .unwrap();
            held_tx.send(()).unwrap();
            let _ = rx.recv_timeout(Duration::from_secs(30));
            t.rollback().await.unwrap();
        })
    });
    held_rx.recv().unwrap();
    let started = Instant::now();
    let r = db.dlq(&["claim", "d1", "--lock-timeout", "1s"]);
    assert!(started.elapsed() < Duration::from_secs(8));
    assert_eq!(r.code, 1, "{}", r.all());
    assert!(r.stderr.contains("lock wait timed out"), "{}", r.stderr);
    tx.send(()).unwrap();
    holder.join().unwrap();
    assert_eq!(db.show("d1")["state"], "pending");
}

#[test]
fn a_black_holed_database_or_broker_fails_within_the_connect_timeout() {
    let hole = Proxy::start("127.0.0.1:1", OnServerBytes::Blackhole);
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("d1", "q", BODY));
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
    db.add(letter("d1", &q, BODY));
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
fn sigterm_before_publishing_releases_the_claim_and_exits_130() {
    let hole = Proxy::start("127.0.0.1:1", OnServerBytes::Blackhole);
    let db = TestDb::migrated(Backend::Postgres);
    db.add(letter("d1", "q", BODY));
    let child = db
        .cmd()
        .args([
            "replay",
            "d1",
            "--yes",
            "--connect-timeout",
            "30s",
            "--lease",
            "5m",
        ])
        .env(
            "DLQ_AMQP_URL",
            format!("amqp://guest:guest@{}/%2f", hole.addr()),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        db.show("d1")["state"],
        "claimed",
        "claimed while the broker hangs"
    );
    let started = Instant::now();
    signal(&child, "TERM");
    let r = Run::from(child.wait_with_output().unwrap());
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(r.code, 130, "{}", r.all());
    assert_eq!(r.json()["outcome"], "interrupted");
    let s = db.show("d1");
    assert_eq!(s["state"], "pending", "claim released");
    assert!(s["history"]
        .as_array()
        .unwrap()
        .iter()
        .any(|h| h["outcome"] == "interrupted"));
}

#[test]
fn sigint_while_waiting_for_the_confirm_is_uncertain_and_recorded() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_h_int");
    let proxy = Proxy::start("127.0.0.1:5672", OnServerBytes::Stall(BASIC_ACK.to_vec()));
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("d1", &q, BODY));
    let child = db
        .cmd()
        .args(["replay", "d1", "--yes", "--confirm-timeout", "60s"])
        .env(
            "DLQ_AMQP_URL",
            format!("amqp://guest:guest@{}/%2f", proxy.addr()),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Interrupt once the broker has the message and dlq waits for the confirm.
    let waited = Instant::now();
    while rabbit.count(&q) == 0 {
        assert!(
            waited.elapsed() < Duration::from_secs(20),
            "never published"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    signal(&child, "INT");
    let r = Run::from(child.wait_with_output().unwrap());
    assert_eq!(r.code, 6, "{}", r.all());
    let s = db.show("d1");
    assert_eq!(s["state"], "uncertain");
    assert_eq!(s["replayed_at"], serde_json::Value::Null);
    assert!(
        s["last_replay_error"]
            .as_str()
            .unwrap()
            .contains("interrupted"),
        "{s}"
    );
    assert!(s["history"]
        .as_array()
        .unwrap()
        .iter()
        .any(|h| h["outcome"] == "uncertain"));
    assert_eq!(rabbit.count(&q), 1, "it did reach the broker");
}

#[test]
fn sqlite_writer_contention_is_clear_and_retryable() {
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("d1", "q", BODY));
    let hold = |ms: u64| {
        let url = db.url.clone();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let h = std::thread::spawn(move || {
            rt().block_on(async move {
                use sqlx::Connection;
                let mut c = sqlx::SqliteConnection::connect(&url).await.unwrap();
                sqlx::query("BEGIN IMMEDIATE")
                    .execute(&mut c)
                    .await
                    .unwrap();
                ready_tx.send(()).unwrap();
                tokio::time::sleep(Duration::from_millis(ms)).await;
                sqlx::query("COMMIT").execute(&mut c).await.unwrap();
            })
        });
        ready_rx.recv().unwrap();
        h
    };
    let h = hold(4000);
    let r = db.dlq(&["claim", "d1", "--lock-timeout", "1s"]);
    assert_eq!(r.code, 1, "{}", r.all());
    assert!(
        r.stderr.contains("locked") && r.stderr.contains("try again"),
        "{}",
        r.stderr
    );
    h.join().unwrap();
    assert_eq!(db.show("d1")["state"], "pending", "no change");
    let h = hold(500);
    let r = db.dlq(&["claim", "d1", "--lock-timeout", "5s"]);
    assert_eq!(r.code, 0, "a shorter hold just waits: {}", r.all());
    h.join().unwrap();
}

#[test]
fn more_bad_input_is_refused_with_one_line() {
    use std::os::unix::ffi::OsStrExt;
    let db = TestDb::migrated(Backend::Sqlite);
    let long = "x".repeat(10_000);
    for args in [
        vec!["show", long.as_str()],
        vec!["list", "--producer", "a\nb"],
        vec!["replay", "x", "--yes", "--confirm-timeout", "0s"],
        vec!["aggregate", "--by", ""],
        vec!["aggregate", "--by", "hour,day"],
        vec!["replay", "--plan", "p.json", "--rate", "0/s"],
        vec!["replay", "--plan", "p.json", "--rate", "fast"],
        vec!["list", "--state", "stuck"],
        vec!["replay", "x", "--yes", "--expect-sha256", "abc"],
    ] {
        let r = db.dlq(&args);
        assert_eq!(r.code, 2, "{args:?}: {}", r.all());
    }
    let r = Run::from(
        db.cmd()
            .arg("show")
            .arg(std::ffi::OsStr::from_bytes(b"\xff\xfe"))
            .output()
            .unwrap(),
    );
    assert_eq!(r.code, 2, "invalid UTF-8 argument: {}", r.all());
    let r = db.dlq(&["replay", "--plan", "/nonexistent/plan.json", "--yes"]);
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(r.stderr.contains("cannot read plan"));
}

#[test]
fn a_50_mib_body_is_cut_in_the_table_view() {
    let db = TestDb::migrated(Backend::Sqlite);
    db.sql(&["INSERT INTO dead_letters (id, body, reason, attempts, headers_json) VALUES ('big', randomblob(52428800), 'poison_message', 1, '{}')"]);
    let r = db.dlq(&["show", "big", "-o", "table"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout.len() < 1_000_000,
        "{} bytes printed",
        r.stdout.len()
    );
    assert!(
        r.stdout.contains("52363264 more bytes not shown"),
        "{}",
        &r.stdout[r.stdout.len() - 300..]
    );
    let r = db.dlq(&["list"]);
    assert_eq!(r.json()[0]["id"], "big");
}

#[test]
fn an_import_line_of_100_mib_is_refused_and_nothing_written() {
    let db = TestDb::migrated(Backend::Sqlite);
    let f = tempfile::NamedTempFile::new().unwrap();
    {
        use std::io::Write;
        let mut w = std::io::BufWriter::new(std::fs::File::create(f.path()).unwrap());
        writeln!(
            w,
            "{}",
            serde_json::json!({"id": "small", "body_text": "{}", "reason": "poison_message"})
        )
        .unwrap();
        write!(
            w,
            "{{\"id\":\"huge\",\"reason\":\"poison_message\",\"body_text\":\""
        )
        .unwrap();
        let chunk = vec![b'a'; 1 << 20];
        for _ in 0..100 {
            w.write_all(&chunk).unwrap();
        }
        writeln!(w, "\"}}").unwrap();
    }
    let r = db.dlq(&["import", f.path().to_str().unwrap()]);
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(
        r.stderr.contains("line 2") && r.stderr.contains("MiB"),
        "{}",
        r.stderr
    );
    assert_eq!(db.dlq(&["list"]).json(), serde_json::json!([]));
}
