//! `dlq plan` and `dlq replay --plan`: frozen plans, group runs, what stops them and what
//! they say when a service goes away.

mod careful;
mod group;
mod sealed;
mod stops;
mod unavailable;

use crate::common::*;
use std::process::Stdio;
use std::time::{Duration, Instant};

fn seed(db: &TestDb, queue: &str, n: usize, prefix: &str) {
    let mut lines = String::new();
    for i in 0..n {
        let id = format!("{prefix}{i:04}");
        let body = format!("{{\"event_id\":\"evt-{id}\",\"n\":{i}}}");
        lines.push_str(&letter(&id, queue, body.as_bytes()).to_string());
        lines.push('\n');
    }
    let r = db.dlq_stdin(&["import", "-"], lines.as_bytes());
    assert_eq!(r.code, 0, "{}", r.all());
}

fn write_plan(db: &TestDb, args: &[&str]) -> (tempfile::NamedTempFile, serde_json::Value) {
    let f = db.plan_file(args);
    let plan = serde_json::from_slice(&std::fs::read(f.path()).unwrap()).unwrap();
    (f, plan)
}

/// `dlq replay --plan FILE --yes` plus `extra`.
fn replay_plan(db: &TestDb, plan: &tempfile::NamedTempFile, extra: &[&str]) -> Run {
    let mut args = vec!["replay", "--plan", plan.path().to_str().unwrap(), "--yes"];
    args.extend_from_slice(extra);
    db.dlq(&args)
}

/// IDs with an open attempt (not replayed, not discarded), sorted.
fn open_attempts(db: &TestDb) -> Vec<String> {
    let mut ids = db.ids(&["--state", "all", "--limit", "10000"]);
    ids.retain(|id| {
        let s = db.show(id);
        s["replay_attempt_at"].is_string() && s["replayed_at"].is_null()
    });
    ids.sort();
    ids
}
