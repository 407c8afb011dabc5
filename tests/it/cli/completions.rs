//! Shell completions and the man page: every subcommand, IDs completed from the database.

use crate::common::*;
use std::time::{Duration, Instant};

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
