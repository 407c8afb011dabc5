//! The dead-letter store: one trait, a PostgreSQL and a SQLite implementation.
//!
//! Each backend keeps all of its SQL in its own file. Rules that must hold on both:
//! - every time comparison uses the database's clock (`now()` / the SQLite expression in
//!   [`sqlite_time::NOW_US`]), never the client's, so two operators on two laptops agree on
//!   whether a lease is live;
//! - every write that moves a row through replay is one conditional UPDATE guarded by the
//!   caller's claim token, so a stale token can neither mark nor release;
//! - reads never touch `body` except where the body is the point (`show`, `plan`, replay).

pub mod alerting;
pub mod copies;
mod identity;
pub mod postgres;
pub mod protocol;
pub mod read;
pub mod revise;
pub mod sqlite;
mod sqlite_export;
pub mod sqlite_open;
pub mod sqlite_read;
pub mod sqlite_time;

pub use alerting::AlertReads;
pub use identity::EventInContent;

/// The prefix of the claim owner a SQLite `dlq import` holds its rows by until they are
/// given back (see `sqlite_import.rs`), followed by a UUID, with a lease to [`IMPORT_UNTIL`].
pub const IMPORT_OWNER: &str = "dlq-import:";
/// The lease end of a row an import holds (TEXT: read as live by every reader).
pub const IMPORT_UNTIL: &str = "4000-01-01 00:00:00.000000";

/// Whether a row's claim is an unfinished import's (its own state not yet in the store).
/// An operator named `dlq-import`, or a claim imported from such an owner, has another
/// token or lease end.
pub(crate) fn import_held(
    owner: Option<&str>,
    lease_end: Option<chrono::DateTime<chrono::Utc>>,
) -> bool {
    // The owner first: the export asks this of every row, and parsing the time is not free.
    let held_until = || {
        chrono::NaiveDateTime::parse_from_str(IMPORT_UNTIL, "%Y-%m-%d %H:%M:%S%.f")
            .map(|t| t.and_utc())
            .ok()
    };
    owner
        .and_then(|o| o.strip_prefix(IMPORT_OWNER))
        .is_some_and(|uuid| uuid::Uuid::parse_str(uuid).is_ok())
        && lease_end.is_some()
        && lease_end == held_until()
}
pub use protocol::{LeaseAfter, Resolution};
pub use read::{Backend, Dialect, Reads};
pub use revise::{NewRevision, Revise, RevisionWrite};

use crate::error::{DlqError, Result};
use crate::model::{DeadLetter, Filter, HistoryEntry, NewHistory, State, Summary};
use crate::secret::{scrub, SecretUrl};
use crate::spell::{words, Flag};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use std::time::Duration;

/// A row to insert with `dlq import` (or by tests and benchmarks).
#[derive(Debug, Clone, Default)]
pub struct NewDeadLetter {
    /// Line of the import file, for error messages.
    pub line: usize,
    pub id: String,
    pub body: Vec<u8>,
    pub reason: String,
    pub attempts: i64,
    pub headers_json: String,
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
    pub dead_lettered_at: Option<DateTime<Utc>>,
    pub replay_attempt_at: Option<DateTime<Utc>>,
    pub discarded_at: Option<DateTime<Utc>>,
    pub discard_note: Option<String>,
    /// Of a revision: the ID of the dead letter it revises (`dlq edit`).
    pub revision_of: Option<String>,
    /// The row's history, oldest first, as exported (restored by `import`); `None`: the
    /// input carried none.
    pub history: Option<Vec<HistoryEntry>>,
    /// Export only: the time columns whose stored value cannot be read (see
    /// [`Summary::unreadable`]); an import refuses such a line.
    pub unreadable: std::collections::BTreeMap<String, String>,
}

