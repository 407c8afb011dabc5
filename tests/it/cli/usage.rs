//! Bad input on the command line: one line and exit 2.

use crate::common::*;

#[test]
fn more_bad_input_is_refused_with_one_line() {
    use std::os::unix::ffi::OsStrExt;
    let db = TestDb::migrated(Backend::Sqlite);
    let long = "x".repeat(10_000);
    for args in [
        vec!["show", long.as_str()],
        vec!["list", "--producer", "a\nb"],
        vec!["replay", "x", "--yes", "--confirm-timeout", "0s"],
        vec!["aggregate", "--by", ""],
        vec!["aggregate", "--by", "hour,day"],
        vec!["replay", "--plan", "p.json", "--rate", "0/s"],
        vec!["replay", "--plan", "p.json", "--rate", "fast"],
        vec!["list", "--state", "stuck"],
        vec!["replay", "x", "--yes", "--expect-sha256", "abc"],
    ] {
        let r = db.dlq(&args);
        assert_eq!(r.code, 2, "{args:?}: {}", r.all());
    }
    let r = Run::from(
        db.cmd()
            .arg("show")
            .arg(std::ffi::OsStr::from_bytes(b"\xff\xfe"))
            .output()
            .unwrap(),
    );
    assert_eq!(r.code, 2, "invalid UTF-8 argument: {}", r.all());
    let r = db.dlq(&["replay", "--plan", "/nonexistent/plan.json", "--yes"]);
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(r.stderr.contains("cannot read plan"));
}

#[test]
fn bad_input_gets_one_line_and_exit_2() {
    let db = TestDb::migrated(Backend::Sqlite);
    for args in [
        vec!["list", "--since", "yesterday"],
        vec!["list", "--limit", "0"],
        vec!["list", "--limit", "-3"],
        vec!["aggregate", "--by", "reason,colour"],
        vec!["claim", "x", "--lease", "0s"],
        vec!["claim", "x", "--lease", "soon"],
        vec!["show", "  "],
        vec!["show", "a\u{7}b"],
        vec!["list", "--reason", ""],
        vec![
            "replay",
            "x",
            "--yes",
            "--lease",
            "5s",
            "--confirm-timeout",
            "10s",
        ],
    ] {
        let r = db.dlq(&args);
        assert_eq!(r.code, 2, "{args:?}: {}", r.all());
        assert!(!r.stderr.trim().is_empty());
    }
    let r = db.dlq(&["list", "--since", "yesterday"]);
    assert!(
        r.stderr.contains("30m") && r.stderr.contains("RFC 3339"),
        "{}",
        r.stderr
    );
    let r = db.dlq(&["show", "no-such-id"]);
    assert_eq!(r.code, 4, "{}", r.all());
    assert_eq!(r.json()["outcome"], "not_found");
    assert_eq!(r.json()["id"], "no-such-id");
}

/// A queue name AMQP cannot carry is refused by the argument parser, naming the option,
/// before any broker is asked.
/// Once broke: the library said `--queue` itself, after connecting (issue 21 moved it).
#[test]
fn a_queue_name_over_255_bytes_is_a_usage_error() {
    let db = TestDb::migrated(Backend::Sqlite);
    let long = "q".repeat(256);
    let r = db.dlq(&[
        "--amqp-url",
        "amqp://guest:guest@127.0.0.1:1/",
        "capture",
        "--queue",
        &long,
    ]);
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(
        r.stderr.contains("--queue") && r.stderr.contains("a queue name is at most 255 bytes"),
        "{}",
        r.stderr
    );
}
