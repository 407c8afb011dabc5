//! `dlq import`: all or nothing, naming line and field; what it refuses (a line of the
//! wrong shape or type, 100 MiB); `show` output read back.

use super::*;
use crate::common::*;
use serde_json::json;

/// An import line refused for a value of the wrong type says so, not "not a JSON
/// object" (found by the big-body review: the reader blamed every data error on the
/// line's shape).
#[test]
fn an_import_line_with_a_wrong_value_says_what_is_wrong() {
    let db = TestDb::migrated(Backend::Sqlite);
    let line =
        r#"{"id":"a","reason":"r","body_text":"x","headers":{"$serde_json::private::Number":5}}"#;
    let r = db.dlq_stdin(&["import", "-"], format!("{line}\n").as_bytes());
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(!r.stderr.contains("not a JSON object"), "{}", r.stderr);
    assert!(r.stderr.contains("line 1"), "{}", r.stderr);
    assert!(r.stderr.contains("invalid type"), "{}", r.stderr);
    assert_eq!(db.dlq(&["list"]).json(), serde_json::json!([]));
    // A line that is not an object is still refused by its line.
    let r = db.dlq_stdin(&["import", "-"], b"[1, 2]\n");
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(
        r.stderr.contains("line 1") && r.stderr.contains("object"),
        "{}",
        r.stderr
    );
}

#[test]
fn an_import_line_of_100_mib_is_refused_and_nothing_written() {
    let db = TestDb::migrated(Backend::Sqlite);
    let f = tempfile::NamedTempFile::new().unwrap();
    {
        use std::io::Write;
        let mut w = std::io::BufWriter::new(std::fs::File::create(f.path()).unwrap());
        writeln!(
            w,
            "{}",
            serde_json::json!({"id": "small", "body_text": "{}", "reason": "poison_message"})
        )
        .unwrap();
        write!(
            w,
            "{{\"id\":\"huge\",\"reason\":\"poison_message\",\"body_text\":\""
        )
        .unwrap();
        let chunk = vec![b'a'; 1 << 20];
        for _ in 0..100 {
            w.write_all(&chunk).unwrap();
        }
        writeln!(w, "\"}}").unwrap();
    }
    let r = db.dlq(&["import", f.path().to_str().unwrap()]);
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(
        r.stderr.contains("line 2") && r.stderr.contains("MiB"),
        "{}",
        r.stderr
    );
    assert_eq!(db.dlq(&["list"]).json(), serde_json::json!([]));
}

#[test]
fn import_is_all_or_nothing_and_names_line_and_field() {
    for b in BACKENDS {
        let db = TestDb::migrated(b);
        let good = json!({"id": "g1", "body_text": "{}", "reason": "poison_message"});
        let bad = json!({"id": "g2", "body_base64": "!!!", "reason": "poison_message"});
        let r = db.dlq_stdin(&["import", "-"], format!("{good}\n{bad}\n").as_bytes());
        assert_eq!(r.code, 2, "{}", r.all());
        assert!(
            r.stderr.contains("line 2") && r.stderr.contains("body_base64"),
            "{}",
            r.stderr
        );
        assert_eq!(db.dlq(&["list"]).json(), json!([]), "nothing written");

        let r = db.dlq_stdin(&["import", "-"], b"{\"id\": \"x\"\nnot json\n");
        assert_eq!(r.code, 2);
        assert!(r.stderr.contains("line 1"), "{}", r.stderr);

        db.add(good.clone());
        let dup = json!({"id": "g3", "body_text": "{}", "reason": "poison_message"});
        let r = db.dlq_stdin(&["import", "-"], format!("{dup}\n{good}\n").as_bytes());
        assert_eq!(r.code, 2, "{}", r.all());
        assert!(
            r.stderr.contains("already exists") && r.stderr.contains("line 2"),
            "{}",
            r.stderr
        );
        assert_eq!(
            db.dlq(&["list"]).json().as_array().unwrap().len(),
            1,
            "g3 not written"
        );
        let r = db.dlq_stdin(
            &["import", "--skip-existing", "-"],
            format!("{dup}\n{good}\n").as_bytes(),
        );
        assert_eq!(r.code, 0, "{}", r.all());
        assert_eq!(r.json(), json!({"imported": 1, "skipped_existing": 1}));
    }
}

