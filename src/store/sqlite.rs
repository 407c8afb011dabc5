//! SQLite: all of its SQL. dlq writes times as INTEGER microseconds since the epoch
//! (UTC); workers may write others, so every comparison reads a time through
//! [`sqlite_time`] (the clock is [`NOW_US`]). The database
//! runs in WAL mode with a busy timeout; write transactions begin IMMEDIATE (a claim or a
//! mark is one UPDATE plus its history), so two processes never deadlock on a lock upgrade.
//! ID sets are bound as one JSON array (`json_each`), so a batch needs one parameter;
//! every write matches each ID exactly, as TEXT ([`EXACT_IDS`]).

use super::identity::identity_hint;
use super::protocol::{self, LeaseAfter, Resolution, WriteDialect};
use super::read::{
    claimed_row, import_history, push_where, Backend, BulkExport, Dialect, NotUtf8, Sql,
};
use super::sqlite_export;
use super::sqlite_open;
use super::sqlite_read::{exact_ids_json, EXACT_IDS};
use super::sqlite_time::{to_us, LEASE_END, NOW_US};
use super::{
    check_prune_filter, db_error, is_sqlite_row_error, migration_error, newly_applied,
    CaptureOutcome, CapturedLetter, Claimed, IfMissing, ImportReport, NewDeadLetter, OnExisting,
    Store, StoreOptions,
};
use crate::error::{DlqError, Result};
use crate::model::shown_id::id_bytes;
use crate::model::{Filter, NewHistory};
use crate::secret::SecretUrl;
use async_trait::async_trait;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};
use sqlx::Sqlite;
use sqlx::{ConnectOptions, QueryBuilder};
use std::collections::HashSet;
use std::str::FromStr;
use std::time::Duration;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/sqlite");

/// The token `dlq migrate` gave a v1 claim ends in `:v1-` and 32 hex digits; a token of
/// this dlq ends in `:` and a UUID (36 characters), so never matches.
const V1_TOKEN: &str = "substr(replay_claim_owner, -36, 4) = ':v1-'";

pub struct SqliteStore {
    pool: SqlitePool,
    busy: Duration,
    file: std::path::PathBuf,
}

impl SqliteStore {
    async fn applied_versions(&self) -> Vec<i64> {
        sqlx::query_scalar("SELECT version FROM _sqlx_migrations ORDER BY version")
            .fetch_all(&self.pool)
            .await
            .unwrap_or_default()
    }

    pub async fn connect(url: &SecretUrl, opts: &StoreOptions) -> Result<Self> {
        let mut options = SqliteConnectOptions::from_str(url.expose())
            .map_err(|e| DlqError::usage(format!("invalid SQLite URL {url}: {e}")))?
            .create_if_missing(opts.if_missing == IfMissing::Create)
            // FULL: a committed mark survives a power loss (NORMAL in WAL mode may undo
            // the last commits), so `replayed` never reverts to a state that replays again.
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(opts.busy_timeout)
            // A long statement (an export, an aggregate over millions of rows) is not a
            // warning for the operator; `-v` shows it.
            .log_slow_statements(log::LevelFilter::Info, Duration::from_secs(1));
        if opts.if_missing == IfMissing::Create {
            // WAL is a property of the database file: `dlq migrate` sets it once, for
            // dlq and the workers alike, and every later connection inherits it.
            options = options.journal_mode(SqliteJournalMode::Wal);
        }
        let file = options.get_filename().to_path_buf();
        sqlite_open::check_target(&url.to_string(), &file, opts.if_missing)?;
        // A new file being switched to WAL by another `dlq migrate` at this moment is
        // busy for an instant (the busy handler does not cover it): try again within the
        // busy timeout.
        let deadline = tokio::time::Instant::now() + opts.busy_timeout;
        let pool = loop {
            let pool = SqlitePoolOptions::new()
                .max_connections(opts.max_connections.min(4))
                .test_before_acquire(opts.long_running)
                .acquire_timeout(opts.connect_timeout + opts.busy_timeout)
                .connect_with(options.clone())
                .await
                .map_err(|e| match db_error(e) {
                    DlqError::Busy(_) => DlqError::Busy(opts.busy_timeout),
                    other => sqlite_open::explain(&file, other),
                });
            match pool {
                Err(DlqError::Busy(_))
                    if opts.if_missing == IfMissing::Create
                        && tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                pool => break pool?,
            }
        };
        let store = SqliteStore {
            pool,
            busy: opts.busy_timeout,
            file,
        };
        // Whatever the command: an import that died leaves no row behind for it.
        if let Err(e) = store.undo_dead_imports().await {
            tracing::debug!(error = %e, "dead imports not undone");
        }
        Ok(store)
    }

