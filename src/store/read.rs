//! The read side of both stores, written once over a small [`Dialect`].
//!
//! Reads differ between PostgreSQL and SQLite only in a few spellings (the clock, how a
//! time is stored, how a set of IDs is bound, the hour/day bucket, the JSON and byte
//! functions of the content filters, how the export aggregates a history), so one
//! generic implementation ([`Reads`], for every [`Backend`]) builds and decodes every
//! read; rows are decoded by column name. The protocol steps, the capture and import
//! inserts and the migrations stay in each backend's file: they differ for real reasons
//! (one statement with a data-modifying `WITH` there, an IMMEDIATE transaction here).
//!
//! This file holds the dialect, the [`Reads`] trait and the few helpers every read runs
//! through; each read's SQL sits in the file of what it reads, so that a new read joins
//! its neighbours: [`filter`] (the WHERE clause and states), [`columns`] (the SELECT lists
//! and row decoding), [`list`] (summaries, counts, aggregates), [`rollup`] (aggregates
//! from the counts a store keeps), [`letters`] (whole rows, history), [`plan`] (plan
//! candidates, returned events), [`export`].

use super::copies::{copy_of, restored_copies, LiveCopy};
use super::{NewDeadLetter, PlanCandidate};
use crate::error::{DlqError, Result};
use crate::model::{
    ContentMatch, DeadLetter, Dimension, Filter, Group, HistoryEntry, State, Summary,
};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use futures_util::stream::BoxStream;
use futures_util::TryStreamExt;
use sqlx::query::Query;
use sqlx::{Database, Pool, QueryBuilder};

mod columns;
mod decode;
mod export;
mod filter;
mod letters;
mod list;
mod plan;
mod rollup;
mod rows;
mod sql;

pub(crate) use columns::{
    claimed_columns, claimed_row, summary_columns, whole_row, whole_row_columns, Partial,
};
pub use columns::{BODY_INLINE_MAX, BODY_SLICE};
use decode::time;
pub(crate) use decode::{required, text};
pub(crate) use decode::{Col, Columns};
pub(crate) use filter::{push_where, state_of, where_sql};
pub(crate) use rollup::{kept_pair_counts, Fold, Rollup};
pub(crate) use rows::{carried_history, exported, import_history};
pub use sql::Sql;

pub(crate) type Decoded<T> = std::result::Result<T, sqlx::Error>;

/// A value bound by the shared reads; each dialect binds it as its type.
pub enum Bind {
    Text(String),
    OptText(Option<String>),
    Int(i64),
    Bytes(Vec<u8>),
    Time(DateTime<Utc>),
    OptTime(Option<DateTime<Utc>>),
    /// A list of texts: PostgreSQL binds a `text[]`, SQLite a JSON array.
    Texts(Vec<String>),
}

/// Binds `values` separated by commas (the inside of a VALUES tuple).
pub(crate) fn push_binds<D: Dialect>(
    qb: &mut QueryBuilder<'static, D>,
    values: impl IntoIterator<Item = Bind>,
) {
    for (i, v) in values.into_iter().enumerate() {
        qb.push(if i == 0 { "" } else { ", " });
        D::bind(qb, v);
    }
}

/// A time column of `dead_letters`; [`Dialect::at`] spells it as SQL.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum TimeCol {
    DeadLetteredAt,
    ReplayedAt,
    LeaseEnd,
    AttemptAt,
    DiscardedAt,
}

impl TimeCol {
    pub const ALL: [TimeCol; 5] = [
        TimeCol::DeadLetteredAt,
        TimeCol::ReplayedAt,
        TimeCol::LeaseEnd,
        TimeCol::AttemptAt,
        TimeCol::DiscardedAt,
    ];

    pub fn name(self) -> &'static str {
        match self {
            TimeCol::DeadLetteredAt => "dead_lettered_at",
            TimeCol::ReplayedAt => "replayed_at",
            TimeCol::LeaseEnd => "replay_claim_expires_at",
            TimeCol::AttemptAt => "replay_attempt_at",
            TimeCol::DiscardedAt => "discarded_at",
        }
    }
}

/// Where a content filter looks.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Doc {
    Body,
    Headers,
    Error,
}

