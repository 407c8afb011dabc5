//! Revisions (`dlq edit`, `dlq diff`): a fixed copy made in the same transaction that
//! sets the original aside, untouched text kept exactly, and never both copies published.

use crate::common::*;

mod broken_chains;
mod editor;
mod plan;
mod prune_keeps;
mod race;
mod set_aside;

/// A pending dead letter whose body is `body` (JSON text or bytes).
pub fn add(db: &TestDb, id: &str, body: &[u8]) {
    let mut l = letter(id, "dlq_rev_q", body);
    l["event_id"] = serde_json::Value::Null;
    l["headers"] = serde_json::json!({"tenant": "acme", "x-event-id": format!("evt-{id}")});
    db.add(l);
}

/// The one revision of `id` (its show JSON).
pub fn revision_of(db: &TestDb, id: &str) -> serde_json::Value {
    let rid = db.show(id)["revised_as"]
        .as_str()
        .unwrap_or_else(|| panic!("{id} has no revision"))
        .to_string();
    db.show(&rid)
}

pub fn body_of(show: &serde_json::Value) -> Vec<u8> {
    unb64(&show["body_base64"])
}

pub const BODY: &str = r#"{ "id": 12345678901234567890, "amount": "1,50", "rate": 1.10, "huge": 1e400, "name": "Caf\u00e9", "nested": {"z": 1, "a": [1, 2.50]} }"#;

