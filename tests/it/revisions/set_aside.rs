//! A revised original stays set aside whatever happens to its revision afterwards
//! (prune, export and import, a failed `edit --plan`), and neither `import` nor `restore`
//! makes a second live copy of an event its revision chain links: one business event
//! never goes out through both copies. (Copies whose chain is broken here:
//! `broken_chains`.)

use crate::common::*;
use tempfile::NamedTempFile;

/// A pending dead letter of `queue` with event `evt-ID` and a JSON body.
pub(super) fn add(db: &TestDb, id: &str, queue: &str) {
    db.add(letter(id, queue, br#"{"amount": "1,50"}"#));
}

/// Edits `id` (a one-field fix) and returns its revision's ID.
pub(super) fn revise(db: &TestDb, id: &str) -> String {
    let r = db.dlq(&[
        "edit",
        id,
        "--note",
        "fix the amount",
        "--set",
        r#"amount="1.50""#,
    ]);
    assert_eq!(r.code, 0, "edit {id}: {}", r.all());
    r.json()["revision_id"].as_str().unwrap().to_string()
}

pub(super) fn replay(db: &TestDb, id: &str) -> Run {
    db.dlq(&["replay", id, "--yes"])
}

/// The messages of `queue` that carry event `event` (by message_id).
fn of_event(msgs: &[Received], event: &str) -> usize {
    msgs.iter()
        .filter(|m| m.message_id.as_deref() == Some(event))
        .count()
}

/// `prune --older-than 1s ARGS --yes`, a second after now: the rows settled until now go.
pub(super) fn prune_settled(db: &TestDb, args: &[&str]) -> Run {
    std::thread::sleep(std::time::Duration::from_millis(1200));
    let mut a = vec!["prune", "--older-than", "1s", "--yes"];
    a.extend_from_slice(args);
    let r = db.dlq(&a);
    assert_eq!(r.code, 0, "{:?} prune: {}", db.backend, r.all());
    r
}

/// Once broke: `prune` deleted a replayed revision, and with it the only trace
/// (`revision_of`) that `restore` looked at, so the revised original could be made
/// pending again and replayed: the event went out through both copies. (A replayed
/// revision is now kept while its original is here: see prune_keeps.rs.)
#[test]
fn a_revised_original_stays_set_aside_after_its_revision_is_pruned() {
    for b in BACKENDS {
        let db = TestDb::migrated(b);
        let mut mq = Rabbit::new();
        let q = mq.queue("dlq_rev_prune");
        add(&db, "orig", &q);
        let rev = revise(&db, "orig");
        let r = replay(&db, &rev);
        assert_eq!(r.code, 0, "{b:?} replay of the revision: {}", r.all());
        let r = prune_settled(&db, &["--state", "replayed"]);
        assert_eq!(r.json()["deleted"], 0, "{b:?} the revision is kept");
        let r = db.dlq(&["restore", "orig", "--note", "looks stuck", "--yes"]);
        assert_eq!(
            r.code,
            3,
            "{b:?} a revised original must not become pending again: {}",
            r.all()
        );
        assert_eq!(db.show("orig")["state"], "discarded", "{b:?}");
        // Whatever the operator does next, the event is out once.
        replay(&db, "orig");
        assert_eq!(of_event(&mq.drain(&q), "evt-orig"), 1, "{b:?}");
    }
}

/// The same through a chain: the revision was itself revised, and `prune --state
/// discarded` removed the middle link, so the first original lost its guard.
#[test]
fn a_revised_original_stays_set_aside_after_the_middle_of_a_chain_is_pruned() {
    for b in BACKENDS {
        let db = TestDb::migrated(b);
        let mut mq = Rabbit::new();
        let q = mq.queue("dlq_rev_chain");
        add(&db, "first", &q);
        let middle = revise(&db, "first");
        let r = db.dlq(&["edit", &middle, "--note", "again", "--set", "extra=1"]);
        assert_eq!(r.code, 0, "{b:?} edit of the revision: {}", r.all());
        let last = r.json()["revision_id"].as_str().unwrap().to_string();
        // Only the middle link: its discarded_at is the newest of the two discarded.
        let r = prune_settled(&db, &["--state", "discarded", "--revisions"]);
        assert_eq!(
            r.json()["deleted"],
            0,
            "{b:?} the middle revision is kept (prune_keeps.rs)"
        );
        let r = db.dlq(&["restore", "first", "--note", "looks stuck", "--yes"]);
        assert_eq!(r.code, 3, "{b:?} restore of the first: {}", r.all());
        replay(&db, "first");
        let r = replay(&db, &last);
        assert_eq!(r.code, 0, "{b:?} the last revision replays: {}", r.all());
        assert_eq!(of_event(&mq.drain(&q), "evt-first"), 1, "{b:?}");
    }
}

/// `dlq export` of the rows `list_args` select, as a file for `import`.
pub(super) fn export(db: &TestDb, args: &[&str]) -> NamedTempFile {
    let mut a = vec!["export"];
    a.extend_from_slice(args);
    let r = db.dlq(&a);
    assert_eq!(r.code, 0, "export: {}", r.all());
    let f = NamedTempFile::new().unwrap();
    std::fs::write(f.path(), &r.stdout).unwrap();
    f
}

fn path(f: &NamedTempFile) -> &str {
    f.path().to_str().unwrap()
}

/// `import FILE` into `db`: it goes in.
pub(super) fn import(db: &TestDb, f: &NamedTempFile) {
    let r = db.dlq(&["import", path(f)]);
    assert_eq!(r.code, 0, "{:?} import: {}", db.backend, r.all());
}

/// `import FILE` into `db`: refused (exit 2) as a second live copy of one event, with
/// nothing imported. Returns the run, for what its message names.
pub(super) fn import_refused(db: &TestDb, f: &NamedTempFile) -> Run {
    let before = db.ids(&["--state", "all"]);
    let r = db.dlq(&["import", path(f)]);
    assert_eq!(r.code, 2, "{:?} import: {}", db.backend, r.all());
    assert!(r.all().contains("copies of one event"), "{}", r.all());
    assert_eq!(db.ids(&["--state", "all"]), before, "nothing imported");
    r
}

/// `orig`, a pending dead letter of a store of `b`, exported before its edit, then edited.
pub(super) struct Edited {
    pub src: TestDb,
    /// The export taken before the edit (a backup): `orig` pending.
    pub before: NamedTempFile,
    /// The revision of `orig`.
    pub rev: String,
}

pub(super) fn edited(b: Backend, queue: &str) -> Edited {
    let src = TestDb::migrated(b);
    add(&src, "orig", queue);
    let before = export(&src, &[]);
    let rev = revise(&src, "orig");
    Edited { src, before, rev }
}

impl Edited {
    /// `export --revisions` now.
    pub fn revisions(&self) -> NamedTempFile {
        export(&self.src, &["--revisions"])
    }
}

/// Imports `one` then `other` into a fresh store, in both orders: the second import is
/// refused and leaves the first's rows alone; one stream of both is refused as a whole.
pub(super) fn refused_in_either_order(b: Backend, one: &NamedTempFile, other: &NamedTempFile) {
    for order in [[one, other], [other, one]] {
        let dst = TestDb::migrated(b);
        import(&dst, order[0]);
        import_refused(&dst, order[1]);
        let dst = TestDb::migrated(b);
        let both = [
            std::fs::read(order[0].path()).unwrap(),
            std::fs::read(order[1].path()).unwrap(),
        ];
        let r = dst.dlq_stdin(&["import", "-"], &both.concat());
        assert_eq!(r.code, 2, "{b:?} one stream: {}", r.all());
        assert!(dst.ids(&["--state", "all"]).is_empty(), "{b:?}");
    }
}

/// Once broke: an export of the original taken before the edit (a backup) and one of its
/// revision, imported into another store, made both pending: the event went out twice.
/// In either order, and in one stream, the import that would make an original and its
/// revision both replayable is refused and imports nothing.
#[test]
fn import_never_makes_an_original_and_its_revision_both_replayable() {
    for b in BACKENDS {
        let e = edited(b, &unique("dlq_rev_import"));
        refused_in_either_order(b, &e.before, &e.revisions());
        // The whole store (the original set aside) moves as it is.
        let dst = TestDb::migrated(b);
        import(&dst, &export(&e.src, &[]));
        assert_eq!(dst.ids(&["--state", "pending"]), vec![e.rev], "{b:?}");
    }
}

/// The session of a query of PostgreSQL's import check, held idle in its transaction.
const CHECKED: &str = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                       AND state = 'idle in transaction' AND query LIKE 'WITH RECURSIVE chain%'";

/// A proxy to PostgreSQL that holds each COMMIT for 5 s, and `db`'s URL through it.
fn commit_held(db: &TestDb) -> (Proxy, String) {
    let commit = b"Q\0\0\0\x0bCOMMIT\0".to_vec();
    let proxy = Proxy::start(
        "127.0.0.1:5432",
        OnServerBytes::HoldClientBytes(commit, std::time::Duration::from_secs(5)),
    );
    let url = format!(
        "{}?sslmode=disable",
        db.url.replace("127.0.0.1:5432", &proxy.addr())
    );
    (proxy, url)
}

/// Once broke: two imports at once on PostgreSQL, one of the original (pending) and one
/// of its revision, each passed its live-pair check blind to the other's uncommitted rows
/// and both committed: the event could go out twice. Import A's COMMIT is held by a proxy
/// once its check has run; import B runs meanwhile. Once broke again (review): under a
/// database default of REPEATABLE READ the check after the lock read an old snapshot.
/// SQLite needs no such test: its imports' commit points are BEGIN IMMEDIATE, so writers
/// are serialised.
#[test]
fn concurrent_imports_never_make_an_original_and_its_revision_both_replayable() {
    let e = edited(Backend::Postgres, &unique("dlq_rev_import_race"));
    let revisions = e.revisions();
    let (before, revisions) = (path(&e.before), path(&revisions));
    let runs = [
        ("read committed", [before, revisions]),
        ("read committed", [revisions, before]),
        ("repeatable read", [before, revisions]),
    ];
    for (isolation, [a, b]) in runs {
        let dst = TestDb::migrated(Backend::Postgres);
        dst.default_isolation(isolation);
        let (_proxy, url) = commit_held(&dst);
        let first = dst.spawn_env(&["import", a], &[("DLQ_DATABASE_URL", &url)]);
        // A has run its check (its last statement) and its COMMIT is held.
        wait_until("import A's check", 60, || dst.scalar(CHECKED) > 0);
        // B may wait for A's commit: longer than the default lock timeout.
        let second = dst.dlq_env(&["import", b], &[("DLQ_LOCK_TIMEOUT", "60s")]);
        let first = Run::from(first.wait_with_output().unwrap());
        let mut codes = [first.code, second.code];
        codes.sort();
        assert_eq!(
            codes,
            [0, 2],
            "{isolation}: A: {}\nB: {}",
            first.all(),
            second.all()
        );
        let refused = if first.code == 2 { &first } else { &second };
        assert!(
            refused.all().contains("copies of one event"),
            "{}",
            refused.all()
        );
        assert_eq!(
            dst.ids(&["--state", "pending"]).len(),
            1,
            "{isolation}: {a} then {b}"
        );
        assert_eq!(
            dst.ids(&["--state", "all"]).len(),
            1,
            "the refused import left nothing"
        );
    }
}

/// Once broke: on PostgreSQL a `restore` of a plainly discarded original, run while an
/// import of its revision was between its live-pair check and its COMMIT, passed its
/// not-revised guard (blind to the uncommitted revision; it took no lock) and both rows
/// were pending. The import's COMMIT is held by a proxy once its check has run; the
/// restore waits for it, then finds the revision and refuses.
#[test]
fn restore_racing_an_import_of_its_revision_never_makes_both_replayable() {
    let e = edited(Backend::Postgres, &unique("dlq_rev_restore_race"));
    let dst = TestDb::migrated(Backend::Postgres);
    import(&dst, &e.before);
    let r = dst.dlq(&["discard", "orig", "--note", "not now", "--yes"]);
    assert_eq!(r.code, 0, "discard: {}", r.all());
    let (_proxy, url) = commit_held(&dst);
    let revisions = e.revisions();
    let import = dst.spawn_env(&["import", path(&revisions)], &[("DLQ_DATABASE_URL", &url)]);
    wait_until("the import's check", 60, || dst.scalar(CHECKED) > 0);
    // The restore may wait for the import's commit: longer than the default lock timeout.
    let restore = dst.dlq_env(
        &["restore", "orig", "--note", "after all", "--yes"],
        &[("DLQ_LOCK_TIMEOUT", "60s")],
    );
    let import = Run::from(import.wait_with_output().unwrap());
    assert_eq!(import.code, 0, "import: {}", import.all());
    assert_eq!(restore.code, 3, "restore: {}", restore.all());
    assert_eq!(dst.ids(&["--state", "pending"]), vec![e.rev]);
    assert_eq!(dst.show("orig")["state"], "discarded");
}

/// Once broke: `restore` checked only that no revision was made of the row. A revision
/// set aside in its store (discarded), imported beside its original, pending here, was
/// made pending again: the event could go out through both.
#[test]
fn restore_never_makes_a_revision_live_beside_its_live_original() {
    for b in BACKENDS {
        let e = edited(b, &unique("dlq_rev_restore_copy"));
        let r = e
            .src
            .dlq(&["discard", &e.rev, "--note", "not yet", "--yes"]);
        assert_eq!(r.code, 0, "{b:?} discard: {}", r.all());
        let dst = TestDb::migrated(b);
        import(&dst, &e.before);
        import(&dst, &e.revisions());
        let r = dst.dlq(&["restore", &e.rev, "--note", "after all", "--yes"]);
        assert_eq!(r.code, 3, "{b:?} restore: {}", r.all());
        let j = r.json();
        assert_eq!(j["outcome"], "not_restored", "{j}");
        let detail = j["detail"].as_str().unwrap();
        assert!(
            detail.contains("\"orig\"") && detail.contains("copies of one event"),
            "{detail}"
        );
        assert_eq!(dst.ids(&["--state", "pending"]), vec!["orig"], "{b:?}");
        let r = dst.dlq(&["discard", "orig", "--note", "the revision instead", "--yes"]);
        assert_eq!(r.code, 0, "{b:?} discard: {}", r.all());
        // The original set aside, its revision may be restored.
        let r = dst.dlq(&["restore", &e.rev, "--note", "after all", "--yes"]);
        assert_eq!(r.code, 0, "{b:?} restore: {}", r.all());
    }
}

/// Once broke: `edit --plan --plan-out` with a path it cannot write made every revision,
/// then failed (exit 2, "bad arguments") with no summary and no plan of them: the
/// reviewed plan was spent and nothing said which revisions to replay. The path is
/// checked before anything is edited.
#[test]
fn edit_plan_with_an_unwritable_plan_out_edits_nothing() {
    let db = TestDb::migrated(Backend::Sqlite);
    for id in ["a", "b", "c"] {
        add(&db, id, "dlq_rev_planout");
    }
    let plan = db.plan_file(&["--reason", "retries_exhausted"]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("no-such-dir").join("revisions.json");
    let r = db.dlq(&[
        "edit",
        "--plan",
        plan.path().to_str().unwrap(),
        "--set",
        r#"amount="1.50""#,
        "--note",
        "fix",
        "--yes",
        "--plan-out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(r.stderr.contains("--plan-out"), "{}", r.all());
    assert!(
        db.ids(&["--revisions", "--state", "all"]).is_empty(),
        "no revision made"
    );
    assert_eq!(
        db.ids(&["--state", "pending"]).len(),
        3,
        "the originals are as they were"
    );
}

/// Once broke: an import checked a revision only against its original; a revision made
/// elsewhere of an original already revised here went in beside this store's revision,
/// two pending copies of one event.
#[test]
fn import_never_makes_two_revisions_of_one_original_both_replayable() {
    for b in BACKENDS {
        let e = edited(b, &unique("dlq_rev_siblings"));
        let dst = TestDb::migrated(b);
        import(&dst, &e.before);
        let ours = revise(&dst, "orig");
        import_refused(&dst, &e.revisions());
        assert_eq!(dst.ids(&["--state", "pending"]), vec![ours], "{b:?}");
    }
}

/// Edits the revision `id` again (another change than [`revise`]'s) and returns the new
/// revision's ID: a revision of a revision.
fn revise_again(db: &TestDb, id: &str) -> String {
    let r = db.dlq(&["edit", id, "--note", "again", "--set", "extra=1"]);
    assert_eq!(r.code, 0, "edit of the revision {id}: {}", r.all());
    r.json()["revision_id"].as_str().unwrap().to_string()
}

/// Once broke: the check paired a revision only with its direct original and its
/// siblings. `orig` edited into R1 and R1 into R2: the export of R1 (discarded) and R2
/// (pending) went in beside the export of `orig` taken before the edits, `orig` and R2
/// both pending, one event replayable twice.
#[test]
fn import_never_makes_an_original_and_a_revision_of_its_revision_both_replayable() {
    for b in BACKENDS {
        let e = edited(b, &unique("dlq_rev_chain_import"));
        let r2 = revise_again(&e.src, &e.rev);
        refused_in_either_order(b, &e.before, &e.revisions());
        // The whole chain (orig and R1 set aside) moves as it is.
        let dst = TestDb::migrated(b);
        import(&dst, &export(&e.src, &[]));
        assert_eq!(dst.ids(&["--state", "pending"]), vec![r2], "{b:?}");
    }
}

/// Once broke: a revision of `orig` made elsewhere went in beside this store's revision
/// of a revision of `orig` (its first revision set aside, so no sibling was live): two
/// pending copies of one event.
#[test]
fn import_never_makes_a_revision_live_beside_a_revision_of_a_sibling() {
    for b in BACKENDS {
        let e = edited(b, &unique("dlq_rev_cousins"));
        let dst = TestDb::migrated(b);
        import(&dst, &e.before);
        let ours = revise(&dst, "orig");
        let ours = revise_again(&dst, &ours);
        import_refused(&dst, &e.revisions());
        assert_eq!(dst.ids(&["--state", "pending"]), vec![ours], "{b:?}");
    }
}

/// `import -` of `lines`, failing the test if it runs for more than a minute (a walk of
/// `revision_of` that loops).
fn import_bounded(db: &TestDb, lines: &[serde_json::Value]) -> Run {
    use std::io::Write;
    use std::process::Stdio;
    let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
    let mut child = db
        .cmd()
        .args(["import", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("import still running after 60 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    Run::from(child.wait_with_output().unwrap())
}

/// Once broke: a crafted import whose rows name each other in a ring a → b → c → d → a,
/// b and d set aside, put a and c in both pending: neither names the other nor shares
/// its original, yet each descends from the other. By the rule (shared ancestors, both
/// live) the import is refused; the walk of a ring ends (and so does one of two rows
/// naming each other, refused as before).
#[test]
fn import_of_a_revision_of_cycle_ends_and_is_refused() {
    for b in BACKENDS {
        let ring = |ids: &[&str], discarded: &[&str]| -> Vec<serde_json::Value> {
            let q = unique("dlq_rev_ring");
            (0..ids.len())
                .map(|i| {
                    let mut l = letter(ids[i], &q, br#"{"amount": "1,50"}"#);
                    l["event_id"] = "evt-ring".into();
                    l["revision_of"] = ids[(i + 1) % ids.len()].into();
                    if discarded.contains(&ids[i]) {
                        l["discarded_at"] = "2026-01-02T03:04:05Z".into();
                        l["discard_note"] = "revised".into();
                    }
                    l
                })
                .collect()
        };
        for lines in [
            ring(&["a", "b", "c", "d"], &["b", "d"]),
            ring(&["a", "b"], &[]),
        ] {
            let dst = TestDb::migrated(b);
            let r = import_bounded(&dst, &lines);
            assert_eq!(r.code, 2, "{b:?} {} rows: {}", lines.len(), r.all());
            assert!(r.all().contains("copies of one event"), "{}", r.all());
            assert!(dst.ids(&["--state", "all"]).is_empty(), "{b:?}");
            // The ring with one live row is one live copy: it goes in.
            let one_live: Vec<_> = lines
                .iter()
                .cloned()
                .map(|mut l| {
                    if l["id"] != "a" {
                        l["discarded_at"] = "2026-01-02T03:04:05Z".into();
                    }
                    l
                })
                .collect();
            let r = import_bounded(&dst, &one_live);
            assert_eq!(r.code, 0, "{b:?} one live: {}", r.all());
            assert_eq!(dst.ids(&["--state", "pending"]), vec!["a"], "{b:?}");
        }
    }
}

/// Once broke: a worker stored the original's `id` as a BLOB; an import of its revision
/// (made with `--new-event-id`, so no event ID links them) found no row for its
/// `revision_of` (a TEXT never equals a BLOB) and went in: once the id was made TEXT as
/// dlq says to, both were pending.
#[test]
fn import_of_a_revision_finds_an_original_whose_id_a_worker_stored_as_bytes() {
    let src = TestDb::migrated(Backend::Sqlite);
    let q = unique("dlq_rev_blob");
    add(&src, "orig", &q);
    let r = src.dlq(&[
        "edit",
        "orig",
        "--note",
        "fix",
        "--set",
        r#"amount="1.50""#,
        "--new-event-id",
    ]);
    assert_eq!(r.code, 0, "edit: {}", r.all());
    let revisions = export(&src, &["--revisions"]);
    let dst = TestDb::migrated(Backend::Sqlite);
    dst.sql(&[&format!(
        "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, source_queue) \
         VALUES (CAST('orig' AS BLOB), X'7b7d', 'retries_exhausted', 1, '{{}}', '{q}')"
    )]);
    let r = dst.dlq(&["import", revisions.path().to_str().unwrap()]);
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(r.all().contains("copies of one event"), "{}", r.all());
    assert_eq!(dst.scalar("SELECT count(*) FROM dead_letters"), 1);
}
