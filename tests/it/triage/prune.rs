//! `dlq prune`: settled rows only, with their history, while workers insert.

use super::*;
use crate::common::*;
use serde_json::json;

/// Moves the settled times of rows `days` into the past.
fn age(db: &TestDb, ids: &[&str], days: i64) {
    let list = ids
        .iter()
        .map(|i| format!("'{i}'"))
        .collect::<Vec<_>>()
        .join(",");
    let shift = match db.backend {
        Backend::Postgres => format!("- interval '{days} days'"),
        Backend::Sqlite => format!("- {}", days * 86_400_000_000),
    };
    db.sql(&[&format!(
        "UPDATE dead_letters SET replayed_at = replayed_at {shift}, discarded_at = discarded_at {shift}, \
         dead_lettered_at = dead_lettered_at {shift} WHERE id IN ({list})"
    )]);
}

fn now_sql(db: &TestDb) -> &'static str {
    match db.backend {
        Backend::Postgres => "now()",
        Backend::Sqlite => {
            "(CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000)"
        }
    }
}

#[test]
fn prune_deletes_settled_rows_only_with_their_history() {
    for b in BACKENDS {
        let db = TestDb::migrated(b);
        let lines: Vec<String> = [
            "r-old", "r-new", "d-old", "d-new", "p-old", "c-old", "u-old", "d-other",
        ]
        .iter()
        .map(|id| {
            let mut r = row(id, b"{}", json!({}));
            if *id == "d-other" {
                r["reason"] = json!("poison_message");
            }
            r.to_string()
        })
        .collect();
        assert_eq!(import_lines(&db, &lines).code, 0);
        let now = now_sql(&db);
        db.sql(&[
            &format!("UPDATE dead_letters SET replayed_at = {now} WHERE id IN ('r-old', 'r-new')"),
            &format!(
                "UPDATE dead_letters SET replay_attempt_at = {now}, replay_claim_owner = 'x:y' WHERE id = 'u-old'"
            ),
        ]);
        for id in ["d-old", "d-new", "d-other"] {
            assert_eq!(db.dlq(&["discard", id, "--note", "old", "--yes"]).code, 0);
        }
        assert_eq!(db.dlq(&["claim", "c-old", "--lease", "1h"]).code, 0);
        assert_eq!(db.dlq(&["note", "r-old", "kept until pruned"]).code, 0);
        age(
            &db,
            &["r-old", "d-old", "p-old", "c-old", "u-old", "d-other"],
            40,
        );

        for state in [
            "pending",
            "claimed",
            "uncertain",
            "replayed,uncertain",
            "all",
        ] {
            let r = db.dlq(&["prune", "--older-than", "30d", "--state", state, "--yes"]);
            assert_eq!(r.code, 2, "{b:?} {state}: {}", r.all());
        }
        let r = db.dlq(&["prune", "--older-than", "30d", "--yes"]);
        assert_eq!(r.code, 2, "--state is required: {}", r.all());
        let r = db.dlq(&[
            "prune",
            "--older-than",
            "30d",
            "--state",
            "replayed,discarded",
            "--dry-run",
        ]);
        assert_eq!(r.code, 0, "{}", r.all());
        assert_eq!(r.json()["matched"], 3, "{b:?} {}", r.stdout);
        assert_eq!(r.json()["deleted"], 0);
        assert_eq!(
            db.scalar("SELECT count(*) FROM dead_letters"),
            8,
            "dry run deletes nothing"
        );
        let r = db.dlq(&[
            "prune",
            "--older-than",
            "30d",
            "--state",
            "replayed,discarded",
        ]);
        assert_eq!(r.code, 2, "no terminal, no --yes: {}", r.all());
        // Filters narrow it.
        let r = db.dlq(&[
            "prune",
            "--older-than",
            "30d",
            "--state",
            "discarded",
            "--reason",
            "poison_message",
            "--yes",
        ]);
        assert_eq!(r.code, 0, "{}", r.all());
        assert_eq!(r.json()["deleted"], 1);
        let r = db.dlq(&[
            "prune",
            "--older-than",
            "30d",
            "--state",
            "replayed,discarded",
            "--yes",
            "--batch-size",
            "2",
        ]);
        assert_eq!(r.code, 0, "{}", r.all());
        assert_eq!(r.json()["deleted"], 2, "{b:?} {}", r.stdout);
        let left = ids(&db, &[]);
        assert_eq!(
            left,
            set(&["r-new", "d-new", "p-old", "c-old", "u-old"]),
            "{b:?}"
        );
        assert_eq!(
            db.scalar("SELECT count(*) FROM dead_letter_history WHERE dead_letter_id IN ('r-old', 'd-old', 'd-other')"),
            0,
            "{b:?}: the history goes with the rows"
        );
        assert!(
            db.scalar("SELECT count(*) FROM dead_letter_history WHERE dead_letter_id = 'd-new'")
                > 0
        );
    }
}

