//! The main commands' output pinned by `insta` snapshots: `list`, `show` and `aggregate`
//! as tables and JSON, the replay prompts on a terminal, a plan run's summary, the `check` line, `--help` of the main
//! commands and the one line of a usage error (exit 2). Times, ages, UUIDs, tokens and
//! the test's own queue and file names are filtered out, so that a snapshot holds on
//! every run; a change of output shows as a diff (`cargo insta review`, or
//! `INSTA_UPDATE=always` and read the `.snap` files' diff).

use crate::common::*;

/// Redactions for everything that differs between runs.
fn settings() -> insta::Settings {
    let mut s = insta::Settings::clone_current();
    s.set_snapshot_path("snapshots");
    s.set_prepend_module_to_snapshot(false);
    for (re, with) in [
        (
            r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:?\d{2}| UTC)?",
            "[time]",
        ),
        (
            r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
            "[uuid]",
        ),
        (r"dlq_snap_[0-9a-f]{32}", "[queue]"),
        (r"sqlite:///\S+\.db", "[db]"),
        (r"\b\d+(\.\d+)?(ms|s)\b", "[duration]"),
        (r"oldest pending \w+", "oldest pending [age]"),
    ] {
        s.add_filter(re, with);
    }
    s
}

/// Runs `$body` with the redactions in force.
macro_rules! redacted {
    ($body:block) => {
        settings().bind(|| $body)
    };
}

/// Five dead letters of two reasons and three producers, dead-lettered at fixed times.
fn seeded(queue: &str) -> TestDb {
    let db = TestDb::migrated(Backend::Sqlite);
    let rows = [
        (
            "snap-1",
            "retries_exhausted",
            "inventory",
            "2026-01-01T10:00:00Z",
        ),
        (
            "snap-2",
            "retries_exhausted",
            "inventory",
            "2026-01-01T10:05:00Z",
        ),
        (
            "snap-3",
            "poison_message",
            "billing",
            "2026-01-01T11:00:00Z",
        ),
        (
            "snap-4",
            "retries_exhausted",
            "orders",
            "2026-01-01T11:30:00Z",
        ),
        (
            "snap-5",
            "poison_message",
            "billing",
            "2026-01-01T12:00:00Z",
        ),
    ];
    for (id, reason, producer, at) in rows {
        let mut l = letter(
            id,
            queue,
            format!("{{\"event_id\":\"evt-{id}\"}}").as_bytes(),
        );
        l["reason"] = reason.into();
        l["producer"] = producer.into();
        l["dead_lettered_at"] = at.into();
        db.add(l);
    }
    db
}

/// `dlq ARGS` on `db` as a table (not JSON), at a fixed width (wide enough for every column).
fn table(db: &TestDb, args: &[&str]) -> Run {
    db.dlq_env(args, &[("DLQ_OUTPUT", "table"), ("COLUMNS", "200")])
}

fn pretty(r: &Run) -> String {
    serde_json::to_string_pretty(&r.json()).unwrap()
}

#[test]
fn list_as_a_table_and_as_json() {
    let db = seeded("orders.created");
    let t = table(&db, &["list"]);
    assert_eq!(t.code, 0, "{}", t.all());
    let j = db.dlq(&["list", "--limit", "2"]);
    assert_eq!(j.code, 0, "{}", j.all());
    redacted!({
        insta::assert_snapshot!("list_table", t.all());
        insta::assert_snapshot!("list_json", pretty(&j));
    });
}

#[test]
fn show_as_a_table_and_as_json() {
    let db = seeded("orders.created");
    let t = table(&db, &["show", "snap-3"]);
    assert_eq!(t.code, 0, "{}", t.all());
    let j = db.dlq(&["show", "snap-3"]);
    assert_eq!(j.code, 0, "{}", j.all());
    redacted!({
        insta::assert_snapshot!("show_table", t.all());
        insta::assert_snapshot!("show_json", pretty(&j));
    });
}

#[test]
fn aggregate_as_a_table_and_as_json() {
    let db = seeded("orders.created");
    let t = table(&db, &["aggregate", "--by", "reason,producer"]);
    assert_eq!(t.code, 0, "{}", t.all());
    let j = db.dlq(&["aggregate", "--by", "reason,producer"]);
    assert_eq!(j.code, 0, "{}", j.all());
    redacted!({
        insta::assert_snapshot!("aggregate_table", t.all());
        insta::assert_snapshot!("aggregate_json", pretty(&j));
    });
}