impl NewDeadLetter {
    /// About what the row takes in the statements that insert it and its history: every
    /// value counts, since any can be large (PostgreSQL refuses a message past 1 GB; a
    /// SQLite batch writes large headers as long as large bodies).
    pub(crate) fn bytes(&self) -> usize {
        let opt = |v: &Option<String>| v.as_ref().map_or(0, String::len);
        let texts = [
            &self.replay_claim_owner,
            &self.last_replay_error,
            &self.event_id,
            &self.error,
            &self.producer,
            &self.schema_version,
            &self.source_queue,
            &self.exchange,
            &self.routing_key,
            &self.discard_note,
            &self.revision_of,
        ];
        let history = self.history.iter().flatten().map(|h| {
            let extra = [&h.detail, &h.token_ref, &h.target, &h.plan_id];
            64 + h.operator.len()
                + h.action.len()
                + h.outcome.len()
                + extra.map(opt).iter().sum::<usize>()
        });
        64 + self.id.len()
            + self.body.len()
            + self.reason.len()
            + self.headers_json.len()
            + texts.map(opt).iter().sum::<usize>()
            + history.sum::<usize>()
    }
}

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ImportReport {
    pub imported: u64,
    pub skipped_existing: u64,
}

/// A message taken from a RabbitMQ dead-letter queue by `dlq capture`, ready to insert.
#[derive(Debug, Clone)]
pub struct CapturedLetter {
    pub row: NewDeadLetter,
    /// What identifies the message across redeliveries (docs/capture.md); stored with it.
    pub capture_key: String,
    /// The broker flagged the delivery as redelivered: a row may already hold it.
    pub redelivered: bool,
}

/// What became of one [`CapturedLetter`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaptureOutcome {
    Inserted,
    /// A redelivery of a message that already has a row: nothing inserted.
    AlreadyThere,
    /// The database refused this row (a constraint, a value it cannot hold); the others
    /// of the batch are unaffected. The text says why.
    Refused(String),
}

/// A row just claimed. A body over [`read::BODY_INLINE_MAX`] does not come with it (read
/// the row with [`Reads::held`]): a claim holds its row locks only while its `UPDATE`
/// returns small rows, whatever the size of a body.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub summary: Summary,
    /// Database time at the claim, to tell how long the lease still runs.
    pub db_now: DateTime<Utc>,
    /// Headers and body, when the body is small enough to come with the claim.
    pub content: Option<(String, Vec<u8>)>,
}

impl Claimed {
    /// The whole row, or the row's ID when its body is still to be read.
    pub fn into_whole(self) -> std::result::Result<DeadLetter, String> {
        match self.content {
            Some((headers_json, body)) => Ok(DeadLetter {
                summary: self.summary,
                headers_json,
                body,
                db_now: self.db_now,
            }),
            None => Err(self.summary.id),
        }
    }
}

/// A row selected for a plan: its identity and body hash.
#[derive(Debug, Clone)]
pub struct PlanCandidate {
    pub id: String,
    pub reason: String,
    pub producer: Option<String>,
    pub schema_version: Option<String>,
    pub sha256: String,
}

/// Whether a sweep of the come-back window reads the `x-dead-letter-id` headers of all
/// its rows, or finds come-backs by event ID alone (every row the run sent has one; the
/// headers of what it finds are read all the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderSweep {
    Window,
    NotNeeded,
}

/// A dead letter written since a plan run started, as its come-back watch reads it.
#[derive(Debug, Clone)]
pub struct NewArrival {
    pub id: String,
    pub event_id: Option<String>,
    /// Its `x-dead-letter-id` header: the row a replay published it from, when the
    /// consumer kept the headers of what it dead-lettered.
    pub replayed_from: Option<String>,
    pub at: DateTime<Utc>,
}

