//! `metrics` and `check` on PostgreSQL from the per-group counts the store keeps (the
//! ones `aggregate` reads), not from a pass over every row: whatever wrote the rows, and
//! whenever the counts were last folded, the gauges are exactly the scan's. A `--state`
//! of every state makes dlq scan, so both answers come from the same code.

use super::{metrics, parse, value};
use crate::common::*;
use chrono::{DateTime, TimeZone, Utc};
use dlq::model::{Filter, State};
use dlq::store::alerting::{Gauges, PairCounts};

/// 120 rows, 2 minutes apart from 20:02, in one statement: two reasons (`g` even:
/// poison_message), producers billing (`g % 3 = 1`), ledger and none (`g % 3 = 0`), and
/// a few other schema versions, queues and errors: most rows of a pair in an hour share
/// a bucket, some have one of their own.
const BULK: &str = "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, producer, \
     schema_version, source_queue, error, dead_lettered_at) \
     SELECT 'g-' || g, convert_to('{}', 'UTF8'), \
            (ARRAY['poison_message','permanent_failure'])[1 + g % 2], 1, '{}', \
            CASE g % 3 WHEN 0 THEN NULL WHEN 1 THEN 'billing' ELSE 'ledger' END, \
            CASE WHEN g % 10 = 5 THEN NULL ELSE '3' END, \
            CASE WHEN g % 11 = 0 THEN NULL ELSE 'orders' END, \
            CASE WHEN g % 13 < 2 THEN 'ValueError: x' END, \
            TIMESTAMPTZ '2026-11-28T20:00:00Z' + g * interval '2 minutes' \
     FROM generate_series(1, 120) g";

/// When BULK's row `g` was dead-lettered.
fn at(g: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 28, 20, 0, 0).unwrap() + chrono::Duration::minutes(2 * g)
}

fn gauges(url: &str, filter: &Filter) -> Gauges {
    let url = dlq::secret::SecretUrl::new(url.to_string());
    rt().block_on(async {
        let opts = dlq::store::StoreOptions::default();
        let store = dlq::store::open(&url, &opts).await.unwrap();
        let g = store.gauges(filter).await.unwrap();
        store.close().await;
        g
    })
}

/// The same filter, answered by a scan (the counts answer no state filter).
fn scan_of(filter: &Filter) -> Filter {
    Filter {
        states: State::ALL.to_vec(),
        ..filter.clone()
    }
}

/// Whole table, a pair, the pair with no producer, whole hours, and a window with a
/// part of an hour at either end.
fn filters() -> Vec<Filter> {
    let t = |s: &str| Some(s.parse::<DateTime<Utc>>().unwrap());
    vec![
        Filter::default(),
        Filter {
            reason: Some("poison_message".into()),
            producer: Some("billing".into()),
            ..Filter::default()
        },
        Filter {
            producer: Some(dlq::model::UNKNOWN.into()),
            ..Filter::default()
        },
        Filter {
            since: t("2026-11-28T22:00:00Z"),
            ..Filter::default()
        },
        Filter {
            since: t("2026-11-28T20:30:00Z"),
            until: t("2026-11-28T23:15:00Z"),
            ..Filter::default()
        },
    ]
}

/// Every filter's gauges, as `url`'s role reads them, are the scan's (read as the owner).
fn answers_as_a_scan_as(db: &TestDb, url: &str, step: &str) {
    for f in filters() {
        let kept = gauges(url, &f).pairs;
        let scanned = gauges(&db.url, &scan_of(&f)).pairs;
        assert_eq!(kept, scanned, "{step}: {f:?}");
    }
}

fn answers_as_a_scan(db: &TestDb, step: &str) {
    answers_as_a_scan_as(db, &db.url, step);
}

fn pair<'a>(g: &'a Gauges, reason: &str, producer: Option<&str>) -> &'a PairCounts {
    g.pairs
        .iter()
        .find(|p| p.reason == reason && p.producer.as_deref() == producer)
        .unwrap_or_else(|| panic!("no pair {reason}/{producer:?} in {:?}", g.pairs))
}

fn ok(r: Run) {
    assert_eq!(r.code, 0, "{}", r.all());
}

