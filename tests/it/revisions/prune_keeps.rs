//! `prune` keeps a replayed revision while its original is here: the revision is what
//! tells that the original's event went out. Pruned, nothing here said so any more, and
//! `restore` or `import` made the event replayable a second time (review 30).

use super::set_aside::{edited, import, import_refused, prune_settled, replay, revise};
use crate::common::*;

/// Once broke: the revision came by import (no "revised as" in the original's history
/// here); replayed, then pruned, and `restore` made the original pending: the event
/// went out twice.
#[test]
fn a_replayed_revision_is_kept_while_its_original_is_here_and_restore_refuses() {
    for b in BACKENDS {
        let mut mq = Rabbit::new();
        let q = mq.queue("dlq_prune_keeps");
        let e = edited(b, &q);
        let dst = TestDb::migrated(b);
        import(&dst, &e.before);
        let r = dst.dlq(&["discard", "orig", "--note", "not now", "--yes"]);
        assert_eq!(r.code, 0, "{b:?} discard: {}", r.all());
        import(&dst, &e.revisions());
        assert_eq!(replay(&dst, &e.rev).code, 0, "{b:?} replay of the revision");
        let r = prune_settled(&dst, &["--state", "replayed"]);
        assert_eq!(r.json()["deleted"], 0, "{b:?} {}", r.all());
        let dry = [
            "prune",
            "--older-than",
            "1ms",
            "--state",
            "replayed",
            "--dry-run",
        ];
        let dry = dst.dlq_env(&dry, &[("DLQ_OUTPUT", "table")]);
        assert!(dry.all().contains("would delete 0 "), "{b:?} {}", dry.all());
        let r = dst.dlq(&["restore", "orig", "--note", "looks stuck", "--yes"]);
        assert_eq!(r.code, 3, "{b:?} restore: {}", r.all());
        assert_eq!(state(&dst, "orig"), "discarded", "{b:?}");
    }
}

/// Once broke: our revision replayed and pruned, another store's revision of the same
/// original went in beside the original (whose history says "revised as" ours).
#[test]
fn a_sibling_revision_is_refused_after_ours_was_replayed_and_a_prune_ran() {
    for b in BACKENDS {
        let mut mq = Rabbit::new();
        let q = mq.queue("dlq_prune_sibling");
        let e = edited(b, &q);
        let dst = TestDb::migrated(b);
        import(&dst, &e.before);
        let ours = revise(&dst, "orig");
        assert_eq!(replay(&dst, &ours).code, 0, "{b:?} replay of ours");
        let r = prune_settled(&dst, &["--state", "replayed"]);
        assert_eq!(r.json()["deleted"], 0, "{b:?} ours is kept: {}", r.all());
        import_refused(&dst, &e.revisions());
    }
}

/// Once the original is gone, its replayed revision is pruned as any settled row: one
/// prune of both states deletes the original, the next the revision.
#[test]
fn a_replayed_revision_is_pruned_once_its_original_is_gone() {
    let mut mq = Rabbit::new();
    let q = mq.queue("dlq_prune_after");
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("orig", &q, br#"{"amount": "1,50"}"#));
    let rev = revise(&db, "orig");
    assert_eq!(replay(&db, &rev).code, 0);
    let both = ["--state", "replayed,discarded"];
    assert_eq!(
        prune_settled(&db, &both).json()["deleted"],
        1,
        "the original"
    );
    assert_eq!(
        prune_settled(&db, &both).json()["deleted"],
        1,
        "then the revision"
    );
    assert_eq!(db.scalar("SELECT count(*) FROM dead_letters"), 0);
}
