//! Passwords in every URL shape (and generated ones) stay out of every stream.

use super::*;
use crate::common::*;
use proptest::prelude::*;

/// Once broke (review of protocol v2): such passwords were printed in errors.
/// Contract: errors "never contain a password: not in a URL that failed to
/// parse, not in a `password=` query parameter, not with a `/`, `@`, `#` or `?` inside it".
#[test]
fn passwords_with_a_slash_or_in_the_query_are_never_printed() {
    const PW: &str = "Canary9x";
    let db = TestDb::migrated(Backend::Sqlite);
    let cases: Vec<(&str, String)> = vec![
        (
            "database",
            format!("postgres://postgres:pw/{PW}@127.0.0.1:5432/x"),
        ),
        (
            "database",
            format!("postgres://postgres@127.0.0.1:5432/x?sslmode=bogus&password={PW}"),
        ),
        ("amqp", format!("amqp://guest:pw/{PW}@127.0.0.1:5672/%2f")),
        (
            "amqp",
            format!("amqp://guest@127.0.0.1:5672/%2f?password={PW}"),
        ),
    ];
    let mut leaks = Vec::new();
    for (kind, url) in &cases {
        let r = match *kind {
            "database" => db.dlq_env(&["list"], &[("DLQ_DATABASE_URL", url)]),
            _ => db.dlq_env(&["replay", "x", "--yes"], &[("DLQ_AMQP_URL", url)]),
        };
        if r.all().contains(PW) {
            leaks.push(format!("{kind} {url}: {}", r.all().trim()));
        }
    }
    assert!(leaks.is_empty(), "password printed:\n{}", leaks.join("\n"));
}

// ---------------------------------------------------------------------------------------
// Secrets in URLs

