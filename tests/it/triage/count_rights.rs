//! Who may write and read the kept counts (issue 24): any role that may write the rows
//! keeps them right through the triggers, only the migrating role runs the folds, and a
//! reader without rights on the counts reads the rows instead. docs/security.md lists the
//! grants an operator's role needs to read the counts; the test here holds it to them.

use super::kept_counts::{answers_as_a_scan, session, BULK, SCAN};
use super::*;

#[test]
fn roles_without_rights_on_the_counts_write_and_read_as_before() {
    let db = TestDb::migrated(Backend::Postgres);
    db.import_examples();
    // A worker's role that may only insert; readers that may read every table, or only
    // the rows (as `dlq aggregate` needed before the counts).
    let (worker, readers, rows_only) = (unique("dlq_w"), unique("dlq_ro"), unique("dlq_rows"));
    db.sql(&[
        &format!("CREATE ROLE {worker} LOGIN"),
        &format!("GRANT INSERT ON dead_letters TO {worker}"),
        &format!("CREATE ROLE {readers} LOGIN"),
        &format!("GRANT SELECT ON ALL TABLES IN SCHEMA public TO {readers}"),
        &format!("CREATE ROLE {rows_only} LOGIN"),
        &format!("GRANT SELECT ON dead_letters, dead_letter_history TO {rows_only}"),
    ]);
    let url_of = |role: &str| db.url.replace("postgres@", &format!("{role}@"));
    let inserted = rt().block_on(async {
        let pool = sqlx::PgPool::connect(&url_of(&worker)).await.unwrap();
        let r = sqlx::query(&format!("{BULK} LIMIT 5")).execute(&pool).await;
        let one = sqlx::query(
            "INSERT INTO dead_letters (id, body, reason, attempts, headers_json) \
             VALUES ('by-worker', 'b', 'poison_message', 1, '{}')",
        )
        .execute(&pool)
        .await;
        pool.close().await;
        (r.map(|r| r.rows_affected()), one.map(|r| r.rows_affected()))
    });
    db.sql(&["DELETE FROM dead_letters WHERE id = 'bulk-3'"]);
    let scan = db.dlq(&["aggregate", "--by", "reason,producer", SCAN[0], SCAN[1]]);
    let as_role = |role: &str| {
        db.dlq_env(
            &["aggregate", "--by", "reason,producer"],
            &[("DLQ_DATABASE_URL", &url_of(role))],
        )
    };
    let (unfolded, scanned) = (as_role(&readers), as_role(&rows_only));
    let deltas = db.scalar("SELECT count(*) FROM dead_letter_rollup_delta");
    for role in [&worker, &readers, &rows_only] {
        db.sql(&[
            &format!("DROP OWNED BY {role}"),
            &format!("DROP ROLE {role}"),
        ]);
    }
    assert_eq!(inserted.0.expect("the worker's bulk insert"), 5);
    assert_eq!(inserted.1.expect("the worker's single-row insert"), 1);
    assert!(
        deltas > 0,
        "only the role that migrated folds; a reader sums the deltas"
    );
    for r in [unfolded, scanned] {
        assert_eq!(r.code, 0, "{}", r.all());
        assert_eq!(r.json(), scan.json());
    }
}

#[test]
fn an_operator_role_that_may_update_the_rows_writes_the_counts_through_the_trigger() {
    // A trigger function replaced by a later migration loses the settings it was given
    // after CREATE: without them it ran as the updating role, or searched pg_temp first.
    let db = TestDb::migrated(Backend::Postgres);
    db.sql(&[BULK]);
    let unfixed = db.scalar(
        "SELECT count(*) FROM pg_proc WHERE proname LIKE 'dlq_rollup_%' AND prosecdef \
         AND NOT COALESCE(array_to_string(proconfig, ' ') LIKE '%search_path=%pg_temp%', false)",
    );
    let public = db.scalar(
        "SELECT count(*) FROM pg_proc WHERE proname LIKE 'dlq_rollup_%' AND prosecdef \
         AND proname <> 'dlq_rollup_is_kept' AND has_function_privilege('public', oid, 'EXECUTE')",
    );
    let operator = unique("dlq_op");
    db.sql(&[
        &format!("CREATE ROLE {operator} LOGIN"),
        &format!("GRANT SELECT, UPDATE ON dead_letters TO {operator}"),
    ]);
    let url = db.url.replace("postgres@", &format!("{operator}@"));
    let moved = session(
        &url,
        &[
            "UPDATE dead_letters SET replay_claim_owner = 'op', \
             replay_claim_expires_at = now() + interval '1 minute' WHERE id LIKE 'bulk-1%'",
            "UPDATE dead_letters SET dead_lettered_at = dead_lettered_at - interval '3 hours' \
             WHERE id LIKE 'bulk-2%'",
        ],
    );
    db.sql(&[
        &format!("DROP OWNED BY {operator}"),
        &format!("DROP ROLE {operator}"),
    ]);
    assert_eq!(
        unfixed, 0,
        "every function that writes the counts fixes its search path"
    );
    assert_eq!(public, 0, "only the migrating role runs them");
    assert_eq!(moved, Ok(()));
    answers_as_a_scan(&db, "after an operator's claim and move");
}

