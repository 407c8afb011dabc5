//! `dlq import` into SQLite commits in short batches (issue 26 item 5) and stays all or
//! nothing: a killed import leaves nothing the next command shows or replays, a worker's
//! inserts beside a large import are not refused, and a failed one undoes its batches.

use crate::common::*;
use serde_json::{json, Value};
use std::io::Write;
use std::process::{Child, Stdio};

fn file_of(db: &TestDb) -> String {
    db.url.trim_start_matches("sqlite://").to_string()
}

/// An import file of `n` rows `imp-NNNNNN` with bodies of about 2 KB: a few seconds of
/// import, many batches.
fn big_file(n: usize) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    let pad = "x".repeat(2000);
    let mut w = std::io::BufWriter::new(f.as_file_mut());
    for i in 0..n {
        let body = json!({"event_id": format!("evt-{i}"), "pad": pad}).to_string();
        let line = json!({"id": format!("imp-{i:06}"), "reason": "retries_exhausted",
                          "attempts": 1, "source_queue": "q", "body_text": body});
        writeln!(w, "{line}").unwrap();
    }
    drop(w);
    f
}

fn spawn_import(db: &TestDb, file: &str) -> Child {
    db.cmd()
        .args(["import", file])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Rows left of imports in the raw tables: staged rows, their kept values, imports.
fn leftovers(db: &TestDb) -> [i64; 4] {
    [
        db.scalar("SELECT count(*) FROM dead_letters WHERE id LIKE 'imp-%'"),
        db.scalar("SELECT count(*) FROM dlq_import_rows"),
        db.scalar("SELECT count(*) FROM dlq_imports"),
        db.scalar("SELECT count(*) FROM dead_letter_history WHERE dead_letter_id LIKE 'imp-%'"),
    ]
}

/// All rows and the pending ones, as `dlq aggregate` counts them (a dlq command).
fn counted(db: &TestDb) -> (i64, i64) {
    let r = db.dlq(&["aggregate", "--by", "reason"]);
    assert_eq!(r.code, 0, "{}", r.all());
    let groups = r.json();
    let sum = |k: &str| -> i64 {
        groups
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g[k].as_i64().unwrap())
            .sum()
    };
    (sum("count"), sum("pending"))
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..6000 {
        if f() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("timed out waiting for {what}");
}

#[test]
fn a_killed_import_leaves_nothing_the_next_command_shows_and_is_undone() {
    let db = TestDb::migrated(Backend::Sqlite);
    let file = big_file(20_000);
    let path = file.path().to_str().unwrap();
    let mut child = spawn_import(&db, path);
    // Midway: some batches committed (their rows are in the file), the import running.
    wait_until("a committed batch", || {
        db.scalar("SELECT count(*) FROM dlq_import_rows") > 0
    });
    signal(&child, "KILL");
    child.wait().unwrap();
    let staged = db.scalar(
        "SELECT count(*) FROM dead_letters WHERE id LIKE 'imp-%' \
         AND replay_claim_owner LIKE 'dlq-import:%'",
    );
    assert!(staged > 0, "no batch committed before the kill");
    assert!(staged < 20_000, "the import had finished before the kill");
    // The staged rows were never free: every one held by the import's claim.
    assert_eq!(
        db.scalar("SELECT count(*) FROM dead_letters WHERE replay_claim_owner IS NULL"),
        0
    );

    // The next command (any: an aggregate) undoes the dead import before it reads.
    assert_eq!(counted(&db), (0, 0));
    assert_eq!(leftovers(&db), [0, 0, 0, 0]);

    // Nothing of it is left to collide with: the same file imports whole.
    let r = db.dlq(&["import", path]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(r.json()["imported"], json!(20_000));
    assert_eq!(leftovers(&db), [20_000, 0, 0, 0]);
    assert_eq!(counted(&db), (20_000, 20_000));
}

#[test]
fn a_worker_inserting_beside_a_large_import_is_not_refused() {
    let db = TestDb::migrated(Backend::Sqlite);
    let file = big_file(30_000);
    let dir = tempfile::tempdir().unwrap();
    let stop = dir.path().join("stop");
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/common/python_inserter.py"
    );
    let worker = std::process::Command::new("python3")
        .args([script, &file_of(&db), stop.to_str().unwrap(), "imp-"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut child = spawn_import(&db, file.path().to_str().unwrap());
    // Another dlq opening the file while the import runs leaves the live import alone.
    wait_until("a committed batch", || {
        db.scalar("SELECT count(*) FROM dlq_import_rows") > 0
    });
    let (_, pending_midway) = counted(&db);
    let imported = child.wait().unwrap();
    std::fs::write(&stop, "").unwrap();
    let out = worker.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(imported.success());
    let w: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        w["failed"],
        json!(0),
        "the worker's inserts were refused: {w}"
    );
    assert!(
        w["inserted_during_import"].as_i64().unwrap() > 0,
        "no insert while the import was staging: {w}"
    );
    assert_eq!(w["half_imports"], json!([]), "{w}");
    // Midway, only the worker's rows were pending; now every imported row is too.
    let workers = w["inserted"].as_i64().unwrap();
    assert!(pending_midway <= workers, "{pending_midway} > {workers}");
    assert_eq!(counted(&db), (30_000 + workers, 30_000 + workers));
    assert_eq!(leftovers(&db)[1..], [0, 0, 0]);
}

#[test]
fn a_failed_import_undoes_the_batches_it_committed() {
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(json!({"id": "imp-009999", "reason": "r", "body_text": "there before"}));
    let file = big_file(10_000);
    let r = db.dlq(&["import", file.path().to_str().unwrap()]);
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(
        r.stderr.contains("line 10000: field id") && r.stderr.contains("nothing was imported"),
        "{}",
        r.stderr
    );
    assert_eq!(leftovers(&db), [1, 0, 0, 0]);
    assert_eq!(db.show("imp-009999")["body_text"], json!("there before"));
}

/// The rows of an export keep their own state through the batches: a claim (its
/// owner's name, a new token), an open attempt, a replay, a discard.
#[test]
fn imported_states_are_given_back_after_the_release() {
    let db = TestDb::migrated(Backend::Sqlite);
    let rows = [
        json!({"id": "imp-claimed", "reason": "r", "body_text": "a",
               "replay_claim_owner": "alice:tok", "replay_claim_expires_at": "2099-01-01T00:00:00Z"}),
        json!({"id": "imp-uncertain", "reason": "r", "body_text": "b",
               "replay_claim_owner": "bob:tok", "replay_claim_expires_at": "2020-01-01T00:00:00Z",
               "replay_attempt_at": "2019-12-31T23:59:00Z"}),
        json!({"id": "imp-replayed", "reason": "r", "body_text": "c",
               "replayed_at": "2020-02-02T00:00:00Z"}),
        json!({"id": "imp-discarded", "reason": "r", "body_text": "d",
               "discarded_at": "2020-03-03T00:00:00Z", "discard_note": "dup"}),
        json!({"id": "imp-pending", "reason": "r", "body_text": "e"}),
    ];
    let input: String = rows.iter().map(|r| format!("{r}\n")).collect();
    let r = db.dlq_stdin(&["import", "-"], input.as_bytes());
    assert_eq!(r.code, 0, "{}", r.all());
    for (id, state) in [
        ("imp-claimed", "claimed"),
        ("imp-uncertain", "uncertain"),
        ("imp-replayed", "replayed"),
        ("imp-discarded", "discarded"),
        ("imp-pending", "pending"),
    ] {
        assert_eq!(db.show(id)["state"], json!(state), "{id}");
    }
    let shown = db.show("imp-uncertain");
    assert_eq!(shown["replay_attempt_at"], json!("2019-12-31T23:59:00Z"));
    assert_eq!(
        db.show("imp-replayed")["replayed_at"],
        json!("2020-02-02T00:00:00Z")
    );
    assert_eq!(leftovers(&db)[1..], [0, 0, 0]);
}

/// PostgreSQL keeps one transaction: its inserts take row locks only, so a worker's
/// INSERT of another ID commits while the import's transaction is still open.
#[test]
fn postgres_import_in_one_transaction_does_not_hold_back_a_workers_insert() {
    let db = TestDb::migrated(Backend::Postgres);
    let file = big_file(20_000);
    let mut child = spawn_import(&db, file.path().to_str().unwrap());
    let open_xid = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                    AND backend_xid IS NOT NULL AND pid <> pg_backend_pid()";
    wait_until("the import's open transaction", || db.scalar(open_xid) > 0);
    let xid = "SELECT backend_xid::text::bigint FROM pg_stat_activity \
               WHERE datname = current_database() AND backend_xid IS NOT NULL \
               AND pid <> pg_backend_pid()";
    let before = db.scalar(xid);
    db.sql(&[
        "SET lock_timeout = '5s'",
        "INSERT INTO dead_letters (id, body, reason, attempts, headers_json) \
         VALUES ('w-1', '\\x7b7d'::bytea, 'poison_message', 1, '{}')",
    ]);
    // The worker's row is committed, and the import's transaction is the same one, open.
    assert_eq!(
        db.scalar("SELECT count(*) FROM dead_letters WHERE id = 'w-1'"),
        1
    );
    assert_eq!(db.scalar(xid), before, "the import had committed first");
    assert_eq!(
        db.scalar("SELECT count(*) FROM dead_letters WHERE id LIKE 'imp-%'"),
        0,
        "none of the import visible before its commit"
    );
    assert!(child.wait().unwrap().success());
    assert_eq!(counted(&db), (20_001, 20_001));
}

/// Once lost a message: `--skip-existing` skipped an id that another import, still
/// running, held; that import was then killed and undone, deleting the row, while this
/// one had reported it as already there (exit 0).
#[test]
fn skip_existing_never_skips_a_row_another_import_has_not_finished() {
    let db = TestDb::migrated(Backend::Sqlite);
    let file = big_file(20_000);
    let mut other = spawn_import(&db, file.path().to_str().unwrap());
    wait_until("the other import's first row", || {
        db.scalar("SELECT count(*) FROM dlq_import_rows WHERE id = 'imp-000000'") > 0
    });
    let mine = format!(
        "{}\n",
        json!({"id": "imp-000000", "reason": "r", "body_text": "mine"})
    );
    let r = db.dlq_stdin(&["import", "--skip-existing", "-"], mine.as_bytes());
    signal(&other, "KILL");
    other.wait().unwrap();
    assert!(
        db.scalar("SELECT count(*) FROM dlq_import_rows") > 0,
        "the other import had finished before the kill"
    );
    // The next command undoes the killed import; what this import kept must be there.
    let shown = db.dlq(&["show", "imp-000000"]);
    assert!(
        r.code != 0 || shown.code == 0,
        "reported {} (exit 0), and the row is gone: {}",
        r.stdout,
        shown.all()
    );
    assert_ne!(r.code, 0, "{}", r.all());
    assert!(r.stderr.contains("imp-000000"), "{}", r.stderr);
    // Run again once the other is undone, it imports the row.
    let again = db.dlq_stdin(&["import", "--skip-existing", "-"], mine.as_bytes());
    assert_eq!(again.code, 0, "{}", again.all());
    assert_eq!(db.show("imp-000000")["body_text"], json!("mine"));
}

/// Once lost a message through a backup: an export taken while an import was running
/// wrote its unfinished rows as claimed by `dlq-import` until the year 4000 (a row
/// imported as replayed had `replayed_at` null), exit 0; imported elsewhere, such a row
/// could never be replayed, released, resolved or discarded.
#[test]
fn an_export_never_writes_rows_an_import_has_not_finished() {
    let db = TestDb::migrated(Backend::Sqlite);
    let mut file = big_file(20_000);
    let first = json!({"id": "imp-replayed", "reason": "r", "body_text": "a",
                       "replayed_at": "2020-02-02T00:00:00Z"});
    let path = file.path().to_path_buf();
    let rest = std::fs::read_to_string(&path).unwrap();
    let f = file.as_file_mut();
    f.set_len(0).unwrap();
    use std::io::Seek;
    f.rewind().unwrap();
    write!(f, "{first}\n{rest}").unwrap();
    let mut child = spawn_import(&db, path.to_str().unwrap());
    wait_until("the import's first row", || {
        db.scalar("SELECT count(*) FROM dlq_import_rows WHERE id = 'imp-replayed'") > 0
    });
    let r = db.dlq(&["export"]);
    let held: Vec<Value> = r
        .stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["replay_claim_owner"] == json!("dlq-import"))
        .collect();
    assert!(child.wait().unwrap().success());
    assert!(
        held.is_empty(),
        "exported {} unfinished rows (exit {}), e.g. {}",
        held.len(),
        r.code,
        held[0]["id"]
    );
    assert_ne!(r.code, 0, "{}", r.all());
    assert!(r.stderr.contains("import"), "{}", r.stderr);
    // Once the import has ended, the row exports as it was imported; an operator who
    // happens to be called `dlq-import` holds an ordinary claim.
    let c = db.dlq_env(&["claim", "imp-000001"], &[("DLQ_OPERATOR", "dlq-import")]);
    assert_eq!(c.code, 0, "{}", c.all());
    let r = db.dlq(&["export"]);
    assert_eq!(r.code, 0, "{}", r.all());
    let row = r
        .lines()
        .into_iter()
        .find(|l| l["id"] == json!("imp-replayed"))
        .unwrap();
    assert_eq!(row["replayed_at"], json!("2020-02-02T00:00:00Z"));
    assert_eq!(row["replay_claim_owner"], Value::Null);
}
