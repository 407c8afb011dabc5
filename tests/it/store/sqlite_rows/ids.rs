//! How dlq matches the ID an operator types to a row a worker wrote (TEXT or bytes),
//! and how it treats a lease another tool wrote in a form it cannot read.

use super::*;

/// A replay of an ID with a literal `\x31` claims, publishes and marks that row only,
/// never the row `ord1` those characters would decode to.
// Once broke: `ord\x31` also matched `ord1`, marked replayed with nothing published.
#[test]
fn replay_of_an_id_with_backslash_x_marks_another_row_replayed() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("r2_esc");
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("ord\\x31", &q, b"selected"));
    db.add(letter("ord1", &q, b"never selected"));
    assert_eq!(db.show("ord1")["state"], "pending");

    let r = db.dlq(&["replay", "ord\\x31", "--yes"]);
    let got = per_id(&rabbit.drain(&q));
    assert_eq!(got.get("ord\\x31"), Some(&1), "{got:?} {}", r.all());
    assert_eq!(got.get("ord1"), None, "ord1 was not asked for: {got:?}");
    let other = db.show("ord1");
    assert_eq!(
        other["state"],
        "pending",
        "ord1 was never published, yet: {other} / replay said: {}",
        r.all()
    );
}

/// A TEXT row and a worker's BLOB row with the same bytes are two rows: a replay by
/// that ID writes the TEXT row only, so every row marked replayed was published once.
// Once broke: a TEXT and a BLOB row with one ID were both marked after one publish.
#[test]
fn text_and_blob_rows_with_one_id_both_marked_after_one_publish() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("r2_blob");
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("dup-1", &q, b"text row"));
    db.sql(&[&format!(
        "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, source_queue) \
         VALUES (CAST('dup-1' AS BLOB), X'626c6f6220726f77', 'retries_exhausted', 1, '{{}}', '{q}')"
    )]);
    assert_eq!(
        db.scalar(
            "SELECT count(*) FROM dead_letters WHERE id = 'dup-1' OR id = CAST('dup-1' AS BLOB)"
        ),
        2
    );

    let r = db.dlq(&["replay", "dup-1", "--yes"]);
    let msgs = rabbit.drain(&q);
    let replayed = db.scalar("SELECT count(*) FROM dead_letters WHERE replayed_at IS NOT NULL");
    assert_eq!(
        replayed as usize,
        msgs.len(),
        "every row marked replayed was published and confirmed once: {} published, {} marked; {}",
        msgs.len(),
        replayed,
        r.all()
    );
    // The TEXT row is the one written; `show` names the two rows rather than merge them.
    assert_eq!(
        db.scalar("SELECT count(*) FROM dead_letters WHERE id = CAST('dup-1' AS BLOB) AND replayed_at IS NULL"),
        1
    );
    let s = db.dlq(&["show", "dup-1"]);
    assert_eq!(s.code, 1, "{}", s.all());
    assert!(
        s.stderr.contains("two rows have id \"dup-1\""),
        "{}",
        s.stderr
    );
}

