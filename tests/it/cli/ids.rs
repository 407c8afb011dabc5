//! The ID a person types: spaces around it trimmed, a unique prefix of 8 characters or
//! more taken for the full ID, an ambiguous one refused with its candidates.

use crate::common::*;

/// Three rows: two share the prefix `aaaabbbb`, one is alone under `ccccdddd`.
fn three(db: &TestDb, q: &str) -> (String, String, String) {
    let ids = (
        "aaaabbbb-1111-0000".to_string(),
        "aaaabbbb-2222-0000".to_string(),
        "ccccdddd-3333-0000".to_string(),
    );
    for id in [&ids.0, &ids.1, &ids.2] {
        db.add(letter(id, q, b"{\"n\":1}"));
    }
    ids
}

#[test]
fn a_unique_prefix_is_the_full_id_for_show_on_both_stores() {
    for backend in BACKENDS {
        let db = TestDb::migrated(backend);
        let (_, _, alone) = three(&db, "q");
        let r = db.dlq(&["show", "ccccdddd"]);
        assert_eq!(r.code, 0, "{backend:?}: {}", r.all());
        assert_eq!(r.json()["id"], alone.as_str(), "{backend:?}");
        let r = db.dlq(&["show", "ccccdddd-33"]);
        assert_eq!(r.json()["id"], alone.as_str(), "{backend:?}");
    }
}

#[test]
fn an_ambiguous_prefix_is_refused_with_its_candidates() {
    for backend in BACKENDS {
        let db = TestDb::migrated(backend);
        let (a, b, _) = three(&db, "q");
        for args in [
            vec!["show", "aaaabbbb"],
            vec!["note", "aaaabbbb", "a note"],
            vec!["diff", "aaaabbbb", "ccccdddd"],
        ] {
            let r = db.dlq(&args);
            assert_eq!(r.code, 2, "{backend:?} {args:?}: {}", r.all());
            assert!(r.stdout.is_empty(), "{}", r.stdout);
            let line = r.stderr.trim();
            assert_eq!(line.lines().count(), 1, "{line}");
            assert!(line.starts_with("dlq: error: "), "{line}");
            assert!(line.contains(&a) && line.contains(&b), "{line}");
        }
    }
}

#[test]
fn a_short_prefix_is_not_found_and_an_exact_id_wins_over_a_prefix() {
    let db = TestDb::migrated(Backend::Sqlite);
    three(&db, "q");
    // Seven characters: looked up as they are.
    let r = db.dlq(&["show", "ccccddd"]);
    assert_eq!(r.code, 4, "{}", r.all());
    assert_eq!(r.json()["outcome"], "not_found");
    // An ID that is also the prefix of others is itself.
    db.add(letter("aaaabbbb", "q", b"{}"));
    let r = db.dlq(&["show", "aaaabbbb"]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(r.json()["id"], "aaaabbbb");
    // A prefix nothing starts with: not_found as before.
    let r = db.dlq(&["show", "zzzzzzzzzz"]);
    assert_eq!(r.code, 4, "{}", r.all());
    assert_eq!(r.json()["id"], "zzzzzzzzzz");
}

#[test]
fn spaces_around_a_pasted_id_are_trimmed() {
    for backend in BACKENDS {
        let db = TestDb::migrated(backend);
        let (_, _, alone) = three(&db, "q");
        let pasted = format!("  {alone}\t\n");
        let r = db.dlq(&["show", &pasted]);
        assert_eq!(r.code, 0, "{backend:?}: {}", r.all());
        assert_eq!(r.json()["id"], alone.as_str());
        let r = db.dlq(&["note", " ccccdddd ", "pasted"]);
        assert_eq!(r.code, 0, "{backend:?}: {}", r.all());
        assert_eq!(r.json()["id"], alone.as_str(), "{}", r.stdout);
    }
}

/// The replay of a prefix claims, publishes, marks and reports the full ID.
#[test]
fn a_replay_of_a_unique_prefix_uses_the_full_id_throughout() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_prefix_replay");
    let db = TestDb::migrated(Backend::Postgres);
    let (_, _, alone) = three(&db, &q);
    let r = db.dlq(&["replay", " ccccdddd", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(r.json()["id"], alone.as_str(), "{}", r.stdout);
    assert_eq!(db.show(&alone)["state"], "replayed");
    let got = rabbit.drain(&q);
    assert_eq!(got.len(), 1);
    let r = db.dlq(&["replay", "aaaabbbb", "--yes"]);
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(rabbit.drain(&q).is_empty());
}
