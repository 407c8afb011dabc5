//! The headers a replay sends keep their numbers.

use crate::common::*;
use crate::triage::import_lines;
use serde_json::json;

#[test]
fn replayed_headers_keep_their_numbers() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_numbers");
    let db = TestDb::migrated(Backend::Postgres);
    let line = format!(
        r#"{{"id":"h1","reason":"retries_exhausted","attempts":1,"source_queue":"{q}","body_text":"{{}}","headers":{{"big":123456789012345678901234567890,"d":1.10,"i":42,"many":0.1000000000000000055511151231257827}}}}"#
    );
    assert_eq!(import_lines(&db, &[line]).code, 0);
    let shown = db.dlq(&["show", "h1"]).stdout;
    assert!(
        shown.contains("123456789012345678901234567890") && shown.contains("1.10"),
        "{shown}"
    );
    let dry = db.dlq(&["replay", "h1", "--dry-run"]);
    assert!(
        dry.stdout
            .contains(r#""big": 123456789012345678901234567890"#)
            && dry.stdout.contains(r#""d": 1.10"#),
        "{}",
        dry.stdout
    );
    let r = db.dlq(&["replay", "h1", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.all());
    let got = rabbit.drain(&q);
    assert_eq!(got.len(), 1);
    let h = &got[0].headers;
    // A number a double would round goes out as its exact text; the others as numbers.
    assert_eq!(h["big"], json!("123456789012345678901234567890"));
    assert_eq!(h["many"], json!("0.1000000000000000055511151231257827"));
    assert_eq!(h["d"].as_f64(), Some(1.1));
    assert_eq!(h["i"].as_i64(), Some(42));
}
