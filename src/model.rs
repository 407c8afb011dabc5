//! What a dead letter is, how it is filtered and grouped, and what a replay step reports.

use crate::error::{DlqError, Result};
use crate::exit;
use crate::spell::{words, Flag, Words};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fmt;

mod content;
pub(crate) mod shown_id;
pub use content::{ContentMatch, MatchOn};

/// Shown where the effective producer, schema version or source queue is unknown.
pub const UNKNOWN: &str = "(unknown)";

/// Where a row is in its lifecycle, judged on the database clock. Exactly one holds:
/// `replayed` (marked after a confirm), else `discarded` (an operator set it aside), else
/// `uncertain` (a publish was attempted and not settled, whatever its lease), else
/// `claimed` (a live lease), else `pending`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Pending,
    Claimed,
    Uncertain,
    Replayed,
    Discarded,
}

impl State {
    pub const ALL: [State; 5] = [
        State::Pending,
        State::Claimed,
        State::Uncertain,
        State::Replayed,
        State::Discarded,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Claimed => "claimed",
            State::Uncertain => "uncertain",
            State::Replayed => "replayed",
            State::Discarded => "discarded",
        }
    }

    /// The state named by the database's CASE expression (see the stores).
    pub fn parse(s: &str) -> Option<State> {
        State::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// `--state pending,uncertain` or `all` (the empty list: no condition).
    pub fn parse_list(s: &str) -> Result<Vec<State>> {
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if part == "all" {
                return Ok(Vec::new());
            }
            let st = State::parse(part).ok_or_else(|| {
                DlqError::usage(format!(
                    "unknown state {part:?}: expected a comma list of pending, claimed, uncertain, replayed, discarded, or all"
                ))
            })?;
            if !out.contains(&st) {
                out.push(st);
            }
        }
        if out.is_empty() {
            return Err(DlqError::usage(
                Words::default().flag(Flag::State).text(" is empty"),
            ));
        }
        Ok(out)
    }
}

/// The selection shared by `list`, `aggregate`, `plan` and the bulk commands.
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
    /// Rows in any of these states; empty: every state.
    #[serde(default)]
    pub states: Vec<State>,
    /// `prune`: replayed or discarded before this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settled_before: Option<DateTime<Utc>>,
    /// `--grep`: the body contains these bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grep: Option<String>,
    /// `--error-contains`: the worker's error text contains this text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_contains: Option<String>,
    /// `--header KEY=VALUE` (all must match).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<ContentMatch>,
    /// `--field PATH=VALUE` on a JSON object body (all must match).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<ContentMatch>,
    /// `--revisions`: only revisions made by `dlq edit`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub revisions: bool,
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
    /// The operator part of the claim token: the token itself is a bearer secret,
    /// printed only by `dlq claim` to the one who claimed.
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
    /// None only when what a worker stored cannot be read (see `unreadable`).
    pub dead_lettered_at: Option<DateTime<Utc>>,
    pub replay_attempt_at: Option<DateTime<Utc>>,
    pub discarded_at: Option<DateTime<Utc>>,
    pub discard_note: Option<String>,
    /// Of a revision (`dlq edit`): the ID of the dead letter it revises.
    #[serde(default)]
    pub revision_of: Option<String>,
    pub state: State,
    /// The claim was taken by dlq v1 and carried over by `dlq migrate` (its token was
    /// replaced by one nobody holds): no run can still settle it.
    #[serde(skip, default)]
    pub v1_claim: bool,
    /// The time columns whose stored value cannot be read (SQLite: a worker's text in
    /// another format, a BLOB), each with what is stored; such a time counts as absent
    /// (but a lease end that cannot be read holds the row: [`Summary::lease_unreadable`])
    /// in comparisons, while a set `replayed_at` still means replayed.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub unreadable: BTreeMap<String, String>,
    /// How its id is stored: dlq writes only a TEXT id.
    #[serde(skip, default)]
    pub id_storage: IdStorage,
}

