//! `prune` over the workers' rows: what it deletes, what it keeps (a worker's BLOB id, a
//! settled time it cannot read), and that what it counts is what it deletes.

use super::*;

// A BLOB id sorts after every text: prune's window ended on it and failed to decode it.
#[test]
fn prune_walks_past_blob_ids_and_keeps_unreadable_settled_times() {
    let db = TestDb::migrated(Backend::Sqlite);
    python_workers(&db, "orders");
    let r = db.dlq(&[
        "prune",
        "--older-than",
        "1s",
        "--state",
        "replayed,discarded",
        "--yes",
        "--batch-size",
        "2",
    ]);
    assert_eq!(r.code, 0, "{}", r.all());
    // py-replayed (text time) and py-discarded go; the unreadable replayed_at stays.
    assert_eq!(r.json()["deleted"], 2, "{}", r.stdout);
    let left = db.ids(&["--limit", "100"]);
    assert_eq!(left.len(), 14, "{left:?}");
    assert!(left.contains(&"py-replayed-garbage".to_string()));
    assert!(left.contains(&"py-blob-id".to_string()));
}

/// A worker's settled row with a BLOB id is never deleted by `prune` (every write names a
/// TEXT id), so neither `--dry-run` nor the report counts it.
// Once broke: `--dry-run` said it would delete 2 rows and `prune` deleted 1.
#[test]
fn prune_counts_only_the_rows_it_deletes_not_a_workers_blob_id() {
    let db = TestDb::migrated(Backend::Sqlite);
    let q = unique("dlq_prune_blob");
    db.add(letter("text-1", &q, b"{}"));
    db.sql(&[
        &format!(
            "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, source_queue, \
             dead_lettered_at, replayed_at) VALUES (CAST('blob-1' AS BLOB), X'7b7d', \
             'retries_exhausted', 1, '{{}}', '{q}', '2026-01-01 00:00:00', '2026-01-02 00:00:00')"
        ),
        "UPDATE dead_letters SET replayed_at = '2026-01-02 00:00:00' WHERE id = 'text-1'",
    ]);
    let prune = |more: &[&str]| {
        let mut args = vec![
            "prune",
            "--older-than",
            "1d",
            "--state",
            "replayed",
            "--yes",
        ];
        args.extend_from_slice(more);
        let r = db.dlq(&args);
        assert_eq!(r.code, 0, "{}", r.all());
        r.json()
    };
    let dry = prune(&["--dry-run"]);
    assert_eq!(
        dry["matched"], 1,
        "the BLOB row is kept, so not counted: {dry}"
    );
    let done = prune(&[]);
    assert_eq!(
        (&done["matched"], &done["deleted"]),
        (&1.into(), &1.into()),
        "{done}"
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM dead_letters WHERE id = CAST('blob-1' AS BLOB)"),
        1
    );
}