#[test]
fn import_reads_show_output_and_refuses_what_it_cannot_keep() {
    for b in BACKENDS {
        let src = TestDb::migrated(b);
        seed_for_export(&src);
        let shown = src.dlq(&["show", "n1"]);
        assert!(
            shown.stdout.contains("123456789012345678901234567890")
                && shown.stdout.contains("1.10"),
            "show keeps numbers as written: {}",
            shown.stdout
        );
        let db = TestDb::migrated(b);
        // `show -o json` is pretty-printed over many lines, after a BOM.
        let mut input = b"\xEF\xBB\xBF".to_vec();
        input.extend_from_slice(shown.stdout.as_bytes());
        input.extend_from_slice(src.dlq(&["show", "j1"]).stdout.as_bytes());
        let r = db.dlq_stdin(&["import", "-"], &input);
        assert_eq!(r.code, 0, "{b:?}: {}", r.all());
        assert_eq!(r.json()["imported"], 2);
        assert_eq!(db.show("n1")["history"], src.show("n1")["history"]);
        assert_eq!(db.show("j1")["history"], src.show("j1")["history"]);
        assert_eq!(
            db.show("n1")["headers"].to_string(),
            src.show("n1")["headers"].to_string()
        );

        let refuse = |input: &str, expect: &str| {
            let r = db.dlq_stdin(&["import", "-"], input.as_bytes());
            assert_eq!(r.code, 2, "{b:?} {input}: {}", r.all());
            assert!(r.stderr.contains(expect), "{b:?}: {}", r.stderr);
            assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
        };
        let ok = r#"{"id":"g1","reason":"r","body_text":"x"}"#;
        // A NUL in a text field: the same per-line error on both stores.
        refuse(
            &format!(
                "{ok}\n{}\n",
                r#"{"id":"g2","reason":"r","body_text":"x","error":"a\u0000b"}"#
            ),
            "line 2: field error: holds a NUL",
        );
        refuse(
            &format!(
                "{ok}\n{}\n",
                r#"{"id":"g2","reason":"r\u0000","body_text":"x"}"#
            ),
            "line 2: field reason",
        );
        refuse(
            r#"{"id":"g3","reason":"r","body_text":"x","history":[{"at":"2026-01-01T00:00:00Z","operator":"a\u0000","action":"n","outcome":"o"}]}"#,
            "field history[0].operator",
        );
        refuse(
            r#"{"id":"g3","reason":"r","body_text":"x","body_base64":"eQ=="}"#,
            "line 1: field body_text: differs from body_base64",
        );
        refuse(
            &format!("{ok}\n{{\"id\": \"g4\",\n"),
            "line 2: not valid JSON",
        );
        assert_eq!(db.dlq(&["show", "g1"]).code, 4, "nothing imported");
        // A directory is named.
        let dir = tempfile::tempdir().unwrap();
        let r = db.dlq(&["import", dir.path().to_str().unwrap()]);
        assert_eq!(r.code, 2, "{}", r.all());
        assert!(
            r.stderr.contains(dir.path().to_str().unwrap()) && r.stderr.contains("directory"),
            "{}",
            r.stderr
        );
    }
}

/// `n` import lines `m0000`..: line k (1-based) holds id `m{k-1}`, a body naming its line
/// and one history entry.
fn many_lines(n: usize) -> Vec<serde_json::Value> {
    (0..n)
        .map(|i| {
            json!({"id": format!("m{i:04}"), "reason": "poison_message",
                   "body_text": format!("{{\"line\": {}}}", i + 1),
                   "history": [{"at": "2026-01-01T00:00:00Z", "operator": "ops",
                                "action": "note", "outcome": "noted",
                                "detail": format!("line {}", i + 1)}]})
        })
        .collect()
}

fn lines_of(rows: &[serde_json::Value]) -> Vec<u8> {
    rows.iter()
        .map(|r| format!("{r}\n"))
        .collect::<String>()
        .into_bytes()
}

/// PostgreSQL inserts an import's rows a thousand at a time; a row refused deep in the
/// file is still named by its line, and nothing is written.
#[test]
fn a_refused_row_past_the_first_thousand_is_named_by_its_line() {
    for b in BACKENDS {
        let db = TestDb::migrated(b);
        db.add(json!({"id": "m2344", "body_text": "{}", "reason": "poison_message"}));
        let r = db.dlq_stdin(&["import", "-"], &lines_of(&many_lines(2500)));
        assert_eq!(r.code, 2, "{b:?}: {}", r.all());
        assert!(
            r.stderr.contains("line 2345") && r.stderr.contains("already exists"),
            "{b:?}: {}",
            r.stderr
        );
        assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
        assert_eq!(db.dlq(&["list"]).json().as_array().unwrap().len(), 1);
        assert_eq!(db.dlq(&["show", "m0000"]).code, 4, "nothing imported");
    }
}