#[test]
fn metrics_and_check_answer_from_the_kept_counts() {
    // A scrape read every row (6.7 s at 10,000,000): longer than many scrape timeouts,
    // in a flood, when the alert matters.
    let db = TestDb::migrated(Backend::Postgres);
    db.sql(&[BULK, "SELECT dlq_rollup_fold()"]);
    let billing = "reason = 'poison_message' AND eff_producer = 'billing'";
    let rows = db.scalar(&format!(
        "SELECT count(*) FROM dead_letters WHERE {billing}"
    ));
    let buckets = db.scalar(&format!(
        "SELECT count(*) FROM dead_letter_rollup WHERE state = 'open' AND {billing}"
    ));
    let all_buckets = db.scalar("SELECT count(*) FROM dead_letter_rollup WHERE state = 'open'");
    let all_rows = db.scalar("SELECT count(*) FROM dead_letters");
    // Counts that disagree with the rows tell which answered.
    db.sql(&["UPDATE dead_letter_rollup SET n = n + 1000 WHERE state = 'open'"]);
    let pending = |args: &[&str]| {
        let s = parse(&metrics(&db, args));
        let labels = [
            ("state", "pending"),
            ("reason", "poison_message"),
            ("producer", "billing"),
        ];
        value(&s, "dlq_dead_letters", &labels) as i64
    };
    assert_eq!(pending(&[]), rows + 1000 * buckets);
    let scan = ["--state", "pending,claimed,uncertain,replayed,discarded"];
    assert_eq!(pending(&scan), rows);
    let r = db.dlq(&["check", "--max-pending", "0"]);
    assert_eq!(r.code, 7, "{}", r.all());
    assert_eq!(r.json()["pending"], all_rows + 1000 * all_buckets);
}

#[test]
fn gauges_from_the_kept_counts_are_the_scans_after_every_kind_of_write() {
    let db = TestDb::migrated(Backend::Postgres);
    db.sql(&[BULK]);
    db.insert_one_by_one(3);
    answers_as_a_scan(&db, "after bulk and single-row inserts, nothing folded");

    claim_the_oldest_rows(&db);
    settle_some_rows(&db);

    // Rows leaving their bucket or hour: the counts' times are stale until a fold.
    ok(db.dlq(&[
        "prune",
        "--older-than",
        "1ms",
        "--state",
        "replayed,discarded",
        "--yes",
    ]));
    db.sql(&[
        "UPDATE dead_letters SET dead_lettered_at = dead_lettered_at + interval '3 hours' \
         WHERE id = 'g-3'",
        "UPDATE dead_letters SET dead_lettered_at = dead_lettered_at - interval '5 hours' \
         WHERE id = 'g-15'",
        "UPDATE dead_letters SET producer = NULL WHERE id = 'g-34'",
        "DELETE FROM dead_letters WHERE id = 'g-21'",
    ]);
    answers_as_a_scan(&db, "after prune, deletes and moves");
    let g = gauges(&db.url, &Filter::default());
    let unnamed = pair(&g, "permanent_failure", None);
    assert_eq!(
        unnamed.oldest_pending,
        Some(at(15) - chrono::Duration::hours(5))
    );

    // A fold under way elsewhere: the read sums the deltas itself.
    db.with_fold_held(|| {
        db.sql(&["DELETE FROM dead_letters WHERE id = 'g-27'"]);
        answers_as_a_scan(&db, "while another fold holds the lock");
    });

    db.sql(&["TRUNCATE dead_letters", BULK]);
    answers_as_a_scan(&db, "after truncate");
}

/// Leases live and lapsed on the oldest rows of three pairs, compared with the scan.
fn claim_the_oldest_rows(db: &TestDb) {
    // The oldest pending row of poison_message/billing (g-4) claimed, live: the oldest
    // pending is the next one (g-10, in the same bucket, whose first time is still
    // g-4's). Every row of poison_message/ledger in its first hour claimed, live, as
    // another tool would: its oldest pending row is in the next hour (g-32); so is g-19,
    // before g-25 (permanent_failure/billing) in the window's first part-hour. The oldest
    // of permanent_failure with no producer (g-3) claimed, lapsed: still the oldest.
    ok(db.dlq(&["claim", "g-4", "--lease", "5m"]));
    db.sql(&["UPDATE dead_letters SET replay_claim_owner = 'tool:t1', \
         replay_claim_expires_at = now() + interval '5 minutes' \
         WHERE id IN ('g-2', 'g-8', 'g-14', 'g-20', 'g-26', 'g-19')"]);
    ok(db.dlq(&["claim", "g-3", "--lease", "1s"]));
    std::thread::sleep(std::time::Duration::from_millis(1500));
    answers_as_a_scan(db, "with live and lapsed leases");
    let g = gauges(&db.url, &Filter::default());
    let billing = pair(&g, "poison_message", Some("billing"));
    assert_eq!(billing.count(State::Claimed), 1);
    assert_eq!(
        billing.oldest_pending,
        Some(at(10)),
        "g-10 after the claimed g-4"
    );
    let ledger = pair(&g, "poison_message", Some("ledger"));
    assert_eq!(
        ledger.oldest_pending,
        Some(at(32)),
        "its first hour all claimed"
    );
    let unnamed = pair(&g, "permanent_failure", None);
    assert_eq!(
        unnamed.oldest_pending,
        Some(at(3)),
        "a lapsed lease is pending"
    );
}