/// What the read side needs to know of a database's SQL.
pub trait Dialect: Database {
    /// The database clock, as SQL.
    const NOW: &'static str;
    /// `ORDER BY` of the ID in the export: byte order on both.
    const ID_ORDER: &'static str;
    /// The export's correlated subquery: the row's history as a JSON array, oldest
    /// first, times in microseconds (read by `parse_history_json`).
    const HISTORY_JSON: &'static str;
    /// Run before the export's one statement, in its transaction (none: no transaction).
    const UNBOUNDED: Option<&'static str>;
    /// Makes the current transaction read one snapshot (none: it always does).
    const SNAPSHOT: Option<&'static str>;
    /// The body's length in bytes, as SQL, where a large body is best read in slices
    /// (see [`BODY_INLINE_MAX`]); `None`: always read whole.
    const BODY_LEN: Option<&'static str>;
    /// The history's `at` as SQL of the clock's type.
    const HISTORY_AT: &'static str;
    /// A JSON object text of the time columns whose stored value cannot be read (column:
    /// what is stored), or NULL: the store's types may not hold such a value.
    const UNREADABLE: &'static str;
    /// The code of [`crate::model::IdStorage`] of the row's id, as a BIGINT.
    const ID_STORAGE: &'static str;
    /// Begins a transaction that writes (SQLite: takes the write lock at once, so two
    /// writers never deadlock on a lock upgrade; PostgreSQL: READ COMMITTED whatever the
    /// role's or database's default, since the checks made after an advisory lock must
    /// see what the lock's previous holder committed: a snapshot per statement).
    const BEGIN_WRITE: &'static str;
    /// A statement whose BIGINT `n` is 1 when `id` sorts in code point order (a C-like
    /// collation), so that the IDs starting with a prefix are one range of its index;
    /// `None`: the prefix is tested on every row (see `list::ids_starting_with`).
    const CODE_POINT_IDS: Option<&'static str>;
    /// The row's id is one a write can name ([`Dialect::push_exact_ids`]; SQLite: TEXT,
    /// never a worker's BLOB): what `prune` selects, so that what it counts it deletes.
    const WRITABLE_ID: &'static str;

    /// A time column as SQL of the clock's type, whatever a writer stored in it: every
    /// read, filter, ordering and comparison of a time goes through it (and metrics
    /// should). Whether a time is set is the column's own nullness.
    fn at(col: TimeCol) -> &'static str;

    /// A time column as a SELECT list shows it: [`Dialect::at`]'s value, spelled as
    /// cheaply as the store allows (SQLite tests NULL before the expression's type
    /// tests, once per column of every row read).
    fn shown_at(col: TimeCol) -> &'static str {
        Self::at(col)
    }

    fn bind(qb: &mut QueryBuilder<'static, Self>, value: Bind);
    /// `id` is one of `ids`.
    fn push_ids(qb: &mut QueryBuilder<'static, Self>, ids: &[String]);
    /// `id` is exactly one of `ids`, as every write matches it (SQLite: as TEXT, never a
    /// BLOB, so a write never matches a worker's twin of an ID).
    fn push_exact_ids(qb: &mut QueryBuilder<'static, Self>, ids: &[String]);
    /// The row `col` (an `id`) is the one the TEXT `id` names, as `revision_of` does
    /// (SQLite: or a worker's BLOB id of the same bytes, which names the same dead
    /// letter; two equalities, so each is a probe of the primary key).
    fn id_named(col: &str, id: &str) -> String;
    /// The `id` column `col` as TEXT (SQLite: a worker's BLOB id cast, so that it equals
    /// the TEXT naming it).
    fn id_text(col: &str) -> String;
    /// The start of the hour or day (`unit`) of `dead_lettered_at`.
    fn bucket(unit: Bucket) -> String;
    /// `doc` contains `needle` (bytes for the body, text otherwise).
    fn push_contains(sql: &mut Sql, doc: Doc, needle: Bind);
    /// `doc` holds a backslash (an escape may hide a needle).
    fn backslash_in(doc: Doc) -> &'static str;
    /// The conditions, before and after the byte tests, under which `doc` is parsed.
    fn json_guard(doc: Doc) -> (&'static str, &'static str);
    /// The value at `path` in the JSON object `doc` matches `m` (see [`ContentMatch`]).
    fn push_json_match(sql: &mut Sql, doc: Doc, path: &[&str], m: &ContentMatch);

    /// A text column; `lossy`: invalid UTF-8 becomes U+FFFD instead of an error.
    fn text(row: &Self::Row, col: &str, bytes: NotUtf8) -> Decoded<Option<String>>;
    fn int(row: &Self::Row, col: &str) -> Decoded<i64>;
    fn time(row: &Self::Row, col: &str) -> Decoded<Option<DateTime<Utc>>>;
    fn bytes<'r>(row: &'r Self::Row, col: &str) -> Decoded<Option<&'r [u8]>>;
    fn fetch<'e>(
        conn: &'e mut Self::Connection,
        query: Query<'e, Self, <Self as Database>::Arguments<'static>>,
    ) -> BoxStream<'e, Decoded<Self::Row>>;
}

