//! Copies of one event whose revision chain is broken in this store (a middle never
//! exported, or pruned): no `revision_of` links them, so `import` knows them by the
//! event ID an edit keeps.

use super::set_aside::{add, export, import, import_refused, revise};
use crate::common::*;
use tempfile::NamedTempFile;

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

/// One dead letter as a file for `import`.
fn file_of(row: &serde_json::Value) -> NamedTempFile {
    let f = NamedTempFile::new().unwrap();
    std::fs::write(f.path(), format!("{row}\n")).unwrap();
    f
}

/// Once broke: the check followed `revision_of` only through rows of this store. `orig`
/// edited into R1 and R1 into R2 elsewhere: the export of the pending rows holds only R2
/// (`revision_of` R1, a row this store never had), and it went in beside `orig` pending,
/// one event (the same event ID) replayable twice. A plain duplicate (the same event
/// dead-lettered twice, no revision) still goes in. Not caught: the other order, and an
/// old export of `orig` after `prune` deleted the discarded `orig` and R1 (see
/// `live_pair`).
#[test]
fn import_never_makes_an_original_and_a_revision_with_a_missing_middle_both_replayable() {
    for b in BACKENDS {
        let src = TestDb::migrated(b);
        let q = unique("dlq_rev_gap");
        add(&src, "orig", &q);
        let before = export(&src, &[]);
        chain_of_edits(&src, "orig", 2);
        let pending = export(&src, &["--state", "pending"]);
        // The original here, then the revision whose middle this store never had. (The
        // other order, the revision first, is not caught: see `live_pair`.)
        let dst = TestDb::migrated(b);
        import(&dst, &before);
        let r = import_refused(&dst, &pending);
        assert!(r.all().contains("same event ID"), "{}", r.all());
        // A plain duplicate of one event (no revision) goes in beside the original.
        let mut twin = letter("orig-again", &q, br#"{"amount": "1,50"}"#);
        twin["event_id"] = "evt-orig".into();
        let dst = TestDb::migrated(b);
        import(&dst, &before);
        import(&dst, &file_of(&twin));
        assert_eq!(dst.ids(&["--state", "pending"]).len(), 2, "{b:?}");
    }
}

/// Once broke (review): the event-ID rule refused imports an operator needs: a store's
/// whole export (an edited row beside a plain duplicate of its event) into an empty
/// store, and a come-back of a replayed revision's event. Only a revision whose chain
/// is broken here is matched by its event ID.
#[test]
fn whole_exports_and_come_backs_of_revised_events_import() {
    for b in BACKENDS {
        let src = TestDb::migrated(b);
        let q = unique("dlq_rev_whole");
        add(&src, "a1", &q);
        let mut twin = letter("a2", &q, br#"{"amount": "1,50"}"#);
        twin["event_id"] = "evt-a1".into();
        import(&src, &file_of(&twin));
        let v = revise(&src, "a1");
        let dst = TestDb::migrated(b);
        import(&dst, &export(&src, &[]));
        assert_eq!(dst.ids(&["--state", "all"]).len(), 3, "{b:?}");
        // The revision replayed elsewhere came back as a new dead letter of its event.
        dst.sql(&[&format!(
            "UPDATE dead_letters SET replayed_at = dead_lettered_at WHERE id = '{v}'"
        )]);
        let mut back = letter("a1-back", &q, br#"{"amount": "1.50"}"#);
        back["event_id"] = "evt-a1".into();
        back["headers"]["x-dead-letter-id"] = v.clone().into();
        import(&dst, &file_of(&back));
    }
}
