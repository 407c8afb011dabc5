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

/// `dlq __ids --for COMMAND` offers the rows the command can act on: replay, claim,
/// discard and edit pending ones, resolve uncertain, restore discarded, release claimed,
/// show, note and diff any.
#[test]
fn ids_are_completed_in_the_state_each_command_needs() {
    let db = TestDb::migrated(Backend::Postgres);
    for id in ["st-pending", "st-claimed", "st-uncertain", "st-discarded"] {
        db.add(letter(id, "q", b"{}"));
    }
    assert_eq!(db.dlq(&["claim", "st-claimed"]).code, 0);
    let r = db.dlq(&["discard", "st-discarded", "--note", "x", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.all());
    db.sql(&["UPDATE dead_letters SET replay_attempt_at = now() WHERE id = 'st-uncertain'"]);
    let offered = |command: &str| -> Vec<String> {
        let r = db.dlq(&["__ids", "--for", command, "st-"]);
        assert_eq!(r.code, 0, "{command}: {}", r.all());
        let mut ids: Vec<String> = r.stdout.lines().map(str::to_string).collect();
        ids.sort();
        ids
    };
    let all = ["st-claimed", "st-discarded", "st-pending", "st-uncertain"];
    for (command, want) in [
        ("replay", &["st-pending"][..]),
        ("claim", &["st-pending"]),
        ("discard", &["st-pending"]),
        ("edit", &["st-pending"]),
        ("resolve", &["st-uncertain"]),
        ("restore", &["st-discarded"]),
        ("release", &["st-claimed"]),
        ("show", &all),
        ("note", &all),
        ("diff", &all),
    ] {
        assert_eq!(offered(command), want, "{command}");
    }
}

/// Bash and fish complete IDs after every command that takes one, with the command's
/// state; `dlq <TAB>` never offers the hidden helpers.
#[test]
fn bash_completes_ids_for_every_id_command_and_hides_the_helpers() {
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("hid-pending", "q", b"{}"));
    db.add(letter("hid-gone", "q", b"{}"));
    let r = db.dlq(&["discard", "hid-gone", "--note", "x", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.all());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dlq.bash");
    std::fs::write(&path, db.dlq(&["completions", "bash"]).stdout).unwrap();
    let complete = |words: &str, cword: usize| -> Vec<String> {
        let out = bash_complete(&db, &path, words, cword);
        let mut got: Vec<String> = out.lines().map(str::to_string).collect();
        got.sort();
        got
    };
    assert_eq!(complete("dlq restore hid", 2), ["hid-gone"]);
    assert_eq!(complete("dlq discard hid", 2), ["hid-pending"]);
    assert_eq!(complete("dlq note hid", 2), ["hid-gone", "hid-pending"]);
    assert_eq!(
        complete("dlq diff hid-gone hid", 3),
        ["hid-gone", "hid-pending"]
    );
    let top = complete("dlq ''", 1);
    assert!(top.contains(&"replay".to_string()), "{top:?}");
    assert!(!top.iter().any(|w| w.starts_with("__")), "{top:?}");
    assert!(complete("dlq __", 1).is_empty());
    assert!(!complete("dlq help ''", 2)
        .iter()
        .any(|w| w.starts_with("__")));
    for shell in ["zsh", "fish"] {
        let script = db.dlq(&["completions", shell]).stdout;
        let generated = script.split("# Dead-letter IDs").next().unwrap();
        assert!(
            !generated.contains("__ids") && !generated.contains("__values"),
            "{shell} offers a hidden helper"
        );
    }
}

/// `--reason`, `--producer`, `--schema-version` and `--source-queue` complete the stored
/// values, the most common first.
#[test]
fn filter_values_are_completed_from_the_store() {
    for backend in BACKENDS {
        let db = TestDb::migrated(backend);
        let mut lines = String::new();
        for (i, reason) in ["poison_message", "poison_message", "permanent_failure"]
            .iter()
            .enumerate()
        {
            let mut l = letter(&format!("v{i}"), "orders.dlq", b"{}");
            l["reason"] = (*reason).into();
            lines.push_str(&format!("{l}\n"));
        }
        assert_eq!(db.dlq_stdin(&["import", "-"], lines.as_bytes()).code, 0);
        let values = |args: &[&str]| {
            db.dlq(args)
                .stdout
                .lines()
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            values(&["__values", "reason"]),
            ["poison_message", "permanent_failure"],
            "{backend:?}"
        );
        assert_eq!(values(&["__values", "reason", "pois"]), ["poison_message"]);
        assert_eq!(values(&["__values", "producer"]), ["inventory"]);
        assert_eq!(values(&["__values", "schema-version"]), ["5"]);
        assert_eq!(values(&["__values", "source-queue"]), ["orders.dlq"]);
    }
    // Through bash, after the flag.
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("b1", "q", b"{}"));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dlq.bash");
    std::fs::write(&path, db.dlq(&["completions", "bash"]).stdout).unwrap();
    let out = bash_complete(&db, &path, "dlq list --reason ret", 3);
    assert_eq!(out.trim(), "retries_exhausted");
}

