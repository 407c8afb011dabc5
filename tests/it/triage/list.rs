//! `dlq list`: shape, filters, order and truncation; `--watch` and Ctrl-C; a list cut
//! short by an error is not valid JSON.

use super::*;
use crate::common::*;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// A Ctrl-C that arrives while `list --watch` is refreshing ends it (it used to be lost
/// when it came while the query ran: no `ctrl_c()` future was waiting then). Each
/// refresh here scans 300,000 rows on PostgreSQL and finds none, so a signal almost
/// always lands during one.
#[test]
fn list_watch_never_loses_a_ctrl_c() {
    let db = TestDb::migrated(Backend::Postgres);
    db.sql(&[
        "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, error) \
              SELECT 'w-' || g, '\\x7b7d'::bytea, 'poison_message', 1, '{}', repeat('x', 100) \
              FROM generate_series(1, 300000) g",
    ]);
    for (i, delay) in [900u64, 1100, 1300, 1500, 1700].iter().enumerate() {
        let mut child = db
            .cmd()
            .args([
                "list",
                "--watch",
                "1ms",
                "--error-contains",
                "nomatch",
                "-o",
                "table",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(*delay));
        signal(&child, "INT");
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break Some(s);
            }
            if Instant::now() > deadline {
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        if status.is_none() {
            let _ = child.kill();
        }
        let status = status.unwrap_or_else(|| panic!("run {i}: the Ctrl-C was lost"));
        assert!(status.success(), "run {i}: {status:?}");
    }
}

/// `list -o json` whose read fails half way (here the statement timeout, while the
/// reader is slow) never leaves a well-formed array holding part of the rows on stdout:
/// a script would take it for the whole list. Found by the issue-14 review.
#[test]
fn a_list_cut_short_by_an_error_is_not_valid_json() {
    let db = TestDb::migrated(Backend::Postgres);
    db.sql(&[
        "INSERT INTO dead_letters (id, body, reason, attempts, headers_json) \
              SELECT 'row-' || lpad(g::text, 7, '0'), convert_to('{\"n\":' || g || '}', 'UTF8'), \
              'poison_message', 1, '{}' FROM generate_series(1, 200000) g",
    ]);
    let child = db
        .cmd()
        .args([
            "--statement-timeout",
            "2s",
            "list",
            "-o",
            "json",
            "--limit",
            "200000",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // A slow reader: the database waits on the full pipe until the timeout cancels it.
    std::thread::sleep(Duration::from_secs(5));
    let out = child.wait_with_output().unwrap();
    let r = Run::from(out);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stderr.contains("timed out"), "{}", r.stderr);
    assert!(
        serde_json::from_str::<serde_json::Value>(&r.stdout).is_err(),
        "a partial list parsed as JSON ({} bytes)",
        r.stdout.len()
    );
}

#[test]
fn list_shape_filters_order_and_truncation() {
    for b in BACKENDS {
        let db = TestDb::migrated(b);
        db.import_examples();
        let all = db.dlq(&["list", "--limit", "100"]).json();
        let rows = all.as_array().unwrap();
        assert_eq!(rows.len(), 33, "{b:?}");
        for r in rows {
            let keys: Vec<&str> = r.as_object().unwrap().keys().map(String::as_str).collect();
            assert_eq!(keys.len(), LIST_KEYS.len(), "{keys:?}");
            for k in LIST_KEYS {
                assert!(r.get(k).is_some(), "missing {k}");
            }
            assert!(r.get("body").is_none() && r.get("headers_json").is_none());
        }
        let times: Vec<&str> = rows
            .iter()
            .map(|r| r["dead_lettered_at"].as_str().unwrap())
            .collect();
        let mut sorted = times.clone();
        sorted.sort_by(|a, b| b.cmp(a));
        assert_eq!(times, sorted, "newest first");

        let r = db.dlq(&["list", "--limit", "5"]);
        assert_eq!(r.json().as_array().unwrap().len(), 5);
        assert!(r.stderr.contains("5 of 33 shown"), "{}", r.stderr);

        let r = db
            .dlq(&[
                "list",
                "--reason",
                "retries_exhausted",
                "--producer",
                "inventory",
                "--schema-version",
                "5",
            ])
            .json();
        assert_eq!(r.as_array().unwrap().len(), 9);
        let r = db
            .dlq(&[
                "list",
                "--since",
                "2026-11-28T22:00:00Z",
                "--until",
                "2026-11-28T23:00:00Z",
            ])
            .json();
        assert_eq!(r.as_array().unwrap().len(), 12, "{b:?}: billing flood only");
        let r = db
            .dlq(&["list", "--since", "1000d", "--state", "replayed"])
            .json();
        assert_eq!(r.as_array().unwrap().len(), 0);
        let r = db
            .dlq(&["list", "--state", "pending", "--limit", "100"])
            .json();
        assert_eq!(r.as_array().unwrap().len(), 33);
    }
}

#[test]
fn list_watch_refreshes_until_stopped() {
    use std::io::BufRead;
    let db = TestDb::migrated(Backend::Sqlite);
    db.import_examples();
    let mut child = db
        .cmd()
        .args(["list", "--limit", "1", "--watch", "300ms"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<serde_json::Value>();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(serde_json::from_str(&line).unwrap()).is_err() {
                break;
            }
        }
    });
    let first = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("a first render");
    assert_ne!(first[0]["id"], "new-arrival");
    db.add(serde_json::json!({"id": "new-arrival", "body_text": "{}", "reason": "poison_message", "dead_lettered_at": "2030-01-01T00:00:00Z"}));
    let mut renders = 1;
    loop {
        let r = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("more renders");
        renders += 1;
        if r[0]["id"] == "new-arrival" {
            break;
        }
    }
    assert!(renders >= 2);
    signal(&child, "INT");
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "Ctrl-C ends the watch cleanly");
}