/// `list`, `aggregate --by reason,producer,schema_version` and `show` as tables at 80,
/// 120 and 200 columns: the keys asked for are kept at every width, free text is cut
/// with `…`, and what is left out is said (stderr is in the snapshot). `show` is the
/// same at every width (its long lines wrap as the terminal wraps them).
#[test]
fn tables_at_80_120_and_200_columns() {
    let db = seeded("orders.created");
    db.sql(&[
        "UPDATE dead_letters SET error = 'timeout: inventory did not answer within 30 s after 5 attempts, the last one at the gateway' WHERE id = 'snap-3'",
        "UPDATE dead_letters SET schema_version = '6' WHERE id = 'snap-4'",
    ]);
    let commands: [(&str, &[&str]); 3] = [
        ("list", &["list"]),
        (
            "aggregate",
            &["aggregate", "--by", "reason,producer,schema_version"],
        ),
        ("show", &["show", "snap-3"]),
    ];
    for (name, args) in commands {
        for columns in ["80", "120", "200"] {
            let r = db.dlq_env(args, &[("DLQ_OUTPUT", "table"), ("COLUMNS", columns)]);
            assert_eq!(r.code, 0, "{args:?} at {columns}: {}", r.all());
            // A table fits the width; `show` (lines of `field: value`) does not depend on it.
            let width: usize = columns.parse().unwrap();
            assert!(
                name == "show" || r.stdout.lines().all(|l| l.chars().count() <= width),
                "{args:?} at {columns}:\n{}",
                r.stdout
            );
            redacted!({
                insta::assert_snapshot!(format!("{name}_table_{columns}"), r.all());
            });
        }
    }
}

#[test]
fn a_plan_run_ends_with_its_summary() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_snap");
    let db = seeded(&q);
    let plan = db.plan_file(&["--reason", "retries_exhausted", "--producer", "inventory"]);
    let path = plan.path().to_str().unwrap();
    let t = table(&db, &["replay", "--plan", path, "--yes"]);
    assert_eq!(t.code, 0, "{}", t.all());
    assert_eq!(rabbit.drain(&q).len(), 2);
    let again = db.dlq(&["replay", "--plan", path, "--yes"]);
    redacted!({
        // `-o table` through a pipe: the summary line for people (once JSON lines).
        insta::assert_snapshot!("plan_run_stdout", t.all());
        insta::assert_snapshot!(
            "plan_rerun_summary_json",
            serde_json::to_string_pretty(&summary_of(&again)).unwrap()
        );
    });
}

#[test]
fn check_prints_one_line() {
    let db = seeded("orders.created");
    let ok = table(&db, &["check", "--max-pending", "5"]);
    assert_eq!(ok.code, 0, "{}", ok.all());
    let breached = table(
        &db,
        &["check", "--max-pending", "2", "--max-uncertain", "0"],
    );
    assert_eq!(breached.code, 7, "{}", breached.all());
    redacted!({
        insta::assert_snapshot!(ok.all(), @"dlq check: OK: 5 pending, 0 uncertain, oldest pending [age]");
        insta::assert_snapshot!(breached.all(), @"dlq check: CRITICAL: 5 pending > 2");
    });
}

#[test]
fn help_of_the_main_commands() {
    let db = TestDb::new(Backend::Sqlite);
    for cmd in [
        &[][..],
        &["list"],
        &["show"],
        &["aggregate"],
        &["plan"],
        &["replay"],
        &["resolve"],
        &["capture"],
        &["check"],
    ] {
        let mut args = cmd.to_vec();
        args.push("--help");
        let r = db.dlq_env(&args, &[("COLUMNS", "100")]);
        assert_eq!(r.code, 0, "{args:?}: {}", r.all());
        let name = format!("help_{}", cmd.first().unwrap_or(&"dlq"));
        redacted!({
            insta::assert_snapshot!(name, r.all());
        });
    }
}

#[test]
fn usage_errors_are_one_line_and_exit_2() {
    let db = TestDb::migrated(Backend::Sqlite);
    let cases: [&[&str]; 6] = [
        &["list", "--limit", "many"],
        &["replay"],
        &["discard", "d1"],
        &["check"],
        &["aggregate", "--by", "colour"],
        &["frobnicate"],
    ];
    let mut all = String::new();
    for args in cases {
        let r = db.dlq_env(args, &[("COLUMNS", "100")]);
        assert_eq!(r.code, 2, "{args:?}: {}", r.all());
        assert_eq!(r.stdout, "", "{args:?}");
        all.push_str(&format!(
            "$ dlq {}\n{}\n",
            args.join(" "),
            r.stderr.trim_end()
        ));
    }
    redacted!({
        insta::assert_snapshot!("usage_errors", all);
    });
}

/// What the prompts of `replay ID` and `replay --plan` say on a terminal of 80, 120 and
/// 200 columns: the row, where it goes, through which broker and database, how much and
/// how fast (declined: nothing is published).
#[test]
fn replay_prompts_at_80_120_and_200_columns() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_snap");
    let db = seeded(&q);
    let plan = db.plan_file(&["--reason", "retries_exhausted", "--producer", "inventory"]);
    let group = format!("replay --plan {} --rate 2/s", plan.path().display());
    for width in ["80", "120", "200"] {
        let single = on_a_terminal(&db, &[("COLUMNS", width)], "replay snap-1", "\n");
        let planned = on_a_terminal(&db, &[("COLUMNS", width)], &group, "\n");
        redacted!({
            insta::assert_snapshot!(format!("prompt_replay_{width}"), single.stdout);
            insta::assert_snapshot!(format!("prompt_plan_{width}"), planned.stdout);
        });
    }
    assert!(rabbit.drain(&q).is_empty(), "declined, yet published");
}