/// The time buckets an aggregate groups by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bucket {
    Hour,
    Day,
}

impl Bucket {
    /// PostgreSQL's `date_trunc` unit.
    pub fn unit(self) -> &'static str {
        match self {
            Bucket::Hour => "hour",
            Bucket::Day => "day",
        }
    }

    pub fn micros(self) -> i64 {
        match self {
            Bucket::Hour => 3_600_000_000,
            Bucket::Day => 86_400_000_000,
        }
    }
}

/// How a text column read from bytes that are not UTF-8 is taken (SQLite keeps what a
/// worker bound; PostgreSQL's text is always UTF-8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotUtf8 {
    /// Each byte that is not UTF-8 written `\xNN` (a value shown or matched by dlq).
    Escape,
    /// A decode error (a value dlq wrote itself, or JSON it parses).
    Refuse,
}

/// A store's pool and how it words its errors: all the shared reads need.
pub trait Backend: Send + Sync {
    type Db: Dialect;
    fn pool(&self) -> &Pool<Self::Db>;
    fn db_err(&self, e: sqlx::Error) -> DlqError;
    /// Runs the export's statement itself, off the async driver; `None`: the driver
    /// streams its rows (see `store/sqlite_export.rs` for why SQLite does).
    fn bulk_export(&self) -> Option<&dyn BulkExport> {
        None
    }
    /// The per-group counts `aggregate`, `metrics` and `check` read when their filter
    /// allows (see [`rollup`]).
    fn rollup(&self) -> Option<&dyn Rollup> {
        None
    }
}

/// A store that steps the export's statement (built by the read side) itself.
#[async_trait]
pub trait BulkExport: Send + Sync {
    async fn export(
        &self,
        sql: Sql,
        sink: &mut (dyn FnMut(NewDeadLetter) -> Result<()> + Send),
    ) -> Result<u64>;
}

/// The reads of a store (see [`super::Store`] for the writes).
#[async_trait]
pub trait Reads: Send + Sync {
    /// Fails with [`DlqError::SchemaMissing`] unless `dlq migrate` has run.
    async fn check_schema(&self) -> Result<()>;
    /// The database's clock.
    async fn now(&self) -> Result<DateTime<Utc>>;
    /// The identity `dlq migrate` stored once for this database (table `dlq_meta`).
    async fn database_id(&self) -> Result<String>;
    /// IDs that start with `prefix` (of rows in `state`, or any), newest first, at most
    /// `limit`: shell completion and ID prefixes (no count, no body, one short statement).
    async fn ids_starting_with(
        &self,
        prefix: &str,
        state: Option<State>,
        limit: i64,
    ) -> Result<Vec<String>>;
    /// The `limit` most common values of a text dimension (reason, producer, schema
    /// version, source queue) with their counts, most common first.
    async fn common_values(&self, dim: Dimension, limit: i64) -> Result<Vec<(String, i64)>>;
    /// Newest first, at most `limit`, each row handed to `sink` as it arrives (memory
    /// stays flat however many). Returns the number of rows.
    async fn list_each(
        &self,
        filter: &Filter,
        limit: i64,
        sink: &mut (dyn FnMut(Summary) -> Result<()> + Send),
    ) -> Result<u64>;
    /// Newest first, at most `limit`; also the number of rows matching.
    async fn list(&self, filter: &Filter, limit: i64) -> Result<(Vec<Summary>, i64)> {
        let mut rows = Vec::new();
        self.list_each(filter, limit, &mut |r| {
            rows.push(r);
            Ok(())
        })
        .await?;
        let total = match rows.len() as i64 {
            n if n < limit => n,
            n => self.count(filter).await?.max(n),
        };
        Ok((rows, total))
    }
    /// How many rows match the filter.
    async fn count(&self, filter: &Filter) -> Result<i64>;
    /// How many rows match, counting at most `cap + 1`: more than `cap` means "more".
    async fn count_at_most(&self, filter: &Filter, cap: i64) -> Result<i64>;
    async fn aggregate(&self, dims: &[Dimension], filter: &Filter) -> Result<Vec<Group>>;
    /// Whole rows, body included, in no particular order; unknown IDs are absent.
    async fn load(&self, ids: &[String]) -> Result<Vec<DeadLetter>>;
    /// The one row shown as `id`; an error names two rows shown as one ID.
    async fn get(&self, id: &str) -> Result<Option<DeadLetter>> {
        decode::only_one(self.load(&[id.to_string()]).await?, id)
    }
    async fn summaries(&self, ids: &[String]) -> Result<Vec<Summary>>;
    /// The bytes of the bodies of these rows together (unknown IDs count 0): what a
    /// prompt says a replay will send.
    async fn body_bytes(&self, ids: &[String]) -> Result<i64>;
    async fn history(&self, id: &str) -> Result<Vec<HistoryEntry>>;
    /// The revisions made of `id` by `dlq edit` (at most one while the promise holds).
    async fn revised_as(&self, id: &str) -> Result<Vec<String>>;
    /// Each of the rows `ids` that a restore keeps discarded as a second live copy of its
    /// event, with that copy (see the `copies` module).
    async fn live_copies(&self, ids: &[String]) -> Result<Vec<LiveCopy>>;
    /// Rows matching the filter, oldest first, with body hashes, for `dlq plan`.
    async fn plan_candidates(&self, filter: &Filter, limit: i64) -> Result<Vec<PlanCandidate>>;
    /// Rows on which `token` (taken earlier by `dlq claim`) holds a live lease and that no
    /// attempt has used yet, whole.
    async fn held(&self, ids: &[String], token: &str) -> Result<Vec<DeadLetter>>;
    /// Dead letters after `after` in (dead_lettered_at, id) order that carry an event ID,
    /// at most `limit`: (id, event_id, dead_lettered_at). A plan run watches these to see
    /// a replayed event come back; paging by both columns never repeats a page when many
    /// rows share one time.
    async fn dead_lettered_since(
        &self,
        after: &(DateTime<Utc>, String),
        limit: i64,
    ) -> Result<Vec<super::NewArrival>>;
    /// Dead letters stamped at or after `since` that carry one of `events` or (with
    /// [`super::HeaderSweep::Window`]) an `x-dead-letter-id` header, in no order: the
    /// come-backs [`Reads::dead_lettered_since`] pages past when one is stored after a
    /// newer row was read.
    async fn came_back_among(
        &self,
        since: DateTime<Utc>,
        events: &[String],
        headers: super::HeaderSweep,
    ) -> Result<Vec<super::NewArrival>>;
    /// Streams the rows that match, oldest first, each whole with its raw columns and its
    /// history, to `sink`, in constant memory. The claim owner is its operator part only.
    /// Returns the number of rows.
    async fn export(
        &self,
        filter: &Filter,
        sink: &mut (dyn FnMut(NewDeadLetter) -> Result<()> + Send),
    ) -> Result<u64>;
}

