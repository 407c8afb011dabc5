//! Colour for states and outcomes: on a terminal (or `--color always`), never with
//! `--color never`, `NO_COLOR`, JSON, TSV or through a pipe by default; and the
//! `--watch` header's time of the last refresh.

use crate::common::*;

const ESC: &str = "\x1b[";

fn with_an_uncertain_row(db: &TestDb) {
    db.add(letter("c-pending", "orders", b"{}"));
    db.add(letter("c-uncertain", "orders", b"{}"));
    db.sql(&["UPDATE dead_letters SET replay_attempt_at = '2026-01-01T00:00:00Z', replay_claim_owner = 'x', replay_claim_expires_at = '2026-01-01T00:00:00Z' WHERE id = 'c-uncertain'"]);
    assert_eq!(db.show("c-uncertain")["state"], "uncertain");
}

/// Once broke: `uncertain` looked like `pending` in `list` (issue 25, item 9).
#[test]
fn states_are_coloured_when_asked_or_on_a_terminal() {
    let db = TestDb::migrated(Backend::Sqlite);
    with_an_uncertain_row(&db);
    let r = db.dlq(&["list", "-o", "table", "--color", "always"]);
    assert_eq!(r.code, 0, "{}", r.all());
    let line = r
        .stdout
        .lines()
        .find(|l| l.contains("c-uncertain"))
        .unwrap();
    assert!(
        line.contains(&format!("{ESC}38;5;11m uncertain")),
        "{line:?}"
    );
    let pending = r.stdout.lines().find(|l| l.contains("c-pending")).unwrap();
    assert!(!pending.contains(ESC), "pending stays plain: {pending:?}");
    for args in [
        &["list", "-o", "table", "--color", "never"][..],
        &["list", "-o", "table"],
        &["list", "-o", "json", "--color", "always"],
        &["list", "-o", "tsv", "--color", "always"],
    ] {
        let r = db.dlq(args);
        assert!(!r.stdout.contains(ESC), "{args:?}: {}", r.stdout);
    }
    // On a terminal by default (an empty NO_COLOR is no NO_COLOR; the tests' commands
    // set it); NO_COLOR and --color never turn it off.
    let r = on_a_terminal(&db, &[("NO_COLOR", "")], "list", "");
    assert!(
        r.stdout.contains(&format!("{ESC}38;5;11m uncertain")),
        "{}",
        r.all()
    );
    let r = on_a_terminal(&db, &[("NO_COLOR", "1")], "list", "");
    assert!(
        r.stdout.contains("uncertain") && !r.stdout.contains(ESC),
        "{}",
        r.all()
    );
    let r = on_a_terminal(&db, &[("NO_COLOR", "")], "list --color never", "");
    assert!(
        r.stdout.contains("uncertain") && !r.stdout.contains(ESC),
        "{}",
        r.all()
    );
}

#[test]
fn an_outcome_line_is_coloured_by_its_outcome() {
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("o1", &unique("dlq_nowhere"), b"{}"));
    let r = db.dlq(&["replay", "o1", "--yes", "-o", "table", "--color", "always"]);
    assert_eq!(r.code, 5, "{}", r.all());
    assert!(
        r.stdout
            .starts_with(&format!("o1: {ESC}31mpublish_failed{ESC}0m (")),
        "{:?}",
        r.stdout
    );
    let r = db.dlq(&["show", "nope", "-o", "table", "--color", "always"]);
    assert!(
        r.stdout.starts_with(&format!("nope: {ESC}31mnot_found")),
        "{:?}",
        r.stdout
    );
}

/// Once broke: `list --watch` did not say when it last refreshed (issue 25, item 9).
#[test]
fn watch_says_when_it_last_refreshed() {
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("w1", "orders", b"{}"));
    let r = on_a_terminal(&db, &[], "list --watch 1s", "\x03");
    let re =
        regex::Regex::new(r"refreshed at \d{2}:\d{2}:\d{2} UTC, every 1s; Ctrl-C to stop").unwrap();
    assert!(re.is_match(&r.stdout), "{}", r.all());
}