/// How to connect. Timeouts bound every wait on the database.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    pub connect_timeout: Duration,
    pub statement_timeout: Duration,
    pub lock_timeout: Duration,
    /// SQLite: how long a writer waits for another writer's lock.
    pub busy_timeout: Duration,
    /// SQLite: whether a missing file is created (only migrating does).
    pub if_missing: IfMissing,
    /// One for a command that runs its statements one after another: a second would
    /// only cost another connection setup (and TLS handshake) while the first is being
    /// returned to the pool.
    pub max_connections: u32,
    /// Ping a pooled connection before reusing it: worth a round trip only in runs
    /// that last long enough for a connection to die idle (`--plan`, `--watch`).
    pub long_running: bool,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            connect_timeout: Duration::from_secs(10),
            statement_timeout: Duration::from_secs(30),
            lock_timeout: Duration::from_secs(10),
            busy_timeout: Duration::from_secs(5),
            if_missing: IfMissing::Refuse,
            max_connections: 1,
            long_running: false,
        }
    }
}

/// The writes of a store: each backend's own SQL. The reads ([`Reads`]) are one
/// implementation for both.
#[async_trait]
pub trait Store: Reads + AlertReads + Revise {
    /// Applies the embedded migrations; returns the descriptions of those applied now.
    async fn migrate(&self) -> Result<Vec<String>>;
    /// All rows or none: PostgreSQL in one transaction; SQLite in short batches held by
    /// the import's claim until one last transaction releases them all (a dead import's
    /// rows are undone by the next dlq that opens the file).
    async fn import(&self, rows: Vec<NewDeadLetter>, existing: OnExisting) -> Result<ImportReport>;
    /// Protocol step 1: claims each row that exists and is `pending` (not replayed, not
    /// discarded, no open attempt, no live lease), and appends the entry of `history` of
    /// each row claimed, in one transaction. Returns the claimed rows (a large body left
    /// out), with the lease end and the database time.
    async fn claim(
        &self,
        ids: &[String],
        token: &str,
        lease: Duration,
        history: &[NewHistory],
    ) -> Result<Vec<Claimed>>;
    /// Protocol step 2: where `token` holds the row, it is not replayed, no attempt is
    /// open and the lease outlives `outlive` on the database clock, records the attempt
    /// and swaps the token for `new_token`. Returns the IDs attempted: only these may be
    /// published.
    async fn attempt(
        &self,
        ids: &[String],
        token: &str,
        new_token: &str,
        outlive: Duration,
        history: &[NewHistory],
    ) -> Result<Vec<String>>;
    /// Protocol step 4: marks replayed where `token` holds an attempted, unreplayed row.
    /// Returns the IDs marked.
    async fn mark_replayed(
        &self,
        ids: &[String],
        token: &str,
        history: &[NewHistory],
    ) -> Result<Vec<String>>;
    /// Protocol step 5: where `token` holds the row with a live lease, clears lease and
    /// attempt and records `error`: the row is `pending` again. Only after a certain
    /// failure, or before any publish. A token whose lease has ended can never clear an
    /// attempt (the row is `uncertain`: only `resolve` settles it). Returns the IDs
    /// released.
    async fn release(
        &self,
        ids: &[String],
        token: &str,
        error: Option<&str>,
        history: &[NewHistory],
    ) -> Result<Vec<String>>;
    /// Protocol step 6: the publish of these attempted rows was not settled. Keeps the
    /// attempt (the row stays `uncertain`), records `error`, and ends the lease now or
    /// lets it run out (the message may still be on its way), as `lease` says.
    async fn settle_uncertain(
        &self,
        ids: &[String],
        token: &str,
        error: &str,
        lease: LeaseAfter,
        history: &[NewHistory],
    ) -> Result<Vec<String>>;
    /// Protocol step 7: an operator's decision on `uncertain` rows whose attempting run
    /// can no longer settle them (its lease has ended, or the claim was a v1 tool's):
    /// [`Resolution::Delivered`] marks them replayed, else they go back to `pending`. A run that seems
    /// gone may still be settling: only the lease's end tells (docs/replay-protocol.md,
    /// "Settling").
    /// Returns the IDs resolved.
    async fn resolve(
        &self,
        ids: &[String],
        resolution: Resolution,
        history: &[NewHistory],
    ) -> Result<Vec<String>>;
    async fn append_history(&self, entries: &[NewHistory]) -> Result<()>;
    async fn close(&self);