#[test]
fn prune_lets_a_worker_insert_while_it_runs() {
    for b in BACKENDS {
        let db = TestDb::migrated(b);
        let n = 20_000;
        let settled = match b {
            Backend::Postgres => format!(
                "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, replayed_at) \
                 SELECT 'old-' || lpad(g::text, 6, '0'), '\\x7b7d'::bytea, 'retries_exhausted', 1, '{{}}', now() - interval '60 days' \
                 FROM generate_series(1, {n}) g"
            ),
            Backend::Sqlite => format!(
                "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < {n}) \
                 INSERT INTO dead_letters (id, body, reason, attempts, headers_json, replayed_at) \
                 SELECT 'old-' || printf('%06d', n), X'7b7d', 'retries_exhausted', 1, '{{}}', \
                 CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) - 5184000000 FROM g"
            ),
        };
        db.sql(&[&settled]);
        let child = db
            .cmd()
            .args([
                "prune",
                "--older-than",
                "30d",
                "--state",
                "replayed",
                "--yes",
                "--batch-size",
                "100",
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // A worker inserting new dead letters, one statement each, while prune runs; each
        // time, how many old rows are left. Inserts that go through while some, not all,
        // are deleted show that prune commits batch by batch, never holding the table.
        let (inserted, mid_run) = insert_while(&db, n, || child_running(&child));
        eprintln!("{b:?}: {inserted} inserts while prune ran, {mid_run} of them mid-deletion");
        let out = child.wait_with_output().unwrap();
        let r = Run::from(out);
        assert_eq!(r.code, 0, "{b:?}: {}", r.all());
        assert_eq!(r.json()["deleted"], n, "{b:?}");
        assert!(
            mid_run >= 3,
            "{b:?}: only {mid_run} inserts went through while prune was deleting"
        );
        let new_rows = db.scalar("SELECT count(*) FROM dead_letters WHERE id LIKE 'new-%'");
        assert_eq!(new_rows, inserted as i64, "{b:?}: every insert is kept");
        assert_eq!(
            db.scalar("SELECT count(*) FROM dead_letters WHERE id LIKE 'old-%'"),
            0
        );
    }
}

fn child_running(child: &std::process::Child) -> bool {
    std::path::Path::new(&format!("/proc/{}/stat", child.id())).exists()
        && std::fs::read_to_string(format!("/proc/{}/stat", child.id()))
            .map(|s| !s.contains(") Z "))
            .unwrap_or(false)
}

/// Inserts rows one by one on one connection while `running()` holds, and counts the old
/// rows left after each: (inserts, inserts made while 0 < left < `n`).
fn insert_while(db: &TestDb, n: i64, running: impl Fn() -> bool) -> (usize, usize) {
    macro_rules! run_loop {
        ($pool:expr, $blob:expr) => {{
            let pool = $pool;
            let (mut inserted, mut mid) = (0usize, 0usize);
            while running() && inserted < 1_000_000 {
                sqlx::query(&format!(
                    "INSERT INTO dead_letters (id, body, reason, attempts, headers_json) \
                     VALUES ('new-{inserted:07}', {}, 'retries_exhausted', 1, '{{}}')",
                    $blob
                ))
                .execute(&pool)
                .await
                .unwrap();
                inserted += 1;
                let left: i64 =
                    sqlx::query_scalar("SELECT count(*) FROM dead_letters WHERE id LIKE 'old-%'")
                        .fetch_one(&pool)
                        .await
                        .unwrap();
                if left > 0 && left < n {
                    mid += 1;
                }
            }
            pool.close().await;
            (inserted, mid)
        }};
    }
    rt().block_on(async {
        match db.backend {
            Backend::Postgres => run_loop!(
                sqlx::PgPool::connect(&db.url).await.unwrap(),
                "'\\x7b7d'::bytea"
            ),
            Backend::Sqlite => {
                run_loop!(sqlx::SqlitePool::connect(&db.url).await.unwrap(), "X'7b7d'")
            }
        }
    })
}
