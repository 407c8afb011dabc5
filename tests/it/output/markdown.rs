//! `-o markdown`: tables and fenced blocks that paste into a ticket.

use crate::common::*;

/// `show -o markdown` is Markdown (it printed the plain text view): the columns as a
/// table, headers and body fenced so that no backtick run in the body closes the fence,
/// the history as a table.
#[test]
fn show_as_markdown_is_a_table_and_fenced_blocks() {
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(serde_json::json!({
        "id": "md-1", "reason": "poison_message", "error": "bad | thing",
        "body_text": "{\"a\":\"```\\n# not a heading\"}", "headers": {"tenant": "a|b"},
    }));
    assert_eq!(db.dlq(&["note", "md-1", "looked | at it"]).code, 0);
    let r = db.dlq(&["show", "md-1", "-o", "markdown"]);
    assert_eq!(r.code, 0, "{}", r.all());
    let md = &r.stdout;
    assert!(md.contains("| field | value |\n|---|---|\n"), "{md}");
    assert!(md.contains("| error | bad \\| thing |"), "{md}");
    // The body holds a run of three backticks: its fence is longer.
    let body = md.split("#### Body").nth(1).unwrap();
    let fence_line = body.lines().find(|l| l.starts_with("```")).unwrap();
    assert!(fence_line.starts_with("````json"), "{md}");
    let closing = body.lines().filter(|l| *l == "````").count();
    assert_eq!(closing, 1, "{md}");
    assert!(
        md.contains("| at | operator | action | outcome | detail |"),
        "{md}"
    );
    assert!(md.contains("looked \\| at it"), "{md}");
    // The table view is unchanged: plain `key: value` lines.
    let t = db.dlq(&["show", "md-1", "-o", "table"]);
    assert!(
        t.stdout.starts_with("id:               md-1\n"),
        "{}",
        t.stdout
    );
}

#[test]
fn markdown_output_pastes_into_a_ticket() {
    let db = TestDb::migrated(Backend::Postgres);
    db.import_examples();
    let r = db.dlq(&["aggregate", "--by", "reason", "-o", "markdown"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(
        lines[0]
            .split('|')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()[..2],
        ["REASON", "COUNT"]
    );
    assert!(
        lines[1].starts_with("|--") || lines[1].starts_with("|-"),
        "{}",
        lines[1]
    );
    assert!(
        lines[2].contains("| poison_message") && lines[2].contains("| 14"),
        "{}",
        r.stdout
    );
    let r = db.dlq(&["list", "--limit", "2", "-o", "markdown"]);
    assert!(r.stdout.lines().all(|l| l.starts_with('|')), "{}", r.stdout);
    assert!(!r.stdout.contains('\u{1b}'), "no escape codes");
}
