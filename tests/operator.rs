//! Completions, man page, profiles, output formats, watch, logging.

mod common;
use common::*;
use std::process::Stdio;
use std::time::Duration;

const SUBCOMMANDS: [&str; 11] = [
    "list",
    "aggregate",
    "show",
    "claim",
    "release",
    "replay",
    "plan",
    "import",
    "migrate",
    "completions",
    "man",
];

#[test]
fn completions_and_man_page_name_every_subcommand() {
    let db = TestDb::new(Backend::Sqlite);
    for shell in ["bash", "zsh", "fish"] {
        let r = db.dlq(&["completions", shell]);
        assert_eq!(r.code, 0, "{}", r.stderr);
        for sub in SUBCOMMANDS {
            assert!(r.stdout.contains(sub), "{shell} completion misses {sub}");
        }
    }
    let r = db.dlq(&["man"]);
    assert_eq!(r.code, 0);
    assert!(
        r.stdout.starts_with(".ie") || r.stdout.contains(".TH dlq 1"),
        "{}",
        &r.stdout[..200]
    );
    for sub in SUBCOMMANDS {
        assert!(
            r.stdout.contains(&format!("dlq\\-{sub}")) || r.stdout.contains(sub),
            "man page misses {sub}"
        );
    }
}

#[test]
fn bash_completes_dead_letter_ids() {
    let db = TestDb::migrated(Backend::Sqlite);
    db.import_examples();
    let script = db.dlq(&["completions", "bash"]).stdout;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dlq.bash");
    std::fs::write(&path, script).unwrap();
    let bin_dir = std::path::Path::new(env!("CARGO_BIN_EXE_dlq"))
        .parent()
        .unwrap();
    let out = db
        .cmd()
        .env(
            "PATH",
            format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap()),
        )
        .env_remove("DLQ_OUTPUT")
        .arg("--version")
        .output()
        .unwrap();
    assert!(out.status.success());
    let r = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source {}; COMP_WORDS=(dlq show 4691); COMP_CWORD=2; _dlq_with_ids; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            path.display()
        ))
        .env("PATH", format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap()))
        .env("DLQ_DATABASE_URL", &db.url)
        .output()
        .unwrap();
    let got = String::from_utf8_lossy(&r.stdout);
    assert_eq!(
        got.trim(),
        "469116c6-eae4-55b7-a890-ca523b18f97a",
        "{got} {}",
        String::from_utf8_lossy(&r.stderr)
    );
}

#[test]
fn profile_resolution_order_is_flag_env_profile_default() {
    let a = TestDb::migrated(Backend::Sqlite);
    let b = TestDb::migrated(Backend::Sqlite);
    a.add(serde_json::json!({"id": "only-in-a", "body_text": "{}", "reason": "poison_message"}));
    b.add(serde_json::json!({"id": "only-in-b", "body_text": "{}", "reason": "poison_message"}));
    let xdg = tempfile::tempdir().unwrap();
    write_config(
        xdg.path(),
        &format!("[profiles.staging]\ndatabase_url = \"{}\"\noperator = \"from-profile\"\nlease = \"7m\"\n", a.url),
    );
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let mut c = a.cmd();
        c.env_remove("DLQ_DATABASE_URL")
            .env_remove("DLQ_OPERATOR")
            .env("XDG_CONFIG_HOME", xdg.path());
        for (k, v) in env {
            c.env(k, v);
        }
        Run::from(c.args(args).output().unwrap())
    };
    let ids = |r: &Run| r.ids();
    // profile > default
    assert_eq!(
        ids(&run(&["--profile", "staging", "list"], &[])),
        ["only-in-a"]
    );
    // env > profile
    assert_eq!(
        ids(&run(
            &["--profile", "staging", "list"],
            &[("DLQ_DATABASE_URL", &b.url)]
        )),
        ["only-in-b"]
    );
    // flag > env > profile
    assert_eq!(
        ids(&run(
            &["--profile", "staging", "--database-url", &b.url, "list"],
            &[("DLQ_DATABASE_URL", &a.url)]
        )),
        ["only-in-b"]
    );
    // DLQ_PROFILE selects it too; the profile's operator and lease are used.
    let r = run(&["claim", "only-in-a"], &[("DLQ_PROFILE", "staging")]);
    assert_eq!(r.code, 0, "{}", r.all());
    let j = r.json();
    assert!(j["token"].as_str().unwrap().starts_with("from-profile:"));
    assert!(j["detail"].as_str().unwrap().contains("7m"), "{j}");
    // flag > profile for the operator and the lease
    let r = run(
        &[
            "--profile",
            "staging",
            "--operator",
            "flag-op",
            "claim",
            "only-in-a",
            "--lease",
            "3m",
        ],
        &[],
    );
    assert_eq!(r.code, 3, "still claimed by from-profile: {}", r.all());
    assert!(r.json()["detail"]
        .as_str()
        .unwrap()
        .contains("from-profile"));
    // without a profile: the built-in default sqlite://dlq.db in the working directory.
    let cwd = tempfile::tempdir().unwrap();
    let mut c = a.cmd();
    c.env_remove("DLQ_DATABASE_URL")
        .current_dir(cwd.path())
        .args(["list"]);
    let r = Run::from(c.output().unwrap());
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.contains("dlq.db") && r.stderr.contains("dlq migrate"),
        "{}",
        r.stderr
    );
    // unknown profile: bad configuration
    let r = run(&["--profile", "prod", "list"], &[]);
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.contains("no profile \"prod\"") && r.stderr.contains("staging"),
        "{}",
        r.stderr
    );
}