#[test]
fn a_role_without_rights_cannot_change_the_counts_through_its_own_tables() {
    // The functions searched pg_temp first and anyone could run them: a temporary table
    // named like the deltas once set `uncertain` to -1000 in the real counts.
    let db = TestDb::migrated(Backend::Postgres);
    db.import_examples();
    let before = db.dlq(&["aggregate", "--by", "reason"]).json();
    let evil = unique("dlq_evil");
    db.sql(&[
        &format!("CREATE ROLE {evil} LOGIN"),
        &format!(
            "GRANT TEMPORARY ON DATABASE {} TO {evil}",
            db.url.rsplit('/').next().unwrap()
        ),
    ]);
    let url = db.url.replace("postgres@", &format!("{evil}@"));
    let forged = session(
        &url,
        &[
            "CREATE TEMP TABLE dead_letter_rollup_delta (reason text, eff_producer text, \
             eff_schema_version text, source_queue text, eff_error_class text, hour timestamptz, \
             state text, n bigint, first_seen timestamptz, last_seen timestamptz, stale boolean)",
            "INSERT INTO dead_letter_rollup_delta VALUES ('poison_message', NULL, NULL, NULL, \
             NULL, '2026-11-28T22:00:00Z', 'uncertain', -1000, NULL, NULL, false)",
            "SELECT dlq_rollup_compact()",
        ],
    );
    let after = db.dlq(&["aggregate", "--by", "reason"]).json();
    db.sql(&[
        &format!("DROP OWNED BY {evil}"),
        &format!("DROP ROLE {evil}"),
    ]);
    assert!(forged.is_err(), "only the role that migrated runs the fold");
    assert_eq!(after, before);
}

/// docs/security.md's PostgreSQL grants for the operator's role, given to `role`.
fn documented_grants(role: &str) -> Vec<String> {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/security.md")).unwrap();
    let block = doc
        .split("```sql\nCREATE ROLE dlq_operator LOGIN;\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("security.md's operator role");
    let sql: String = block
        .lines()
        .map(|l| l.split("--").next().unwrap())
        .collect::<Vec<_>>()
        .join("\n");
    let grants: Vec<String> = sql
        .split(';')
        .map(|s| s.trim().replace("dlq_operator", role))
        .filter(|s| !s.is_empty())
        .collect();
    assert!(grants.len() >= 5, "{grants:?}");
    grants
}

#[test]
fn the_documented_operator_grants_answer_from_the_counts_not_the_rows() {
    // Without rights on the counts' newer objects a role read every row: the same answer,
    // but a pass over millions in a flood, and nothing said so.
    let db = TestDb::migrated(Backend::Postgres);
    let n = 5000;
    db.sql(&[
        &BULK.replace(
            "generate_series(1, 40)",
            &format!("generate_series(1, {n})"),
        ),
        "SELECT dlq_rollup_fold()",
        &BULK.replace("'bulk-'", "'later-'"),
    ]);
    let role = unique("dlq_op");
    let mut setup = vec![format!("CREATE ROLE {role} LOGIN")];
    setup.extend(documented_grants(&role));
    db.sql(&setup.iter().map(String::as_str).collect::<Vec<_>>());
    let url = db.url.replace("postgres@", &format!("{role}@"));
    let as_role = |args: &[&str]| db.dlq_env(args, &[("DLQ_DATABASE_URL", &url)]);
    // Rows read from dead_letters, as the server counts them once a session ends.
    let rows_read = || {
        db.scalar(
            "SELECT seq_tup_read + COALESCE(idx_tup_fetch, 0) FROM pg_stat_user_tables \
             WHERE relname = 'dead_letters'",
        )
    };
    let start = rows_read();
    let counted = as_role(&["aggregate", "--by", "reason,producer"]);
    std::thread::sleep(std::time::Duration::from_millis(1000));
    let by_counts = rows_read() - start;
    let mut scan_args = vec!["aggregate", "--by", "reason,producer"];
    scan_args.extend(SCAN);
    let scanned = as_role(&scan_args);
    wait_until("the scan's reads counted by the server", 30, || {
        rows_read() - start - by_counts >= n
    });
    db.sql(&[
        &format!("DROP OWNED BY {role}"),
        &format!("DROP ROLE {role}"),
    ]);
    assert_eq!(counted.code, 0, "{}", counted.all());
    assert_eq!(scanned.code, 0, "{}", scanned.all());
    assert_eq!(counted.json(), scanned.json());
    assert!(
        by_counts < 200,
        "the counts answered, and the rows written since: {by_counts} rows read of {n}"
    );
}