/// How a row's id is stored. SQLite keeps what a worker binds: bytes (a BLOB) make a
/// row whose id `list` and `show` print as text but which no write of dlq matches (a
/// write matches one TEXT id exactly, so a TEXT row of the same bytes is another row).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IdStorage {
    #[default]
    Text,
    /// A BLOB (a worker's bug): read, never written, until it is made TEXT.
    Bytes,
    /// A BLOB whose bytes a TEXT row also has as its id: two rows shown as one ID.
    BytesBesideText,
}

impl IdStorage {
    /// The store's code (`0` TEXT, `1` bytes, `2` bytes beside a TEXT row).
    pub fn from_code(code: i64) -> Self {
        match code {
            0 => IdStorage::Text,
            1 => IdStorage::Bytes,
            _ => IdStorage::BytesBesideText,
        }
    }

    /// Why dlq does not write the row shown as `id`, and the fix (SQL that makes it a
    /// TEXT row, by the bytes it holds); None for a TEXT id.
    pub fn refusal(self, id: &str) -> Option<String> {
        let bytes = shown_id::id_bytes(id);
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let lit = id.replace('\'', "''");
        let text = match std::str::from_utf8(&bytes) {
            Ok(_) => "CAST(id AS TEXT)".to_string(),
            Err(_) => format!("'{lit}'"),
        };
        match self {
            IdStorage::Text => None,
            IdStorage::Bytes => Some(format!(
                "its id is stored as bytes (a BLOB, a worker's bug), which dlq never writes; make it text first: UPDATE dead_letters SET id = {text} WHERE id = X'{hex}'"
            )),
            IdStorage::BytesBesideText => Some(format!(
                "two rows have id {id:?}: a TEXT one and one stored as bytes (a BLOB, a worker's bug); dlq writes only the TEXT one; give the other its own text id, e.g. UPDATE dead_letters SET id = '{lit}-bytes' WHERE id = X'{hex}'"
            )),
        }
    }
}

/// Who may still settle an `uncertain` row (docs/replay-protocol.md, "Settling").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settling {
    /// The run that attempted it may still settle it, until its lease ends. Nothing
    /// short of that end shows the run gone: one that lost its database connection lives
    /// on, retrying its mark.
    Running { until: DateTime<Utc> },
    /// A claim by a tool older than this schema (dlq v1), carried over by `dlq migrate`:
    /// nobody holds its token.
    V1Claim,
    /// Its lease has ended: only `resolve` settles it now.
    Ended,
}

impl Settling {
    /// Whether `resolve` may decide it now.
    pub fn resolvable(self) -> bool {
        !matches!(self, Settling::Running { .. })
    }

    /// Until when the attempting run may still settle it (`settling_until`).
    pub fn until(self) -> Option<DateTime<Utc>> {
        match self {
            Settling::Running { until } => Some(until),
            _ => None,
        }
    }
}

impl Summary {
    /// The lease end is set but cannot be read (another tool's format): it holds the
    /// row, as a live lease does, until an operator fixes the stored value.
    pub fn lease_unreadable(&self) -> bool {
        self.unreadable.contains_key("replay_claim_expires_at")
    }

    /// Who may still settle this row, if it is `uncertain`.
    pub fn settling(&self, now: DateTime<Utc>) -> Option<Settling> {
        if self.state != State::Uncertain {
            return None;
        }
        let live = self.replay_claim_owner.is_some()
            && (self.replay_claim_expires_at.is_some_and(|t| t > now) || self.lease_unreadable());
        Some(match (self.v1_claim, live) {
            (true, _) => Settling::V1Claim,
            (false, false) => Settling::Ended,
            (false, true) => Settling::Running {
                until: self.replay_claim_expires_at.unwrap_or(now),
            },
        })
    }
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
    Sha256Hex::of(bytes).as_str().to_string()
}

