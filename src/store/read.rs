//! The read side of both stores, written once over a small [`Dialect`].
//!
//! Reads differ between PostgreSQL and SQLite only in a few spellings (the clock, how a
//! time is stored, how a set of IDs is bound, the hour/day bucket, the JSON and byte
//! functions of the content filters, how the export aggregates a history), so one
//! generic implementation ([`Reads`], for every [`Backend`]) builds and decodes every
//! read; rows are decoded by column name. The protocol steps, the capture and import
//! inserts and the migrations stay in each backend's file: they differ for real reasons
//! (one statement with a data-modifying `WITH` there, an IMMEDIATE transaction here).

use super::{state_case, state_predicate_at, Claimed, NewDeadLetter, PlanCandidate};
use crate::error::{DlqError, Result};
use crate::model::{
    sha256_hex, token_ref, ContentMatch, DeadLetter, Dimension, Filter, Group, GroupKey,
    HistoryEntry, State, Summary, UNKNOWN,
};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use futures_util::stream::BoxStream;
use futures_util::TryStreamExt;
use sqlx::query::Query;
use sqlx::{Database, Pool, QueryBuilder};

mod decode;
mod rows;

pub(crate) use decode::{required, text};
use decode::{summary, time, unreadable};
pub(crate) use rows::import_history;
use rows::{exported, read_bodies};

pub(crate) type Decoded<T> = std::result::Result<T, sqlx::Error>;

/// A value bound by the shared reads; each dialect binds it as its type.
pub enum Bind {
    Text(String),
    OptText(Option<String>),
    Int(i64),
    Bytes(Vec<u8>),
    Time(DateTime<Utc>),
    OptTime(Option<DateTime<Utc>>),
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
    /// writers never deadlock on a lock upgrade).
    const BEGIN_WRITE: &'static str;

    /// A time column as SQL of the clock's type, whatever a writer stored in it: every
    /// read, filter, ordering and comparison of a time goes through it (and metrics
    /// should). Whether a time is set is the column's own nullness.
    fn at(col: TimeCol) -> &'static str;

