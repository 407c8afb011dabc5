//! `aggregate` from the per-group counts PostgreSQL keeps as rows are written (issue 24):
//! whatever writes the rows, and whenever the counts were last folded, it answers exactly
//! as a scan of the rows does. A `--state` of every state makes dlq scan, so the two
//! answers come from the same binary.

use super::*;

/// A scan of every row: the counts cannot answer a state filter (every row is in one of
/// these).
pub(super) const SCAN: [&str; 2] = ["--state", "pending,claimed,uncertain,replayed,discarded"];

const GROUPINGS: [&str; 5] = [
    "reason,producer,schema_version",
    "source_queue,error_class",
    "hour",
    "day,reason",
    "producer",
];

/// Every grouping, with and without a key filter, answers as the scan.
pub(super) fn answers_as_a_scan(db: &TestDb, step: &str) {
    for by in GROUPINGS {
        for filter in [
            &[][..],
            &["--reason", "poison_message", "--producer", "billing"][..],
        ] {
            let mut kept = vec!["aggregate", "--by", by];
            kept.extend(filter);
            let counted = db.dlq(&kept);
            assert_eq!(counted.code, 0, "{step}: {}", counted.all());
            let mut scan = kept.clone();
            scan.extend(SCAN);
            let scanned = db.dlq(&scan);
            assert_eq!(
                counted.json(),
                scanned.json(),
                "{step}: aggregate --by {by} {filter:?}"
            );
        }
    }
}

/// 40 rows in one statement across hours, producers and missing keys.
pub(super) const BULK: &str =
    "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, producer, \
     schema_version, source_queue, error, dead_lettered_at) \
     SELECT 'bulk-' || g, convert_to('{}', 'UTF8'), \
            (ARRAY['poison_message','permanent_failure'])[1 + g % 2], 1, '{}', \
            CASE WHEN g % 3 = 0 THEN NULL ELSE 'billing' END, \
            CASE WHEN g % 4 = 0 THEN NULL ELSE '3' END, \
            CASE WHEN g % 5 = 0 THEN NULL ELSE 'orders' END, \
            CASE WHEN g % 2 = 0 THEN 'ValueError: x' END, \
            TIMESTAMPTZ '2026-11-28T20:00:00Z' + g * interval '7 minutes' \
     FROM generate_series(1, 40) g";