/// Runs the bash completion of `words` (the word at `cword` being completed) and returns
/// what it offers, one per line.
fn bash_complete(db: &TestDb, script: &std::path::Path, words: &str, cword: usize) -> String {
    let bin_dir = std::path::Path::new(env!("CARGO_BIN_EXE_dlq"))
        .parent()
        .unwrap();
    let line = words.replace("''", "");
    let r = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source {}; COMP_LINE='{line}'; COMP_WORDS=({words}); COMP_CWORD={cword}; _dlq_with_ids dlq \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            script.display()
        ))
        .env("PATH", format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap()))
        .env("DLQ_DATABASE_URL", &db.url)
        .output()
        .unwrap();
    String::from_utf8_lossy(&r.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The commands that take an ID, each completed by `__ids --for` it.
const ID_COMMANDS: [&str; 10] = [
    "show", "claim", "release", "replay", "resolve", "discard", "restore", "note", "edit", "diff",
];

/// Once broke: zsh completed file names after `show`, `replay`, ... and `--reason`
/// (only bash and fish asked the store). Zsh completes the IDs each command takes (in its
/// state) and the four filters' values; where zsh is installed, it accepts the script
/// and completes through it in a real line editor.
#[test]
fn zsh_completes_ids_per_command_and_filter_values() {
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("zid-pending", "q", b"{}"));
    db.add(letter("zid-gone", "q", b"{}"));
    let r = db.dlq(&["discard", "zid-gone", "--note", "x", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.all());
    let script = db.dlq(&["completions", "zsh"]).stdout;
    assert!(script.contains("__ids --for") && script.contains("__values"));
    for command in ID_COMMANDS {
        let start = script.find(&format!("\n({command})\n")).unwrap();
        let block = &script[start..start + script[start..].find("\n;;").unwrap()];
        assert!(
            block.contains(&format!(":_dlq_ids {command}' \\")),
            "{command}:{block}"
        );
    }
    for key in ["reason", "producer", "schema-version", "source-queue"] {
        let specs: Vec<&str> = script
            .lines()
            .filter(|l| l.starts_with(&format!("'--{key}=[")))
            .collect();
        assert!(!specs.is_empty(), "--{key}");
        for l in specs {
            assert!(l.ends_with(&format!(":_dlq_values {key}' \\")), "{l}");
        }
    }
    // Defined before the lines that run the completion when the file is autoloaded.
    let defined = script.find("\n_dlq_ids() {").unwrap();
    assert!(defined < script.find("if [ \"$funcstack[1]\" = \"_dlq\" ]").unwrap());
    if std::process::Command::new("zsh")
        .arg("--version")
        .output()
        .is_err()
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("_dlq");
    std::fs::write(&path, &script).unwrap();
    let check = std::process::Command::new("zsh")
        .arg("-n")
        .arg(&path)
        .output()
        .unwrap();
    assert!(check.status.success(), "{check:?}");
    let other = TestDb::migrated(Backend::Sqlite);
    let on_line = |rest: &str| format!("dlq --database-url {} {rest}", db.url);
    let cases = [
        (on_line("restore zid"), on_line("restore zid-gone")),
        (on_line("discard zid"), on_line("discard zid-pending")),
        (
            on_line("list --reason ret"),
            on_line("list --reason retries_exhausted"),
        ),
    ];
    for (line, want) in cases {
        assert_eq!(zsh_complete(&other, &path, &line), want);
    }
}

/// Types `line` and a TAB into an interactive zsh (under `zpty`) that loaded `script`,
/// and returns the line as completion left it.
fn zsh_complete(db: &TestDb, script: &std::path::Path, line: &str) -> String {
    const DRIVER: &str = r#"
zmodload zsh/zpty
zpty z 'TERM=dumb zsh -f -i'
zpty -w z "autoload -Uz compinit; compinit -u -D; source ${(q)SCRIPT}; PS1='> '"
zpty -w -n z "$LINE"$'\t'
zpty -w z $'\x01print -r -- G""OT: '
zpty -r z out '*GOT: *'$'\n'
print -r -- "${${out##*GOT: }%%$'\r'*}"
zpty -d z
"#;
    let bin_dir = std::path::Path::new(env!("CARGO_BIN_EXE_dlq"))
        .parent()
        .unwrap();
    let r = std::process::Command::new("timeout")
        .args(["30", "zsh", "-f", "-c", DRIVER])
        .env("SCRIPT", script)
        .env("LINE", line)
        .env(
            "PATH",
            format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap()),
        )
        .env("DLQ_DATABASE_URL", &db.url)
        .output()
        .unwrap();
    assert!(r.status.success(), "{line}: {r:?}");
    String::from_utf8_lossy(&r.stdout).trim().to_string()
}
