//! The upgrade of a v1 database to protocol v2: in place, and what v1 tokens and v1
//! binaries can no longer do to a row that may have been published.

use crate::common::*;

#[test]
fn migrate_upgrades_a_v1_database_in_place() {
    for b in BACKENDS {
        let db = TestDb::new(b);
        // The v1 schema: the migrations that shipped before protocol v2.
        let dir = tempfile::tempdir().unwrap();
        let sub = match b {
            Backend::Postgres => "postgres",
            Backend::Sqlite => "sqlite",
        };
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("migrations")
            .join(sub);
        for f in std::fs::read_dir(&src).unwrap() {
            let f = f.unwrap();
            if f.file_name().to_string_lossy().starts_with("20261129") {
                std::fs::copy(f.path(), dir.path().join(f.file_name())).unwrap();
            }
        }
        let (past, future) = match b {
            Backend::Postgres => ("now() - interval '1 hour'", "now() + interval '1 hour'"),
            Backend::Sqlite => ("1000", "99999999999999"),
        };
        rt().block_on(async {
            let m = sqlx::migrate::Migrator::new(dir.path()).await.unwrap();
            match b {
                Backend::Postgres => {
                    let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
                    m.run(&pool).await.unwrap();
                    pool.close().await;
                }
                Backend::Sqlite => {
                    let pool = sqlx::SqlitePool::connect(&format!("{}?mode=rwc", db.url))
                        .await
                        .unwrap();
                    m.run(&pool).await.unwrap();
                    pool.close().await;
                }
            }
        });
        let body = match b {
            Backend::Postgres => "'\\x7b7d'::bytea",
            Backend::Sqlite => "X'7b7d'",
        };
        let ins = |id: &str, rest: &str| {
            format!("INSERT INTO dead_letters (id, body, reason, attempts, headers_json, replayed_at, replay_claim_owner, replay_claim_expires_at) VALUES ('{id}', {body}, 'retries_exhausted', 3, '{{}}', {rest})")
        };
        db.sql(&[
            &ins("v-pending", "NULL, NULL, NULL"),
            &ins("v-replayed", &format!("{past}, 'alice:aaaa', NULL")),
            &ins("v-in-flight", &format!("NULL, 'bob:bbbb', {future}")),
            &ins("v-lapsed", &format!("NULL, 'carol:cccc', {past}")),
            &ins("v-no-owner", &format!("NULL, NULL, {future}")),
        ]);
        let r = db.dlq(&["migrate"]);
        assert_eq!(r.code, 0, "{b:?}: {}", r.all());
        assert!(r.all().contains("protocol v2"), "{}", r.all());
        let state = |id: &str| db.show(id)["state"].as_str().unwrap().to_string();
        assert_eq!(state("v-pending"), "pending");
        assert_eq!(state("v-replayed"), "replayed");
        assert_eq!(
            state("v-in-flight"),
            "uncertain",
            "a v1 run may have sent it"
        );
        assert_eq!(state("v-lapsed"), "uncertain", "a v1 run may have sent it");
        assert!(db.show("v-lapsed")["last_replay_error"]
            .as_str()
            .unwrap()
            .contains("upgraded from protocol v1"));
        // Once broke: the live v1 claim (a lease until 2099 here: one hour) got the lease
        // end as its attempt time, and resolve refused it until then, though nobody holds
        // its token. Its attempt time is the upgrade's now, and it is resolvable at once.
        let s = db.show("v-in-flight");
        assert_eq!(s["settling"], "v1_claim", "{b:?}: {s}");
        assert_eq!(s["settling_until"], serde_json::Value::Null);
        let attempt =
            chrono::DateTime::parse_from_rfc3339(s["replay_attempt_at"].as_str().unwrap()).unwrap();
        let lease =
            chrono::DateTime::parse_from_rfc3339(s["replay_claim_expires_at"].as_str().unwrap())
                .unwrap();
        assert!(attempt < lease, "{b:?}: no invented attempt time: {s}");
        assert!(
            s["history"]
                .to_string()
                .contains("claimed by a tool older than this schema"),
            "{b:?}: {s}"
        );
        let table = db.dlq(&["-o", "table", "show", "v-in-flight"]).stdout;
        assert!(table.contains("tool older than this schema"), "{table}");
        assert!(table.contains("unknown, before"), "{table}");
        let r = db.dlq(&["replay", "v-in-flight", "--yes", "--routing-key", "nowhere"]);
        assert_eq!(r.code, 6, "{b:?}: a replay reports the doubt: {}", r.all());
        let r = db.dlq(&[
            "resolve",
            "v-in-flight",
            "--not-delivered",
            "--note",
            "checked",
        ]);
        assert_eq!(r.code, 0, "{b:?}: resolvable at once: {}", r.all());
        assert_eq!(state("v-in-flight"), "pending");
        // A worker's expiry with no owner is no lease: not "claimed by unknown".
        assert_eq!(state("v-no-owner"), "pending", "{b:?}");
        let table = db.dlq(&["-o", "table", "show", "v-no-owner"]).stdout;
        assert!(!table.contains("unknown until"), "{table}");
        assert_eq!(db.ids(&["--limit", "10"]).len(), 5, "no row lost");
        // A Python worker keeps writing its nine columns.
        db.sql(&[&ins("w-new", "NULL, NULL, NULL")]);
        assert_eq!(state("w-new"), "pending");
        lapse_leases(&db);
        let r = db.dlq(&["migrate"]);
        assert_eq!(r.code, 0, "again: {}", r.all());
    }
}