/// Runs `dlq` on a pseudo-terminal (util-linux `script`), typing `input`.
fn on_a_terminal(db: &TestDb, env: &[(&str, &str)], args: &str, input: &str) -> Run {
    let bin = env!("CARGO_BIN_EXE_dlq");
    let mut c = db.cmd();
    for (k, v) in env {
        c.env(k, v);
    }
    let mut child = c
        .env_remove("DLQ_OUTPUT")
        .env("TERM", "dumb")
        .env("COLUMNS", "200")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn_script(bin, args);
    use std::io::Write;
    let mut stdin = child.stdin.take().unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    stdin.write_all(input.as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    drop(stdin);
    Run::from(child.wait_with_output().unwrap())
}

trait SpawnScript {
    fn spawn_script(&mut self, bin: &str, args: &str) -> std::process::Child;
}

impl SpawnScript for std::process::Command {
    fn spawn_script(&mut self, bin: &str, args: &str) -> std::process::Child {
        let mut c = std::process::Command::new("script");
        c.args(["-qefc", &format!("{bin} {args}"), "/dev/null"]);
        for (k, v) in self.get_envs() {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        c.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }
}

#[test]
fn a_production_profile_asks_for_its_name_before_replaying() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_prod");
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("d1", &q, b"{}"));
    let xdg = tempfile::tempdir().unwrap();
    let cfg = write_config(
        xdg.path(),
        &format!(
            "[profiles.prod]\ndatabase_url = \"{}\"\nproduction = true\n",
            db.url
        ),
    );
    let cfg = cfg.to_str().unwrap().to_string();
    let env = [("DLQ_CONFIG", cfg.as_str()), ("DLQ_PROFILE", "prod")];
    // Answering "y" is not enough.
    let r = on_a_terminal(&db, &env, "replay d1", "y\n");
    assert!(
        r.stdout.contains("PRODUCTION") && r.stdout.contains("prod"),
        "{}",
        r.all()
    );
    assert_eq!(rabbit.count(&q), 0, "{}", r.all());
    assert_eq!(db.show("d1")["state"], "pending");
    // Typing the profile's name goes on.
    let r = on_a_terminal(&db, &env, "replay d1", "prod\n");
    assert!(r.stdout.contains("replayed"), "{}", r.all());
    assert_eq!(rabbit.count(&q), 1);
    // --yes skips the question, as everywhere.
    db.add(letter("d2", &q, b"{}"));
    let r = db.dlq_env(&["replay", "d2", "--yes"], &env);
    assert_eq!(r.code, 0, "{}", r.all());
}

#[test]
fn a_plain_terminal_prompt_defaults_to_no() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_prompt");
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("d1", &q, b"{\"event_id\":\"evt-p\"}"));
    let r = on_a_terminal(&db, &[], "replay d1", "\n");
    assert!(
        r.stdout.contains("evt-p")
            && r.stdout.contains("retries_exhausted")
            && r.stdout.contains(&q),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("declined"), "{}", r.stdout);
    assert_eq!(
        db.show("d1")["history"],
        serde_json::json!([]),
        "declining claims nothing"
    );
    assert_eq!(rabbit.count(&q), 0);
}

#[test]
fn markdown_output_pastes_into_a_ticket() {
    let db = TestDb::migrated(Backend::Postgres);
    db.import_examples();
    let r = db.dlq(&["aggregate", "--by", "reason", "-o", "markdown"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(
        lines[0]
            .split('|')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()[..2],
        ["REASON", "COUNT"]
    );
    assert!(
        lines[1].starts_with("|--") || lines[1].starts_with("|-"),
        "{}",
        lines[1]
    );
    assert!(
        lines[2].contains("| poison_message") && lines[2].contains("| 14"),
        "{}",
        r.stdout
    );
    let r = db.dlq(&["list", "--limit", "2", "-o", "markdown"]);
    assert!(r.stdout.lines().all(|l| l.starts_with('|')), "{}", r.stdout);
    assert!(!r.stdout.contains('\u{1b}'), "no escape codes");
}

#[test]
fn aggregate_by_hour_draws_bars_in_time_order() {
    let db = TestDb::migrated(Backend::Sqlite);
    db.import_examples();
    let r = db.dlq(&["aggregate", "--by", "hour", "-o", "table"]);
    let rows: Vec<&str> = r
        .stdout
        .lines()
        .filter(|l| l.contains("2026-11-2"))
        .collect();
    assert_eq!(rows.len(), 5, "{}", r.stdout);
    assert!(
        rows[0].contains("2026-11-27T10:00:00Z"),
        "oldest first: {}",
        rows[0]
    );
    let widest = rows.iter().max_by_key(|l| l.matches('█').count()).unwrap();
    assert!(
        widest.contains("2026-11-28T22:00:00Z") && widest.matches('█').count() == 30,
        "{widest}"
    );
    assert!(!r.stdout.contains('\u{1b}'));
}

#[test]
fn list_watch_refreshes_until_stopped() {
    use std::io::BufRead;
    let db = TestDb::migrated(Backend::Sqlite);
    db.import_examples();
    let mut child = db
        .cmd()
        .args(["list", "--limit", "1", "--watch", "300ms"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<serde_json::Value>();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(serde_json::from_str(&line).unwrap()).is_err() {
                break;
            }
        }
    });
    let first = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("a first render");
    assert_ne!(first[0]["id"], "new-arrival");
    db.add(serde_json::json!({"id": "new-arrival", "body_text": "{}", "reason": "poison_message", "dead_lettered_at": "2030-01-01T00:00:00Z"}));
    let mut renders = 1;
    loop {
        let r = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("more renders");
        renders += 1;
        if r[0]["id"] == "new-arrival" {
            break;
        }
    }
    assert!(renders >= 2);
    signal(&child, "INT");
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "Ctrl-C ends the watch cleanly");
}
