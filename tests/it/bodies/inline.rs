//! Bodies up to 1 MiB come inline with the claim, larger ones are read after it: mixed
//! batches, and SQLite bodies that are TEXT or INTEGER in the BLOB column.

use crate::common::*;
use std::collections::HashMap;

/// Per-item report lines of a plan run (lines with an `id` and an `outcome`).
fn item_reports(r: &Run) -> HashMap<String, Vec<String>> {
    let mut m: HashMap<String, Vec<String>> = HashMap::new();
    for v in r.lines() {
        if let (Some(id), Some(o)) = (v["id"].as_str(), v["outcome"].as_str()) {
            m.entry(id.to_string()).or_default().push(o.to_string());
        }
    }
    m
}

/// A batch mixing 0 B, 1 MiB - 1, exactly 1 MiB (inline) and 1 MiB + 1, 3 MiB (read after
/// the claim) whose large-body read fails for good: the small ones go ahead, byte-identical
/// and once; the large ones are released, unpublished, reported once each.
#[test]
fn pg_mixed_batch_large_read_fails_small_ones_go_ahead() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("rv_split");
    let db = TestDb::migrated(Backend::Postgres);
    let sizes = [0usize, 10, MIB - 1, MIB, MIB + 1, 3 * MIB];
    let mut rows = Vec::new();
    let mut lines = String::new();
    for (i, len) in sizes.iter().enumerate() {
        let id = format!("m{i}-{len}");
        let b = noise(900 + i as u32, *len);
        lines.push_str(&letter(&id, &q, &b).to_string());
        lines.push('\n');
        rows.push((id, b));
    }
    let r = db.dlq_stdin(&["import", "-"], lines.as_bytes());
    assert_eq!(r.code, 0, "{}", r.all());
    let plan = db.plan_file(&["--source-queue", &q]);
    // Every slice read now fails (not a transient error).
    replace_substr(&db, "RAISE EXCEPTION 'slice read refused by the test';");
    let r = db.dlq(&[
        "replay",
        "--plan",
        plan.path().to_str().unwrap(),
        "--yes",
        "--batch-size",
        "100",
    ]);
    eprintln!("{}", r.all());
    let reports = item_reports(&r);
    let got = rabbit.drain(&q);
    let counts = per_id(&got);
    for (id, b) in &rows {
        assert_eq!(
            reports.get(id).map(|v| v.len()),
            Some(1),
            "{id}: one report, got {:?}",
            reports.get(id)
        );
        let outcome = &reports[id][0];
        if b.len() <= MIB {
            assert_eq!(outcome, "replayed", "{id}");
            assert_eq!(counts.get(id), Some(&1), "{id} published once");
            let m = got
                .iter()
                .find(|m| m.headers["x-dead-letter-id"].as_str() == Some(id.as_str()))
                .unwrap();
            assert!(m.body == *b, "{id}: published body differs");
        } else {
            assert_eq!(outcome, "not_replayed", "{id}");
            assert_eq!(counts.get(id), None, "{id} not published");
        }
    }
    // The large ones are pending again (no lease, no attempt); the small ones replayed.
    assert_eq!(
        db.scalar(
            "SELECT count(*) FROM dead_letters WHERE octet_length(body) > 1048576 \
             AND replayed_at IS NULL AND replay_attempt_at IS NULL \
             AND replay_claim_expires_at IS NULL"
        ),
        2
    );
    assert_eq!(
        db.scalar(
            "SELECT count(*) FROM dead_letters WHERE octet_length(body) <= 1048576 \
             AND replayed_at IS NOT NULL"
        ),
        4
    );
    // Every release has its history entry.
    assert_eq!(
        db.scalar(
            "SELECT count(*) FROM dead_letter_history WHERE action = 'release' \
             AND dead_letter_id IN (SELECT id FROM dead_letters WHERE octet_length(body) > 1048576)"
        ),
        2
    );
}

async fn sqlite_insert(url: &str, id: &str, body: SqlBody, queue: &str) {
    let pool = sqlx::SqlitePool::connect(&format!("{url}?mode=rwc"))
        .await
        .unwrap();
    let q = sqlx::query(
        "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, source_queue) \
         VALUES (?1, ?2, 'retries_exhausted', 1, '{}', ?3)",
    )
    .bind(id);
    let q = match body {
        SqlBody::Text(t) => q.bind(t),
        SqlBody::Int(n) => q.bind(n),
    };
    q.bind(queue).execute(&pool).await.unwrap();
    pool.close().await;
}

enum SqlBody {
    Text(String),
    Int(i64),
}