type Row<B> = <<B as Backend>::Db as Database>::Row;

/// Runs a query on one pooled connection and hands each row to `f`.
async fn each<B: Backend>(
    b: &B,
    qb: &mut QueryBuilder<'static, B::Db>,
    mut f: impl FnMut(&Row<B>) -> Result<()> + Send,
) -> Result<u64> {
    let mut conn = b.pool().acquire().await.map_err(|e| b.db_err(e))?;
    let mut rows = B::Db::fetch(&mut conn, qb.build());
    let mut n = 0;
    while let Some(row) = rows.try_next().await.map_err(|e| b.db_err(e))? {
        f(&row)?;
        n += 1;
    }
    Ok(n)
}

pub(crate) async fn all<B: Backend, T: Send>(
    b: &B,
    qb: &mut QueryBuilder<'static, B::Db>,
    decode: impl Fn(&Row<B>) -> Decoded<T> + Send + Sync,
) -> Result<Vec<T>> {
    let mut out = Vec::new();
    each(b, qb, |row| {
        out.push(decode(row).map_err(|e| b.db_err(e))?);
        Ok(())
    })
    .await?;
    Ok(out)
}

async fn count_of<B: Backend>(b: &B, qb: &mut QueryBuilder<'static, B::Db>) -> Result<i64> {
    let n = all(b, qb, |r| B::Db::int(r, "n")).await?;
    Ok(n.first().copied().unwrap_or_default())
}

pub(crate) fn select<D: Dialect>(columns: &str, filter: &Filter) -> QueryBuilder<'static, D> {
    let mut qb = QueryBuilder::new(format!("SELECT {columns} FROM dead_letters"));
    push_where(&mut qb, filter);
    qb
}

fn by_ids<D: Dialect>(columns: &str, ids: &[String]) -> QueryBuilder<'static, D> {
    let mut qb = QueryBuilder::new(format!("SELECT {columns} FROM dead_letters WHERE "));
    D::push_ids(&mut qb, ids);
    qb
}

