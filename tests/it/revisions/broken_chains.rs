//! Copies of one event whose revision chain is broken in this store (a middle never
//! exported, or pruned): no `revision_of` links them, so `import` and `restore` know them
//! by what an edit keeps, the event ID and the dead-lettered time (an edit copies it). A
//! plain duplicate of the event (dead-lettered again, at its own time) is no copy.

use super::set_aside::{
    add, export, import, import_refused, prune_settled, refused_in_either_order, replay, revise,
};
use crate::common::*;
use tempfile::NamedTempFile;

/// `orig`, a pending dead letter of `queue` in a store of `b`, exported (a backup), then
/// edited `n` times.
struct Chain {
    src: TestDb,
    before: NamedTempFile,
    /// The revisions, first first: each of the one before.
    revisions: Vec<String>,
}

fn chain(b: Backend, queue: &str, n: usize) -> Chain {
    let src = TestDb::migrated(b);
    add(&src, "orig", queue);
    let before = export(&src, &[]);
    let revisions = chain_of_edits(&src, "orig", n);
    Chain {
        src,
        before,
        revisions,
    }
}

/// A plain duplicate of `event` (of `queue`): the same event dead-lettered again, at its
/// own time.
fn twin(id: &str, queue: &str, event: &str) -> serde_json::Value {
    let mut l = letter(id, queue, br#"{"amount": "1,50"}"#);
    l["event_id"] = event.into();
    l
}

/// Edits `id` `n` times, each time its last revision: the chain's revisions, first first.
fn chain_of_edits(db: &TestDb, id: &str, n: usize) -> Vec<String> {
    let mut last = id.to_string();
    (1..=n)
        .map(|i| {
            let step = format!("step={i}");
            let r = db.dlq(&["edit", &last, "--note", "again", "--set", &step]);
            assert_eq!(r.code, 0, "edit {i} of {id}: {}", r.all());
            last = r.json()["revision_id"].as_str().unwrap().to_string();
            last.clone()
        })
        .collect()
}

/// The lines of the export `f` but those of `gone`: an export taken after `prune`
/// deleted them.
fn without(f: &NamedTempFile, gone: &[&str]) -> NamedTempFile {
    let text = std::fs::read_to_string(f.path()).unwrap();
    let kept: String = text
        .lines()
        .filter(|l| {
            let id = serde_json::from_str::<serde_json::Value>(l).unwrap()["id"].clone();
            !gone.iter().any(|g| id == *g)
        })
        .map(|l| format!("{l}\n"))
        .collect();
    let out = NamedTempFile::new().unwrap();
    std::fs::write(out.path(), kept).unwrap();
    out
}

/// Dead letters as a file for `import`.
fn file_of(rows: &[&serde_json::Value]) -> NamedTempFile {
    let f = NamedTempFile::new().unwrap();
    let text: String = rows.iter().map(|r| format!("{r}\n")).collect();
    std::fs::write(f.path(), text).unwrap();
    f
}

/// What the cure stands on: an edit copies the original's `dead_lettered_at`, and an
/// export read by `import` keeps it to the microsecond, from either store into either.
#[test]
fn an_edit_and_a_round_trip_keep_the_dead_lettered_time_to_the_microsecond() {
    let at = "2026-01-02T03:04:05.123456Z";
    for (from, to) in [
        (Backend::Postgres, Backend::Sqlite),
        (Backend::Sqlite, Backend::Postgres),
    ] {
        let src = TestDb::migrated(from);
        let mut row = letter("orig", &unique("dlq_rev_time"), br#"{"amount": "1,50"}"#);
        row["dead_lettered_at"] = at.into();
        src.add(row);
        let rev = revise(&src, "orig");
        let dst = TestDb::migrated(to);
        import(&dst, &export(&src, &[]));
        for (db, id) in [(&src, "orig"), (&src, &rev), (&dst, "orig"), (&dst, &rev)] {
            assert_eq!(db.show(id)["dead_lettered_at"], at, "{:?} {id}", db.backend);
        }
    }
}

/// Once broke: only an imported revision whose direct original was missing here was
/// matched by its event ID. `orig` edited into R1, R2, R3; R1 pruned: R3 (its R2 here,
/// discarded) went in beside `orig` pending, and `orig` beside R3.
#[test]
fn import_refuses_a_revision_whose_chain_breaks_above_its_direct_original() {
    for b in BACKENDS {
        let c = chain(b, &unique("dlq_rev_high"), 3);
        let pruned = without(&export(&c.src, &["--revisions"]), &[&c.revisions[0]]);
        refused_in_either_order(b, &c.before, &pruned);
    }
}

/// Once broke: an imported revision whose chain is broken here was exempt when it was
/// replayed, beside its live original that had never been: the event could go out
/// through both, once each.
#[test]
fn import_refuses_a_replayed_revision_with_a_broken_chain_beside_its_live_original() {
    for b in BACKENDS {
        let mut mq = Rabbit::new();
        let c = chain(b, &mq.queue("dlq_rev_replayed_gap"), 2);
        let r = replay(&c.src, &c.revisions[1]);
        assert_eq!(r.code, 0, "{b:?} replay: {}", r.all());
        let replayed = export(&c.src, &["--revisions", "--state", "replayed"]);
        refused_in_either_order(b, &c.before, &replayed);
    }
}

/// Once broke: the check followed `revision_of` only through rows of this store. `orig`
/// edited into R1 and R1 into R2 elsewhere: the export of the pending rows holds only R2
/// (`revision_of` R1, a row this store never had), and it went in beside `orig` pending,
/// one event (the same event ID) replayable twice. Once broke too: in the other order,
/// `orig` imported after R2. A plain duplicate (the same event dead-lettered again, at
/// its own time) still goes in beside either.
#[test]
fn import_never_makes_an_original_and_a_revision_with_a_missing_middle_both_replayable() {
    for b in BACKENDS {
        let q = unique("dlq_rev_gap");
        let c = chain(b, &q, 2);
        let pending = export(&c.src, &["--state", "pending"]);
        refused_in_either_order(b, &c.before, &pending);
        let dst = TestDb::migrated(b);
        import(&dst, &c.before);
        let r = import_refused(&dst, &pending);
        assert!(r.all().contains("same event ID"), "{}", r.all());
        // A plain duplicate of the event goes in beside the original and the revision.
        let again = twin("orig-again", &q, "evt-orig");
        for first in [&c.before, &pending] {
            let dst = TestDb::migrated(b);
            import(&dst, first);
            import(&dst, &file_of(&[&again]));
            assert_eq!(dst.ids(&["--state", "pending"]).len(), 2, "{b:?}");
        }
    }
}

/// Once broke (review): the event-ID rule refused imports an operator needs: a store's
/// whole export (an edited row beside a plain duplicate of its event) into an empty
/// store, and a come-back of a replayed revision's event. Once broke too: the same whole
/// export once `prune` had deleted the discarded original (the revision's chain broken).
/// The old export of that original is still refused there.
#[test]
fn whole_exports_and_come_backs_of_revised_events_import() {
    for b in BACKENDS {
        let src = TestDb::migrated(b);
        let q = unique("dlq_rev_whole");
        add(&src, "a1", &q);
        let before = export(&src, &[]);
        import(&src, &file_of(&[&twin("a2", &q, "evt-a1")]));
        let v = revise(&src, "a1");
        let dst = TestDb::migrated(b);
        import(&dst, &export(&src, &[]));
        assert_eq!(dst.ids(&["--state", "all"]).len(), 3, "{b:?}");
        // The revision replayed elsewhere came back as a new dead letter of its event.
        dst.sql(&[&format!(
            "UPDATE dead_letters SET replayed_at = dead_lettered_at WHERE id = '{v}'"
        )]);
        let mut back = twin("a1-back", &q, "evt-a1");
        back["headers"]["x-dead-letter-id"] = v.clone().into();
        import(&dst, &file_of(&[&back]));
        // The discarded original pruned, the rest moves as it is.
        let r = prune_settled(&src, &["--state", "discarded"]);
        assert_eq!(r.json()["deleted"], 1, "{b:?} a1 is pruned: {}", r.all());
        let dst = TestDb::migrated(b);
        import(&dst, &export(&src, &[]));
        assert_eq!(dst.ids(&["--state", "pending"]).len(), 2, "{b:?}");
        import_refused(&dst, &before);
    }
}

/// The times are compared as instants: a worker's SQLite text in any of the forms dlq
/// reads (a `T` or a space, `Z`, `+00:00`, `+0000`, another offset) is the instant an
/// edit copied into the revision (dlq's INTEGER microseconds), and a microsecond apart
/// is another time: a plain duplicate, which goes in. Once broke: any live row of the
/// event was taken for the original, that duplicate too.
#[test]
fn import_matches_a_time_a_worker_wrote_as_text_as_the_instant_it_is() {
    let src = TestDb::migrated(Backend::Postgres);
    let q = unique("dlq_rev_text_time");
    let mut row = letter("orig", &q, br#"{"amount": "1,50"}"#);
    row["dead_lettered_at"] = "2026-01-02T03:04:05.123456Z".into();
    src.add(row);
    chain_of_edits(&src, "orig", 2);
    let pending = export(&src, &["--state", "pending"]);
    let forms = [
        ("2026-01-02 03:04:05.123456+0000", 2),
        ("2026-01-02T03:04:05.123456Z", 2),
        ("2026-01-02 03:04:05.123456+00:00", 2),
        ("2026-01-02T04:04:05.123456+0100", 2),
        ("2026-01-02 03:04:05.123457+0000", 0),
    ];
    for (at, code) in forms {
        let dst = TestDb::migrated(Backend::Sqlite);
        dst.sql(&[&format!(
            "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, event_id, \
             source_queue, dead_lettered_at) \
             VALUES ('orig', X'7b7d', 'retries_exhausted', 1, '{{}}', 'evt-orig', '{q}', '{at}')"
        )]);
        let r = dst.dlq(&["import", pending.path().to_str().unwrap()]);
        assert_eq!(r.code, code, "{at}: {}", r.all());
    }
}

/// Two dead letters of one event at one time (a worker's batch in one transaction), each
/// edited: the revisions share the event ID and the time, but their chains are whole here
/// and apart, so they are no copies: a whole export of that store imports (the event rule
/// without its broken-chain condition refused it).
#[test]
fn revisions_of_two_duplicates_at_one_time_with_whole_chains_import() {
    for b in BACKENDS {
        let src = TestDb::migrated(b);
        let q = unique("dlq_rev_same_time");
        let [mut d1, mut d2] = ["d1", "d2"].map(|id| letter(id, &q, br#"{"amount": "1,50"}"#));
        for d in [&mut d1, &mut d2] {
            d["event_id"] = "evt-batch".into();
            d["dead_lettered_at"] = "2026-01-02T03:04:05.123456Z".into();
        }
        import(&src, &file_of(&[&d1, &d2]));
        revise(&src, "d1");
        revise(&src, "d2");
        let dst = TestDb::migrated(b);
        import(&dst, &export(&src, &[]));
        assert_eq!(dst.ids(&["--state", "pending"]).len(), 2, "{b:?}");
    }
}

/// Once broke: `restore` checked only that no revision here named the row. `orig`,
/// imported from a backup and set aside (discarded) here, was made pending again beside
/// R2, a revision of its revision R1 imported from the store that edited it (R1 never
/// here): the event could go out through both. A plain duplicate of the event, at its
/// own time, is restored; two copies restored together are not.
#[test]
fn restore_never_makes_an_original_live_beside_a_revision_with_a_missing_middle() {
    for b in BACKENDS {
        let q = unique("dlq_rev_restore_gap");
        let c = chain(b, &q, 2);
        let dst = TestDb::migrated(b);
        import(&dst, &c.before);
        import(&dst, &file_of(&[&twin("orig-again", &q, "evt-orig")]));
        for id in ["orig", "orig-again"] {
            let r = dst.dlq(&["discard", id, "--note", "not now", "--yes"]);
            assert_eq!(r.code, 0, "{b:?} discard: {}", r.all());
        }
        // One live copy: it goes in.
        import(&dst, &export(&c.src, &["--state", "pending"]));
        let r = dst.dlq(&["restore", "orig", "--note", "after all", "--yes"]);
        assert_eq!(r.code, 3, "{b:?} restore: {}", r.all());
        let j = r.json();
        assert_eq!(j["outcome"], "not_restored", "{j}");
        let detail = j["detail"].as_str().unwrap();
        assert!(
            detail.contains(&c.revisions[1]) && detail.contains("same event ID"),
            "{detail}"
        );
        assert_eq!(
            dst.ids(&["--state", "pending"]),
            vec![c.revisions[1].clone()]
        );
        let r = dst.dlq(&["restore", "orig-again", "--note", "its own", "--yes"]);
        assert_eq!(r.code, 0, "{b:?} plain duplicate: {}", r.all());
        // Two copies restored together: neither is.
        let r = dst.dlq(&[
            "discard",
            &c.revisions[1],
            "--note",
            "the original instead",
            "--yes",
        ]);
        assert_eq!(r.code, 0, "{b:?} discard: {}", r.all());
        let both = ["--event-id", "evt-orig", "--state", "discarded"];
        let r = dst.dlq(&[&["restore", "--note", "both", "--yes"][..], &both].concat());
        assert_eq!(r.code, 3, "{b:?} restore of both: {}", r.all());
        assert_eq!(
            dst.ids(&["--state", "pending"]),
            vec!["orig-again"],
            "{b:?}"
        );
        let r = dst.dlq(&["restore", "orig", "--note", "after all", "--yes"]);
        assert_eq!(r.code, 0, "{b:?} restore of one: {}", r.all());
    }
}

/// Revisions of one hot event whose chains are broken here, each at its own time, are
/// no copies of each other nor of the event's plain rows: 20,000 rows go in. (Its speed
/// is not asserted, as no test's is: the rule pairs rows only within an (event, time)
/// group; paired row by row, this import ran for minutes.)
#[test]
fn broken_revisions_of_one_hot_event_at_their_own_times_all_go_in() {
    let q = unique("dlq_rev_hot");
    let lines: String = (0..20_000)
        .map(|i| {
            let mut l = twin(&format!("hot-{i:05}"), &q, "evt-hot");
            l["dead_lettered_at"] = format!("2026-01-02T03:04:05.{i:06}Z").into();
            if i % 2 == 1 {
                l["revision_of"] = format!("gone-{i:05}").into();
            }
            format!("{l}\n")
        })
        .collect();
    let db = TestDb::migrated(Backend::Sqlite);
    let r = db.dlq_stdin(&["import", "-"], lines.as_bytes());
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(db.scalar("SELECT count(*) FROM dead_letters"), 20_000);
}

/// Edits `id` with `--new-event-id` and returns its revision's ID: nothing but its chain
/// links the revision to its original's event.
fn revise_new_event(db: &TestDb, id: &str) -> String {
    let step = [
        "edit",
        id,
        "--note",
        "fresh",
        "--set",
        "step=9",
        "--new-event-id",
    ];
    let r = db.dlq(&step);
    assert_eq!(r.code, 0, "edit {id}: {}", r.all());
    r.json()["revision_id"].as_str().unwrap().to_string()
}

/// Once broke: the event rule compared a broken revision only with the live rows of its
/// own event ID. `orig` edited with `--new-event-id` (R: a new event ID, its chain whole)
/// and R2, a revision of `orig`'s revision made elsewhere (the old event ID, its chain
/// broken), went in beside each other in either order, both pending: R's event and time
/// are its original's, set aside.
#[test]
fn import_refuses_a_broken_revision_beside_a_revision_with_a_new_event_id() {
    for b in BACKENDS {
        let c = chain(b, &unique("dlq_rev_new_event"), 2);
        let pending = export(&c.src, &["--state", "pending"]);
        let dst = TestDb::migrated(b);
        import(&dst, &c.before);
        let ours = revise_new_event(&dst, "orig");
        let r = import_refused(&dst, &pending);
        assert!(r.all().contains("same event ID"), "{}", r.all());
        assert_eq!(dst.ids(&["--state", "pending"]), vec![ours], "{b:?}");
        // `orig` (set aside) and R from the store that made R, and R2: in either order.
        refused_in_either_order(b, &export(&dst, &[]), &pending);
    }
}

/// Once broke, as the import above: R2 (the old event ID, its chain broken) imported and
/// set aside, then `orig` imported and edited here with `--new-event-id` (R): R2 was
/// restored beside R, both pending.
#[test]
fn restore_never_makes_a_broken_revision_live_beside_a_revision_with_a_new_event_id() {
    for b in BACKENDS {
        let c = chain(b, &unique("dlq_rev_new_event_restore"), 2);
        let dst = TestDb::migrated(b);
        import(&dst, &export(&c.src, &["--state", "pending"]));
        let r2 = &c.revisions[1];
        let r = dst.dlq(&["discard", r2, "--note", "not now", "--yes"]);
        assert_eq!(r.code, 0, "{b:?} discard: {}", r.all());
        import(&dst, &c.before);
        let ours = revise_new_event(&dst, "orig");
        let r = dst.dlq(&["restore", r2, "--note", "after all", "--yes"]);
        assert_eq!(r.code, 3, "{b:?} restore: {}", r.all());
        let j = r.json();
        assert_eq!(j["outcome"], "not_restored", "{j}");
        assert!(j["detail"].as_str().unwrap().contains(&ours), "{j}");
        assert_eq!(dst.ids(&["--state", "pending"]), vec![ours], "{b:?}");
    }
}

/// Once broke, the other way round: R3, made elsewhere with `--new-event-id` of R2 (the
/// old event ID, here set aside, its chain broken above it), went in beside `orig`
/// pending, in either order: R3's own event ID is new, and nothing linked it to R2's.
#[test]
fn import_refuses_a_broken_revision_with_a_new_event_id_whose_original_is_here() {
    for b in BACKENDS {
        let c = chain(b, &unique("dlq_rev_new_event_above"), 2);
        revise_new_event(&c.src, &c.revisions[1]);
        let pruned = without(&export(&c.src, &["--revisions"]), &[&c.revisions[0]]);
        refused_in_either_order(b, &c.before, &pruned);
    }
}

/// `orig` edited here with `--new-event-id` (R, replayed): `prune` keeps `orig` (set
/// aside) while R is here, so R2, a revision of `orig` made elsewhere (the old event ID,
/// its chain broken), is still refused.
// Once broke (review 34): prune deleted `orig`, the one row that says R's event is
// `orig`'s, and R2 imported pending beside R: the event could go out a second time.
#[test]
fn import_refuses_a_broken_revision_beside_a_replayed_revision_with_a_new_event_id_once_its_original_is_pruned(
) {
    for b in BACKENDS {
        let mut mq = Rabbit::new();
        let c = chain(b, &mq.queue("dlq_rev_new_event_pruned"), 2);
        let pending = export(&c.src, &["--state", "pending"]);
        let dst = TestDb::migrated(b);
        import(&dst, &c.before);
        let ours = revise_new_event(&dst, "orig");
        let r = replay(&dst, &ours);
        assert_eq!(r.code, 0, "{b:?} replay: {}", r.all());
        // Refused while `orig` is here (the F1 cure).
        import_refused(&dst, &pending);
        let r = prune_settled(&dst, &["--state", "discarded"]);
        assert_eq!(r.json()["deleted"], 0, "{b:?} orig is kept: {}", r.all());
        import_refused(&dst, &pending);
    }
}