    fn err(&self) -> impl Fn(sqlx::Error) -> DlqError + '_ {
        move |e| match db_error(e) {
            DlqError::Busy(_) => DlqError::Busy(self.busy),
            other => sqlite_open::explain(&self.file, other),
        }
    }

    /// A write transaction that takes the write lock at once (no lock upgrade to deadlock on).
    async fn begin_write(&self) -> Result<sqlx::Transaction<'_, sqlx::Sqlite>> {
        self.pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(self.err())
    }

    /// Runs a write of [`protocol`] (after `first`, if any) and the history of the rows
    /// it changed in one write transaction; returns the rows it RETURNed.
    async fn step(
        &self,
        first: Option<&str>,
        mut qb: QueryBuilder<'static, Sqlite>,
        history: &[NewHistory],
    ) -> Result<Vec<sqlx::sqlite::SqliteRow>> {
        let mut tx = self.begin_write().await?;
        if let Some(first) = first {
            sqlx::query(first)
                .execute(&mut *tx)
                .await
                .map_err(self.err())?;
        }
        let rows = qb.build().fetch_all(&mut *tx).await.map_err(self.err())?;
        let changed = rows
            .iter()
            .map(|r| {
                <Sqlite as Dialect>::text(r, "id", NotUtf8::Escape)
                    .and_then(|id| id.ok_or_else(|| sqlx::Error::Decode("NULL id".into())))
            })
            .collect::<std::result::Result<HashSet<String>, sqlx::Error>>()
            .map_err(self.err())?;
        let ids: HashSet<&str> = changed.iter().map(String::as_str).collect();
        insert_history(&mut tx, &only_for(history, &ids))
            .await
            .map_err(self.err())?;
        tx.commit().await.map_err(self.err())?;
        Ok(rows)
    }

    /// A step that returns the IDs it changed.
    async fn ids_step(
        &self,
        qb: QueryBuilder<'static, Sqlite>,
        history: &[NewHistory],
    ) -> Result<Vec<String>> {
        self.ids_step_after(None, qb, history).await
    }

    /// [`Self::ids_step`], after `first` in the same transaction.
    async fn ids_step_after(
        &self,
        first: Option<&str>,
        qb: QueryBuilder<'static, Sqlite>,
        history: &[NewHistory],
    ) -> Result<Vec<String>> {
        self.step(first, qb, history)
            .await?
            .iter()
            .map(|r| {
                <Sqlite as Dialect>::text(r, "id", NotUtf8::Escape)
                    .and_then(|id| id.ok_or_else(|| sqlx::Error::Decode("NULL id".into())))
            })
            .collect::<std::result::Result<_, sqlx::Error>>()
            .map_err(self.err())
    }
}

impl WriteDialect for Sqlite {
    const LEASE_END: &'static str = LEASE_END;
    const V1_TOKEN: &'static str = V1_TOKEN;
    const STEP_OPEN: &'static str = "";
    // BEGIN IMMEDIATE: the import's commit point (its check) and a restore are serialised.
    const BEFORE_RESTORE: Option<&'static str> = None;

    fn lease_ended_now() -> String {
        format!("min(COALESCE({LEASE_END}, {NOW_US}), {NOW_US})")
    }

    fn push_now_plus(qb: &mut QueryBuilder<'static, Self>, d: Duration) {
        qb.push(NOW_US);
        qb.push(" + ");
        qb.push_bind(d.as_micros() as i64);
    }
}

impl Backend for SqliteStore {
    type Db = Sqlite;
    fn pool(&self) -> &SqlitePool {
        &self.pool
    }
    fn db_err(&self, e: sqlx::Error) -> DlqError {
        self.err()(e)
    }
    fn bulk_export(&self) -> Option<&dyn BulkExport> {
        Some(self)
    }
}