    /// `dlq capture`: inserts the rows in one transaction, skipping each redelivered one
    /// whose capture key already has a row; outcomes in the order of `rows`. A row the
    /// database refuses is reported [`CaptureOutcome::Refused`] and the others are still
    /// inserted. An error means nothing may be assumed committed (nor not committed).
    /// An empty slice writes nothing but checks that the schema has the capture key.
    async fn capture(&self, rows: &[CapturedLetter]) -> Result<Vec<CaptureOutcome>>;

    /// How many capture transactions one run may have open at once. SQLite has one
    /// writer: a second transaction would only wait for the first out of the busy budget.
    fn capture_transactions(&self) -> usize {
        1
    }

    // Triage (the contract's "Triage beyond replay").

    /// Sets aside `pending` rows (they become `discarded`, with `note`) and appends the
    /// entry of `history` of each row discarded, in one transaction. Returns the IDs
    /// discarded.
    async fn discard(
        &self,
        ids: &[String],
        note: &str,
        history: &[NewHistory],
    ) -> Result<Vec<String>>;
    /// Makes `discarded` rows `pending` again, with their history, in one transaction.
    /// Returns the IDs restored.
    async fn restore(&self, ids: &[String], history: &[NewHistory]) -> Result<Vec<String>>;
    /// One batch of `prune`: of the next `window` rows in ID order after `after`, deletes
    /// those that match `filter`, with their history, in one short transaction. The filter
    /// must select only settled states and carry `settled_before`. Returns the last ID
    /// looked at (`None`: the end of the table) and the number of rows deleted.
    async fn prune_batch(
        &self,
        filter: &Filter,
        after: Option<&str>,
        window: i64,
    ) -> Result<(Option<String>, u64)>;
}

/// (producer, schema_version, event_id) as a row with these headers and body and no such
/// columns derives them (the header, else the top-level body field).
pub fn derived_identity(headers_json: &str, body: &[u8]) -> [Option<String>; 3] {
    identity::identity_hint([None, None, None], headers_json, body)
}

/// A history entry as both stores' export queries render it (JSON, times in µs).
#[derive(serde::Deserialize)]
struct RawHistory {
    at: Option<i64>,
    operator: String,
    action: String,
    outcome: String,
    detail: Option<String>,
    token: Option<String>,
    token_ref: Option<String>,
    target: Option<String>,
    plan_id: Option<String>,
}

/// The history an export query aggregated as a JSON array (NULL: none).
pub(crate) fn parse_history_json(json: Option<&str>) -> Result<Vec<HistoryEntry>> {
    let Some(json) = json else {
        return Ok(Vec::new());
    };
    let raw: Vec<RawHistory> = serde_json::from_str(json)
        .map_err(|e| DlqError::other(format!("database: unreadable history ({e})")))?;
    Ok(raw
        .into_iter()
        .map(|h| HistoryEntry {
            at: h.at.and_then(sqlite_time::from_int).unwrap_or_default(),
            operator: h.operator,
            action: h.action,
            outcome: h.outcome,
            detail: h.detail,
            token_ref: h
                .token
                .as_deref()
                .map(crate::model::token_ref)
                .or(h.token_ref),
            target: h.target,
            plan_id: h.plan_id,
        })
        .collect())
}

/// Refuses a prune filter that could select a row that is not settled.
pub(crate) fn check_prune_filter(filter: &Filter) -> Result<DateTime<Utc>> {
    let settled = |s: &State| matches!(s, State::Replayed | State::Discarded);
    if filter.states.is_empty() || !filter.states.iter().all(settled) {
        return Err(DlqError::usage(
            "prune deletes replayed or discarded dead letters only",
        ));
    }
    filter
        .settled_before
        .ok_or_else(|| DlqError::usage("prune needs a time before which rows were settled"))
}

