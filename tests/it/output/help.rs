//! `--help`: headings and the order of options.

use crate::common::*;

#[test]
fn help_lists_global_options_after_the_commands_own() {
    let db = TestDb::new(Backend::Sqlite);
    let r = db.dlq(&["replay", "--help"]);
    assert_eq!(r.code, 0);
    let own = r.stdout.find("--lease").expect("replay's own option");
    let heading = r.stdout.find("Global Options:").expect("a heading");
    let global = r.stdout.find("--database-url").expect("a global option");
    assert!(own < heading && heading < global, "{}", r.stdout);
    // The global options are not listed among the command's own.
    let options = r.stdout.find("\nOptions:").expect("own options");
    assert!(
        !r.stdout[options..heading].contains("--database-url"),
        "{}",
        r.stdout
    );
}

/// Once broke: `replay -h` was 83 lines, 44 of them global options, so the command's own
/// scrolled off an 80x30 screen.
#[test]
fn short_help_is_the_commands_own_options_and_fits_a_screen() {
    let db = TestDb::new(Backend::Sqlite);
    let short = db.dlq_env(&["replay", "-h"], &[("COLUMNS", "80")]);
    assert_eq!(short.code, 0, "{}", short.all());
    assert!(short.stdout.lines().count() <= 40, "{}", short.stdout);
    for own in ["--plan <FILE>", "--canary <N>", "--max-failures <N>"] {
        assert!(short.stdout.contains(own), "{own}: {}", short.stdout);
    }
    assert!(!short.stdout.contains("--database-url"), "{}", short.stdout);
    assert!(!short.stdout.contains("Examples:"), "{}", short.stdout);
    assert!(
        short.stdout.trim_end().ends_with("and examples: --help"),
        "{}",
        short.stdout
    );
    // One line per option: the short form of each help.
    assert!(
        short
            .stdout
            .lines()
            .any(|l| l.contains("--canary <N>") && l.contains("replay N first")),
        "{}",
        short.stdout
    );
}

#[test]
fn long_help_adds_global_options_and_examples() {
    let db = TestDb::new(Backend::Sqlite);
    for cmd in ["replay", "plan", "resolve", "edit", "capture"] {
        let long = db.dlq(&[cmd, "--help"]);
        assert_eq!(long.code, 0, "{}", long.all());
        let examples = long.stdout.find("\nExamples:\n").expect(cmd);
        let globals = long.stdout.find("Global Options:").expect(cmd);
        assert!(globals < examples, "{cmd}: {}", long.stdout);
        assert!(
            long.stdout[examples..].contains(&format!("  dlq {cmd} ")),
            "{cmd}: {}",
            long.stdout
        );
        assert!(long.stdout.contains("--database-url"), "{cmd}");
        assert!(!long.stdout.contains("and examples: --help"), "{cmd}");
    }
    // --max-failures says that batches in flight still settle.
    let replay = db.dlq(&["replay", "--help"]);
    let words = replay
        .stdout
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        words.contains("batches already out still settle"),
        "{words}"
    );
}