    fn bind(qb: &mut QueryBuilder<'static, Self>, value: Bind);
    /// `id` is one of `ids`.
    fn push_ids(qb: &mut QueryBuilder<'static, Self>, ids: &[String]);
    /// `id` is exactly `id`, as every write matches it (SQLite: as TEXT, never a BLOB).
    fn push_exact_id(qb: &mut QueryBuilder<'static, Self>, id: &str);
    /// The start of the hour or day (`unit`) of `dead_lettered_at`.
    fn bucket(unit: &str) -> String;
    /// `doc` contains `needle` (bytes for the body, text otherwise).
    fn push_contains(qb: &mut QueryBuilder<'static, Self>, doc: Doc, needle: Bind);
    /// `doc` holds a backslash (an escape may hide a needle).
    fn backslash_in(doc: Doc) -> &'static str;
    /// The conditions, before and after the byte tests, under which `doc` is parsed.
    fn json_guard(doc: Doc) -> (&'static str, &'static str);
    /// The value at `path` in the JSON object `doc` matches `m` (see [`ContentMatch`]).
    fn push_json_match(
        qb: &mut QueryBuilder<'static, Self>,
        doc: Doc,
        path: &[&str],
        m: &ContentMatch,
    );

    /// A text column; `lossy`: invalid UTF-8 becomes U+FFFD instead of an error.
    fn text(row: &Self::Row, col: &str, lossy: bool) -> Decoded<Option<String>>;
    fn int(row: &Self::Row, col: &str) -> Decoded<i64>;
    fn time(row: &Self::Row, col: &str) -> Decoded<Option<DateTime<Utc>>>;
    fn bytes<'r>(row: &'r Self::Row, col: &str) -> Decoded<Option<&'r [u8]>>;
    fn fetch<'e>(
        conn: &'e mut Self::Connection,
        query: Query<'e, Self, <Self as Database>::Arguments<'static>>,
    ) -> BoxStream<'e, Decoded<Self::Row>>;
}

/// A store's pool and how it words its errors: all the shared reads need.
pub trait Backend: Send + Sync {
    type Db: Dialect;
    fn pool(&self) -> &Pool<Self::Db>;
    fn db_err(&self, e: sqlx::Error) -> DlqError;
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
    /// IDs of rows not yet replayed or discarded that start with `prefix`, newest first,
    /// at most `limit` (shell completion: no count, no body, one short statement).
    async fn ids_starting_with(&self, prefix: &str, limit: i64) -> Result<Vec<String>>;
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
    async fn history(&self, id: &str) -> Result<Vec<HistoryEntry>>;
    /// The revisions made of `id` by `dlq edit` (at most one while the promise holds).
    async fn revised_as(&self, id: &str) -> Result<Vec<String>>;
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
    ) -> Result<Vec<(String, String, DateTime<Utc>)>>;
    /// Streams the rows that match, oldest first, each whole with its raw columns and its
    /// history, to `sink`, in constant memory. The claim owner is its operator part only.
    /// Returns the number of rows.
    async fn export(
        &self,
        filter: &Filter,
        sink: &mut (dyn FnMut(NewDeadLetter) -> Result<()> + Send),
    ) -> Result<u64>;
}

/// Appends the filter's WHERE clause. Every value is a bound parameter; `--header` and
/// `--field` first look for their texts in the raw bytes (a cheap test that never rules
/// out a match, see [`ContentMatch::needles`]; SQLite evaluates AND from the left), and
/// parse the JSON only where the dialect's guard says it parses.
pub(crate) fn push_where<D: Dialect>(qb: &mut QueryBuilder<'static, D>, f: &Filter) {
    qb.push(" WHERE 1=1");
    for (col, val) in [
        ("reason", &f.reason),
        ("eff_producer", &f.producer),
        ("eff_schema_version", &f.schema_version),
        ("source_queue", &f.source_queue),
        ("eff_event_id", &f.event_id),
    ] {
        match val.as_deref() {
            None => {}
            Some(UNKNOWN) if col != "reason" => {
                qb.push(format!(" AND {col} IS NULL"));
            }
            Some(v) => {
                qb.push(format!(" AND {col} = "));
                D::bind(qb, Bind::Text(v.to_string()));
            }
        }
    }
    let settled = format!(
        "COALESCE({}, {})",
        D::at(TimeCol::ReplayedAt),
        D::at(TimeCol::DiscardedAt)
    );
    for (col, cmp, t) in [
        (D::at(TimeCol::DeadLetteredAt), ">=", f.since),
        (D::at(TimeCol::DeadLetteredAt), "<", f.until),
        (settled.as_str(), "<", f.settled_before),
    ] {
        if let Some(t) = t {
            qb.push(format!(" AND {col} {cmp} "));
            D::bind(qb, Bind::Time(t));
        }
    }
    if !f.states.is_empty() {
        let any: Vec<String> = f.states.iter().map(|st| state_of::<D>(*st)).collect();
        qb.push(format!(" AND (({}))", any.join(") OR (")));
    }
    if f.revisions {
        qb.push(" AND revision_of IS NOT NULL");
    }
    if let Some(g) = &f.grep {
        qb.push(" AND ");
        D::push_contains(qb, Doc::Body, Bind::Bytes(g.as_bytes().to_vec()));
    }
    if let Some(e) = &f.error_contains {
        qb.push(" AND ");
        D::push_contains(qb, Doc::Error, Bind::Text(e.clone()));
    }
    let headers = f
        .headers
        .iter()
        .map(|m| (Doc::Headers, m, vec![m.key.as_str()]));
    let fields = f.fields.iter().map(|m| (Doc::Body, m, m.path()));
    for (doc, m, path) in headers.chain(fields) {
        let (before, after) = D::json_guard(doc);
        qb.push(format!(" AND CASE WHEN {before}"));
        for n in m.needles(doc == Doc::Body) {
            qb.push(" AND (");
            let n = match doc {
                Doc::Body => Bind::Bytes(n.into_bytes()),
                _ => Bind::Text(n),
            };
            D::push_contains(qb, doc, n);
            qb.push(format!(" OR {})", D::backslash_in(doc)));
        }
        qb.push(format!("{after} THEN "));
        D::push_json_match(qb, doc, &path, m);
        qb.push(" ELSE false END");
    }
}

/// The condition of one state in the dialect (see [`state_predicate_at`]).
pub(crate) fn state_of<D: Dialect>(state: State) -> String {
    state_predicate_at(state, D::NOW, D::at(TimeCol::LeaseEnd))
}

/// The time columns, each as [`Dialect::at`] reads it under its own name, and what
/// cannot be read of them (`unreadable`).
fn time_columns<D: Dialect>() -> String {
    let mut cols: Vec<String> = TimeCol::ALL
        .iter()
        .map(|c| format!("{} AS {}", D::at(*c), c.name()))
        .collect();
    cols.push(format!("{} AS unreadable", D::UNREADABLE));
    cols.join(", ")
}

/// The SELECT list of a [`Summary`]. The claim owner is read whole; [`summary`] keeps
/// only its operator part.
pub(crate) fn summary_columns<D: Dialect>() -> String {
    format!(
        "id, reason, CAST(attempts AS BIGINT) AS attempts, replay_claim_owner, \
         last_replay_error, eff_event_id, error, eff_producer, eff_schema_version, \
         source_queue, exchange, routing_key, discard_note, revision_of, {}, {} AS id_storage, \
         {} AS state",
        time_columns::<D>(),
        D::ID_STORAGE,
        state_case(D::NOW, D::at(TimeCol::LeaseEnd))
    )
}

/// A body longer than this is not sent with its row but read after it in slices of
/// [`BODY_SLICE`] bytes into one buffer, where the dialect has a [`Dialect::BODY_LEN`].
/// PostgreSQL's driver holds a value twice while it reads it and decoding copies it once
/// more: read whole, a 50 MiB body cost 3.2x its size (docs/performance.md).
pub const BODY_INLINE_MAX: i64 = 1 << 20;
pub const BODY_SLICE: i64 = 8 << 20;

/// The body's length in bytes, as SQL (SQLite's `length` counts a TEXT value's
/// characters: only ever compared with [`BODY_INLINE_MAX`] there).
fn body_len<D: Dialect>() -> &'static str {
    D::BODY_LEN.unwrap_or("length(body)")
}