/// `--skip-existing` over rows already here in two of PostgreSQL's thousand-row inserts:
/// those are kept as they were, every other line is imported with its history.
#[test]
fn skip_existing_keeps_the_rows_here_across_a_large_import() {
    for b in BACKENDS {
        let db = TestDb::migrated(b);
        for id in ["m0020", "m1799"] {
            db.add(json!({"id": id, "body_text": "{\"here\": true}", "reason": "poison_message"}));
        }
        let r = db.dlq_stdin(
            &["import", "--skip-existing", "-"],
            &lines_of(&many_lines(2500)),
        );
        assert_eq!(r.code, 0, "{b:?}: {}", r.all());
        assert_eq!(r.json(), json!({"imported": 2498, "skipped_existing": 2}));
        for id in ["m0020", "m1799"] {
            let shown = db.show(id);
            assert_eq!(shown["body_text"], "{\"here\": true}", "{b:?} {id}");
            assert_eq!(shown["history"], json!([]), "{b:?} {id}");
        }
        for (id, line) in [
            ("m0000", 1),
            ("m0021", 22),
            ("m1800", 1801),
            ("m2499", 2500),
        ] {
            let shown = db.show(id);
            assert_eq!(
                shown["body_text"],
                format!("{{\"line\": {line}}}"),
                "{b:?} {id}"
            );
            let history = shown["history"].as_array().unwrap();
            assert_eq!(history.len(), 1, "{b:?} {id}: {history:?}");
            assert_eq!(history[0]["detail"], format!("line {line}"), "{b:?} {id}");
        }
    }
}

/// A PostgreSQL database in another encoding than UTF-8, where an ID can be kept as
/// other characters than it was written with (EUC_JP keeps U+00A6 as U+FFE4).
fn euc_jp_db() -> TestDb {
    let db = TestDb::postgres_created_with(
        "ENCODING 'EUC_JP' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0",
    );
    let r = db.dlq(&["migrate"]);
    assert_eq!(r.code, 0, "migrate: {}", r.all());
    db
}

/// An imported row is counted and keeps its history even when the database keeps its ID
/// as other characters. Once counted such a row as skipped and dropped its history.
#[test]
fn a_row_kept_under_other_characters_is_counted_as_imported() {
    let db = euc_jp_db();
    let line = json!({"id": "a\u{a6}1", "reason": "poison_message", "body_text": "{}",
                      "history": [{"at": "2026-01-01T00:00:00Z", "operator": "ops",
                                   "action": "note", "outcome": "noted", "detail": "kept"}]});
    let r = db.dlq_stdin(&["import", "-"], &lines_of(&[line]));
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(r.json(), json!({"imported": 1, "skipped_existing": 0}));
    let shown = db.show("a\u{ffe4}1");
    assert_eq!(shown["history"][0]["detail"], "kept", "{shown}");
}

/// A revision whose ID the database keeps as other characters is still seen beside its
/// live original: the import is refused, not one event left live twice. Once such a
/// revision slipped past the check and both rows were live.
#[test]
fn a_revision_kept_under_other_characters_still_meets_its_live_original() {
    let db = euc_jp_db();
    let original = json!({"id": "orig", "reason": "poison_message", "body_text": "{}",
                          "event_id": "e1", "dead_lettered_at": "2026-01-01T00:00:00Z"});
    assert_eq!(
        db.dlq_stdin(&["import", "-"], &lines_of(&[original])).code,
        0
    );
    let revision = json!({"id": "rev\u{a6}", "reason": "poison_message", "body_text": "{}",
                          "event_id": "e1", "revision_of": "orig",
                          "dead_lettered_at": "2026-01-02T00:00:00Z"});
    let r = db.dlq_stdin(&["import", "-"], &lines_of(&[revision]));
    assert_eq!(r.code, 2, "{}", r.all());
    assert_eq!(db.dlq(&["show", "rev\u{ffe4}"]).code, 4, "nothing imported");
}