/// A body's SHA-256 in hex, held on the stack: `export` writes one per line, and
/// `hex::encode` builds its `String` a character at a time.
pub struct Sha256Hex([u8; 64]);

impl Sha256Hex {
    pub fn of(bytes: &[u8]) -> Sha256Hex {
        let mut hex = [0; 64];
        // A 32-byte digest always fills 64 digits.
        hex::encode_to_slice(Sha256::digest(bytes), &mut hex).expect("64 hex digits");
        Sha256Hex(hex)
    }

    pub fn as_str(&self) -> &str {
        // Hex digits are ASCII.
        std::str::from_utf8(&self.0).expect("hex is ASCII")
    }
}

/// A claim token's fingerprint for history and logs: 12 hex digits of its SHA-256. It
/// tells two tokens apart; it cannot be turned back into one.
pub fn token_ref(token: &str) -> String {
    sha256_hex(token.as_bytes())[..12].to_string()
}

/// The operator part of a claim token (`OPERATOR:UUID`).
pub fn token_operator(token: &str) -> &str {
    token.rsplit_once(':').map(|(op, _)| op).unwrap_or(token)
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
    /// The worker's error text up to its first `:`, trimmed (`ValueError`).
    ErrorClass,
}

impl Dimension {
    pub const ALL: [Dimension; 7] = [
        Dimension::Reason,
        Dimension::SchemaVersion,
        Dimension::Producer,
        Dimension::SourceQueue,
        Dimension::ErrorClass,
        Dimension::Hour,
        Dimension::Day,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Dimension::Reason => "reason",
            Dimension::SchemaVersion => "schema_version",
            Dimension::Producer => "producer",
            Dimension::SourceQueue => "source_queue",
            Dimension::ErrorClass => "error_class",
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
                    DlqError::usage(words("unknown ").flag(Flag::By).text(format!(
                        " dimension {part:?}: expected a comma list of {}",
                        Dimension::ALL.map(|d| d.name()).join(", ")
                    )))
                })?;
            if out.contains(&d) {
                return Err(by(&format!(" names {part:?} twice")));
            }
            out.push(d);
        }
        if out.is_empty() {
            return Err(by(" needs at least one dimension"));
        }
        if out.contains(&Dimension::Hour) && out.contains(&Dimension::Day) {
            return Err(by(" takes hour or day, not both"));
        }
        Ok(out)
    }
}

/// A usage error about the aggregate's dimensions: the option, then `rest`.
fn by(rest: &str) -> DlqError {
    DlqError::usage(Words::default().flag(Flag::By).text(rest))
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
    pub uncertain: i64,
    pub replayed: i64,
    pub discarded: i64,
    /// None: no time of the group could be read (a worker's unreadable value).
    pub first_seen: Option<DateTime<Utc>>,
    pub last_seen: Option<DateTime<Utc>>,
}

/// One line of a dead letter's history.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HistoryEntry {
    pub at: DateTime<Utc>,
    pub operator: String,
    pub action: String,
    pub outcome: String,
    pub detail: Option<String>,
    /// A fingerprint of the claim token the step acted under (see [`token_ref`]): it ties
    /// the steps of one replay together without printing the token.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub token_ref: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub target: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub plan_id: Option<String>,
}

/// What a history entry records. Stored as [`HistoryAction::as_str`]: the contract's
/// names, which stored rows and scripts reading `show -o json` depend on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HistoryAction {
    Claim,
    Attempt,
    Release,
    Replay,
    Resolve,
    Discard,
    Restore,
    Note,
    Edit,
}

impl HistoryAction {
    pub fn as_str(self) -> &'static str {
        match self {
            HistoryAction::Claim => "claim",
            HistoryAction::Attempt => "attempt",
            HistoryAction::Release => "release",
            HistoryAction::Replay => "replay",
            HistoryAction::Resolve => "resolve",
            HistoryAction::Discard => "discard",
            HistoryAction::Restore => "restore",
            HistoryAction::Note => "note",
            HistoryAction::Edit => "edit",
        }
    }
}