/// A row's columns: the summary, headers, the body when `len` (SQL) is at most
/// [`BODY_INLINE_MAX`] or when there is no `len`, and `body_len`.
fn row_columns<D: Dialect>(len: Option<&str>) -> String {
    let body = match len {
        Some(len) => format!(
            "CASE WHEN {len} <= {BODY_INLINE_MAX} THEN body END AS body, \
             CAST({len} AS BIGINT) AS body_len"
        ),
        None => "body, 0 AS body_len".to_string(),
    };
    format!(
        "{}, headers_json, {body}, {} AS db_now",
        summary_columns::<D>(),
        D::NOW
    )
}

/// The columns of a whole row, as [`whole_row`] reads them.
pub(crate) fn whole_row_columns<D: Dialect>() -> String {
    row_columns::<D>(D::BODY_LEN)
}

/// The columns of a claimed row, as [`claimed_row`] reads them (a RETURNING list): a
/// large body is left out on every store (SQLite materializes RETURNING rows).
pub(crate) fn claimed_columns<D: Dialect>() -> String {
    row_columns::<D>(Some(body_len::<D>()))
}

pub(crate) fn claimed_row<D: Dialect>(row: &D::Row) -> Decoded<Claimed> {
    // A body that is no bytes (SQLite does not enforce a column's type) is left to
    // `held`, whose error releases that row alone.
    let content = match D::bytes(row, "body").ok().flatten() {
        Some(body) => Some((
            required(text::<D>(row, "headers_json")?, "headers_json")?,
            body.to_vec(),
        )),
        None => None,
    };
    Ok(Claimed {
        summary: summary::<D>(row)?,
        db_now: time::<D>(row, "db_now")?,
        content,
    })
}

/// A row read by [`whole_row_columns`]: whole, or with its body still to read (its
/// length in bytes; see [`read_bodies`]).
pub(crate) type Partial = (DeadLetter, Option<i64>);