/// A lease another tool stored in a form dlq cannot read (Go's `time.Time` text with a
/// zone name, ISO text bound as bytes) holds its row: dlq publishes neither row.
// Once broke: an unreadable lease counted as lapsed, so dlq published under another tool's lease.
#[test]
fn an_unreadable_live_lease_of_another_tool_is_taken_over() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("r2_lease");
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("held-text", &q, b"a"));
    db.add(letter("held-blob", &q, b"b"));
    db.sql(&[
        "UPDATE dead_letters SET replay_claim_owner = 'replayer:1', \
         replay_claim_expires_at = '2099-01-01 00:00:00.000001 +0000 UTC' WHERE id = 'held-text'",
        "UPDATE dead_letters SET replay_claim_owner = 'replayer:1', \
         replay_claim_expires_at = CAST('2099-01-01 00:00:00.000001+00:00' AS BLOB) \
         WHERE id = 'held-blob'",
    ]);
    let mut said = String::new();
    for id in ["held-text", "held-blob"] {
        let before = db.show(id);
        let r = db.dlq(&["replay", id, "--yes"]);
        said.push_str(&format!(
            "\n{id}: state before {} (unreadable {}), replay exit {}: {}",
            before["state"],
            before["unreadable"],
            r.code,
            r.stdout.trim()
        ));
    }
    let got = per_id(&rabbit.drain(&q));
    assert!(
        got.is_empty(),
        "rows another tool holds until 2099 were published by dlq too: {got:?}{said}"
    );
    // Both count as claimed, and a refusal says the lease end cannot be read.
    for id in ["held-text", "held-blob"] {
        assert_eq!(db.show(id)["state"], "claimed", "{id}");
        let r = db.dlq(&["claim", id]);
        assert_eq!(r.code, 3, "{}", r.all());
        assert!(r.stdout.contains("cannot read"), "{}", r.all());
    }
    // `resolve` takes the same rule: an attempt under such a lease may still settle.
    db.sql(&[
        "UPDATE dead_letters SET replay_attempt_at = 1764590000000000 WHERE id = 'held-text'",
    ]);
    let r = db.dlq(&["resolve", "held-text", "--not-delivered", "--note", "n"]);
    assert_eq!(r.code, 3, "{}", r.all());
    assert!(r.stdout.contains("cannot read"), "{}", r.all());
    assert_eq!(db.show("held-text")["state"], "uncertain");
}

/// `import --skip-existing` of an exported BLOB-id row into its own file skips it: the
/// bytes row and its text are one dead letter, never a silent twin.
// Once broke: importing an exported BLOB-id row beside itself made a TEXT twin.
#[test]
fn import_skip_existing_of_an_exported_blob_id_row_makes_a_twin() {
    let db = TestDb::migrated(Backend::Sqlite);
    db.sql(&[
        "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, source_queue) \
         VALUES (CAST('w-7' AS BLOB), X'7b7d', 'retries_exhausted', 1, '{}', 'orders')",
    ]);
    let e = db.dlq(&["export"]);
    assert_eq!(e.code, 0, "{}", e.all());
    let r = db.dlq_stdin(&["import", "--skip-existing", "-"], e.stdout.as_bytes());
    assert_eq!(
        db.scalar("SELECT count(*) FROM dead_letters"),
        1,
        "the exported row already exists, yet import added it again: {}",
        r.all()
    );
    assert_eq!(r.code, 0, "{}", r.all());
    // Without --skip-existing it is refused as existing, naming the bytes.
    let r = db.dlq_stdin(&["import", "-"], e.stdout.as_bytes());
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(r.stderr.contains("stored as bytes"), "{}", r.stderr);
    assert_eq!(db.scalar("SELECT count(*) FROM dead_letters"), 1);
}

/// `resolve` of an ID with a literal `\x31` resolves that row only, never `ord1`.
// Once broke: resolving `ord\x31` also resolved `ord1`, with no history entry.
#[test]
fn resolve_of_an_id_with_backslash_x_resolves_another_row() {
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("ord\\x31", "orders", b"checked"));
    db.add(letter("ord1", "orders", b"not checked"));
    db.sql(&[
        "UPDATE dead_letters SET replay_claim_owner = 'op:11111111-1111-1111-1111-111111111111', \
         replay_attempt_at = 1764590000000000, replay_claim_expires_at = 1764590060000000",
    ]);
    assert_eq!(db.show("ord1")["state"], "uncertain");
    assert_eq!(db.show("ord\\x31")["state"], "uncertain");
    let r = db.dlq(&[
        "resolve",
        "ord\\x31",
        "--not-delivered",
        "--note",
        "checked the consumers of ord\\x31",
    ]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(db.show("ord\\x31")["state"], "pending");
    let other = db.show("ord1");
    assert_eq!(
        other["state"],
        "uncertain",
        "ord1 was not resolved by anyone: {other} / resolve said: {}",
        r.all()
    );
}