/// Every byte not an ASCII letter or digit as %XX: how a password goes into a URL.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The forms of `pw` that must not appear: as given, percent-encoded, and decoded (the
/// form a driver would use when the URL held it raw).
fn forms(pw: &str) -> Vec<String> {
    let decoded = url::form_urlencoded::parse(format!("x={}", pw.replace('+', "%2B")).as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default();
    let mut v = vec![pw.to_string(), encode(pw), decoded];
    v.retain(|s| s.len() >= 6);
    v.dedup();
    v
}

#[track_caller]
fn assert_no_password(r: &Raw, pw: &str, what: &str) {
    let all = format!("{}{}", r.out(), r.err());
    for f in forms(pw) {
        assert!(
            !all.contains(&f),
            "{what}: {f:?} leaked:\n{}",
            all.escape_debug()
        );
    }
}

/// The PostgreSQL URL shapes the docs accept, and broken ones, for database `db`.
/// `true`: the shape is broken whatever the password.
fn pg_shapes(pw: &str, db: &str) -> Vec<(String, bool)> {
    let enc = encode(pw);
    vec![
        (
            format!("postgres://postgres:{enc}@127.0.0.1:5432/{db}"),
            false,
        ),
        (
            format!("postgresql://postgres:{pw}@127.0.0.1:5432/{db}"),
            false,
        ),
        (
            format!("postgres://postgres@127.0.0.1:5432/{db}?password={enc}"),
            false,
        ),
        (
            format!("postgres://postgres@127.0.0.1:5432/{db}?sslmode=disable&password={pw}"),
            false,
        ),
        (format!("postgres:postgres:{pw}@127.0.0.1:5432/{db}"), true),
        (
            format!("postgres://postgres:{pw}@127.0.0.1:54x2/{db}"),
            true,
        ),
        (
            format!("postgres://postgres:{enc}@127.0.0.1:5432/{db}?sslmode=bogus"),
            true,
        ),
    ]
}

/// The AMQP URL shapes, and broken ones (every password here is wrong for the broker).
fn amqp_shapes(pw: &str) -> Vec<(String, bool)> {
    let enc = encode(pw);
    vec![
        (format!("amqp://guest:{enc}@127.0.0.1:5672/%2f"), false),
        (format!("amqp://guest:{pw}@127.0.0.1:5672/%2f"), false),
        (format!("amqp://guest:{enc}@127.0.0.1:5672"), false),
        (format!("amqp:guest:{pw}@127.0.0.1"), true),
        (format!("amqp://guest:{pw}@127.0.0.1:56x2/%2f"), true),
        (format!("amqp://guest:{enc}@127.0.0.1:5672/"), true),
        (
            format!("amqp://guest:{enc}@127.0.0.1:5672/%2f?password={enc}"),
            false,
        ),
    ]
}

/// Where a URL comes from.
#[derive(Debug, Clone, Copy)]
enum Source {
    Env,
    Flag,
    File,
}

/// Everything needed to run each command that opens the database or dials the broker.
struct Fixture {
    db: TestDb,
    dir: tempfile::TempDir,
    plan: String,
    import: String,
}

impl Fixture {
    fn new() -> Fixture {
        let db = TestDb::migrated(Backend::Postgres);
        db.add(letter("u1", "dlq_u_none", b"{}"));
        let dir = tempfile::tempdir().unwrap();
        let plan = dir.path().join("plan.json");
        let r = db.dlq(&["plan"]);
        assert_eq!(r.code, 0, "{}", r.stderr);
        std::fs::write(&plan, &r.stdout).unwrap();
        let import = dir.path().join("import.jsonl");
        std::fs::write(&import, format!("{}\n", letter("u2", "dlq_u_none", b"{}"))).unwrap();
        Fixture {
            plan: plan.display().to_string(),
            import: import.display().to_string(),
            db,
            dir,
        }
    }

    fn db_name(&self) -> String {
        self.db.url.rsplit('/').next().unwrap().to_string()
    }

    /// Every command that opens the database.
    fn db_commands(&self) -> Vec<Vec<String>> {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        vec![
            s(&["list"]),
            s(&["aggregate", "--by", "reason"]),
            s(&["show", "u1"]),
            s(&["claim", "u1"]),
            s(&["release", "u1", "--token", "tester:x"]),
            s(&["plan"]),
            s(&["import", &self.import, "--skip-existing"]),
            s(&["migrate"]),
            s(&["__ids"]),
            s(&["replay", "u1", "--dry-run"]),
            s(&["replay", "--plan", &self.plan, "--yes"]),
        ]
    }

    /// Every command that dials the broker (or checks its URL first).
    fn amqp_commands(&self) -> Vec<Vec<String>> {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        vec![
            s(&["replay", "u1", "--yes"]),
            s(&["replay", "u1", "--dry-run"]),
            s(&["replay", "--plan", &self.plan, "--yes"]),
        ]
    }

    /// Runs `args` with the database URL (`amqp == false`) or the AMQP URL from `source`.
    fn run(&self, amqp: bool, url: &str, source: Source, extra: &[&str], args: &[String]) -> Raw {
        let mut c = self.db.cmd();
        c.env("DLQ_CONNECT_TIMEOUT", "2s");
        let (flag, env) = if amqp {
            ("--amqp-url", "DLQ_AMQP_URL")
        } else {
            ("--database-url", "DLQ_DATABASE_URL")
        };
        match source {
            Source::Env => {
                c.env(env, url);
            }
            Source::Flag => {
                c.arg(format!("{flag}={url}"));
            }
            Source::File => {
                let f = self.dir.path().join(unique("url"));
                std::fs::write(&f, format!("{url}\n")).unwrap();
                c.arg(format!("{flag}-file")).arg(&f);
            }
        }
        c.args(extra).args(args);
        Raw::of(c)
    }
}

#[track_caller]
fn check_url_run(r: &Raw, pw: &str, broken: bool, what: &str) {
    assert_no_password(r, pw, what);
    let err = r.err();
    let errors = err.lines().filter(|l| l.starts_with("dlq: error")).count();
    assert!(
        errors <= 1,
        "{what}: {errors} error lines: {}",
        err.replace(pw, "***")
    );
    if broken {
        assert_ne!(r.code, 0, "{what}: a broken URL was accepted");
    }
}

#[test]
fn passwords_in_every_url_shape_stay_out_of_every_stream() {
    let fx = Fixture::new();
    let db = fx.db_name();
    // Each shape the issue found, each password character that needs encoding.
    for pw in ["PASS/WORD-Canary1", "Canary2@p#w?d%x y"] {
        // Every command plainly; the refusal of --require-tls and -vv's logs on a few.
        let with_extras = |args: &[String]| {
            ["list", "migrate", "--plan"]
                .iter()
                .any(|a| args.contains(&a.to_string()))
                || args == fx.amqp_commands()[0].as_slice()
        };
        for (url, broken) in pg_shapes(pw, &db) {
            for args in fx.db_commands() {
                for extra in [&[][..], &["--require-tls"][..], &["-vv"][..]] {
                    if !extra.is_empty() && !with_extras(&args) {
                        continue;
                    }
                    let r = fx.run(false, &url, Source::Env, extra, &args);
                    check_url_run(&r, pw, broken, &format!("{url:?} {extra:?} {args:?}"));
                }
            }
        }
        for (url, broken) in amqp_shapes(pw) {
            for args in fx.amqp_commands() {
                for extra in [&[][..], &["--require-tls"][..], &["-vv"][..]] {
                    if !extra.is_empty() && !with_extras(&args) {
                        continue;
                    }
                    let r = fx.run(true, &url, Source::Env, extra, &args);
                    check_url_run(&r, pw, broken, &format!("{url:?} {extra:?} {args:?}"));
                }
            }
        }
    }
    // What the errors say: which part is wrong, at most scheme and host.
    let pw = "PASS/WORD-Canary3";
    let cases = [
        (
            false,
            format!("postgres://root:{pw}@127.0.0.1:5432/test"),
            "an `@` after the host",
        ),
        (
            false,
            format!("postgres:root:{pw}@127.0.0.1:5432/x"),
            "no `//` after the scheme",
        ),
        (
            false,
            "postgres://root:Canary4@127.0.0.1:5x/x".to_string(),
            "port is not a number",
        ),
        (
            true,
            format!("amqp:guest:{pw}@127.0.0.1"),
            "no `//` after the scheme",
        ),
        (
            true,
            format!("amqp://guest:{pw}@127.0.0.1:5672/%2f"),
            "an `@` after the host",
        ),
    ];
    for (amqp, url, says) in cases {
        for source in [Source::Env, Source::Flag, Source::File] {
            let args = if amqp {
                fx.amqp_commands()[0].clone()
            } else {
                vec!["list".to_string()]
            };
            let r = fx.run(amqp, &url, source, &[], &args);
            assert_eq!(r.code, 2, "{url:?} {source:?}: {}", r.err());
            assert!(r.err().contains(says), "{url:?}: {}", r.err());
            assert_no_password(&r, pw, &url);
            assert_no_password(&r, "Canary4", &url);
        }
    }
    // A parsed URL is shown with its password and password= parameter replaced.
    let url = format!("postgres://postgres@127.0.0.1:5432/{db}?password=Canary5pw");
    let r = fx.run(
        false,
        &url,
        Source::Env,
        &["-o", "table"],
        &["migrate".to_string()],
    );
    assert_eq!(r.code, 0, "{}", r.err());
    assert!(r.out().contains("?password=***"), "{}", r.out());
    let r = fx.run(
        false,
        &url,
        Source::Env,
        &["--require-tls"],
        &["list".to_string()],
    );
    assert_eq!(r.code, 2);
    assert!(
        r.err().contains("?password=***") && !r.err().contains("Canary5pw"),
        "{}",
        r.err()
    );
}

#[test]
fn generated_passwords_never_leak_through_any_command() {
    let fx = Fixture::new();
    let db = fx.db_name();
    let db_commands = fx.db_commands();
    let amqp_commands = fx.amqp_commands();
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let password = "[A-Za-z0-9/@#?% ]{4,12}".prop_map(|s| format!("Pw{s}Zq"));
    let pick = (
        0..7usize,
        0..7usize,
        0..11usize,
        0..3usize,
        0..3usize,
        0..3usize,
    );
    runner
        .run(
            &(password, pick),
            |(pw, (pg, amqp, cmd, acmd, source, extra))| {
                let source = [Source::Env, Source::Flag, Source::File][source];
                let extra: &[&str] = [&[][..], &["-vv"][..], &["--require-tls"][..]][extra];
                let (url, broken) = pg_shapes(&pw, &db)[pg].clone();
                let args = &db_commands[cmd % db_commands.len()];
                let r = fx.run(false, &url, source, extra, args);
                check_url_run(
                    &r,
                    &pw,
                    broken,
                    &format!("{url:?} {source:?} {extra:?} {args:?}"),
                );
                let (url, broken) = amqp_shapes(&pw)[amqp].clone();
                let args = &amqp_commands[acmd];
                let r = fx.run(true, &url, source, extra, args);
                check_url_run(
                    &r,
                    &pw,
                    broken,
                    &format!("{url:?} {source:?} {extra:?} {args:?}"),
                );
                Ok(())
            },
        )
        .unwrap();
}