/// Reads the URL's connection parameters without connecting, as [`open`] will: a bad one
/// (`sslmode=bogus`) is a usage error the caller can blame on where the URL came from.
pub fn check_url(url: &SecretUrl) -> Result<()> {
    use std::str::FromStr;
    match url.scheme() {
        "postgres" | "postgresql" => postgres::options(url).map(drop),
        s if s.starts_with("sqlite") => sqlx::sqlite::SqliteConnectOptions::from_str(url.expose())
            .map(drop)
            .map_err(|e| DlqError::usage(format!("invalid SQLite URL {url}: {}", scrub(&e.to_string())))),
        _ => Err(DlqError::usage(format!(
            "unsupported database URL {url}: expected postgres://..., postgresql://... or sqlite://FILE"
        ))),
    }
}

/// The file a `sqlite:` URL names when it does not exist yet: what `dlq migrate` would
/// create. `None` for another scheme, an existing file or a URL that names no file.
pub fn sqlite_file_to_create(url: &SecretUrl) -> Option<std::path::PathBuf> {
    use std::str::FromStr;
    if !url.scheme().starts_with("sqlite") {
        return None;
    }
    // An in-memory database is no file, and a read-only open creates none.
    let query = url.expose().split_once('?').map(|(_, q)| q).unwrap_or("");
    let never = ["mode=memory", "mode=ro", "immutable=1"];
    if url.expose().contains(":memory:") || query.split('&').any(|p| never.contains(&p)) {
        return None;
    }
    let options = sqlx::sqlite::SqliteConnectOptions::from_str(url.expose()).ok()?;
    let file = options.get_filename();
    (!file.as_os_str().is_empty() && !file.exists()).then(|| file.to_path_buf())
}

/// Opens the store named by the URL's scheme: `postgres://`, `postgresql://` or `sqlite:`.
pub async fn open(url: &SecretUrl, opts: &StoreOptions) -> Result<Box<dyn Store>> {
    match url.scheme() {
        "postgres" | "postgresql" => Ok(Box::new(postgres::PgStore::connect(url, opts).await?)),
        s if s.starts_with("sqlite") => Ok(Box::new(sqlite::SqliteStore::connect(url, opts).await?)),
        _ => Err(DlqError::usage(format!(
            "unsupported database URL {url}: expected postgres://..., postgresql://... or sqlite://FILE"
        ))),
    }
}

/// The migrations of `migrator` not in `before` (the versions applied before the run).
pub(crate) fn newly_applied(migrator: &sqlx::migrate::Migrator, before: &[i64]) -> Vec<String> {
    migrator
        .iter()
        .filter(|m| !before.contains(&m.version))
        .map(|m| format!("{} {}", m.version, m.description))
        .collect()
}

/// What opening a SQLite file that does not exist does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IfMissing {
    /// Refuses: a typo in a URL must not make a new, empty database.
    Refuse,
    /// Creates it (and sets it to WAL mode).
    Create,
}

/// What an import does with a line whose dead letter already exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnExisting {
    /// Refuses the import (nothing is imported).
    Refuse,
    /// Keeps the existing row and goes on.
    Skip,
}

/// An imported line whose dead letter already exists; `stored` says how the existing
/// id is stored when that is news (", its id stored as bytes by a worker").
pub(crate) fn already_exists(line: usize, id: &str, stored: &str) -> DlqError {
    DlqError::usage(
        words(format!(
            "line {line}: field id: a dead letter with id {id:?} already exists{stored} (nothing was imported; use "
        ))
        .flag(Flag::SkipExisting)
        .text(" to keep the existing rows)"),
    )
}

pub(crate) fn migration_error(e: sqlx::migrate::MigrateError) -> DlqError {
    DlqError::other(format!("migration failed: {}", scrub(&e.to_string())))
}

