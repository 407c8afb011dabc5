//! Rows the kept counts do not hold yet (issue 24: a single-row insert writes no delta of
//! its own). Readers read them where they are, and a sweep counts each once, whenever its
//! transaction commits and whatever changed it first.

use super::kept_counts::{answers_as_a_scan, in_background, session, BULK, FOLD_IN_THE_INSERT};
use super::*;

fn insert(id: &str) -> String {
    format!(
        "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, producer) \
         VALUES ('{id}', 'b', 'poison_message', 1, '{{}}', 'billing')"
    )
}

/// The rows no sweep has counted yet.
const UNCOUNTED: &str = "SELECT count(*) FROM dlq_rollup_unswept()";

#[test]
fn a_row_committed_after_a_fold_began_is_counted_once() {
    // A fold that took every transaction ID below its own for counted would miss a
    // worker's row still uncommitted while it ran.
    let db = TestDb::migrated(Backend::Postgres);
    db.sql(&[BULK]);
    let worker = in_background(
        &db.url,
        &[
            "BEGIN",
            &insert("open-1"),
            "SELECT pg_sleep(1)",
            "UPDATE dead_letters SET discarded_at = now() WHERE id = 'open-1'",
            "COMMIT",
        ],
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    // A later writer commits first: transaction IDs below the fold's are not all done.
    db.sql(&[&insert("later-1"), "SELECT dlq_rollup_fold()"]);
    worker.join().unwrap().expect("the worker's transaction");
    db.with_fold_held(|| answers_as_a_scan(&db, "read unfolded after the worker committed"));
    answers_as_a_scan(&db, "after the next fold");
    db.sql(&["SELECT dlq_rollup_fold()", "SELECT dlq_rollup_fold()"]);
    answers_as_a_scan(&db, "after more folds");
    assert_eq!(db.scalar(UNCOUNTED), 0);
}

#[test]
fn a_row_changed_before_it_is_counted_is_counted_as_it_is_now() {
    // Its change's delta and the row read where it is would count the change twice.
    let db = TestDb::migrated(Backend::Postgres);
    db.with_fold_held(|| {
        db.sql(&[
            BULK,
            "UPDATE dead_letters SET discarded_at = now() WHERE id = 'bulk-5'",
            "UPDATE dead_letters SET producer = 'moved' WHERE id = 'bulk-7'",
            "DELETE FROM dead_letters WHERE id = 'bulk-6'",
        ]);
        assert!(
            db.scalar("SELECT count(*) FROM dead_letter_rollup_delta WHERE row_xid IS NOT NULL")
                > 0
        );
        answers_as_a_scan(&db, "unfolded, rows changed before they were counted");
    });
    answers_as_a_scan(&db, "folded");
    assert_eq!(
        db.scalar("SELECT count(*) FROM dead_letter_rollup_delta"),
        0
    );
    // Changed again once counted: a plain delta now.
    db.sql(&["UPDATE dead_letters SET discarded_at = NULL WHERE id = 'bulk-5'"]);
    answers_as_a_scan(&db, "changed after it was counted");
}

#[test]
fn a_writers_fold_counts_a_bounded_number_of_rows_and_leaves_a_bulk_statement_to_aggregate() {
    // A writer's fold must end within its statement timeout whatever the backlog.
    let db = TestDb::migrated(Backend::Postgres);
    db.insert_one_by_one(3);
    db.sql(&[
        "INSERT INTO dead_letters (id, body, reason, attempts, headers_json) \
         SELECT 'many-' || g, 'b', 'permanent_failure', 1, '{}' FROM generate_series(1, 20000) g",
    ]);
    session(
        &db.url,
        &[
            "SET statement_timeout = '2s'",
            FOLD_IN_THE_INSERT,
            &insert("w-1"),
        ],
    )
    .expect("the worker's insert");
    let left = db.scalar(UNCOUNTED);
    assert!(
        (20_000..=20_001).contains(&left),
        "the three single rows counted, the bulk statement's left: {left}"
    );
    db.with_fold_held(|| answers_as_a_scan(&db, "unfolded, a bulk statement not counted"));
    answers_as_a_scan(&db, "after aggregate folded");
    assert_eq!(db.scalar(UNCOUNTED), 0);
}

#[test]
fn a_rows_writer_is_given_by_the_database_and_never_changed() {
    // A copy naming counted rows' writer would be taken for counted; a changed writer
    // would have a counted row read again.
    let db = TestDb::migrated(Backend::Postgres);
    db.sql(&[BULK, "SELECT dlq_rollup_fold()"]);
    db.sql(&[
        "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, written_xid) \
         SELECT 'copy-' || id, body, reason, attempts, headers_json, written_xid \
         FROM dead_letters WHERE id LIKE 'bulk-%'",
    ]);
    answers_as_a_scan(&db, "after a copy that named its rows' writer");
    let changed = session(
        &db.url,
        &["UPDATE dead_letters SET written_xid = '1' WHERE id = 'bulk-1'"],
    );
    assert!(
        changed
            .as_ref()
            .is_err_and(|e| e.contains("written_xid is kept by dlq")),
        "{changed:?}"
    );
}

#[test]
fn counts_restored_ahead_of_this_server_are_not_read_until_counted_anew() {
    // A restore into a server whose transaction IDs are behind the counted snapshot: new
    // rows would be taken for counted ones, and never counted.
    let db = TestDb::migrated(Backend::Postgres);
    db.sql(&[
        BULK,
        "SELECT dlq_rollup_fold()",
        "UPDATE dead_letter_rollup_swept SET snap = '4000000000:4000000000:'",
    ]);
    db.insert_one_by_one(3);
    answers_as_a_scan(&db, "with a counted snapshot ahead of the server");
    assert_eq!(
        db.scalar("SELECT count(*) FROM dead_letter_rollup_kept WHERE kept"),
        0,
        "a fold turned the counts off"
    );
    db.sql(&["SELECT dlq_rollup_enable()"]);
    answers_as_a_scan(&db, "counted anew");
    db.sql(&["UPDATE dead_letter_rollup SET n = n + 1000 WHERE state = 'open'"]);
    let counted = db.dlq(&["aggregate", "--by", "reason"]).json();
    let scanned = db
        .dlq(&[
            "aggregate",
            "--by",
            "reason",
            "--state",
            "pending,claimed,uncertain,replayed,discarded",
        ])
        .json();
    assert_ne!(counted, scanned, "read again once counted anew");
}

#[test]
fn rows_a_writer_inserts_after_its_own_fold_are_counted() {
    // A snapshot never lists its own transaction: a fold inside a worker's transaction
    // (the insert trigger's one in 2,000, or `dlq import`'s many rows) took the worker as
    // counted, and the rows it inserted after the fold were never counted.
    let db = TestDb::migrated(Backend::Postgres);
    let worker = in_background(
        &db.url,
        &[
            "BEGIN",
            &insert("w-1"),
            "SELECT pg_sleep(1)",
            FOLD_IN_THE_INSERT,
            &insert("w-2"),
            &insert("w-3"),
            "UPDATE dead_letters SET replay_attempt_at = now() WHERE id = 'w-3'",
            "COMMIT",
        ],
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    // A later transaction commits first, so the worker's ID is below the fold's xmax.
    db.sql(&[&insert("later-1")]);
    worker.join().unwrap().expect("the worker's transaction");
    db.with_fold_held(|| answers_as_a_scan(&db, "unfolded, after the worker committed"));
    db.sql(&["SELECT dlq_rollup_fold()", "SELECT dlq_rollup_fold()"]);
    answers_as_a_scan(&db, "after the worker committed and two folds");
}

#[test]
fn a_bounded_fold_never_takes_a_running_writer_for_counted() {
    // The bound of a writer's fold could be its own ID, above its snapshot's xmax: a
    // writer running in between was listed nowhere, taken for counted, never counted.
    let db = TestDb::migrated(Backend::Postgres);
    db.sql(&["SELECT dlq_rollup_fold()", &insert("c-1")]);
    let running = in_background(
        &db.url,
        &["BEGIN", &insert("x-1"), "SELECT pg_sleep(1.5)", "COMMIT"],
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    session(
        &db.url,
        &[
            "BEGIN",
            "INSERT INTO dead_letters (id, body, reason, attempts, headers_json) \
             SELECT 'b-' || g, 'b', 'permanent_failure', 1, '{}' FROM generate_series(1, 4001) g",
            "SELECT dlq_rollup_compact(4000)",
            "COMMIT",
        ],
    )
    .expect("the bulk writer");
    running.join().unwrap().expect("the running writer");
    db.sql(&["SELECT dlq_rollup_fold()"]);
    answers_as_a_scan(&db, "after both writers committed");
}

#[test]
fn turning_the_counts_on_waits_for_a_fold_under_way() {
    // It once failed on the fold's uncommitted counts (duplicate key).
    let db = TestDb::migrated(Backend::Postgres);
    db.sql(&[BULK]);
    let fold = in_background(
        &db.url,
        &[
            "BEGIN",
            "SELECT dlq_rollup_fold()",
            "SELECT pg_sleep(1)",
            "COMMIT",
        ],
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    db.sql(&["SELECT dlq_rollup_enable()"]);
    fold.join().unwrap().expect("the fold");
    answers_as_a_scan(&db, "after enable waited for the fold");
}

/// Pages `query` touches, run twice in one session (the first warms the caches).
fn pages_touched(db: &TestDb, query: &str) -> i64 {
    db.sql(&[
        "CREATE OR REPLACE FUNCTION pages_touched(q TEXT) RETURNS BIGINT LANGUAGE plpgsql AS $$ \
         DECLARE j JSON; BEGIN \
           EXECUTE 'EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ' || q INTO j; \
           EXECUTE 'EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ' || q INTO j; \
           RETURN (j->0->'Plan'->>'Shared Hit Blocks')::bigint \
                + (j->0->'Plan'->>'Shared Read Blocks')::bigint; END $$",
    ]);
    db.scalar(&format!(
        "SELECT pages_touched('{}')",
        query.replace('\'', "''")
    ))
}

/// 20,000 rows in one statement, counted by a fold; then one more, not yet counted.
const COUNTED_MANY: [&str; 3] = [
    "INSERT INTO dead_letters (id, body, reason, attempts, headers_json) \
     SELECT 'many-' || g, 'b', 'permanent_failure', 1, '{}' FROM generate_series(1, 20000) g",
    "SELECT dlq_rollup_fold()",
    "INSERT INTO dead_letters (id, body, reason, attempts, headers_json) \
     VALUES ('one-1', 'b', 'poison_message', 1, '{}')",
];

/// A read, a writer's fold and aggregate's (unbounded) fold each touch few pages: what
/// is not counted, not the table.
fn assert_visits_only_uncounted(db: &TestDb) {
    let read = pages_touched(db, "SELECT count(*) FROM dlq_rollup_unswept()");
    let fold = pages_touched(db, "SELECT dlq_rollup_compact(4000)");
    let whole = pages_touched(db, "SELECT dlq_rollup_compact()");
    assert!(read < 200, "a read touched {read} pages");
    assert!(fold < 400, "a writer's fold touched {fold} pages");
    assert!(whole < 400, "aggregate's fold touched {whole} pages");
}

#[test]
fn folds_and_reads_visit_only_the_rows_not_counted() {
    // What a fold or a read visits is what is not counted, not the table: each gap of
    // writers' IDs is one index range (flattened or in one OR, planners walked the whole
    // index: the aggregate's fold here touched 533 pages before its fence).
    let db = TestDb::migrated(Backend::Postgres);
    db.sql(&COUNTED_MANY);
    assert_visits_only_uncounted(&db);
}

/// Runs `f` while another session holds a transaction open after `statements`.
fn with_transaction_open(db: &TestDb, statements: &str, f: impl FnOnce()) {
    use std::io::{BufRead, Write};
    let mut held = std::process::Command::new("psql")
        .args(["-X", "-q", &db.url])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("psql");
    let mut stdin = held.stdin.take().unwrap();
    stdin
        .write_all(format!("BEGIN; {statements}\n\\echo held\n").as_bytes())
        .unwrap();
    let out = std::io::BufReader::new(held.stdout.take().unwrap());
    for line in out.lines() {
        if line.unwrap().trim() == "held" {
            break;
        }
    }
    f();
    drop(stdin);
    held.wait().unwrap();
}

#[test]
fn a_transaction_held_open_elsewhere_never_makes_folds_or_reads_visit_counted_rows() {
    // The rows not counted were found from the oldest running transaction's ID: one
    // held open anywhere made every fold and read visit every row written since, and a
    // writer's fold failed its statement timeout.
    let db = TestDb::migrated(Backend::Postgres);
    with_transaction_open(&db, "SELECT pg_current_xact_id();", || {
        db.sql(&COUNTED_MANY);
        assert_visits_only_uncounted(&db);
    });
    answers_as_a_scan(&db, "after the transaction held open ended");
}

#[test]
fn rows_of_a_large_transaction_still_running_are_stepped_over() {
    // A fold's bound counted only rows it could see: every fold and read walked a large
    // import's uncommitted rows one by one, and a writer's fold failed its statement
    // timeout for as long as the import ran.
    let db = TestDb::migrated(Backend::Postgres);
    db.sql(&["SELECT dlq_rollup_fold()"]);
    let import = "INSERT INTO dead_letters (id, body, reason, attempts, headers_json) \
                  SELECT 'imp-' || g, 'b', 'permanent_failure', 1, '{}' \
                  FROM generate_series(1, 50000) g;";
    with_transaction_open(&db, import, || {
        db.sql(&[&insert("s-1")]);
        assert_visits_only_uncounted(&db);
    });
    answers_as_a_scan(&db, "after the import committed");
}

#[test]
fn a_row_deleted_before_it_is_counted_leaves_no_time_in_the_counts() {
    // A fold reads a stale bucket's times from its rows, counted or not; the delete of
    // a row not yet counted left only a tagged stale mark, skipped and then deleted, so
    // the bucket kept the deleted row's time.
    let db = TestDb::migrated(Backend::Postgres);
    let row = |id: &str, at: &str| {
        format!(
            "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, producer, \
             dead_lettered_at) VALUES ('{id}', 'b', 'poison_message', 1, '{{}}', 'billing', '{at}')"
        )
    };
    db.sql(&[
        &row("a", "2026-12-01 10:30Z"),
        &row("b", "2026-12-01 10:40Z"),
        "SELECT dlq_rollup_fold()",
        "DELETE FROM dead_letters WHERE id = 'b'",
    ]);
    session(
        &db.url,
        &[
            "BEGIN",
            &row("c", "2026-12-01 10:05Z"),
            "SELECT dlq_rollup_fold()",
            "DELETE FROM dead_letters WHERE id = 'c'",
            "COMMIT",
        ],
    )
    .expect("the session");
    answers_as_a_scan(
        &db,
        "after a row the times were read from was deleted uncounted",
    );
}

#[test]
fn turning_the_counts_off_never_deadlocks_a_writer() {
    // It took the triggers' lock, then DROP INDEX's stronger one: a writer that had read
    // the table first deadlocked with it.
    let db = TestDb::migrated(Backend::Postgres);
    db.sql(&[&insert("a-1")]);
    let worker = in_background(
        &db.url,
        &[
            "BEGIN",
            "SELECT count(*) FROM dead_letters",
            "SELECT pg_sleep(1.5)",
            &insert("a-2"),
            "COMMIT",
        ],
    );
    std::thread::sleep(std::time::Duration::from_millis(500));
    let off = session(&db.url, &["SELECT dlq_rollup_disable()"]);
    let w = worker.join().unwrap();
    assert!(w.is_ok() && off.is_ok(), "worker: {w:?}, disable: {off:?}");
}

#[test]
fn rows_dlq_import_writes_are_counted_when_it_ends() {
    // Its one transaction cannot count its own rows: they were left to the first
    // `aggregate` after it, which paid about 4 s a million rows for them.
    let db = TestDb::migrated(Backend::Postgres);
    let lines: String = (0..2000)
        .map(|i| {
            let producer = ["billing", "orders"][i % 2];
            format!(
                "{}\n",
                serde_json::json!({"id": format!("imp-{i}"), "reason": "poison_message",
                    "body_text": "b", "producer": producer})
            )
        })
        .collect();
    let r = db.dlq_stdin(&["import", "-"], lines.as_bytes());
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(db.scalar(UNCOUNTED), 0, "every imported row counted");
    db.with_fold_held(|| answers_as_a_scan(&db, "read unfolded after the import"));
}