/// A PostgreSQL database at the v1 schema (the migrations before protocol v2).
fn v1_postgres() -> TestDb {
    let db = TestDb::new(Backend::Postgres);
    let dir = tempfile::tempdir().unwrap();
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations/postgres");
    for f in std::fs::read_dir(&src).unwrap() {
        let f = f.unwrap();
        if f.file_name().to_string_lossy().starts_with("20261129") {
            std::fs::copy(f.path(), dir.path().join(f.file_name())).unwrap();
        }
    }
    rt().block_on(async {
        let m = sqlx::migrate::Migrator::new(dir.path()).await.unwrap();
        let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
        m.run(&pool).await.unwrap();
        pool.close().await;
    });
    db
}

fn v1_row(db: &TestDb, id: &str, queue: &str, owner: &str, expires: &str) {
    db.sql(&[&format!(
        "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, replayed_at, \
         replay_claim_owner, replay_claim_expires_at, source_queue) \
         VALUES ('{id}', '\\x7b7d'::bytea, 'retries_exhausted', 3, '{{}}', NULL, '{owner}', {expires}, '{queue}')"
    )]);
}

/// Once broke (review of protocol v2): the v1 token released an upgraded uncertain row.
/// A v1 row whose claim was held at upgrade time becomes `uncertain` (a v1
/// run may have published it). The v1 token (v1 printed it in `claim`, in `list -o json`
/// and in history) still owns the row, and `release` accepts any row with an open
/// attempt, lease or no lease: the uncertain row goes back to `pending`, and the next
/// replay publishes it again. Contract: "uncertain ... stays uncertain, whatever its
/// lease does, until an operator resolves it"; "a stale token can neither mark nor
/// release".
#[test]
fn a_v1_token_cannot_release_an_upgraded_uncertain_row() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("rv_v1_rel");
    let db = v1_postgres();
    v1_row(
        &db,
        "v-lapsed",
        &q,
        "carol:cccc",
        "now() - interval '1 hour'",
    );
    let r = db.dlq(&["migrate"]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(state(&db, "v-lapsed"), "uncertain");

    let r = db.dlq(&["release", "v-lapsed", "--token", "carol:cccc"]);
    let after = state(&db, "v-lapsed");
    // Show what a rerun then does (for the report), before asserting.
    let replay = db.dlq(&["replay", "v-lapsed", "--yes"]);
    let published = rabbit.drain(&q).len();
    assert!(
        r.code == 3 && after == "uncertain",
        "release with the v1 token: exit {} (want 3), state now {after:?} (want uncertain); \
         a following `replay` exited {} and published {published} message(s)\n{}",
        r.code,
        replay.code,
        r.all()
    );
}

/// Once broke (review of protocol v2): `replay --token` with the v1 token made an
/// upgraded row pending.
/// Same root cause through `replay --token`: `held()` does not exclude rows
/// with an attempt, the attempt step then refuses, and the "not attempted" path releases
/// the row with the v1 token: an upgraded (possibly published) row becomes `pending`.
#[test]
fn a_v1_token_replay_does_not_turn_an_upgraded_row_pending() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("rv_v1_tok");
    let db = v1_postgres();
    v1_row(&db, "v-live", &q, "bob:bbbb", "now() + interval '1 hour'");
    let r = db.dlq(&["migrate"]);
    assert_eq!(r.code, 0, "{}", r.all());
    let r = db.dlq(&["replay", "v-live", "--token", "bob:bbbb", "--yes"]);
    assert_eq!(rabbit.drain(&q).len(), 0);
    // Time passes: the v1 lease ends.
    db.sql(&["UPDATE dead_letters SET replay_claim_expires_at = now() - interval '1 second' WHERE replay_claim_expires_at IS NOT NULL"]);
    let after = state(&db, "v-live");
    assert_eq!(
        after,
        "uncertain",
        "replay --token <v1 token> exited {} and left the upgraded row {after:?}: {}",
        r.code,
        r.all()
    );
}

/// Once broke (review of protocol v2): a v1 binary claimed uncertain rows after the
/// upgrade, and published them again.
/// The migration does not fence v1 binaries. A v1 `dlq` (still installed on
/// an operator's laptop or in a cron job) claims with this exact statement (v1
/// src/store/postgres.rs, commit 14660fb), which knows nothing of replay_attempt_at or
/// discarded_at: it claims `uncertain` rows and then publishes them again.
#[test]
fn a_v1_binary_cannot_claim_uncertain_rows_after_the_upgrade() {
    let db = v1_postgres();
    v1_row(
        &db,
        "v-crashed",
        "q",
        "carol:cccc",
        "now() - interval '1 hour'",
    );
    let r = db.dlq(&["migrate"]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(state(&db, "v-crashed"), "uncertain");
    let claimed = rt().block_on(async {
        let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
        // v1's claim, minus its history CTE.
        let n = sqlx::query(
            "UPDATE dead_letters SET replay_claim_owner = $2, \
                 replay_claim_expires_at = now() + make_interval(secs => $3::float8 / 1000.0) \
             WHERE id = ANY($1) AND replayed_at IS NULL \
               AND (replay_claim_expires_at IS NULL OR replay_claim_expires_at <= now())",
        )
        .bind(vec!["v-crashed".to_string()])
        .bind("old-laptop:1111")
        .bind(300_000i64)
        .execute(&pool)
        .await;
        pool.close().await;
        n
    });
    // The database refuses: the v1 binary fails with an error instead of publishing.
    let err = claimed.expect_err(
        "a v1 binary claimed an uncertain row after `dlq migrate`; its replay would publish it again",
    );
    assert!(err.to_string().contains("uncertain or discarded"), "{err}");
    assert_eq!(state(&db, "v-crashed"), "uncertain");
}