/// Turns a driver error into one line an operator can act on, without secrets.
pub(crate) fn db_error(e: sqlx::Error) -> DlqError {
    if let Some(dbe) = e.as_database_error() {
        let code = dbe.code().map(|c| c.into_owned()).unwrap_or_default();
        let msg = dbe.message().to_string();
        // PostgreSQL undefined_table / undefined_column; SQLite's plain text.
        if code == "42P01"
            || code == "42703"
            || msg.contains("no such table")
            || msg.contains("no such column")
        {
            return DlqError::SchemaMissing(scrub(&msg));
        }
        if code == "5" || code == "517" || msg.contains("database is locked") {
            return DlqError::Busy(Duration::from_secs(0));
        }
        let why = match code.as_str() {
            "57014" => Some("statement timed out"),
            "55P03" => Some("lock wait timed out"),
            // serialization_failure, deadlock_detected, admin shutdown / cannot connect now.
            "40001" | "40P01" | "57P01" | "57P03" => Some("temporarily unavailable"),
            _ => None,
        };
        return match why {
            Some(what) => DlqError::Unavailable {
                what: what.into(),
                source: Some(e),
            },
            None => DlqError::Database(e),
        };
    }
    match e {
        sqlx::Error::PoolTimedOut => DlqError::Unavailable {
            what: "timed out connecting (is it reachable?)".into(),
            source: None,
        },
        // The connection broke (also mid-handshake, where a dropped socket reads as a
        // TLS or protocol error): the next try opens a new one.
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => DlqError::Unavailable {
            what: "connection lost".into(),
            source: Some(e),
        },
        other => DlqError::Database(other),
    }
}

/// Whether a SQLite error is about one row's values (a constraint, a value the database
/// cannot hold, a trigger that refused it) rather than the connection or the schema.
pub(crate) fn is_sqlite_row_error(e: &sqlx::Error) -> bool {
    // Extended result codes; the primary one is the low byte: TOOBIG, CONSTRAINT,
    // MISMATCH.
    db_code(e).is_some_and(|code| {
        code.parse::<i64>()
            .is_ok_and(|n| matches!(n & 0xff, 18..=20))
    })
}

/// [`is_sqlite_row_error`] for PostgreSQL.
pub(crate) fn is_postgres_row_error(e: &sqlx::Error) -> bool {
    // SQLSTATE classes: data exception, integrity constraint, program limit, RAISE.
    db_code(e).is_some_and(|code| ["22", "23", "54", "P0"].iter().any(|c| code.starts_with(c)))
}

/// The error code of a database error (none for a connection's).
fn db_code(e: &sqlx::Error) -> Option<String> {
    let dbe = e.as_database_error()?;
    Some(dbe.code().map(|c| c.into_owned()).unwrap_or_default())
}

/// The SQL condition of one state: `now` is the dialect's clock and `lease_end` the
/// lease end as SQL of the clock's type (SQLite normalises what a worker stored, see
/// [`sqlite_time`]). Whether a time is set is always the stored column's nullness. The
/// five are disjoint and cover every row; [`state_case`] is the same rule as one
/// expression. An open attempt is `uncertain` whatever its lease does (a replay in
/// flight, or one that crashed: a rerun must never take it for "someone else holds it");
/// `claimed` is a live lease with no attempt. A lease nobody owns (a worker's expiry with
/// no owner) holds nothing.
pub(crate) fn state_predicate_at(state: State, now: &str, lease_end: &str) -> String {
    const OPEN: &str = "replayed_at IS NULL AND discarded_at IS NULL";
    let live = lease_live(now, lease_end);
    match state {
        State::Replayed => "replayed_at IS NOT NULL".into(),
        State::Discarded => "replayed_at IS NULL AND discarded_at IS NOT NULL".into(),
        State::Uncertain => format!("{OPEN} AND replay_attempt_at IS NOT NULL"),
        State::Claimed => format!("{OPEN} AND replay_attempt_at IS NULL AND {live}"),
        State::Pending => format!("{OPEN} AND replay_attempt_at IS NULL AND NOT ({live})"),
    }
}

