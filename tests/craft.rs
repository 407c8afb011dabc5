//! Issue 14's consistency items: one rule for an unknown ID, configuration errors and
//! their exit code, a refused database port, concurrent migrations, `--watch` and
//! Ctrl-C, `--help` headings, tables at 80 columns.

mod common;

use common::*;
use std::time::{Duration, Instant};

#[test]
fn show_of_an_unknown_id_prints_the_same_not_found_report_as_claim() {
    for backend in BACKENDS {
        let db = TestDb::migrated(backend);
        let show = db.dlq(&["show", "nosuch"]);
        let claim = db.dlq(&["claim", "nosuch"]);
        assert_eq!(show.code, 4, "{}", show.all());
        assert_eq!(claim.code, 4, "{}", claim.all());
        let (s, c) = (show.json(), claim.json());
        assert_eq!(s["outcome"], "not_found", "{s}");
        assert_eq!(s["id"], "nosuch");
        assert_eq!(s, c, "show and claim report an unknown ID alike");
        // On a terminal table the same report, on stdout.
        let t = db.dlq(&["show", "nosuch", "-o", "table"]);
        assert_eq!(t.code, 4);
        assert!(t.stdout.contains("nosuch: not_found"), "{}", t.all());
    }
}

/// Everything wrong with the config file exits 1 (bad configuration, as the contract
/// and README say) with a one-line error that says what and where; typed arguments
/// stay usage errors (2).
#[test]
fn configuration_errors_exit_1_and_say_what_is_wrong() {
    let db = TestDb::migrated(Backend::Sqlite);
    let xdg = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let mut c = db.cmd();
        c.env("XDG_CONFIG_HOME", xdg.path());
        Run::from(c.args(args).output().unwrap())
    };
    // An unknown field: its name and line are in the error.
    write_config(
        xdg.path(),
        "[profiles.staging]\noperator = \"x\"\nbogus = 1\n",
    );
    let r = run(&["--profile", "staging", "list"]);
    assert_eq!(r.code, 1, "{}", r.all());
    assert!(
        r.stderr.contains("unknown field `bogus`") && r.stderr.contains("line 3"),
        "{}",
        r.stderr
    );
    assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
    // Malformed TOML.
    write_config(xdg.path(), "[profiles.staging\n");
    let r = run(&["--profile", "staging", "list"]);
    assert_eq!(r.code, 1, "{}", r.all());
    assert!(r.stderr.contains("line 1"), "{}", r.stderr);
    // An unknown profile.
    write_config(xdg.path(), "[profiles.staging]\noperator = \"x\"\n");
    let r = run(&["--profile", "prod", "list"]);
    assert_eq!(r.code, 1, "{}", r.all());
    assert!(r.stderr.contains("no profile \"prod\""), "{}", r.stderr);
    // A bad URL in a profile is configuration; the same URL typed is usage.
    write_config(
        xdg.path(),
        "[profiles.staging]\ndatabase_url = \"postgres://u:SECRETPW@[::1/x\"\n",
    );
    let mut c = db.cmd();
    c.env_remove("DLQ_DATABASE_URL")
        .env("XDG_CONFIG_HOME", xdg.path());
    let r = Run::from(c.args(["--profile", "staging", "list"]).output().unwrap());
    assert_eq!(r.code, 1, "{}", r.all());
    assert!(
        r.stderr.contains("profile staging") && !r.stderr.contains("SECRETPW"),
        "{}",
        r.stderr
    );
    let mut c = db.cmd();
    c.env_remove("DLQ_DATABASE_URL");
    let r = Run::from(
        c.args(["--database-url", "postgres://u:SECRETPW@[::1/x", "list"])
            .output()
            .unwrap(),
    );
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(!r.stderr.contains("SECRETPW"), "{}", r.stderr);
    // A bad URL parameter likewise: 1 from the profile (it exited 2), 2 typed.
    let bad = "postgres://postgres:SECRETPW@127.0.0.1:5432/postgres?sslmode=bogus";
    write_config(
        xdg.path(),
        &format!("[profiles.staging]\ndatabase_url = \"{bad}\"\n"),
    );
    let mut c = db.cmd();
    c.env_remove("DLQ_DATABASE_URL")
        .env("XDG_CONFIG_HOME", xdg.path());
    let r = Run::from(c.args(["--profile", "staging", "list"]).output().unwrap());
    assert_eq!(r.code, 1, "{}", r.all());
    assert!(
        r.stderr.contains("profile staging")
            && r.stderr.contains("sslmode")
            && !r.stderr.contains("SECRETPW"),
        "{}",
        r.stderr
    );
    let r = db.dlq_env(&["list"], &[("DLQ_DATABASE_URL", bad)]);
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(!r.stderr.contains("SECRETPW"), "{}", r.stderr);
}