#[async_trait]
impl<B: Backend> Reads for B {
    async fn check_schema(&self) -> Result<()> {
        // One round trip: fails to parse unless both tables and the derived columns exist.
        let mut qb = QueryBuilder::new(
            "SELECT d.eff_producer, h.seq FROM dead_letters d, dead_letter_history h WHERE false",
        );
        each(self, &mut qb, |_| Ok(())).await?;
        Ok(())
    }

    async fn now(&self) -> Result<DateTime<Utc>> {
        let mut qb = QueryBuilder::new(format!("SELECT {} AS now", B::Db::NOW));
        let now = all(self, &mut qb, |r| time::<B::Db>(r, "now")).await?;
        now.first()
            .copied()
            .ok_or_else(|| DlqError::other("database: no time"))
    }

    async fn database_id(&self) -> Result<String> {
        let mut qb = QueryBuilder::new("SELECT value FROM dlq_meta WHERE key = 'database_id'");
        all(self, &mut qb, |r| B::Db::text(r, "value", NotUtf8::Refuse))
            .await?
            .pop()
            .flatten()
            .ok_or_else(|| DlqError::SchemaMissing("no database_id in dlq_meta".into()))
    }

    async fn ids_starting_with(
        &self,
        prefix: &str,
        state: Option<State>,
        limit: i64,
    ) -> Result<Vec<String>> {
        list::ids_starting_with(self, prefix, state, limit).await
    }

    async fn common_values(&self, dim: Dimension, limit: i64) -> Result<Vec<(String, i64)>> {
        list::common_values(self, dim, limit).await
    }

    async fn list_each(
        &self,
        filter: &Filter,
        limit: i64,
        sink: &mut (dyn FnMut(Summary) -> Result<()> + Send),
    ) -> Result<u64> {
        list::list_each(self, filter, limit, sink).await
    }

    async fn count(&self, filter: &Filter) -> Result<i64> {
        count_of(self, &mut select("count(*) AS n", filter)).await
    }

    async fn count_at_most(&self, filter: &Filter, cap: i64) -> Result<i64> {
        list::count_at_most(self, filter, cap).await
    }

    async fn aggregate(&self, dims: &[Dimension], filter: &Filter) -> Result<Vec<Group>> {
        match rollup::aggregate(self, dims, filter).await? {
            Some(groups) => Ok(groups),
            None => list::aggregate(self, dims, filter).await,
        }
    }

    async fn load(&self, ids: &[String]) -> Result<Vec<DeadLetter>> {
        letters::load(self, ids).await
    }

    async fn summaries(&self, ids: &[String]) -> Result<Vec<Summary>> {
        list::summaries(self, ids).await
    }

    async fn body_bytes(&self, ids: &[String]) -> Result<i64> {
        // Bytes, also of a body a worker stored as TEXT on SQLite (`length` counts
        // characters there).
        let len = B::Db::BODY_LEN.unwrap_or("length(CAST(body AS BLOB))");
        let columns = format!("CAST(COALESCE(SUM({len}), 0) AS BIGINT) AS n");
        let mut total = 0;
        for chunk in ids.chunks(1000) {
            total += count_of(self, &mut by_ids::<B::Db>(&columns, chunk)).await?;
        }
        Ok(total)
    }

    async fn history(&self, id: &str) -> Result<Vec<HistoryEntry>> {
        letters::history(self, id).await
    }

    async fn revised_as(&self, id: &str) -> Result<Vec<String>> {
        letters::revised_as(self, id).await
    }

    async fn live_copies(&self, ids: &[String]) -> Result<Vec<LiveCopy>> {
        all(self, &mut restored_copies::<B::Db>(ids), copy_of::<B::Db>).await
    }

    async fn plan_candidates(&self, filter: &Filter, limit: i64) -> Result<Vec<PlanCandidate>> {
        plan::plan_candidates(self, filter, limit).await
    }

    async fn held(&self, ids: &[String], token: &str) -> Result<Vec<DeadLetter>> {
        letters::held(self, ids, token).await
    }

    async fn dead_lettered_since(
        &self,
        after: &(DateTime<Utc>, String),
        limit: i64,
    ) -> Result<Vec<super::NewArrival>> {
        plan::dead_lettered_since(self, after, limit).await
    }

    async fn came_back_among(
        &self,
        since: DateTime<Utc>,
        events: &[String],
        headers: super::HeaderSweep,
    ) -> Result<Vec<super::NewArrival>> {
        plan::came_back_among(self, since, events, headers).await
    }

    async fn export(
        &self,
        filter: &Filter,
        sink: &mut (dyn FnMut(NewDeadLetter) -> Result<()> + Send),
    ) -> Result<u64> {
        export::export(self, filter, sink).await
    }
}
