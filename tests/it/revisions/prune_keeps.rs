//! `prune` keeps a revision while its original is here, so a chain goes from its first
//! row down: a replayed revision is what tells that the original's event went out, and
//! a middle one is what links it to the original. Pruned, nothing here said so any more,
//! and `restore` or `import` made the event replayable a second time (reviews 30, 31).

use super::set_aside::{edited, export, import, import_refused, prune_settled, replay, revise};
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

/// `id` edited again here; the new revision's ID.
fn revise_again(db: &TestDb, id: &str) -> String {
    let r = db.dlq(&["edit", id, "--note", "again", "--set", r#"amount="1.51""#]);
    assert_eq!(r.code, 0, "edit {id}: {}", r.all());
    r.json()["revision_id"].as_str().unwrap().to_string()
}

/// Once broke (review 31): only a replayed revision's direct original kept it. With
/// orig -> r1 -> r2 (r2 replayed), a prune of discarded revisions deleted r1, the next
/// one r2, and another store's revision of orig went in and out again.
#[test]
fn a_chain_is_pruned_from_its_first_row_down() {
    for b in BACKENDS {
        let mut mq = Rabbit::new();
        let q = mq.queue("dlq_prune_chain");
        let e = edited(b, &q);
        let dst = TestDb::migrated(b);
        import(&dst, &e.before);
        let r1 = revise(&dst, "orig");
        let r2 = revise_again(&dst, &r1);
        assert_eq!(replay(&dst, &r2).code, 0, "{b:?} replay of r2");
        let r = prune_settled(&dst, &["--state", "discarded", "--revisions"]);
        assert_eq!(r.json()["deleted"], 0, "{b:?} r1 is kept: {}", r.all());
        let r = prune_settled(&dst, &["--state", "replayed"]);
        assert_eq!(r.json()["deleted"], 0, "{b:?} r2 is kept: {}", r.all());
        import_refused(&dst, &e.revisions());
    }
}

/// The same when the chain came by import and the original was discarded here, by a
/// routine prune of age: orig is restored refused, its event out once.
#[test]
fn a_routine_prune_leaves_an_imported_chain_that_keeps_its_original_set_aside() {
    for b in BACKENDS {
        let mut mq = Rabbit::new();
        let q = mq.queue("dlq_prune_age");
        let e = edited(b, &q);
        let r2 = revise_again(&e.src, &e.rev);
        assert_eq!(
            replay(&e.src, &r2).code,
            0,
            "{b:?} replay of r2 in the source"
        );
        let dst = TestDb::migrated(b);
        std::thread::sleep(std::time::Duration::from_secs(3));
        import(&dst, &e.before);
        let r = dst.dlq(&["discard", "orig", "--note", "not now", "--yes"]);
        assert_eq!(r.code, 0, "{b:?} discard: {}", r.all());
        import(&dst, &export(&e.src, &["--revisions"]));
        for _ in 0..2 {
            let p = [
                "prune",
                "--older-than",
                "2s",
                "--state",
                "replayed,discarded",
                "--yes",
            ];
            let p = dst.dlq(&p);
            assert_eq!(p.json()["deleted"], 0, "{b:?} {}", p.all());
        }
        let r = dst.dlq(&["restore", "orig", "--note", "looks stuck", "--yes"]);
        assert_eq!(r.code, 3, "{b:?} restore must refuse: {}", r.all());
    }
}