#[async_trait]
impl BulkExport for SqliteStore {
    async fn export(
        &self,
        sql: Sql,
        sink: &mut (dyn FnMut(NewDeadLetter) -> Result<()> + Send),
    ) -> Result<u64> {
        let conn = self.pool.acquire().await.map_err(self.err())?;
        let (busy, file) = (self.busy, self.file.clone());
        // Worded as a failure of the same statement through sqlx would be.
        let stepping_err = move |e: rusqlite::Error| match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
                DlqError::Busy(busy)
            }
            _ if e.to_string().contains("no such") => DlqError::SchemaMissing(e.to_string()),
            _ => sqlite_open::explain(&file, DlqError::other(format!("database: {e}"))),
        };
        sqlite_export::export(conn, sql, stepping_err, sink).await
    }
}

/// The entries whose dead letter is in `ids`: those of the rows a step changed.
fn only_for<'a>(entries: &'a [NewHistory], ids: &HashSet<&str>) -> Vec<&'a NewHistory> {
    entries
        .iter()
        .filter(|e| ids.contains(e.dead_letter_id.as_str()))
        .collect()
}

/// Appends `entries`, 1,000 per INSERT.
async fn insert_history(
    conn: &mut SqliteConnection,
    entries: &[&NewHistory],
) -> std::result::Result<(), sqlx::Error> {
    for chunk in entries.chunks(1000) {
        let mut qb = QueryBuilder::new(
            "INSERT INTO dead_letter_history \
             (dead_letter_id, operator, action, outcome, detail, token, target, plan_id) ",
        );
        qb.push_values(chunk, |mut b, e| {
            b.push_bind(&e.dead_letter_id)
                .push_bind(&e.operator)
                .push_bind(e.action.as_str())
                .push_bind(e.outcome.as_str())
                .push_bind(&e.detail)
                .push_bind(&e.token)
                .push_bind(&e.target)
                .push_bind(&e.plan_id);
        });
        qb.build().execute(&mut *conn).await?;
    }
    Ok(())
}

