//! `show` for a person: what identifies the record first and the body last, a large JSON
//! body pretty-printed even when cut, `--no-body`, `--body-only` (the exact bytes), and
//! the pager when the view is longer than the terminal.

use crate::common::*;

/// A minified JSON body of about 150 KB: one line, far over what the table view shows.
fn big_json() -> Vec<u8> {
    let items: Vec<serde_json::Value> = (0..2500)
        .map(|i| serde_json::json!({"sku": format!("SKU-{i:05}"), "qty": i, "note": "restock"}))
        .collect();
    serde_json::to_vec(&serde_json::json!({"order": "o-1", "items": items})).unwrap()
}

/// Once broke: a 150 KB JSON body was one 65,536-character line before "N more bytes not
/// shown", and the ID, state and SHA-256 scrolled away above it (issue 25, item 3).
#[test]
fn a_big_json_body_comes_last_pretty_and_cut_at_a_line() {
    let db = TestDb::migrated(Backend::Sqlite);
    let body = big_json();
    db.add(letter("big-json", "orders", &body));
    let r = db.dlq(&["show", "big-json", "-o", "table"]);
    assert_eq!(r.code, 0, "{}", r.all());
    let at = |s: &str| {
        r.stdout
            .find(s)
            .unwrap_or_else(|| panic!("no {s:?}: {}", r.stdout))
    };
    let body_at = at("\nbody:\n");
    for meta in [
        "id:",
        "state:",
        "sha256:",
        "body bytes:",
        "history:",
        "headers:",
    ] {
        assert!(at(meta) < body_at, "{meta} after the body: {}", r.stdout);
    }
    assert!(
        r.stdout.contains(&body.len().to_string()),
        "body bytes shown"
    );
    let shown = &r.stdout[body_at..];
    assert!(
        shown.contains("\n  \"items\": [\n"),
        "pretty: {}",
        &shown[..300]
    );
    assert!(shown.lines().all(|l| l.len() < 200), "no huge line");
    let note = shown.lines().last().unwrap();
    assert!(
        note.starts_with("… ")
            && note.contains("more bytes not shown")
            && note.contains("--body-only"),
        "{note}"
    );
    // Cut at a line of the pretty form: the line before the note is whole.
    let lines: Vec<&str> = shown.lines().collect();
    let before = lines[lines.len() - 2];
    assert!(
        before.ends_with(',') || before.ends_with('{') || before.ends_with('['),
        "{before:?}"
    );
    // The count is of the pretty form not shown.
    let pretty =
        serde_json::to_string_pretty(&serde_json::from_slice::<serde_json::Value>(&body).unwrap())
            .unwrap();
    let more: usize = note.split(' ').nth(1).unwrap().parse().unwrap();
    let printed = shown.len() - "\nbody:\n".len() - note.len() - 1;
    assert_eq!(printed + more, pretty.len() + 1, "{note}");
}

#[test]
fn no_body_leaves_the_body_out_but_says_its_size() {
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter(
        "nb",
        "orders",
        b"{\"secret_looking\":\"payload-text\"}",
    ));
    let r = db.dlq(&["show", "nb", "-o", "table", "--no-body"]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert!(
        !r.stdout.contains("payload-text") && !r.stdout.contains("body:\n"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains("sha256:") && r.stdout.contains("body bytes:"),
        "{}",
        r.stdout
    );
    let m = db.dlq(&["show", "nb", "-o", "markdown", "--no-body"]);
    assert!(
        !m.stdout.contains("#### Body") && !m.stdout.contains("payload-text"),
        "{}",
        m.stdout
    );
    // JSON keeps its shape (the contract).
    let j = db.dlq(&["show", "nb", "-o", "json", "--no-body"]);
    assert!(j.json()["body_base64"].is_string(), "{}", j.stdout);
}

#[test]
fn body_only_writes_the_exact_bytes_whatever_the_format() {
    let db = TestDb::migrated(Backend::Sqlite);
    let body: Vec<u8> = (0..=255u8).chain([0, 10, 13, 0xff, 0xfe]).collect();
    db.add(letter("bin", "orders", &body));
    for extra in [
        &[][..],
        &["-o", "table"],
        &["-o", "json"],
        &["-o", "markdown"],
    ] {
        for flag in ["--body-only", "--raw"] {
            let o = db
                .cmd()
                .args(["show", "bin", flag])
                .args(extra)
                .output()
                .unwrap();
            assert_eq!(
                o.status.code(),
                Some(0),
                "{}",
                String::from_utf8_lossy(&o.stderr)
            );
            assert_eq!(o.stdout, body, "{flag} {extra:?}");
        }
    }
    let r = db.dlq(&["show", "bin", "--body-only", "--no-body"]);
    assert_eq!(r.code, 2, "{}", r.all());
}

/// A fake pager that records that it ran, then shows what it got.
fn fake_pager(dir: &std::path::Path) -> (String, std::path::PathBuf) {
    let mark = dir.join("paged");
    let script = dir.join("pager.sh");
    std::fs::write(
        &script,
        format!("#!/bin/sh\necho ran > '{}'\ncat\n", mark.display()),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    (script.display().to_string(), mark)
}

#[test]
fn a_view_longer_than_the_terminal_goes_through_the_pager() {
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("long", "orders", &big_json()));
    let dir = tempfile::tempdir().unwrap();
    let (pager, mark) = fake_pager(dir.path());
    let r = on_a_terminal(&db, &[("PAGER", &pager), ("LINES", "30")], "show long", "");
    assert_eq!(r.code, 0, "{}", r.all());
    assert!(mark.exists(), "the pager did not run: {}", r.all());
    assert!(
        r.stdout.contains("sha256:") && r.stdout.contains("more bytes not shown"),
        "{}",
        r.all()
    );
    // Shorter than the screen: written as is.
    let dir = tempfile::tempdir().unwrap();
    let (pager, mark) = fake_pager(dir.path());
    db.add(letter("short", "orders", b"{}"));
    let r = on_a_terminal(
        &db,
        &[("PAGER", &pager), ("LINES", "500")],
        "show short",
        "",
    );
    assert_eq!(r.code, 0, "{}", r.all());
    assert!(
        !mark.exists() && r.stdout.contains("sha256:"),
        "{}",
        r.all()
    );
    // Not a terminal: never the pager.
    let r = db.dlq_env(
        &["show", "long", "-o", "table"],
        &[("PAGER", &pager), ("LINES", "5")],
    );
    assert!(
        !mark.exists() && r.stdout.contains("sha256:"),
        "{}",
        r.all()
    );
}