#[test]
fn edit_by_each_method_makes_a_revision_and_sets_the_original_aside() {
    for b in BACKENDS {
        let db = TestDb::migrated(b);
        for id in ["jq", "set", "del", "file", "hdr"] {
            add(&db, id, BODY.as_bytes());
        }
        let new_body = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(new_body.path(), b"\x00not json at all\xff").unwrap();
        let path = new_body.path().to_str().unwrap().to_string();
        let cases: Vec<(&str, Vec<&str>, Vec<u8>)> = vec![
            (
                "jq",
                vec!["--jq", r#".amount |= sub(",";".")"#],
                BODY.replace("1,50", "1.50").into_bytes(),
            ),
            (
                "set",
                vec!["--set", r#"amount="1.50""#, "--set", "extra.tenant=\"t-1\""],
                BODY.replace("1,50", "1.50")
                    .replace("2.50]} }", "2.50]}, \"extra\": {\"tenant\": \"t-1\"} }")
                    .into_bytes(),
            ),
            (
                "del",
                vec!["--delete", "huge"],
                BODY.replace(" \"huge\": 1e400,", "").into_bytes(),
            ),
            (
                "file",
                vec!["--body-file", &path],
                b"\x00not json at all\xff".to_vec(),
            ),
            (
                "hdr",
                vec!["--header", "tenant=globex", "--drop-header", "x-event-id"],
                BODY.as_bytes().to_vec(),
            ),
        ];
        for (id, flags, want) in cases {
            let mut args = vec!["edit", id, "--note", "TICKET-1 fix"];
            args.extend(flags);
            let r = db.dlq(&args);
            assert_eq!(r.code, 0, "{b:?} {id}: {}", r.all());
            let j = r.json();
            assert_eq!(j["outcome"], "edited", "{j}");
            let rev = revision_of(&db, id);
            assert_eq!(j["revision_id"], rev["id"]);
            assert_eq!(j["sha256"], rev["sha256"]);
            assert_eq!(
                body_of(&rev),
                want,
                "{b:?} {id}: {}",
                String::from_utf8_lossy(&body_of(&rev))
            );
            assert_eq!(rev["revision_of"], id);
            assert_eq!(rev["state"], "pending");
            assert_eq!(rev["attempts"], 0);
            assert_eq!(
                rev["event_id"],
                format!("evt-{id}"),
                "the same business event"
            );
            assert_eq!(rev["source_queue"], "dlq_rev_q");
            assert_eq!(rev["error"], "timeout");
            let orig = db.show(id);
            assert_eq!(orig["state"], "discarded");
            let note = format!("revised as {}: TICKET-1 fix", rev["id"].as_str().unwrap());
            assert_eq!(orig["discard_note"], note);
            assert_eq!(
                body_of(&orig),
                BODY.as_bytes(),
                "a stored body never changes"
            );
            for (row, other) in [(&orig, &rev), (&rev, &orig)] {
                let h = row["history"].as_array().unwrap().last().unwrap().clone();
                assert_eq!(
                    (
                        h["action"].as_str(),
                        h["outcome"].as_str(),
                        h["operator"].as_str()
                    ),
                    (Some("edit"), Some("edited"), Some("tester"))
                );
                let d = h["detail"].as_str().unwrap();
                assert!(
                    d.contains("TICKET-1 fix") && d.contains(other["id"].as_str().unwrap()),
                    "{d}"
                );
                assert!(
                    d.contains(orig["sha256"].as_str().unwrap())
                        && d.contains(rev["sha256"].as_str().unwrap()),
                    "{d}"
                );
            }
        }
        let hdr = revision_of(&db, "hdr");
        assert_eq!(hdr["headers"], serde_json::json!({"tenant": "globex"}));
        // `list --revisions` selects the revisions alone.
        assert_eq!(db.ids(&["--revisions"]).len(), 5, "{b:?}");
    }
}

/// `--new-event-id` changes the event ID the revision is published with (its message ID);
/// where the headers or body name the old one, the edit says so, and how to change it.
#[test]
fn a_new_event_id_says_where_the_content_still_names_the_old_one() {
    for b in BACKENDS {
        let db = TestDb::migrated(b);
        add(&db, "hdr", br#"{"amount": "1,50"}"#);
        db.add(letter("col", "dlq_rev_q", br#"{"amount": "1,50"}"#));
        let fresh = |id: &str| {
            let r = db.dlq(&["edit", id, "--new-event-id", "--note", "new event", "--yes"]);
            assert_eq!(r.code, 0, "{b:?}: {}", r.all());
            let j = r.json();
            let rev = db.show(j["revision_id"].as_str().unwrap());
            (j["detail"].as_str().unwrap().to_string(), rev)
        };
        let (said, rev) = fresh("hdr");
        let new = rev["event_id"].as_str().unwrap().to_string();
        assert_ne!(new, "evt-hdr", "{b:?}");
        let named = r#"its x-event-id header "evt-hdr" still names the old event"#;
        assert!(said.contains(named), "{b:?}: {said}");
        // As it says: the header too, and then nothing is left to say.
        let header = format!("x-event-id={new}");
        let rid = rev["id"].as_str().unwrap();
        let r = db.dlq(&[
            "edit", rid, "--header", &header, "--note", "and here", "--yes",
        ]);
        assert_eq!(r.code, 0, "{b:?}: {}", r.all());
        let again = db.show(r.json()["revision_id"].as_str().unwrap());
        assert_eq!(again["event_id"], new.as_str(), "{b:?}");
        assert_eq!(again["headers"]["x-event-id"], new.as_str(), "{b:?}");
        // The event ID in the column only: the content names no other.
        let (said, _) = fresh("col");
        assert!(!said.contains("still name"), "{b:?}: {said}");
    }
}

#[test]
fn untouched_text_stays_exact() {
    for b in BACKENDS {
        let db = TestDb::migrated(b);
        // Pretty, with escapes, big and long numbers, keys in no sorted order.
        let body = "{\n  \"zeta\": 98765432109876543210,\n  \"price\": 1.10,\n  \"far\": 1e400,\n  \"s\": \"\\u00e9\\n\\\"q\\\"\",\n  \"alpha\": [1.0, -0.0, 3E2]\n}\n";
        add(&db, "x1", body.as_bytes());
        add(&db, "x2", body.as_bytes());
        let r = db.dlq(&[
            "edit",
            "x1",
            "--note",
            "n",
            "--jq",
            ".alpha[1] = 7 | .added = \"new\"",
        ]);
        assert_eq!(r.code, 0, "{}", r.all());
        let want = body
            .replace("-0.0", "7")
            .replace("3E2]", "3E2], \"added\": \"new\"");
        assert_eq!(
            String::from_utf8(body_of(&revision_of(&db, "x1"))).unwrap(),
            want,
            "{b:?}"
        );
        let r = db.dlq(&["edit", "x2", "--note", "n", "--set", "s=\"plain\""]);
        assert_eq!(r.code, 0, "{}", r.all());
        let want = body.replace("\"\\u00e9\\n\\\"q\\\"\"", "\"plain\"");
        assert_eq!(
            String::from_utf8(body_of(&revision_of(&db, "x2"))).unwrap(),
            want,
            "{b:?}"
        );
    }
}

#[test]
fn only_a_pending_row_is_edited() {
    for b in BACKENDS {
        let db = TestDb::migrated(b);
        for id in ["claimed", "uncertain", "replayed", "discarded"] {
            add(&db, id, BODY.as_bytes());
        }
        assert_eq!(db.dlq(&["claim", "claimed"]).code, 0);
        db.sql(&[
            "UPDATE dead_letters SET replay_attempt_at = dead_lettered_at WHERE id = 'uncertain'",
            "UPDATE dead_letters SET replayed_at = dead_lettered_at WHERE id = 'replayed'",
        ]);
        assert_eq!(
            db.dlq(&["discard", "discarded", "--note", "n", "--yes"])
                .code,
            0
        );
        for id in ["claimed", "uncertain", "replayed", "discarded"] {
            let r = db.dlq(&["edit", id, "--note", "n", "--set", "amount=1"]);
            assert_eq!(r.code, 3, "{b:?} {id}: {}", r.all());
            let j = r.json();
            assert_eq!(j["outcome"], "not_edited");
            assert!(j["detail"].as_str().unwrap().contains(id), "{j}");
            assert_eq!(j["revision_id"], serde_json::Value::Null);
            assert_eq!(db.show(id)["state"], id, "left as it was");
        }
        let r = db.dlq(&["edit", "nope", "--note", "n", "--set", "amount=1"]);
        assert_eq!(
            (r.code, r.json()["outcome"].as_str()),
            (4, Some("not_found"))
        );
        assert_eq!(db.ids(&["--revisions"]).len(), 0, "{b:?}: no revision");
        // A revised original can never be restored: both copies would be replayable.
        add(&db, "r1", BODY.as_bytes());
        assert_eq!(
            db.dlq(&["edit", "r1", "--note", "n", "--set", "amount=1"])
                .code,
            0
        );
        let r = db.dlq(&["restore", "r1", "--note", "undo", "--yes"]);
        assert_eq!(r.code, 3, "{b:?}: {}", r.all());
        assert_eq!(db.show("r1")["state"], "discarded");
    }
}

#[test]
fn dry_run_changes_nothing_and_a_no_op_is_unchanged() {
    for b in BACKENDS {
        let db = TestDb::migrated(b);
        add(&db, "d1", BODY.as_bytes());
        let before = db.show("d1");
        let r = db.dlq(&[
            "edit",
            "d1",
            "--note",
            "n",
            "--jq",
            ".rate = 2",
            "--dry-run",
        ]);
        assert_eq!(r.code, 0, "{}", r.all());
        let j = r.json();
        assert_eq!(j["outcome"], "would_edit");
        let want = r#"[{"a":1.10,"b":2,"op":"changed","path":"rate"}]"#;
        assert_eq!(j["diff"]["body"].to_string(), want, "numbers as written");
        let r = db.dlq_env(
            &[
                "edit",
                "d1",
                "--note",
                "n",
                "--jq",
                ".rate = 2",
                "--dry-run",
            ],
            &[("DLQ_OUTPUT", "table")],
        );
        assert!(
            r.stdout.contains("-  \"rate\": 1.10,") && r.stdout.contains("+  \"rate\": 2,"),
            "{}",
            r.stdout
        );
        for no_op in [
            vec!["--jq", "."],
            vec!["--jq", ".rate = 1.1"],
            vec!["--set", "name=\"Café\""],
            vec!["--delete", "missing"],
        ] {
            let mut args = vec!["edit", "d1", "--note", "n"];
            args.extend(no_op);
            let r = db.dlq(&args);
            assert_eq!(
                (r.code, r.json()["outcome"].as_str()),
                (0, Some("unchanged")),
                "{}",
                r.all()
            );
        }
        let after = db.show("d1");
        assert_eq!(before, after, "{b:?}: nothing written, not even history");
        assert_eq!(db.ids(&["--revisions"]).len(), 0);
        // A program that fails, yields twice, or a body that is not JSON: not edited.
        for (jq, why) in [
            (".rate.x", "failed"),
            (".rate, .rate", "more than one"),
            ("empty", "no value"),
        ] {
            let r = db.dlq(&["edit", "d1", "--note", "n", "--jq", jq]);
            assert_eq!(r.code, 3, "{}", r.all());
            assert!(
                r.json()["detail"].as_str().unwrap().contains(why),
                "{}",
                r.stdout
            );
        }
        add(&db, "bin", b"\xff\x00");
        let r = db.dlq(&["edit", "bin", "--note", "n", "--set", "a=1"]);
        assert_eq!(
            (r.code, r.json()["outcome"].as_str()),
            (3, Some("not_edited"))
        );
        assert_eq!(
            db.dlq(&["edit", "d1", "--note", "n", "--jq", "("]).code,
            2,
            "a program that does not parse"
        );
    }
}

#[test]
fn diff_of_json_text_and_binary_bodies() {
    let db = TestDb::migrated(Backend::Sqlite);
    add(&db, "j1", br#"{"a": 1, "b": {"c": "x"}, "gone": true}"#);
    add(&db, "j2", br#"{"a": 1, "b": {"c": "y"}, "new": [1]}"#);
    add(&db, "t1", b"line one\nline two\n");
    add(&db, "t2", b"line one\nline 2\n");
    add(&db, "b1", b"\xff\x00\x01\x02");
    add(&db, "b2", b"\xff\x00\x09\x02");
    db.sql(&["UPDATE dead_letters SET headers_json = '{\"tenant\": \"globex\"}' WHERE id = 'j2'"]);
    let j = db.dlq(&["diff", "j1", "j2"]).json();
    assert_eq!(j["a"], "j1");
    assert_eq!(j["kind"], "json");
    assert_eq!(
        j["body"],
        serde_json::json!([
            {"path": "b.c", "op": "changed", "a": "x", "b": "y"},
            {"path": "gone", "op": "removed", "a": true, "b": null},
            {"path": "new", "op": "added", "a": null, "b": [1]},
        ])
    );
    assert_eq!(j["headers"][0]["path"], "tenant");
    assert_eq!(
        j["headers"].as_array().unwrap().len(),
        2,
        "tenant changed, x-event-id removed: {j}"
    );
    let j = db.dlq(&["diff", "t1", "t2"]).json();
    assert_eq!(
        (j["kind"].as_str(), j["body"][0]["path"].as_str()),
        (Some("text"), Some("line 2"))
    );
    assert_eq!(j["body"][0]["a"], "line two\n");
    let j = db.dlq(&["diff", "b1", "b2"]).json();
    assert_eq!(j["kind"], "bytes");
    assert_eq!(j["body"][0]["a"], "01");
    assert_eq!(j["body"][0]["b"], "09");
    let t = db.dlq_env(&["diff", "t1", "t2"], &[("DLQ_OUTPUT", "table")]);
    assert!(
        t.stdout.contains("-line two\n+line 2\n") && t.stdout.contains("@@"),
        "{}",
        t.stdout
    );
    assert!(!t.stdout.contains('\x1b'), "no colour off a terminal");
    assert_eq!(db.dlq(&["diff", "j1", "nope"]).code, 4);
}

#[test]
fn export_and_import_keep_revision_of() {
    for (from, to) in [
        (Backend::Postgres, Backend::Sqlite),
        (Backend::Sqlite, Backend::Postgres),
    ] {
        let a = TestDb::migrated(from);
        add(&a, "o1", BODY.as_bytes());
        assert_eq!(
            a.dlq(&["edit", "o1", "--note", "n", "--set", "amount=1"])
                .code,
            0
        );
        let rid = a.show("o1")["revised_as"].as_str().unwrap().to_string();
        let export = a.dlq(&["export"]);
        assert_eq!(export.code, 0, "{}", export.all());
        let z = TestDb::migrated(to);
        let r = z.dlq_stdin(&["import", "-"], export.stdout.as_bytes());
        assert_eq!(r.code, 0, "{}", r.all());
        assert_eq!(z.show(&rid)["revision_of"], "o1");
        assert_eq!(z.show("o1")["revised_as"], rid.as_str());
        assert_eq!(z.ids(&["--revisions"]), vec![rid]);
        // A revised original stays set aside there too.
        assert_eq!(z.dlq(&["restore", "o1", "--note", "undo", "--yes"]).code, 3);
    }
}
