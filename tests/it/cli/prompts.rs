//! Prompts on a terminal: a production profile asks for its name, a plain prompt
//! defaults to no.

use crate::common::*;
use std::process::Stdio;
use std::time::{Duration, Instant};

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

/// Once broke: the plan prompt said only "About to replay plan … (N items, made by …),
/// filters {…}": no target, broker, database, rate or age; the single-replay prompt had
/// no body size, broker nor database (issue 25, item 2).
#[test]
fn a_replay_prompt_says_where_the_messages_go() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_where");
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("w1", &q, b"{\"n\":1}"));
    db.add(letter("w2", &q, b"{\"n\":2}"));
    let plan = db.plan_file(&[]);
    let args = format!(
        "replay --plan {} --routing-key elsewhere --rate 2/s",
        plan.path().display()
    );
    let r = on_a_terminal(&db, &[], &args, "\n");
    for shown in [
        "2 items",
        " ago",
        "routing key elsewhere",
        "--routing-key",
        "@127.0.0.1:5672/%2f",
        &db.url,
        "rate 2/s",
        "producer:",
        "inventory 2",
        // {"n":1} and {"n":2}: 7 bytes each.
        "14 bytes",
    ] {
        assert!(
            r.stdout.contains(shown),
            "{shown:?} not shown:\n{}",
            r.stdout
        );
    }
    assert!(
        !r.stdout.contains("guest:guest"),
        "a password shown: {}",
        r.stdout
    );
    assert_eq!(rabbit.count(&q), 0, "declined: {}", r.all());
    let r = on_a_terminal(&db, &[], "replay w1", "\n");
    for shown in ["7 bytes", "@127.0.0.1:5672/%2f", &db.url] {
        assert!(
            r.stdout.contains(shown),
            "{shown:?} not shown:\n{}",
            r.stdout
        );
    }
    assert_eq!(rabbit.count(&q), 0);
}

/// Once broke: bulk `discard` asked "About to discard 3 dead letters" without saying
/// which producers or schema versions (issue 25, item 2).
#[test]
fn a_bulk_discard_prompt_names_producers_and_schema_versions() {
    let db = TestDb::migrated(Backend::Sqlite);
    for (id, producer) in [("b1", "billing"), ("b2", "billing"), ("b3", "orders")] {
        let mut l = letter(id, "q", b"{}");
        l["producer"] = producer.into();
        db.add(l);
    }
    let r = on_a_terminal(
        &db,
        &[],
        "discard --reason retries_exhausted --note t",
        "\n",
    );
    assert!(r.stdout.contains("billing 2, orders 1"), "{}", r.stdout);
    assert!(r.stdout.contains("schema versions: 5 3"), "{}", r.stdout);
    assert!(
        r.stdout.contains(&format!("database:        {}", db.url)),
        "{}",
        r.stdout
    );
    assert_eq!(db.show("b1")["state"], "pending", "declined: {}", r.all());
}

/// Once broke: `resolve` of a selection asked "About to resolve 2 dead letters as not
/// delivered" naming neither the database nor which producers they come from.
#[test]
fn a_bulk_resolve_prompt_names_the_database_and_the_mix() {
    let db = TestDb::migrated(Backend::Sqlite);
    for (id, producer) in [("u1", "billing"), ("u2", "billing"), ("u3", "orders")] {
        let mut l = letter(id, "q", b"{}");
        l["producer"] = producer.into();
        // An open attempt: uncertain.
        l["replay_attempt_at"] = "2026-01-01T00:00:00Z".into();
        db.add(l);
    }
    assert_eq!(db.show("u1")["state"], "uncertain");
    let r = on_a_terminal(
        &db,
        &[],
        "resolve --state uncertain --not-delivered --note t",
        "\n",
    );
    assert!(r.stdout.contains("About to resolve 3"), "{}", r.stdout);
    assert!(r.stdout.contains("billing 2, orders 1"), "{}", r.stdout);
    assert!(
        r.stdout.contains(&format!("database:        {}", db.url)),
        "{}",
        r.stdout
    );
    assert_eq!(db.show("u1")["state"], "uncertain", "declined: {}", r.all());
}

