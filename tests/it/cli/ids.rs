//! The ID a person types: spaces around it trimmed; for reading (`show`, `diff`) a unique
//! prefix of 8 characters or more taken for the full ID, an ambiguous one refused with its
//! candidates; a command that changes something takes only the full ID.

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
        // Said on stderr: the row shown is not the ID typed.
        assert!(r.stderr.contains(&alone), "{}", r.stderr);
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
        let r = db.dlq(&["note", &pasted, "pasted"]);
        assert_eq!(r.code, 0, "{backend:?}: {}", r.all());
        assert_eq!(r.json()["id"], alone.as_str(), "{}", r.stdout);
    }
}

/// Once broke: a full ID that no longer existed (pruned) became the one longer ID it
/// starts (the same event dead-lettered again), and `replay --yes` published the event a
/// second time with exit 0; `resolve`, `discard` and `edit` acted on that other row too.
#[test]
fn a_command_that_changes_something_takes_only_the_full_id() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_prefix_change");
    let db = TestDb::migrated(Backend::Postgres);
    db.add(letter("evt-9001-2", &q, b"{\"n\":1}"));
    for args in [
        vec!["replay", "evt-9001", "--yes"],
        vec!["resolve", "evt-9001", "--delivered", "--note", "n"],
        vec!["discard", "evt-9001", "--note", "n", "--yes"],
        vec!["note", "evt-9001", "n"],
        vec!["claim", "evt-9001"],
        vec!["edit", "evt-9001", "--set", "n=2", "--note", "n", "--yes"],
    ] {
        let r = db.dlq(&args);
        assert_eq!(r.code, 4, "{args:?}: {}", r.all());
    }
    let s = db.show("evt-9001-2");
    assert_eq!(s["state"], "pending", "{s}");
    assert_eq!(s["history"], serde_json::json!([]), "{s}");
    assert!(rabbit.drain(&q).is_empty(), "published");
    // The full ID, pasted with spaces, is replayed.
    let r = db.dlq(&["replay", " evt-9001-2\n", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(r.json()["id"], "evt-9001-2", "{}", r.stdout);
    assert_eq!(rabbit.drain(&q).len(), 1);
}

/// IDs that share a prefix up to characters at the edges of the code point range: the
/// range of the primary key that PostgreSQL reads for a prefix (where IDs sort by code
/// point, issue 24) holds every one of them, and nothing else; an ICU collation, where
/// they do not sort so, is tested row by row as before.
#[test]
fn a_prefix_finds_ids_past_the_edges_of_the_code_points_in_every_collation() {
    for collation in [None, Some("und-x-icu")] {
        let db = TestDb::migrated(Backend::Postgres);
        if let Some(c) = collation {
            db.sql(&[&format!(
                "ALTER TABLE dead_letters ALTER COLUMN id TYPE text COLLATE \"{c}\""
            )]);
        }
        let ids = [
            "edgecase\u{10FFFF}",
            "edgecase\u{D7FF}",
            "edgecase\u{E000}",
            "edgecasf",
            "edgecasd\u{10FFFF}",
        ];
        for id in ids {
            db.add(letter(id, "q", b"{}"));
        }
        // Three start with "edgecase"; "edgecasf" and "edgecasd…" sort beside them.
        let r = db.dlq(&["show", "edgecase"]);
        assert_eq!(r.code, 2, "{collation:?}: {}", r.all());
        for id in &ids[..3] {
            assert!(
                r.stderr.contains(id),
                "{collation:?}: {id:?} in {}",
                r.stderr
            );
        }
        for id in &ids[3..] {
            assert!(
                !r.stderr.contains(id),
                "{collation:?}: {id:?} in {}",
                r.stderr
            );
        }
        for (prefix, id) in [
            ("edgecase\u{D7FF}", ids[1]),
            ("edgecase\u{10FFFF}", ids[0]),
            ("edgecasd\u{10FFFF}", ids[4]),
        ] {
            let r = db.dlq(&["show", prefix]);
            assert_eq!(r.code, 0, "{collation:?} {prefix:?}: {}", r.all());
            assert_eq!(r.json()["id"], id, "{collation:?} {prefix:?}");
        }
        let r = db.dlq(&["show", "edgecasd"]);
        assert_eq!(r.code, 0, "{collation:?}: {}", r.all());
        assert_eq!(r.json()["id"], ids[4], "{collation:?}");
    }
}