#[test]
fn kept_counts_answer_as_a_scan_after_every_kind_of_write() {
    let db = TestDb::new(Backend::Postgres);
    // Rows the workers wrote before this schema are counted by the migration.
    db.sql(&[
        "CREATE TABLE dead_letters (id TEXT PRIMARY KEY, body BYTEA NOT NULL, reason TEXT NOT NULL, \
         attempts INTEGER NOT NULL, headers_json TEXT NOT NULL, replayed_at TIMESTAMPTZ NULL, \
         replay_claim_owner TEXT NULL, replay_claim_expires_at TIMESTAMPTZ NULL, \
         last_replay_error TEXT NULL)",
        "INSERT INTO dead_letters (id, body, reason, attempts, headers_json) \
         VALUES ('old-1', 'x', 'poison_message', 1, '{\"x-producer\":\"billing\"}'), \
                ('old-2', 'y', 'permanent_failure', 2, '{}')",
    ]);
    assert_eq!(db.dlq(&["migrate"]).code, 0);
    answers_as_a_scan(&db, "after migrate");
    db.import_examples();
    db.sql(&[BULK]);
    db.insert_one_by_one(5);
    answers_as_a_scan(&db, "after bulk and single-row inserts");

    // Claims: two live, one whose lease lapses (pending again without a write). Once
    // flaked: read while the 1 s lease was live, it lapsed between the two answers.
    let ids = db.ids(&["--reason", "poison_message", "--producer", "billing"]);
    for (id, lease) in [(&ids[0], "5m"), (&ids[1], "5m"), (&ids[2], "1s")] {
        let r = db.dlq(&["claim", id, "--lease", lease]);
        assert_eq!(r.code, 0, "{}", r.all());
    }
    std::thread::sleep(std::time::Duration::from_millis(1500));
    answers_as_a_scan(&db, "with live leases and one lapsed");
    let claimed = db.dlq(&["aggregate", "--by", "reason", "--state", "claimed"]);
    assert_eq!(claimed.json()[0]["count"], 2, "{}", claimed.all());

    // Discard and restore; an attempt and a mark written as another tool would.
    let r = db.dlq(&["discard", &ids[3], "--note", "bad", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(
        db.dlq(&["discard", &ids[4], "--note", "bad", "--yes"]).code,
        0
    );
    assert_eq!(
        db.dlq(&["restore", &ids[4], "--note", "back", "--yes"])
            .code,
        0
    );
    db.sql(&[
        &format!(
            "UPDATE dead_letters SET replay_attempt_at = now() WHERE id = '{}'",
            ids[5]
        ),
        &format!(
            "UPDATE dead_letters SET replayed_at = now() WHERE id = '{}'",
            ids[6]
        ),
    ]);
    answers_as_a_scan(&db, "after discard, restore, attempt and mark");

    // Rows leaving their bucket: the first and last times must be read again.
    db.sql(&[
        "DELETE FROM dead_letters WHERE id = 'bulk-1'",
        "DELETE FROM dead_letters WHERE id = 'bulk-40'",
        "UPDATE dead_letters SET producer = 'moved' WHERE id = 'bulk-2'",
        "UPDATE dead_letters SET dead_lettered_at = dead_lettered_at + interval '1 minute' \
         WHERE id = 'bulk-4'",
    ]);
    answers_as_a_scan(&db, "after deletes and moves");
    let r = db.dlq(&[
        "prune",
        "--older-than",
        "1ms",
        "--state",
        "replayed,discarded",
        "--yes",
    ]);
    assert_eq!(r.code, 0, "{}", r.all());
    answers_as_a_scan(&db, "after prune");

    // A fold under way elsewhere (its transaction still open): the read sums the deltas
    // and reads stale buckets' times from the rows itself.
    db.with_fold_held(|| {
        db.sql(&["DELETE FROM dead_letters WHERE id = 'bulk-3'"]);
        answers_as_a_scan(&db, "while another fold holds the lock");
    });
    assert_eq!(db.dlq(&["aggregate", "--by", "reason"]).code, 0);
    assert_eq!(
        db.scalar("SELECT count(*) FROM dead_letter_rollup_delta"),
        0,
        "the next aggregate folded the deltas left"
    );

    db.sql(&["TRUNCATE dead_letters", BULK]);
    answers_as_a_scan(&db, "after truncate");

    // The counts are what answers (a scan would not see this).
    db.sql(&["UPDATE dead_letter_rollup SET n = n + 1000 WHERE state = 'open'"]);
    let counted = db.dlq(&["aggregate", "--by", "reason"]).json();
    let scanned = db
        .dlq(&["aggregate", "--by", "reason", SCAN[0], SCAN[1]])
        .json();
    assert_ne!(counted, scanned);
}

#[test]
fn concurrent_writers_and_folds_lose_no_count() {
    let db = TestDb::migrated(Backend::Postgres);
    let url = db.url.clone();
    rt().block_on(async move {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(10)
            .connect(&url)
            .await
            .unwrap();
        let writers = (0..8).map(|w| {
            let pool = pool.clone();
            tokio::spawn(async move {
                for i in 0..150 {
                    sqlx::query(
                        "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, producer) \
                         VALUES ($1, 'b', 'poison_message', 1, '{}', $2)",
                    )
                    .bind(format!("w{w}-{i}"))
                    .bind(format!("svc-{}", i % 3))
                    .execute(&pool)
                    .await
                    .unwrap();
                    // Far more often than the trigger's one in 2,000.
                    if i % 10 == w {
                        sqlx::query("SELECT dlq_rollup_fold()").execute(&pool).await.unwrap();
                    }
                }
            })
        });
        for w in writers.collect::<Vec<_>>() {
            w.await.unwrap();
        }
        pool.close().await;
    });
    assert_eq!(db.scalar("SELECT count(*) FROM dead_letters"), 1200);
    answers_as_a_scan(&db, "after concurrent writers and folds");
    let total: i64 = db
        .dlq(&["aggregate", "--by", "producer"])
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["count"].as_i64().unwrap())
        .sum();
    assert_eq!(total, 1200);
}

/// Runs `statements` on one connection of `url` (a worker's session), returning the
/// first error.
pub(super) fn session(url: &str, statements: &[&str]) -> Result<(), String> {
    let url = url.to_string();
    let statements: Vec<String> = statements.iter().map(|s| s.to_string()).collect();
    rt().block_on(async move {
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
        for s in &statements {
            if let Err(e) = sqlx::query(s).execute(&mut conn).await {
                return Err(format!("{s}: {e}"));
            }
        }
        conn.close().await.unwrap();
        Ok(())
    })
}

/// [`session`] on a thread of its own (a worker beside the test).
pub(super) fn in_background(
    url: &str,
    statements: &[&str],
) -> std::thread::JoinHandle<Result<(), String>> {
    let url = url.to_string();
    let statements: Vec<String> = statements.iter().map(|s| s.to_string()).collect();
    std::thread::spawn(move || {
        session(
            &url,
            &statements.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
        )
    })
}

/// `setseed` makes the next `random()` 0.0001: the insert trigger's one-in-2,000 fold
/// runs inside the worker's statement.
pub(super) const FOLD_IN_THE_INSERT: &str = "SELECT setseed(0.002085)";

#[test]
fn a_key_too_long_for_an_index_is_counted_and_never_fails_an_insert() {
    // It once failed every fold (the counts' unique key indexed the key texts), so every
    // aggregate, and one worker insert in a thousand.
    let db = TestDb::migrated(Backend::Postgres);
    // Hex digits: an index entry compresses a repeated text below its limit, not these.
    let long: String = (0..400u64)
        .map(|i| format!("{:08x}", i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32))
        .collect();
    let insert = |id: &str| {
        format!(
            "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, error) \
             VALUES ('{id}', 'b', 'poison_message', 1, '{{}}', '{long}: boom')"
        )
    };
    db.sql(&[&insert("long-1")]);
    session(&db.url, &[FOLD_IN_THE_INSERT, &insert("long-2")]).expect("the worker's insert");
    answers_as_a_scan(&db, "with an error class of 3,200 bytes");
}

#[test]
fn a_repeatable_read_worker_never_fails_because_of_the_counts() {
    // A fold inside a REPEATABLE READ worker's insert, after another fold had committed,
    // once failed the insert (could not serialize access due to concurrent delete).
    let db = TestDb::migrated(Backend::Postgres);
    db.sql(&[BULK]);
    let worker = in_background(
        &db.url,
        &[
            "BEGIN ISOLATION LEVEL REPEATABLE READ",
            "SELECT count(*) FROM dead_letters",
            "SELECT pg_sleep(1)",
            FOLD_IN_THE_INSERT,
            "INSERT INTO dead_letters (id, body, reason, attempts, headers_json) \
                 VALUES ('rr-1', 'b', 'poison_message', 1, '{}')",
            "COMMIT",
        ],
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    db.sql(&["SELECT dlq_rollup_fold()"]);
    worker.join().unwrap().expect("the worker's insert");
    answers_as_a_scan(&db, "after a repeatable-read worker's insert");
}

#[test]
fn a_time_at_infinity_is_a_clear_error_not_a_crash() {
    // sqlx panicked decoding PostgreSQL's 'infinity' (exit 101, "internal error"), in
    // every read of such a row; the kept counts' buckets at infinity were empty ranges.
    let db = TestDb::migrated(Backend::Postgres);
    db.sql(&[
        "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, dead_lettered_at) \
         VALUES ('inf-1', 'b', 'poison_message', 1, '{}', 'infinity')",
    ]);
    for args in [
        &["aggregate", "--by", "reason"][..],
        &["aggregate", "--by", "reason", SCAN[0], SCAN[1]],
        &["list"],
    ] {
        let r = db.dlq(args);
        assert_ne!(r.code, 0, "{args:?}");
        assert_ne!(r.code, 101, "{args:?}: {}", r.stderr);
        assert!(r.stderr.contains("infinity"), "{args:?}: {}", r.stderr);
        assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
    }
}

#[test]
fn counts_turned_off_are_not_read_and_turned_on_are_counted_anew() {
    // The owner's switch for the counts' cost on every write (docs/performance.md).
    let db = TestDb::migrated(Backend::Postgres);
    db.import_examples();
    let deltas = "SELECT count(*) FROM dead_letter_rollup_delta";
    let index = "SELECT count(*) FROM pg_indexes WHERE indexname = 'dead_letters_written_xid_idx'";
    db.sql(&["SELECT dlq_rollup_disable()"]);
    // Off, writers pay nothing for the counts: not even the index of each row's writer.
    assert_eq!(db.scalar(index), 0);
    let before = db.scalar(deltas);
    db.sql(&[BULK, "DELETE FROM dead_letters WHERE id = 'bulk-1'"]);
    assert_eq!(db.scalar(deltas), before, "nothing is kept while off");
    // Nor swept: a fold of counts nobody reads read every row (no index of writers).
    let swept = "SELECT pg_snapshot_xmax(snap)::text::bigint FROM dead_letter_rollup_swept";
    let at = db.scalar(swept);
    db.sql(&["SELECT dlq_rollup_fold()"]);
    assert_eq!(db.scalar(swept), at);
    answers_as_a_scan(&db, "with the counts off");
    db.sql(&[
        "SELECT dlq_rollup_enable()",
        "DELETE FROM dead_letters WHERE id = 'bulk-2'",
    ]);
    answers_as_a_scan(&db, "with the counts on again");
    assert_eq!(db.scalar(index), 1);
    db.sql(&["UPDATE dead_letter_rollup SET n = n + 1000 WHERE state = 'open'"]);
    let counted = db.dlq(&["aggregate", "--by", "reason"]).json();
    let scanned = db
        .dlq(&["aggregate", "--by", "reason", SCAN[0], SCAN[1]])
        .json();
    assert_ne!(counted, scanned, "the counts answer once on again");
}

#[test]
fn a_writer_with_a_statement_timeout_never_fails_on_a_backlog_of_deltas() {
    // The insert trigger's fold took the whole backlog: a writer's statement timeout
    // (which `WHEN others` cannot catch) failed one insert in a thousand for good.
    let db = TestDb::migrated(Backend::Postgres);
    db.sql(&[
        "INSERT INTO dead_letter_rollup_delta (reason, hour, state, n, first_seen, last_seen) \
         SELECT 'poison_message', TIMESTAMPTZ '2026-11-01T00:00:00Z' + g * interval '1 hour', \
                'open', 0, NULL, NULL FROM generate_series(1, 200000) g",
    ]);
    session(
        &db.url,
        &[
            "SET statement_timeout = '300ms'",
            FOLD_IN_THE_INSERT,
            "INSERT INTO dead_letters (id, body, reason, attempts, headers_json) \
             VALUES ('t-1', 'b', 'poison_message', 1, '{}')",
        ],
    )
    .expect("the worker's insert");
    assert!(db.scalar("SELECT count(*) FROM dead_letter_rollup_delta") < 200_001);
    answers_as_a_scan(&db, "after a bounded fold in a writer");
}

#[test]
fn counts_that_missed_writes_are_never_read_however_the_triggers_come_back() {
    // Triggers enabled again by hand (pg_restore --disable-triggers does so) once made
    // counts that missed every write while off look kept.
    let db = TestDb::migrated(Backend::Postgres);
    db.import_examples();
    db.sql(&[
        "SELECT dlq_rollup_disable()",
        BULK,
        "DELETE FROM dead_letters WHERE id = 'bulk-2'",
        "ALTER TABLE dead_letters ENABLE TRIGGER ALL",
    ]);
    answers_as_a_scan(&db, "with the triggers enabled by hand");
    db.sql(&["SELECT dlq_rollup_enable()"]);
    db.sql(&["UPDATE dead_letter_rollup SET n = n + 1000 WHERE state = 'open'"]);
    let counted = db.dlq(&["aggregate", "--by", "reason"]).json();
    let scanned = db
        .dlq(&["aggregate", "--by", "reason", SCAN[0], SCAN[1]])
        .json();
    assert_ne!(
        counted, scanned,
        "read again once dlq_rollup_enable() counted anew"
    );
}

#[test]
fn a_truncate_in_a_repeatable_read_transaction_leaves_no_ghost_counts() {
    // Its DELETE of the counts saw only its old snapshot: a row committed while it waited
    // for the lock was truncated but stayed counted.
    let db = TestDb::migrated(Backend::Postgres);
    let truncater = in_background(
        &db.url,
        &[
            "BEGIN ISOLATION LEVEL REPEATABLE READ",
            "SELECT count(*) FROM dead_letters",
            "SELECT pg_sleep(1)",
            "TRUNCATE dead_letters",
            "COMMIT",
        ],
    );
    std::thread::sleep(std::time::Duration::from_millis(300));
    db.sql(&[
        "INSERT INTO dead_letters (id, body, reason, attempts, headers_json) \
         VALUES ('ghost', 'b', 'poison_message', 1, '{}')",
    ]);
    truncater.join().unwrap().expect("the truncate");
    assert_eq!(db.scalar("SELECT count(*) FROM dead_letters"), 0);
    answers_as_a_scan(&db, "after a repeatable-read truncate");
    let groups = db.dlq(&["aggregate", "--by", "reason"]).json();
    assert_eq!(groups, serde_json::json!([]));
}

#[test]
fn a_fold_after_a_delete_reads_the_times_again_at_once() {
    // The stale test ran in a snapshot from before the compaction, so the times were
    // read again only one fold later.
    let db = TestDb::migrated(Backend::Postgres);
    db.sql(&[
        BULK,
        "SELECT dlq_rollup_fold()",
        "DELETE FROM dead_letters WHERE id = 'bulk-1'",
    ]);
    db.sql(&["SELECT dlq_rollup_fold()"]);
    assert_eq!(
        db.scalar("SELECT count(*) FROM dead_letter_rollup WHERE stale"),
        0
    );
}

/// Windows over BULK's rows (20:07 to 00:40): on and off the hour, open at either end,
/// inside one hour (read from the rows), and past every row.
const WINDOWS: [&[&str]; 8] = [
    &["--since", "2026-11-28T21:00:00Z"],
    &["--since", "2026-11-28T21:30:00Z"],
    &[
        "--since",
        "2026-11-28T21:30:00Z",
        "--until",
        "2026-11-28T23:15:00Z",
    ],
    &[
        "--since",
        "2026-11-28T21:30:00Z",
        "--until",
        "2026-11-28T23:00:00Z",
    ],
    &["--until", "2026-11-28T22:20:00.5Z"],
    &[
        "--since",
        "2026-11-28T21:10:00Z",
        "--until",
        "2026-11-28T21:50:00Z",
    ],
    &[
        "--since",
        "2026-11-28T22:59:59.999999Z",
        "--until",
        "2026-11-29T00:00:00.000001Z",
    ],
    &["--since", "2030-01-01T00:00:00Z"],
];

/// Every window answers as the scan of the same window.
fn windows_answer_as_a_scan(db: &TestDb, step: &str) {
    for by in [
        "reason,producer,schema_version",
        "hour",
        "day,source_queue,error_class",
    ] {
        for window in WINDOWS {
            for filter in [&[][..], &["--reason", "poison_message"][..]] {
                let mut kept = vec!["aggregate", "--by", by];
                kept.extend(window);
                kept.extend(filter);
                let counted = db.dlq(&kept);
                assert_eq!(counted.code, 0, "{step}: {}", counted.all());
                kept.extend(SCAN);
                assert_eq!(
                    counted.json(),
                    db.dlq(&kept).json(),
                    "{step}: aggregate --by {by} {window:?} {filter:?}"
                );
            }
        }
    }
}

#[test]
fn a_time_window_answers_as_a_scan_of_its_rows() {
    let db = TestDb::migrated(Backend::Postgres);
    db.sql(&[BULK]);
    windows_answer_as_a_scan(&db, "after a bulk insert, nothing folded");
    assert_eq!(db.dlq(&["aggregate", "--by", "reason"]).code, 0);
    // Live leases in a whole hour (21:24) and in a part-hour (21:31); a lapsed one.
    for (id, lease) in [("bulk-12", "5m"), ("bulk-13", "5m"), ("bulk-5", "1s")] {
        let r = db.dlq(&["claim", id, "--lease", lease]);
        assert_eq!(r.code, 0, "{}", r.all());
    }
    std::thread::sleep(std::time::Duration::from_millis(1100));
    // Rows leaving their hour or their bucket, and one settled.
    db.sql(&[
        "DELETE FROM dead_letters WHERE id = 'bulk-17'",
        "UPDATE dead_letters SET dead_lettered_at = dead_lettered_at + interval '50 minutes' \
         WHERE id = 'bulk-9'",
        "UPDATE dead_letters SET producer = 'moved' WHERE id = 'bulk-20'",
        "UPDATE dead_letters SET replay_attempt_at = now(), replayed_at = now() \
         WHERE id = 'bulk-22'",
    ]);
    windows_answer_as_a_scan(&db, "after claims, deletes, moves and a mark");
}

#[test]
fn a_time_window_reads_the_counts_for_its_whole_hours_only() {
    let db = TestDb::migrated(Backend::Postgres);
    db.sql(&[BULK, "SELECT dlq_rollup_fold()"]);
    // Counts that disagree with the rows tell which answered.
    db.sql(&["UPDATE dead_letter_rollup SET n = n + 1000 WHERE state = 'open'"]);
    let total = |window: &[&str]| {
        let mut args = vec!["aggregate", "--by", "reason"];
        args.extend(window);
        let groups = db.dlq(&args).json();
        let groups = groups.as_array().expect("groups").clone();
        groups
            .iter()
            .map(|g| g["count"].as_i64().unwrap())
            .sum::<i64>()
    };
    // What aggregate counts in [since, until), and the rows there.
    let window = |since: &str, until: &str| {
        let counted = total(&["--since", since, "--until", until]);
        let rows = db.scalar(&format!(
            "SELECT count(*) FROM dead_letters WHERE dead_lettered_at >= '{since}' \
             AND dead_lettered_at < '{until}'"
        ));
        (counted, rows)
    };
    // 21:30 to 23:15: the hour from 22:00 from the counts (a bucket per reason and key
    // combination), the rest from the rows.
    let (mixed, rows) = window("2026-11-28T21:30:00Z", "2026-11-28T23:15:00Z");
    assert!(mixed > rows + 1000, "{mixed} of {rows} rows");
    let whole_hour_buckets = db.scalar(
        "SELECT count(*) FROM dead_letter_rollup WHERE state = 'open' \
         AND hour >= '2026-11-28T22:00:00Z' AND hour < '2026-11-28T23:00:00Z'",
    );
    assert_eq!(mixed, rows + 1000 * whole_hour_buckets);
    // Inside one hour: the rows alone.
    let (inside, rows) = window("2026-11-28T21:10:00Z", "2026-11-28T21:50:00Z");
    assert_eq!(inside, rows);
}