/// On a terminal, `migrate` asks before creating a SQLite file that does not exist, and
/// declining creates nothing; `--create` does not ask.
#[test]
fn migrate_asks_before_creating_a_new_sqlite_file_on_a_terminal() {
    let db = TestDb::new(Backend::Sqlite);
    let file = std::path::PathBuf::from(db.url.trim_start_matches("sqlite://"));
    let r = on_a_terminal(&db, &[], "migrate", "n\n");
    assert!(
        r.stdout
            .contains(&format!("create new SQLite database {}?", file.display())),
        "{}",
        r.all()
    );
    assert!(r.stdout.contains("nothing was created"), "{}", r.all());
    assert!(!file.exists(), "declining created the file");
    let r = on_a_terminal(&db, &[], "migrate", "y\n");
    assert!(r.stdout.contains("applied"), "{}", r.all());
    assert!(file.exists());
    // An existing file is not asked about; --create never asks.
    let r = on_a_terminal(&db, &[], "migrate", "");
    assert!(r.stdout.contains("up to date"), "{}", r.all());
    let other = TestDb::new(Backend::Sqlite);
    let r = on_a_terminal(&other, &[], "migrate --create", "");
    assert!(!r.stdout.contains("create new"), "{}", r.all());
    assert!(r.stdout.contains("applied"), "{}", r.all());
}

/// Once broke: Ctrl-C at a prompt exited 130 without a word (issue 25, item 9).
#[test]
fn ctrl_c_at_a_prompt_says_nothing_was_changed() {
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("cc1", "orders", b"{}"));
    let r = on_a_terminal(&db, &[], "replay cc1", "\x03");
    assert_eq!(r.code, 130, "{}", r.all());
    assert!(
        r.stdout
            .contains("interrupted at the prompt; nothing was changed"),
        "{}",
        r.all()
    );
    let s = db.show("cc1");
    assert_eq!(s["state"], "pending");
    assert_eq!(s["history"], serde_json::json!([]));
    let r = on_a_terminal(&db, &[], "discard cc1 --note n", "\x03");
    assert_eq!(r.code, 130, "{}", r.all());
    assert!(r.stdout.contains("nothing was changed"), "{}", r.all());
    assert_eq!(db.show("cc1")["state"], "pending");
}

/// Once broke: the prompt's Ctrl-C handler outlived it, so after a "yes" Ctrl-C no longer
/// stopped the command (here a discard waiting on a locked SQLite file for 20 s).
#[test]
fn ctrl_c_after_a_yes_still_stops_the_command() {
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("cc2", "orders", b"{}"));
    let file = db.url.trim_start_matches("sqlite://").to_string();
    let mut lock = std::process::Command::new("python3")
        .args([
            "-c",
            "import sqlite3,sys,time; c=sqlite3.connect(sys.argv[1], isolation_level=None); c.execute('BEGIN IMMEDIATE'); print('locked', flush=True); time.sleep(60)",
            &file,
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(lock.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "locked");
    let started = Instant::now();
    let r = on_a_terminal_typing(
        &db,
        &[],
        "--lock-timeout 30s discard cc2 --note n",
        &["y\n", "\x03"],
    );
    let _ = lock.kill();
    let _ = lock.wait();
    assert_eq!(r.code, 130, "{}", r.all());
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    assert!(r.stdout.contains("dlq: interrupted"), "{}", r.all());
    assert_eq!(db.show("cc2")["state"], "pending");
}

/// Once broke: with `--yes` a plan run started without saying where it publishes; on a
/// terminal it now prints the prompt's header once, before its progress.
#[test]
fn a_plan_run_with_yes_says_where_it_goes_first_on_a_terminal() {
    for backend in BACKENDS {
        let mut rabbit = Rabbit::new();
        let q = rabbit.queue("dlq_where_yes");
        let db = TestDb::migrated(backend);
        db.add(letter("y1", &q, b"{\"n\":1}"));
        db.add(letter("y2", &q, "{\"n\":\"é\"}".as_bytes()));
        let plan = db.plan_file(&[]);
        let args = format!("replay --plan {} --yes", plan.path().display());
        let r = on_a_terminal(&db, &[], &args, "");
        assert_eq!(r.code, 0, "{backend:?}: {}", r.all());
        let header = r.stdout.find("About to replay plan").expect("the header");
        let summary = r.stdout.find("2 of 2 done").expect("the summary");
        assert!(header < summary, "{}", r.stdout);
        assert_eq!(r.stdout.matches("About to replay plan").count(), 1);
        // 7 bytes and 10 (é is two): bytes, not characters.
        assert!(r.stdout.contains("17 bytes"), "{backend:?}: {}", r.stdout);
        assert!(!r.stdout.contains("Replay this plan?"), "{}", r.stdout);
        assert_eq!(rabbit.drain(&q).len(), 2);
        // Not on a terminal (a script): the header is not printed.
        let r = db.dlq(&["replay", "--plan", plan.path().to_str().unwrap(), "--yes"]);
        assert!(!r.stderr.contains("About to replay plan"), "{}", r.stderr);
    }
}