#[async_trait]
impl Store for SqliteStore {
    async fn migrate(&self) -> Result<Vec<String>> {
        // sqlx takes no lock on SQLite: a second `dlq migrate` running at the same time
        // (two hosts starting together on a new file) fails on a busy lock or on a
        // table the first just created. Each migration is one transaction, so trying
        // again once the other made progress is safe; it then finds them applied.
        sqlite_open::check_ids_before_upgrade(&self.pool).await?;
        let applied = self.applied_versions().await;
        let deadline = tokio::time::Instant::now() + self.busy.max(Duration::from_secs(5));
        loop {
            let before = self.applied_versions().await;
            let Err(e) = MIGRATOR.run(&self.pool).await else {
                // The first migrate to know about imports undoes a dead one at once.
                if let Err(e) = self.undo_dead_imports().await {
                    tracing::debug!(error = %e, "dead imports not undone");
                }
                return Ok(newly_applied(&MIGRATOR, &applied));
            };
            let text = e.to_string();
            let busy = text.contains("database is locked") || text.contains("busy");
            let raced = self.applied_versions().await != before;
            if !(busy || raced) || tokio::time::Instant::now() >= deadline {
                return Err(migration_error(e));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn import(&self, rows: Vec<NewDeadLetter>, existing: OnExisting) -> Result<ImportReport> {
        self.import_in_batches(rows, existing).await
    }

    async fn claim(
        &self,
        ids: &[String],
        token: &str,
        lease: Duration,
        history: &[NewHistory],
    ) -> Result<Vec<Claimed>> {
        // No body over 1 MiB (claimed_columns): SQLite materializes every RETURNING row
        // before the first is read.
        let rows = self
            .step(None, protocol::claim(ids, token, lease), history)
            .await?;
        rows.iter()
            .map(claimed_row::<Sqlite>)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(self.err())
    }

    async fn attempt(
        &self,
        ids: &[String],
        token: &str,
        new_token: &str,
        outlive: Duration,
        history: &[NewHistory],
    ) -> Result<Vec<String>> {
        let update = protocol::attempt(ids, token, new_token, outlive);
        self.ids_step(update, history).await
    }

    async fn mark_replayed(
        &self,
        ids: &[String],
        token: &str,
        history: &[NewHistory],
    ) -> Result<Vec<String>> {
        let update = protocol::mark_replayed(ids, token);
        self.ids_step(update, history).await
    }

    async fn release(
        &self,
        ids: &[String],
        token: &str,
        error: Option<&str>,
        history: &[NewHistory],
    ) -> Result<Vec<String>> {
        let update = protocol::release(ids, token, error);
        self.ids_step(update, history).await
    }

    async fn settle_uncertain(
        &self,
        ids: &[String],
        token: &str,
        error: &str,
        lease: LeaseAfter,
        history: &[NewHistory],
    ) -> Result<Vec<String>> {
        let update = protocol::settle_uncertain(ids, token, error, lease);
        self.ids_step(update, history).await
    }

    async fn resolve(
        &self,
        ids: &[String],
        resolution: Resolution,
        history: &[NewHistory],
    ) -> Result<Vec<String>> {
        self.ids_step(protocol::resolve(ids, resolution), history)
            .await
    }

    async fn append_history(&self, entries: &[NewHistory]) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let mut conn = self.pool.acquire().await.map_err(self.err())?;
        insert_history(&mut conn, &entries.iter().collect::<Vec<_>>())
            .await
            .map_err(self.err())
    }

    async fn close(&self) {
        self.pool.close().await;
    }

    async fn capture(&self, rows: &[CapturedLetter]) -> Result<Vec<CaptureOutcome>> {
        if rows.is_empty() {
            sqlx::query("SELECT capture_key FROM dead_letters WHERE false")
                .execute(&self.pool)
                .await
                .map_err(self.err())?;
            return Ok(Vec::new());
        }
        // One IMMEDIATE transaction: the write lock is held from the key checks to the
        // commit, so no other capture can insert the same message in between. Keys are
        // looked up before anything is inserted, as PostgreSQL's single statement sees
        // them. Rows go in 100 per INSERT; a refused INSERT undoes only itself (SQLite's
        // statement-level ABORT), and its rows are then tried one by one.
        let mut tx = self.begin_write().await?;
        let mut out: Vec<Option<CaptureOutcome>> = vec![None; rows.len()];
        let keys: Vec<&str> = rows
            .iter()
            .filter(|c| c.redelivered)
            .map(|c| c.capture_key.as_str())
            .collect();
        if !keys.is_empty() {
            let found: HashSet<String> = sqlx::query_scalar(
                "SELECT DISTINCT capture_key FROM dead_letters \
                 WHERE capture_key IN (SELECT value FROM json_each(?1))",
            )
            .bind(serde_json::to_string(&keys).unwrap_or_else(|_| "[]".into()))
            .fetch_all(&mut *tx)
            .await
            .map_err(self.err())?
            .into_iter()
            .collect();
            for (o, c) in out.iter_mut().zip(rows) {
                if c.redelivered && found.contains(&c.capture_key) {
                    *o = Some(CaptureOutcome::AlreadyThere);
                }
            }
        }
        let todo: Vec<usize> = (0..rows.len()).filter(|i| out[*i].is_none()).collect();
        for chunk in todo.chunks(100) {
            let all: Vec<&CapturedLetter> = chunk.iter().map(|i| &rows[*i]).collect();
            match insert_captured(&mut tx, &all).await {
                Ok(()) => {
                    for i in chunk {
                        out[*i] = Some(CaptureOutcome::Inserted);
                    }
                }
                Err(e) if is_sqlite_row_error(&e) => {
                    for i in chunk {
                        out[*i] = Some(match insert_captured(&mut tx, &[&rows[*i]]).await {
                            Ok(()) => CaptureOutcome::Inserted,
                            Err(e) if is_sqlite_row_error(&e) => {
                                CaptureOutcome::Refused(self.err()(e).to_string())
                            }
                            Err(e) => return Err(self.err()(e)),
                        });
                    }
                }
                Err(e) => return Err(self.err()(e)),
            }
        }
        let out = out
            .into_iter()
            .map(|o| o.unwrap_or(CaptureOutcome::AlreadyThere))
            .collect();
        tx.commit().await.map_err(self.err())?;
        Ok(out)
    }

    async fn discard(
        &self,
        ids: &[String],
        note: &str,
        history: &[NewHistory],
    ) -> Result<Vec<String>> {
        self.ids_step(protocol::discard(ids, note), history).await
    }

    async fn restore(&self, ids: &[String], history: &[NewHistory]) -> Result<Vec<String>> {
        let first = <Sqlite as WriteDialect>::BEFORE_RESTORE;
        self.ids_step_after(first, protocol::restore(ids), history)
            .await
    }

    async fn prune_batch(
        &self,
        filter: &Filter,
        after: Option<&str>,
        window: i64,
    ) -> Result<(Option<String>, u64)> {
        check_prune_filter(filter)?;
        // A window of the primary key per write transaction: a worker's INSERT waits for
        // one short batch, and the whole run reads the table once.
        let started = std::time::Instant::now();
        let mut tx = self.begin_write().await?;
        // TEXT IDs only: a worker's BLOB ID sorts after every text, so a window could
        // never end on it (such rows are kept).
        let mut qb = QueryBuilder::new(
            "SELECT max(id) FROM (SELECT id FROM dead_letters WHERE typeof(id) = 'text'",
        );
        if let Some(a) = after {
            qb.push(" AND id > ");
            qb.push_bind(a.to_string());
        }
        qb.push(" ORDER BY id LIMIT ");
        qb.push_bind(window);
        qb.push(")");
        let last: Option<String> = qb
            .build_query_scalar()
            .fetch_one(&mut *tx)
            .await
            .map_err(self.err())?;
        let Some(last) = last else {
            tx.rollback().await.map_err(self.err())?;
            return Ok((None, 0));
        };
        let mut qb = QueryBuilder::new("DELETE FROM dead_letters");
        push_where(&mut qb, filter);
        if let Some(a) = after {
            qb.push(" AND id > ");
            qb.push_bind(a.to_string());
        }
        qb.push(" AND id <= ");
        qb.push_bind(last.clone());
        qb.push(" RETURNING id");
        let deleted: Vec<String> = qb
            .build_query_scalar()
            .fetch_all(&mut *tx)
            .await
            .map_err(self.err())?;
        if !deleted.is_empty() {
            sqlx::query(
                "DELETE FROM dead_letter_history \
                 WHERE dead_letter_id IN (SELECT value FROM json_each(?1))",
            )
            .bind(exact_ids_json(&deleted))
            .execute(&mut *tx)
            .await
            .map_err(self.err())?;
        }
        tx.commit().await.map_err(self.err())?;
        // A writer waiting for the lock does not queue: SQLite's busy handler sleeps and
        // polls again (up to 100 ms apart). Batches back to back would keep taking the
        // lock first; a pause as long as the batch leaves the lock free half the time.
        tokio::time::sleep(
            started
                .elapsed()
                .clamp(Duration::from_millis(2), Duration::from_millis(200)),
        )
        .await;
        Ok((Some(last), deleted.len() as u64))
    }
}

/// The identity values the triggers will derive, given with the INSERT so that they do
/// not write the row a second time (see [`identity_hint`]).
fn hint(r: &NewDeadLetter) -> [Option<String>; 3] {
    identity_hint(
        [
            r.producer.as_deref(),
            r.schema_version.as_deref(),
            r.event_id.as_deref(),
        ],
        &r.headers_json,
        &r.body,
    )
}

/// One INSERT of captured rows (a multi-row VALUES list).
async fn insert_captured(
    conn: &mut SqliteConnection,
    rows: &[&CapturedLetter],
) -> std::result::Result<(), sqlx::Error> {
    let mut qb = QueryBuilder::new(
        "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, event_id, error, \
         producer, schema_version, source_queue, exchange, routing_key, dead_lettered_at, \
         capture_key, eff_producer, eff_schema_version, eff_event_id) ",
    );
    qb.push_values(rows, |mut b, c| {
        let r = &c.row;
        let [eff_producer, eff_schema_version, eff_event_id] = hint(r);
        b.push_bind(&r.id)
            .push_bind(&r.body)
            .push_bind(&r.reason)
            .push_bind(r.attempts)
            .push_bind(&r.headers_json)
            .push_bind(&r.event_id)
            .push_bind(&r.error)
            .push_bind(&r.producer)
            .push_bind(&r.schema_version)
            .push_bind(&r.source_queue)
            .push_bind(&r.exchange)
            .push_bind(&r.routing_key)
            .push("COALESCE(")
            .push_bind_unseparated(r.dead_lettered_at.map(to_us))
            .push_unseparated(format!(", {NOW_US})"))
            .push_bind(&c.capture_key)
            .push_bind(eff_producer)
            .push_bind(eff_schema_version)
            .push_bind(eff_event_id);
    });
    qb.build().execute(&mut *conn).await?;
    Ok(())
}

#[path = "sqlite_import.rs"]
mod import;

#[cfg(test)]
#[path = "sqlite_tests.rs"]
pub(crate) mod tests;