/// A profile's `lease` is checked by the commands that take a lease: a bad one does
/// not stop `list`, and stops `claim` as a configuration error.
#[test]
fn a_bad_lease_in_a_profile_does_not_break_list() {
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(serde_json::json!({"id": "a1", "body_text": "{}", "reason": "poison_message"}));
    let xdg = tempfile::tempdir().unwrap();
    write_config(
        xdg.path(),
        &format!(
            "[profiles.staging]\ndatabase_url = \"{}\"\nlease = \"soon\"\n",
            db.url
        ),
    );
    let run = |args: &[&str]| {
        let mut c = db.cmd();
        c.env_remove("DLQ_DATABASE_URL")
            .env("XDG_CONFIG_HOME", xdg.path());
        Run::from(c.args(args).output().unwrap())
    };
    let r = run(&["--profile", "staging", "list"]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(r.ids(), vec!["a1".to_string()]);
    let r = run(&["--profile", "staging", "claim", "a1"]);
    assert_eq!(r.code, 1, "{}", r.all());
    assert!(r.stderr.contains("lease"), "{}", r.stderr);
}

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

/// Two `migrate` on a SQLite file that does not exist yet: both succeed (the busy
/// timeout applies from the first statement).
#[test]
fn concurrent_migrations_of_a_new_sqlite_file_both_succeed() {
    for round in 0..5 {
        let db = TestDb::new(Backend::Sqlite);
        let children: Vec<_> = (0..3)
            .map(|_| {
                db.cmd()
                    .args(["migrate"])
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for child in children {
            let r = Run::from(child.wait_with_output().unwrap());
            assert_eq!(r.code, 0, "round {round}: {}", r.all());
        }
        assert_eq!(db.dlq(&["list"]).code, 0);
    }
}

/// A Ctrl-C that arrives while `list --watch` is refreshing ends it (it used to be lost
/// when it came while the query ran: no `ctrl_c()` future was waiting then). Each
/// refresh here scans 300,000 rows on PostgreSQL and finds none, so a signal almost
/// always lands during one.
#[test]
fn list_watch_never_loses_a_ctrl_c() {
    let db = TestDb::migrated(Backend::Postgres);
    db.sql(&[
        "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, error) \
              SELECT 'w-' || g, '\\x7b7d'::bytea, 'poison_message', 1, '{}', repeat('x', 100) \
              FROM generate_series(1, 300000) g",
    ]);
    for (i, delay) in [900u64, 1100, 1300, 1500, 1700].iter().enumerate() {
        let mut child = db
            .cmd()
            .args([
                "list",
                "--watch",
                "1ms",
                "--error-contains",
                "nomatch",
                "-o",
                "table",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(*delay));
        signal(&child, "INT");
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break Some(s);
            }
            if Instant::now() > deadline {
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        if status.is_none() {
            let _ = child.kill();
        }
        let status = status.unwrap_or_else(|| panic!("run {i}: the Ctrl-C was lost"));
        assert!(status.success(), "run {i}: {status:?}");
    }
}

#[test]
fn help_lists_global_options_after_the_commands_own() {
    let db = TestDb::new(Backend::Sqlite);
    let r = db.dlq(&["replay", "--help"]);
    assert_eq!(r.code, 0);
    let own = r.stdout.find("--lease").expect("replay's own option");
    let heading = r.stdout.find("Global Options:").expect("a heading");
    let global = r.stdout.find("--database-url").expect("a global option");
    assert!(own < heading && heading < global, "{}", r.stdout);
    // The global options are not listed among the command's own.
    let options = r.stdout.find("\nOptions:").expect("own options");
    assert!(
        !r.stdout[options..heading].contains("--database-url"),
        "{}",
        r.stdout
    );
}

/// At 80 columns an ID is never wrapped (it can be copied whole); other columns give
/// way, and what cannot fit is said on stderr.
#[test]
fn ids_never_wrap_at_80_columns() {
    let db = TestDb::migrated(Backend::Sqlite);
    let id = "0192f3a4-5b6c-7d8e-9f00-112233445566";
    db.add(serde_json::json!({
        "id": id, "body_text": "{}", "reason": "retries_exhausted",
        "producer": "inventory-service", "schema_version": "17",
        "error": "timeout: inventory did not answer within 30 s after 5 attempts",
    }));
    for columns in ["80", "100", "40"] {
        let r = db.dlq_env(&["list", "-o", "table"], &[("COLUMNS", columns)]);
        assert_eq!(r.code, 0, "{}", r.all());
        assert!(
            r.stdout.lines().any(|l| l.contains(id)),
            "COLUMNS={columns}: the ID is not on one line:\n{}",
            r.stdout
        );
        let width: usize = columns.parse().unwrap();
        if width >= 80 {
            for l in r.stdout.lines() {
                assert!(l.chars().count() <= width, "COLUMNS={columns}: {l:?}");
            }
        }
    }
    // Wide enough: every column, nothing said.
    let r = db.dlq_env(&["list", "-o", "table"], &[("COLUMNS", "250")]);
    assert!(r.stdout.contains("ERROR") && r.stdout.contains("SCHEMA"));
    assert!(!r.stderr.contains("not shown"), "{}", r.stderr);
    // Narrow: columns left out, and said.
    let r = db.dlq_env(&["list", "-o", "table"], &[("COLUMNS", "80")]);
    assert!(r.stderr.contains("not shown"), "{}", r.stderr);
}

/// Bash completion of an ID: by prefix (an old row too, not only the newest ones), from
/// the database named on the line being completed (not the environment's), bounded in
/// count, and quick to give up on a database that does not answer.
#[test]
fn completion_finds_ids_by_prefix_in_the_lines_database_within_a_bound() {
    let db = TestDb::migrated(Backend::Sqlite);
    let other = TestDb::migrated(Backend::Sqlite);
    let mut lines = String::new();
    for i in 0..300 {
        let at = format!("2026-01-01T00:{:02}:{:02}Z", i / 60, i % 60);
        lines.push_str(&format!(
            "{}\n",
            serde_json::json!({"id": format!("cmp-{i:03}"), "body_text": "{}", "reason": "poison_message", "dead_lettered_at": at})
        ));
    }
    assert_eq!(db.dlq_stdin(&["import", "-"], lines.as_bytes()).code, 0);
    other
        .add(serde_json::json!({"id": "cmp-other", "body_text": "{}", "reason": "poison_message"}));
    let script = tempfile::NamedTempFile::new().unwrap();
    let r = db.dlq(&["completions", "bash"]);
    std::fs::write(script.path(), &r.stdout).unwrap();
    let bin_dir = std::path::Path::new(env!("CARGO_BIN_EXE_dlq"))
        .parent()
        .unwrap();
    let complete = |line: &str| -> (Vec<String>, Duration) {
        let words: Vec<&str> = line.split(' ').collect();
        let program = format!(
            "source {}; COMP_LINE='{line}'; COMP_WORDS=({}); COMP_CWORD={}; _dlq_with_ids; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            script.path().display(),
            words.join(" "),
            words.len() - 1
        );
        let started = Instant::now();
        let out = std::process::Command::new("bash")
            .env("DLQ_DATABASE_URL", &other.url)
            .env(
                "PATH",
                format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap()),
            )
            .args(["-c", &program])
            .output()
            .unwrap();
        let took = started.elapsed();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        (
            text.lines()
                .filter(|l| !l.is_empty())
                .map(str::to_string)
                .collect(),
            took,
        )
    };
    // The oldest row, by its prefix, from the database on the line.
    let (got, _) = complete(&format!("dlq --database-url {} show cmp-00", db.url));
    let want: Vec<String> = (0..10).rev().map(|i| format!("cmp-{i:03}")).collect();
    assert_eq!(got, want);
    // Without the option: the environment's database.
    let (got, _) = complete("dlq show cmp-");
    assert_eq!(got, vec!["cmp-other".to_string()]);
    // A short prefix offers a bounded number.
    let (got, _) = complete(&format!("dlq --database-url {} replay cmp", db.url));
    assert!(!got.is_empty() && got.len() <= 50, "{}", got.len());
    // A database that accepts the connection and never answers: nothing, quickly.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let (got, took) = complete(&format!(
        "dlq --database-url postgres://u@127.0.0.1:{port}/x --connect-timeout 30s show cmp"
    ));
    assert!(got.is_empty(), "{got:?}");
    assert!(took < Duration::from_secs(10), "took {took:?}");
    drop(silent);
}

/// `list -o json` whose read fails half way (here the statement timeout, while the
/// reader is slow) never leaves a well-formed array holding part of the rows on stdout:
/// a script would take it for the whole list. Found by the issue-14 review.
#[test]
fn a_list_cut_short_by_an_error_is_not_valid_json() {
    let db = TestDb::migrated(Backend::Postgres);
    db.sql(&[
        "INSERT INTO dead_letters (id, body, reason, attempts, headers_json) \
              SELECT 'row-' || lpad(g::text, 7, '0'), convert_to('{\"n\":' || g || '}', 'UTF8'), \
              'poison_message', 1, '{}' FROM generate_series(1, 200000) g",
    ]);
    let child = db
        .cmd()
        .args([
            "--statement-timeout",
            "2s",
            "list",
            "-o",
            "json",
            "--limit",
            "200000",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // A slow reader: the database waits on the full pipe until the timeout cancels it.
    std::thread::sleep(Duration::from_secs(5));
    let out = child.wait_with_output().unwrap();
    let r = Run::from(out);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stderr.contains("timed out"), "{}", r.stderr);
    assert!(
        serde_json::from_str::<serde_json::Value>(&r.stdout).is_err(),
        "a partial list parsed as JSON ({} bytes)",
        r.stdout.len()
    );
}

/// `show -o markdown` is Markdown (it printed the plain text view): the columns as a
/// table, headers and body fenced so that no backtick run in the body closes the fence,
/// the history as a table.
#[test]
fn show_as_markdown_is_a_table_and_fenced_blocks() {
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(serde_json::json!({
        "id": "md-1", "reason": "poison_message", "error": "bad | thing",
        "body_text": "{\"a\":\"```\\n# not a heading\"}", "headers": {"tenant": "a|b"},
    }));
    assert_eq!(db.dlq(&["note", "md-1", "looked | at it"]).code, 0);
    let r = db.dlq(&["show", "md-1", "-o", "markdown"]);
    assert_eq!(r.code, 0, "{}", r.all());
    let md = &r.stdout;
    assert!(md.contains("| field | value |\n|---|---|\n"), "{md}");
    assert!(md.contains("| error | bad \\| thing |"), "{md}");
    // The body holds a run of three backticks: its fence is longer.
    let body = md.split("#### Body").nth(1).unwrap();
    let fence_line = body.lines().find(|l| l.starts_with("```")).unwrap();
    assert!(fence_line.starts_with("````json"), "{md}");
    let closing = body.lines().filter(|l| *l == "````").count();
    assert_eq!(closing, 1, "{md}");
    assert!(
        md.contains("| at | operator | action | outcome | detail |"),
        "{md}"
    );
    assert!(md.contains("looked \\| at it"), "{md}");
    // The table view is unchanged: plain `key: value` lines.
    let t = db.dlq(&["show", "md-1", "-o", "table"]);
    assert!(
        t.stdout.starts_with("id:               md-1\n"),
        "{}",
        t.stdout
    );
}

/// An import line refused for a value of the wrong type says so, not "not a JSON
/// object" (found by the big-body review: the reader blamed every data error on the
/// line's shape).
#[test]
fn an_import_line_with_a_wrong_value_says_what_is_wrong() {
    let db = TestDb::migrated(Backend::Sqlite);
    let line =
        r#"{"id":"a","reason":"r","body_text":"x","headers":{"$serde_json::private::Number":5}}"#;
    let r = db.dlq_stdin(&["import", "-"], format!("{line}\n").as_bytes());
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(!r.stderr.contains("not a JSON object"), "{}", r.stderr);
    assert!(r.stderr.contains("line 1"), "{}", r.stderr);
    assert!(r.stderr.contains("invalid type"), "{}", r.stderr);
    assert_eq!(db.dlq(&["list"]).json(), serde_json::json!([]));
    // A line that is not an object is still refused by its line.
    let r = db.dlq_stdin(&["import", "-"], b"[1, 2]\n");
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(
        r.stderr.contains("line 1") && r.stderr.contains("object"),
        "{}",
        r.stderr
    );
}