/// Settled and uncertain rows, written by dlq and as another tool would; folded first.
fn settle_some_rows(db: &TestDb) {
    ok(db.dlq(&["aggregate", "--by", "reason"]));
    ok(db.dlq(&["discard", "g-10", "--note", "bad", "--yes"]));
    ok(db.dlq(&["discard", "g-16", "--note", "bad", "--yes"]));
    ok(db.dlq(&["restore", "g-16", "--note", "back", "--yes"]));
    db.sql(&[
        "UPDATE dead_letters SET replay_attempt_at = now() WHERE id = 'g-22'",
        "UPDATE dead_letters SET replay_attempt_at = now(), replayed_at = now() \
         WHERE id IN ('g-28', 'g-9')",
    ]);
    answers_as_a_scan(db, "after discard, restore, attempt and mark");
    let g = gauges(&db.url, &scan_of(&Filter::default()));
    for st in State::ALL {
        assert!(g.total(st) > 0, "no {st:?} row to compare");
    }
    assert_eq!(
        pair(&g, "poison_message", Some("billing")).oldest_pending,
        Some(at(16)),
        "g-16 restored; g-10 discarded"
    );
}

#[test]
fn a_role_that_may_not_read_the_kept_counts_gets_the_gauges_of_the_rows() {
    let db = TestDb::migrated(Backend::Postgres);
    db.sql(&[BULK]);
    ok(db.dlq(&["claim", "g-4", "--lease", "5m"]));
    ok(db.dlq(&["aggregate", "--by", "reason"]));
    db.sql(&["DELETE FROM dead_letters WHERE id = 'g-2'"]);
    // A reader that may read every table but not fold, and one that may read the rows
    // only (as `dlq metrics` needed before the counts).
    let (readers, rows_only) = (unique("dlq_ro"), unique("dlq_rows"));
    db.sql(&[
        &format!("CREATE ROLE {readers} LOGIN"),
        &format!("GRANT SELECT ON ALL TABLES IN SCHEMA public TO {readers}"),
        &format!("CREATE ROLE {rows_only} LOGIN"),
        &format!("GRANT SELECT ON dead_letters, dead_letter_history TO {rows_only}"),
    ]);
    let url_of = |role: &str| db.url.replace("postgres@", &format!("{role}@"));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        answers_as_a_scan_as(&db, &url_of(&readers), "a reader, deltas unfolded");
        assert!(db.scalar("SELECT count(*) FROM dead_letter_rollup_delta") > 0);
        answers_as_a_scan_as(&db, &url_of(&rows_only), "a reader of the rows only");
        // Counts that disagree with the rows: the first reads them, the second never.
        db.sql(&["UPDATE dead_letter_rollup SET n = n + 1000 WHERE state = 'open'"]);
        let scanned = gauges(&db.url, &scan_of(&Filter::default())).pairs;
        assert_ne!(gauges(&url_of(&readers), &Filter::default()).pairs, scanned);
        answers_as_a_scan_as(&db, &url_of(&rows_only), "the counts wrong");
    }));
    for role in [&readers, &rows_only] {
        db.sql(&[
            &format!("DROP OWNED BY {role}"),
            &format!("DROP ROLE {role}"),
        ]);
    }
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

/// A read-only database (a standby) cannot fold: each scrape reads the counts unfolded,
/// quietly. Once broke: every scrape logged a warning that the fold failed.
#[test]
fn a_read_only_database_reads_the_counts_unfolded_without_a_warning() {
    let db = TestDb::migrated(Backend::Postgres);
    db.sql(&[BULK]);
    let name = db.url.rsplit('/').next().unwrap().to_string();
    db.sql(&[&format!(
        "ALTER DATABASE {name} SET default_transaction_read_only = on"
    )]);
    answers_as_a_scan(&db, "read only");
    let r = db.dlq(&["metrics"]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert!(!r.stderr.contains("fold"), "{}", r.stderr);
}
