//! What a dead letter is, how it is filtered and grouped, and what a replay step reports.

use crate::error::{DlqError, Result};
use crate::exit;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fmt;

/// Shown where the effective producer, schema version or source queue is unknown.
pub const UNKNOWN: &str = "(unknown)";

/// Where a row is in the replay lifecycle, judged on the database clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Pending,
    Claimed,
    Replayed,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Claimed => "claimed",
            State::Replayed => "replayed",
        }
    }
    pub fn parse(s: &str) -> State {
        match s {
            "replayed" => State::Replayed,
            "claimed" => State::Claimed,
            _ => State::Pending,
        }
    }
}

/// `--state` filter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum StateFilter {
    #[default]
    All,
    Pending,
    Claimed,
    Replayed,
}

/// The selection shared by `list`, `aggregate` and `plan`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Filter {
    pub reason: Option<String>,
    pub producer: Option<String>,
    pub schema_version: Option<String>,
    pub source_queue: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_id: Option<String>,
    pub since: Option<DateTime<Utc>>,
    pub until: Option<DateTime<Utc>>,
    pub state: StateFilter,
}

/// A dead letter without its body: what `list` prints. Field order is the contract's.
///
/// `producer`, `schema_version` and `event_id` are the effective values: the column when
/// set, else the header, else the top-level body field (see the migrations).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    pub id: String,
    pub reason: String,
    pub attempts: i64,
    pub replayed_at: Option<DateTime<Utc>>,
    pub replay_claim_owner: Option<String>,
    pub replay_claim_expires_at: Option<DateTime<Utc>>,
    pub last_replay_error: Option<String>,
    pub event_id: Option<String>,
    pub error: Option<String>,
    pub producer: Option<String>,
    pub schema_version: Option<String>,
    pub source_queue: Option<String>,
    pub exchange: Option<String>,
    pub routing_key: Option<String>,
    pub dead_lettered_at: DateTime<Utc>,
    pub state: State,
}

/// A whole dead letter, body included.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    pub summary: Summary,
    pub headers_json: String,
    pub body: Vec<u8>,
    /// Database time when the row was read, to show a lease's time left.
    pub db_now: DateTime<Utc>,
}

impl DeadLetter {
    pub fn sha256(&self) -> String {
        sha256_hex(&self.body)
    }

    /// The stored headers as a JSON object (an unparseable value is kept as a string).
    pub fn headers(&self) -> serde_json::Map<String, serde_json::Value> {
        parse_headers(&self.headers_json)
    }
}

pub fn parse_headers(json: &str) -> serde_json::Map<String, serde_json::Value> {
    match serde_json::from_str::<serde_json::Value>(json) {
        Ok(serde_json::Value::Object(m)) => m,
        Ok(other) => {
            let mut m = serde_json::Map::new();
            m.insert("(not an object)".into(), other);
            m
        }
        Err(_) => {
            let mut m = serde_json::Map::new();
            m.insert(
                "(unparseable)".into(),
                serde_json::Value::String(json.into()),
            );
            m
        }
    }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// A dimension of `aggregate --by`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dimension {
    Reason,
    SchemaVersion,
    Producer,
    SourceQueue,
    Hour,
    Day,
}

impl Dimension {
    pub const ALL: [Dimension; 6] = [
        Dimension::Reason,
        Dimension::SchemaVersion,
        Dimension::Producer,
        Dimension::SourceQueue,
        Dimension::Hour,
        Dimension::Day,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Dimension::Reason => "reason",
            Dimension::SchemaVersion => "schema_version",
            Dimension::Producer => "producer",
            Dimension::SourceQueue => "source_queue",
            Dimension::Hour => "hour",
            Dimension::Day => "day",
        }
    }

    pub fn is_time(self) -> bool {
        matches!(self, Dimension::Hour | Dimension::Day)
    }

    /// Parses `reason,producer,hour`; unknown or repeated names are usage errors.
    pub fn parse_list(s: &str) -> Result<Vec<Dimension>> {
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let d = Dimension::ALL
                .into_iter()
                .find(|d| d.name() == part)
                .ok_or_else(|| {
                    DlqError::usage(format!(
                        "unknown --by dimension {part:?}: expected a comma list of {}",
                        Dimension::ALL.map(|d| d.name()).join(", ")
                    ))
                })?;
            if out.contains(&d) {
                return Err(DlqError::usage(format!("--by names {part:?} twice")));
            }
            out.push(d);
        }
        if out.is_empty() {
            return Err(DlqError::usage("--by needs at least one dimension"));
        }
        if out.contains(&Dimension::Hour) && out.contains(&Dimension::Day) {
            return Err(DlqError::usage("--by takes hour or day, not both"));
        }
        Ok(out)
    }
}