/// A worker stored TEXT in the BLOB column: `length()` counts characters (up to the first
/// NUL), so a multi-MiB body comes with the claim. Whatever the route, the bytes published
/// must be the stored bytes.
#[test]
fn sqlite_text_bodies_are_published_byte_identical_whatever_length_says() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("rv_text");
    let db = TestDb::migrated(Backend::Sqlite);
    let bodies: Vec<(&str, String)> = vec![
        // 700k characters, 2.1 MB: length() says 700k (inlined).
        ("euro", "€".repeat(700_000)),
        // length() stops at the NUL: 0 (inlined), 2 MiB stored.
        ("nul", format!("\0{}", "a".repeat(2 * MIB))),
        // ASCII, 1 MiB + 1: read after the claim.
        ("ascii", "b".repeat(MIB + 1)),
        ("exact", "c".repeat(MIB)),
        ("small", "{\"event_id\":\"e\"}".to_string()),
    ];
    rt().block_on(async {
        for (id, b) in &bodies {
            sqlite_insert(&db.url, id, SqlBody::Text(b.clone()), &q).await;
        }
    });
    let plan = db.plan_file(&["--source-queue", &q, "--allow-mixed"]);
    let r = db.dlq(&[
        "replay",
        "--plan",
        plan.path().to_str().unwrap(),
        "--yes",
        "--batch-size",
        "100",
    ]);
    assert_eq!(r.code, 0, "{}", r.all());
    let reports = item_reports(&r);
    let got = rabbit.drain(&q);
    let counts = per_id(&got);
    for (id, b) in &bodies {
        assert_eq!(reports.get(*id).map(|v| v.len()), Some(1), "{id}");
        assert_eq!(reports[*id][0], "replayed", "{id}");
        assert_eq!(counts.get(*id), Some(&1), "{id}");
        let m = got
            .iter()
            .find(|m| m.headers["x-dead-letter-id"].as_str() == Some(*id))
            .unwrap();
        assert!(
            m.body == b.as_bytes(),
            "{id}: published {} bytes, stored {}",
            m.body.len(),
            b.len()
        );
    }
}

/// A worker stored an INTEGER in SQLite's BLOB column (no STRICT): `length(42)` is 2, so
/// the body now comes with the claim and its decode fails inside the claim. Before this
/// commit the claim succeeded and the failing body read released the row with a
/// `not_replayed` report; now the whole replay fails with an error and the row gets no
/// report (in a plan run: the run stops, the batch's items unreported).
#[test]
fn sqlite_malformed_body_is_reported_not_replayed_rather_than_failing_the_replay() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("rv_int");
    let db = TestDb::migrated(Backend::Sqlite);
    rt().block_on(async {
        sqlite_insert(&db.url, "int", SqlBody::Int(42), &q).await;
    });
    let r = db.dlq(&["replay", "int", "--yes"]);
    eprintln!("code {}: {}", r.code, r.all());
    assert_eq!(rabbit.drain(&q).len(), 0);
    let v = r.json();
    assert_eq!(
        v["outcome"],
        "not_replayed",
        "one outcome for the row, as before the commit: {}",
        r.all()
    );
}

/// The plan-run form of the previous finding: one row's body became an INTEGER after the
/// plan. The claim of its batch fails, the run stops with an error, and the items of that
/// batch and of the batches after it get no report (nothing published). Before this commit
/// the failing read released the batch `not_replayed` and the run went on.
#[test]
fn sqlite_plan_run_reports_every_item_once_despite_one_malformed_row() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("rv_hdr");
    let db = TestDb::migrated(Backend::Sqlite);
    let mut lines = String::new();
    for i in 0..6 {
        lines.push_str(
            &letter(&format!("h{i}"), &q, format!("{{\"n\":{i}}}").as_bytes()).to_string(),
        );
        lines.push('\n');
    }
    let r = db.dlq_stdin(&["import", "-"], lines.as_bytes());
    assert_eq!(r.code, 0, "{}", r.all());
    let plan = db.plan_file(&["--source-queue", &q]);
    // After the plan (which hashes every body, and fails on such a row), a worker
    // rewrites one body as an INTEGER.
    db.sql(&["UPDATE dead_letters SET body = 42 WHERE id = 'h2'"]);
    let r = db.dlq(&[
        "replay",
        "--plan",
        plan.path().to_str().unwrap(),
        "--yes",
        "--batch-size",
        "3",
    ]);
    eprintln!("code {}: {}", r.code, r.all());
    let reports = item_reports(&r);
    let got = per_id(&rabbit.drain(&q));
    for i in 0..6 {
        let id = format!("h{i}");
        assert_eq!(
            reports.get(&id).map(|v| v.len()),
            Some(1),
            "{id}: exactly one outcome (published {:?}): {}",
            got.get(&id),
            r.all()
        );
    }
}
