//! Output that cannot be written: an error, and a closed pipe ends the command at once.

use crate::common::*;
use std::io::{BufRead, Read};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------
// Output integrity

#[test]
fn output_that_cannot_be_written_is_an_error() {
    let db = TestDb::migrated(Backend::Sqlite);
    db.add(letter("o1", "q", b"{\"a\":1}"));
    for args in [
        vec!["plan"],
        vec!["show", "o1", "-o", "json"],
        vec!["show", "o1", "-o", "table"],
        vec!["list"],
        vec!["list", "-o", "table"],
        vec!["list", "-o", "markdown"],
        vec!["aggregate", "--by", "reason"],
        vec!["migrate"],
    ] {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let r = Run::from(db.cmd().args(&args).stdout(full).output().unwrap());
        assert_eq!(r.code, 1, "{args:?}: {}", r.stderr);
        assert_eq!(r.stderr.lines().count(), 1, "{args:?}: {}", r.stderr);
        assert!(
            r.stderr.starts_with("dlq: error: ") && r.stderr.contains("No space left"),
            "{args:?}: {}",
            r.stderr
        );
    }
}

#[test]
fn a_closed_pipe_ends_the_command_at_once_and_quietly() {
    let db = TestDb::migrated(Backend::Sqlite);
    for i in 0..3 {
        db.add(letter(&format!("c{i}"), "q", b"{}"));
    }
    // list --watch: the reader goes away while dlq waits for its next round.
    let mut child = db
        .cmd()
        .args(["list", "--watch", "30s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    assert!(first.starts_with("[{"), "{first}");
    let closed = Instant::now();
    drop(stdout);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if closed.elapsed() > Duration::from_secs(1) {
            let _ = child.kill();
            panic!("list --watch still runs 1s after its reader went away");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(status.code(), Some(0));
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(err, "", "quietly");

    // The same as an operator types it.
    let started = Instant::now();
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "'{}' list --watch | head -1",
            env!("CARGO_BIN_EXE_dlq")
        ))
        .envs(db.cmd().get_envs().filter_map(|(k, v)| Some((k, v?))))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 1);
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");

    // A one-shot command whose reader is already gone: no "Broken pipe" error.
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "'{}' list -o table | true; '{}' show c1 -o json | true",
            env!("CARGO_BIN_EXE_dlq"),
            env!("CARGO_BIN_EXE_dlq")
        ))
        .envs(db.cmd().get_envs().filter_map(|(k, v)| Some((k, v?))))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
}
