//! What a run of `dlq` gave: exit code, stdout, stderr, and readings of them.

use std::process::Output;

pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl From<Output> for Run {
    fn from(o: Output) -> Run {
        Run {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

impl Run {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e}): {}\nstderr: {}",
                self.stdout, self.stderr
            )
        })
    }
    pub fn lines(&self) -> Vec<serde_json::Value> {
        self.stdout
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }
    /// The IDs of a `list` run that must have succeeded.
    pub fn ids(&self) -> Vec<String> {
        assert_eq!(self.code, 0, "{}", self.all());
        self.json()
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["id"].as_str().unwrap().to_string())
            .collect()
    }

    pub fn all(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

/// The exit code of an outcome, as docs/exit-codes.md gives it.
pub fn exit_of(outcome: &serde_json::Value) -> i32 {
    match outcome.as_str().unwrap_or("") {
        "replayed" => 0,
        "not_replayed" => 3,
        "not_found" => 4,
        "publish_failed" => 5,
        "uncertain" => 6,
        "interrupted" => 130,
        other => panic!("not an outcome: {other:?}"),
    }
}

/// The summary line of a plan run (its last line of JSON).
pub fn summary_of(r: &Run) -> serde_json::Value {
    let lines = r.lines();
    let last = lines
        .last()
        .unwrap_or_else(|| panic!("no summary: {}", r.all()));
    let s = last["summary"].clone();
    assert!(s.is_object(), "no summary: {}", r.all());
    assert_eq!(exit_of(&s["worst"]), r.code, "worst is the exit code: {s}");
    s
}