impl fmt::Display for HistoryAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A history line to append (the time is the database's).
#[derive(Debug, Clone)]
pub struct NewHistory {
    pub dead_letter_id: String,
    pub operator: String,
    pub action: HistoryAction,
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
    Resolved,
    NotResolved,
    /// A history step, never a final outcome: a publish was about to start.
    Attempted,
    /// `discard`: set aside, never replayed.
    Discarded,
    NotDiscarded,
    /// `restore`: pending again.
    Restored,
    NotRestored,
    /// `note`: a history entry added.
    Noted,
    /// `edit`: a revision was made and the original set aside.
    Edited,
    /// `edit`: the change changes nothing; no revision.
    Unchanged,
    /// `edit --dry-run`: what an edit would do.
    WouldEdit,
    /// `edit`: the row is not pending, drifted from its plan, or the change fails on it.
    NotEdited,
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
            Outcome::Resolved => "resolved",
            Outcome::NotResolved => "not_resolved",
            Outcome::Attempted => "attempted",
            Outcome::Discarded => "discarded",
            Outcome::NotDiscarded => "not_discarded",
            Outcome::Restored => "restored",
            Outcome::NotRestored => "not_restored",
            Outcome::Noted => "noted",
            Outcome::Edited => "edited",
            Outcome::Unchanged => "unchanged",
            Outcome::WouldEdit => "would_edit",
            Outcome::NotEdited => "not_edited",
        }
    }

    pub fn exit_code(self) -> u8 {
        match self {
            Outcome::Replayed
            | Outcome::Claimed
            | Outcome::Released
            | Outcome::Resolved
            | Outcome::Attempted
            | Outcome::Discarded
            | Outcome::Restored
            | Outcome::Noted
            | Outcome::Edited
            | Outcome::Unchanged
            | Outcome::WouldEdit => exit::OK,
            Outcome::NotReplayed
            | Outcome::NotClaimed
            | Outcome::NotReleased
            | Outcome::NotResolved
            | Outcome::NotDiscarded
            | Outcome::NotRestored
            | Outcome::NotEdited => exit::NOT_DONE,
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
            Outcome::Replayed
            | Outcome::Claimed
            | Outcome::Released
            | Outcome::Resolved
            | Outcome::Attempted
            | Outcome::Discarded
            | Outcome::Restored
            | Outcome::Noted
            | Outcome::Edited
            | Outcome::Unchanged
            | Outcome::WouldEdit => 0,
            Outcome::NotReplayed
            | Outcome::NotClaimed
            | Outcome::NotReleased
            | Outcome::NotResolved
            | Outcome::NotDiscarded
            | Outcome::NotRestored
            | Outcome::NotEdited => 1,
            Outcome::NotFound => 2,
            Outcome::PublishFailed => 3,
            Outcome::Interrupted => 4,
            Outcome::Uncertain => 5,
        }
    }
}

impl Outcome {
    pub const ALL: [Outcome; 22] = [
        Outcome::Replayed,
        Outcome::Claimed,
        Outcome::Released,
        Outcome::NotReplayed,
        Outcome::NotClaimed,
        Outcome::NotReleased,
        Outcome::NotFound,
        Outcome::PublishFailed,
        Outcome::Uncertain,
        Outcome::Interrupted,
        Outcome::Resolved,
        Outcome::NotResolved,
        Outcome::Attempted,
        Outcome::Discarded,
        Outcome::NotDiscarded,
        Outcome::Restored,
        Outcome::NotRestored,
        Outcome::Noted,
        Outcome::Edited,
        Outcome::Unchanged,
        Outcome::WouldEdit,
        Outcome::NotEdited,
    ];

    pub fn parse(s: &str) -> Option<Outcome> {
        Outcome::ALL.into_iter().find(|o| o.as_str() == s)
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