pub(crate) fn whole_row<D: Dialect>(row: &D::Row) -> Decoded<Partial> {
    let (body, to_read) = match D::bytes(row, "body")? {
        Some(body) => (body.to_vec(), None),
        None => (Vec::new(), Some(D::int(row, "body_len")?)),
    };
    let letter = DeadLetter {
        summary: summary::<D>(row)?,
        headers_json: required(text::<D>(row, "headers_json")?, "headers_json")?,
        body,
        db_now: time::<D>(row, "db_now")?,
    };
    Ok((letter, to_read))
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

/// Whole rows: the rows, then any large body in slices, all of each body from one
/// snapshot (never pieced together from two versions of a row).
async fn whole_rows<B: Backend>(
    b: &B,
    qb: &mut QueryBuilder<'static, B::Db>,
) -> Result<Vec<DeadLetter>> {
    let rows = all(b, qb, whole_row::<B::Db>).await?;
    if rows.iter().all(|(_, to_read)| to_read.is_none()) {
        return Ok(rows.into_iter().map(|(letter, _)| letter).collect());
    }
    let err = |e| b.db_err(e);
    let mut tx = b.pool().begin().await.map_err(err)?;
    if let Some(snapshot) = B::Db::SNAPSHOT {
        B::Db::fetch(&mut tx, QueryBuilder::new(snapshot).build())
            .try_collect::<Vec<_>>()
            .await
            .map_err(err)?;
    }
    let rows = read_bodies::<B::Db>(&mut tx, rows, err).await?;
    tx.rollback().await.map_err(err)?;
    Ok(rows)
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
        all(self, &mut qb, |r| B::Db::text(r, "value", false))
            .await?
            .pop()
            .flatten()
            .ok_or_else(|| DlqError::SchemaMissing("no database_id in dlq_meta".into()))
    }

    async fn ids_starting_with(&self, prefix: &str, limit: i64) -> Result<Vec<String>> {
        let mut qb = QueryBuilder::new("SELECT id FROM dead_letters WHERE substr(id, 1, length(");
        B::Db::bind(&mut qb, Bind::Text(prefix.to_string()));
        qb.push(")) = ");
        B::Db::bind(&mut qb, Bind::Text(prefix.to_string()));
        qb.push(format!(
            " AND replayed_at IS NULL AND discarded_at IS NULL ORDER BY {} DESC LIMIT ",
            B::Db::at(TimeCol::DeadLetteredAt)
        ));
        B::Db::bind(&mut qb, Bind::Int(limit));
        all(self, &mut qb, |r| B::Db::text(r, "id", false))
            .await
            .map(|ids| ids.into_iter().flatten().collect())
    }

    async fn list_each(
        &self,
        filter: &Filter,
        limit: i64,
        sink: &mut (dyn FnMut(Summary) -> Result<()> + Send),
    ) -> Result<u64> {
        let mut qb = select(&summary_columns::<B::Db>(), filter);
        qb.push(format!(
            " ORDER BY {} DESC, id LIMIT ",
            B::Db::at(TimeCol::DeadLetteredAt)
        ));
        B::Db::bind(&mut qb, Bind::Int(limit));
        each(self, &mut qb, |row| {
            sink(summary::<B::Db>(row).map_err(|e| self.db_err(e))?)
        })
        .await
    }

    async fn count(&self, filter: &Filter) -> Result<i64> {
        count_of(self, &mut select("count(*) AS n", filter)).await
    }

    async fn count_at_most(&self, filter: &Filter, cap: i64) -> Result<i64> {
        // Stops after cap + 1 rows: a flood of rows costs no more than the cap.
        let mut qb = QueryBuilder::new("SELECT count(*) AS n FROM (SELECT 1 FROM dead_letters");
        push_where(&mut qb, filter);
        qb.push(" LIMIT ");
        B::Db::bind(&mut qb, Bind::Int(cap.saturating_add(1)));
        qb.push(") AS capped");
        count_of(self, &mut qb).await
    }

    async fn aggregate(&self, dims: &[Dimension], filter: &Filter) -> Result<Vec<Group>> {
        let keys: Vec<String> = dims
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let expr = match d {
                    Dimension::Reason => "reason".into(),
                    Dimension::Producer => "eff_producer".into(),
                    Dimension::SchemaVersion => "eff_schema_version".into(),
                    Dimension::SourceQueue => "source_queue".into(),
                    Dimension::ErrorClass => "eff_error_class".into(),
                    Dimension::Hour => B::Db::bucket("hour"),
                    Dimension::Day => B::Db::bucket("day"),
                };
                format!("{expr} AS k{i}")
            })
            .collect();
        let states: Vec<String> = State::ALL
            .iter()
            .map(|st| {
                let p = state_of::<B::Db>(*st);
                format!("count(CASE WHEN {p} THEN 1 END) AS {}", st.as_str())
            })
            .collect();
        let n = dims.len();
        let mut qb = select(
            &format!(
                "{}, count(*) AS n, {}, min({at}) AS first_seen, max({at}) AS last_seen",
                keys.join(", "),
                states.join(", "),
                at = B::Db::at(TimeCol::DeadLetteredAt)
            ),
            filter,
        );
        let positions: Vec<String> = (1..=n).map(|i| i.to_string()).collect();
        qb.push(format!(
            " GROUP BY {0} ORDER BY {1} DESC, {0}",
            positions.join(", "),
            n + 1
        ));
        all(self, &mut qb, |row| {
            let int = |col: &str| B::Db::int(row, col);
            let keys = dims
                .iter()
                .enumerate()
                .map(|(i, d)| {
                    let k = format!("k{i}");
                    Ok((
                        *d,
                        if d.is_time() {
                            // A time no row of the group could be read in: "(unknown)".
                            B::Db::time(row, &k)?.map_or(GroupKey::Text(None), GroupKey::Time)
                        } else {
                            GroupKey::Text(text::<B::Db>(row, &k)?)
                        },
                    ))
                })
                .collect::<Decoded<Vec<_>>>()?;
            Ok(Group {
                keys,
                count: int("n")?,
                pending: int("pending")?,
                claimed: int("claimed")?,
                uncertain: int("uncertain")?,
                replayed: int("replayed")?,
                discarded: int("discarded")?,
                first_seen: B::Db::time(row, "first_seen")?,
                last_seen: B::Db::time(row, "last_seen")?,
            })
        })
        .await
    }

    async fn load(&self, ids: &[String]) -> Result<Vec<DeadLetter>> {
        whole_rows(self, &mut by_ids(&whole_row_columns::<B::Db>(), ids)).await
    }

    async fn summaries(&self, ids: &[String]) -> Result<Vec<Summary>> {
        let mut qb = by_ids(&summary_columns::<B::Db>(), ids);
        // A TEXT id first: of two rows shown as one ID, the one a write takes.
        qb.push(" ORDER BY id_storage");
        all(self, &mut qb, summary::<B::Db>).await
    }

    async fn history(&self, id: &str) -> Result<Vec<HistoryEntry>> {
        let mut qb = QueryBuilder::new(format!(
            "SELECT {} AS at, operator, action, outcome, detail, target, plan_id, token, \
             token_ref FROM dead_letter_history WHERE dead_letter_id = ",
            B::Db::HISTORY_AT
        ));
        B::Db::bind(&mut qb, Bind::Text(id.to_string()));
        qb.push(" ORDER BY seq");
        all(self, &mut qb, |r| {
            let t = |col: &str| text::<B::Db>(r, col);
            Ok(HistoryEntry {
                // Only dlq writes the history; a time no one can read shows as 1970.
                at: B::Db::time(r, "at")?.unwrap_or_default(),
                operator: required(t("operator")?, "operator")?,
                action: required(t("action")?, "action")?,
                outcome: required(t("outcome")?, "outcome")?,
                detail: t("detail")?,
                token_ref: match t("token")? {
                    Some(token) => Some(token_ref(&token)),
                    None => t("token_ref")?,
                },
                target: t("target")?,
                plan_id: t("plan_id")?,
            })
        })
        .await
    }

    async fn revised_as(&self, id: &str) -> Result<Vec<String>> {
        let mut qb = QueryBuilder::new("SELECT id FROM dead_letters WHERE revision_of = ");
        B::Db::bind(&mut qb, Bind::Text(id.to_string()));
        qb.push(" ORDER BY id");
        all(self, &mut qb, |r| B::Db::text(r, "id", true))
            .await
            .map(|ids| ids.into_iter().flatten().collect())
    }

    async fn plan_candidates(&self, filter: &Filter, limit: i64) -> Result<Vec<PlanCandidate>> {
        let mut qb = select("id, reason, eff_producer, eff_schema_version, body", filter);
        qb.push(format!(
            " ORDER BY {}, id LIMIT ",
            B::Db::at(TimeCol::DeadLetteredAt)
        ));
        B::Db::bind(&mut qb, Bind::Int(limit));
        all(self, &mut qb, |r| {
            let t = |col: &str| text::<B::Db>(r, col);
            Ok(PlanCandidate {
                id: required(t("id")?, "id")?,
                reason: required(t("reason")?, "reason")?,
                producer: t("eff_producer")?,
                schema_version: t("eff_schema_version")?,
                sha256: sha256_hex(required(B::Db::bytes(r, "body")?, "body")?),
            })
        })
        .await
    }

    async fn held(&self, ids: &[String], token: &str) -> Result<Vec<DeadLetter>> {
        let mut qb = by_ids(&whole_row_columns::<B::Db>(), ids);
        qb.push(" AND replay_claim_owner = ");
        B::Db::bind(&mut qb, Bind::Text(token.to_string()));
        qb.push(format!(
            " AND replay_attempt_at IS NULL AND {}",
            state_of::<B::Db>(State::Claimed)
        ));
        whole_rows(self, &mut qb).await
    }

    async fn dead_lettered_since(
        &self,
        after: &(DateTime<Utc>, String),
        limit: i64,
    ) -> Result<Vec<(String, String, DateTime<Utc>)>> {
        let at = B::Db::at(TimeCol::DeadLetteredAt);
        let mut qb = QueryBuilder::new(format!(
            "SELECT id, eff_event_id, {at} AS dead_lettered_at FROM dead_letters \
             WHERE ({at}, id) > ("
        ));
        B::Db::bind(&mut qb, Bind::Time(after.0));
        qb.push(", ");
        B::Db::bind(&mut qb, Bind::Text(after.1.clone()));
        qb.push(format!(
            ") AND eff_event_id IS NOT NULL ORDER BY {at}, id LIMIT "
        ));
        B::Db::bind(&mut qb, Bind::Int(limit));
        all(self, &mut qb, |r| {
            let t = |col: &str| text::<B::Db>(r, col);
            Ok((
                required(t("id")?, "id")?,
                required(t("eff_event_id")?, "eff_event_id")?,
                time::<B::Db>(r, "dead_lettered_at")?,
            ))
        })
        .await
    }

    async fn export(
        &self,
        filter: &Filter,
        sink: &mut (dyn FnMut(NewDeadLetter) -> Result<()> + Send),
    ) -> Result<u64> {
        let mut qb = select(
            &format!(
                "id, body, reason, CAST(attempts AS BIGINT) AS attempts, headers_json, \
                 replay_claim_owner, last_replay_error, event_id, error, producer, \
                 schema_version, source_queue, exchange, routing_key, discard_note, revision_of, \
                 {}, {} AS history",
                time_columns::<B::Db>(),
                B::Db::HISTORY_JSON
            ),
            filter,
        );
        qb.push(format!(
            " ORDER BY {}, {}",
            B::Db::at(TimeCol::DeadLetteredAt),
            B::Db::ID_ORDER
        ));
        let err = |e| self.db_err(e);
        let Some(setup) = B::Db::UNBOUNDED else {
            // One statement, so one snapshot.
            return each(self, &mut qb, |row| sink(exported::<B::Db>(row)?)).await;
        };
        // Not bound by --statement-timeout, which is meant for statements that hold locks
        // (this one takes none that writers wait on).
        let mut tx = self.pool().begin().await.map_err(err)?;
        B::Db::fetch(&mut tx, QueryBuilder::new(setup).build())
            .try_collect::<Vec<_>>()
            .await
            .map_err(err)?;
        let mut n = 0;
        {
            let mut rows = B::Db::fetch(&mut tx, qb.build());
            while let Some(row) = rows.try_next().await.map_err(err)? {
                sink(exported::<B::Db>(&row)?)?;
                n += 1;
            }
        }
        tx.rollback().await.map_err(err)?;
        Ok(n)
    }
}