/// The value of one dimension in a group.
#[derive(Debug, Clone, PartialEq)]
pub enum GroupKey {
    Text(Option<String>),
    Time(DateTime<Utc>),
}

/// One row of `aggregate`.
#[derive(Debug, Clone)]
pub struct Group {
    pub keys: Vec<(Dimension, GroupKey)>,
    pub count: i64,
    pub pending: i64,
    pub claimed: i64,
    pub replayed: i64,
    pub first_seen: DateTime<Utc>,
    pub last_seen: DateTime<Utc>,
}

/// One line of a dead letter's history.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HistoryEntry {
    pub at: DateTime<Utc>,
    pub operator: String,
    pub action: String,
    pub outcome: String,
    pub detail: Option<String>,
    /// The claim token the step acted under.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub token: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub target: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub plan_id: Option<String>,
}

/// A history line to append (the time is the database's).
#[derive(Debug, Clone)]
pub struct NewHistory {
    pub dead_letter_id: String,
    pub operator: String,
    pub action: &'static str,
    pub outcome: Outcome,
    pub detail: String,
    pub token: Option<String>,
    pub target: Option<String>,
    pub plan_id: Option<String>,
}

/// What a claim / replay / release step ended in. Serialized as the contract's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Replayed,
    Claimed,
    Released,
    NotReplayed,
    NotClaimed,
    NotReleased,
    NotFound,
    PublishFailed,
    Uncertain,
    Interrupted,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Replayed => "replayed",
            Outcome::Claimed => "claimed",
            Outcome::Released => "released",
            Outcome::NotReplayed => "not_replayed",
            Outcome::NotClaimed => "not_claimed",
            Outcome::NotReleased => "not_released",
            Outcome::NotFound => "not_found",
            Outcome::PublishFailed => "publish_failed",
            Outcome::Uncertain => "uncertain",
            Outcome::Interrupted => "interrupted",
        }
    }

    pub fn exit_code(self) -> u8 {
        match self {
            Outcome::Replayed | Outcome::Claimed | Outcome::Released => exit::OK,
            Outcome::NotReplayed | Outcome::NotClaimed | Outcome::NotReleased => exit::NOT_DONE,
            Outcome::NotFound => exit::NOT_FOUND,
            Outcome::PublishFailed => exit::PUBLISH_FAILED,
            Outcome::Uncertain => exit::UNCERTAIN,
            Outcome::Interrupted => exit::INTERRUPTED,
        }
    }

    /// How bad an outcome is, for "the exit code is that of the worst outcome".
    /// Uncertain is worst: it is the one that needs a person.
    pub fn severity(self) -> u8 {
        match self {
            Outcome::Replayed | Outcome::Claimed | Outcome::Released => 0,
            Outcome::NotReplayed | Outcome::NotClaimed | Outcome::NotReleased => 1,
            Outcome::NotFound => 2,
            Outcome::PublishFailed => 3,
            Outcome::Interrupted => 4,
            Outcome::Uncertain => 5,
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Checks an ID typed by an operator or read from a file.
pub fn validate_id(id: &str) -> Result<()> {
    if id.trim().is_empty() {
        return Err(DlqError::usage("the dead-letter ID is empty"));
    }
    if id.len() > 512 {
        return Err(DlqError::usage(format!(
            "the dead-letter ID is {} bytes long; IDs are at most 512 bytes",
            id.len()
        )));
    }
    if id.chars().any(char::is_control) {
        return Err(DlqError::usage(
            "the dead-letter ID contains a control character",
        ));
    }
    Ok(())
}

/// Checks a filter value (reason, producer, ...) from the command line.
pub fn validate_filter_value(name: &str, v: &str) -> Result<()> {
    if v.trim().is_empty() {
        return Err(DlqError::usage(format!("--{name} is empty")));
    }
    if v.chars().any(char::is_control) {
        return Err(DlqError::usage(format!(
            "--{name} contains a control character"
        )));
    }
    Ok(())
}