/// A lease that holds the row: an owner and a stored end that is after `now`, or that
/// cannot be read (`lease_end` as in [`state_predicate_at`] is NULL for a set column):
/// another tool's lease in a form dlq cannot read may be live, so it holds the row until
/// an operator fixes it (`show` says what is stored).
pub(crate) fn lease_live(now: &str, lease_end: &str) -> String {
    format!(
        "(replay_claim_owner IS NOT NULL AND replay_claim_expires_at IS NOT NULL \
          AND ({lease_end} IS NULL OR {lease_end} > {now}))"
    )
}

/// The state of a row as one SQL expression (see [`state_predicate_at`]).
pub(crate) fn state_case(now: &str, lease_end: &str) -> String {
    format!(
        "CASE WHEN replayed_at IS NOT NULL THEN 'replayed' \
              WHEN discarded_at IS NOT NULL THEN 'discarded' \
              WHEN replay_attempt_at IS NOT NULL THEN 'uncertain' \
              WHEN {} THEN 'claimed' ELSE 'pending' END",
        lease_live(now, lease_end)
    )
}

/// An uncertain row that no run can still settle, so `resolve` may decide it: its lease
/// has ended (`now`, `lease_end` as in [`state_predicate_at`]), or its claim was a v1
/// tool's (`v1_token`: the dialect's test of the token `dlq migrate` gave it).
pub(crate) fn unsettleable(now: &str, lease_end: &str, v1_token: &str) -> String {
    format!("(NOT {} OR {v1_token})", lease_live(now, lease_end))
}

/// Whether a claim token is one `dlq migrate` gave a v1 claim (`OPERATOR:v1-HEX`): a
/// token nobody holds, of a tool older than this schema. A token of this dlq ends in a
/// UUID after its last `:`, which never starts with `v`.
pub fn is_v1_token(token: &str) -> bool {
    token
        .rsplit_once(':')
        .is_some_and(|(_, last)| last.starts_with("v1-"))
}

/// A row no revision was made of: `restore` never makes a revised original pending again
/// (its revision carries the event; both could then be replayed). Its own history says
/// so too ("revised as", see the `revise` module): `prune` may have deleted the revision
/// (replayed, or revised in turn and discarded), and with it `revision_of`.
pub(crate) const NOT_REVISED: &str = "NOT EXISTS (SELECT 1 FROM dead_letters r \
     WHERE r.revision_of = dead_letters.id) \
     AND NOT EXISTS (SELECT 1 FROM dead_letter_history h \
     WHERE h.dead_letter_id = dead_letters.id AND h.action = 'edit' \
     AND h.detail LIKE 'revised as %')";

/// Transient database errors: worth retrying a protocol write that must not be lost.
pub fn is_transient(e: &DlqError) -> bool {
    matches!(e, DlqError::Busy(_) | DlqError::Unavailable { .. })
}

#[cfg(test)]
mod tests {
    use super::sqlite_file_to_create;
    use crate::secret::SecretUrl;

    /// Once broke: `migrate` on `sqlite::memory:` asked whether to create the file
    /// `file:sqlx-in-memory-1`, and on `?mode=ro` asked, then failed to open.
    #[test]
    fn only_a_missing_file_that_an_open_would_create_is_offered() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("new.db");
        let url = |s: String| SecretUrl::new(s);
        let plain = url(format!("sqlite://{}", missing.display()));
        assert_eq!(sqlite_file_to_create(&plain), Some(missing.clone()));
        for s in [
            "sqlite::memory:".to_string(),
            "sqlite://:memory:".to_string(),
            format!("sqlite://{}?mode=ro", missing.display()),
            format!("sqlite://{}?mode=memory", missing.display()),
            "postgres://u@h/db".to_string(),
        ] {
            assert_eq!(sqlite_file_to_create(&url(s.clone())), None, "{s}");
        }
    }
}
