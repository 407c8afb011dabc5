//! Database and broker passwords never reach any output or log.

use crate::common::*;

const CANARY: &str = "Canary-Pw-91c2e";

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
    db.add(letter("d1", &q, SMALL_BODY));
    db.add(letter("d2", &q, SMALL_BODY));
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

/// Once broke: clap's usage error echoes the argument it refuses, and a password with a
/// `'` (clap's own quote), a `/` or a space, or given as `?password=`, went out whole.
#[test]
fn a_usage_error_never_echoes_a_password_of_the_line() {
    let db = TestDb::new(Backend::Sqlite);
    for url in [
        format!("postgres://u:pa'{CANARY}@h/db"),
        format!("postgres://u:pa/{CANARY}@h/db"),
        format!("postgres://u:p {CANARY}@h/db"),
        format!("amqp://u:pa\"{CANARY}@h"),
        format!("postgres://h/db?password={CANARY}"),
    ] {
        for args in [
            vec!["list", url.as_str()],
            vec!["list", "--limit", url.as_str()],
            vec!["--bogus", url.as_str(), "list"],
        ] {
            let r = db.dlq(&args);
            assert_eq!(r.code, 2, "{args:?}: {}", r.all());
            assert!(!r.all().contains(CANARY), "{args:?}: {}", r.all());
        }
    }
}

/// Once broke: an argument that is not UTF-8 before the command word panicked (exit 101),
/// and the panic printed it, password and all.
#[test]
fn an_argument_that_is_not_utf8_is_a_usage_error() {
    use std::os::unix::ffi::OsStrExt;
    let db = TestDb::new(Backend::Sqlite);
    let mut raw = format!("postgres://u:pa'{CANARY}").into_bytes();
    raw.extend_from_slice(b"\xff@h/db");
    let arg = std::ffi::OsStr::from_bytes(&raw);
    let out = db
        .cmd()
        .arg("--database-url")
        .arg(arg)
        .arg("list")
        .output()
        .unwrap();
    let r = Run::from(out);
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(!r.all().contains(CANARY), "{}", r.all());
}
