//! SQLite: all of its SQL. Times are INTEGER milliseconds since the epoch (UTC), one
//! format everywhere, so comparisons are numeric; the clock is [`NOW_MS`]. The database
//! runs in WAL mode with a busy timeout; write transactions begin IMMEDIATE (a claim or a
//! mark is one UPDATE plus its history), so two processes never deadlock on a lock upgrade.
//! ID sets are bound as one JSON array (`json_each`), so a batch needs one parameter.

use super::{
    db_error, dimension_expr, is_row_error, migration_error, newly_applied, push_filter,
    summary_columns, CaptureOutcome, CapturedLetter, ImportReport, NewDeadLetter, PlanCandidate,
    Store, StoreOptions,
};
use crate::error::{DlqError, Result};
use crate::model::{
    sha256_hex, DeadLetter, Dimension, Filter, Group, GroupKey, HistoryEntry, NewHistory, State,
    Summary,
};
use crate::secret::SecretUrl;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use futures_util::TryStreamExt;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteRow, SqliteSynchronous,
};
use sqlx::{QueryBuilder, Row};
use std::collections::HashSet;
use std::str::FromStr;
use std::time::Duration;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/sqlite");

/// The database clock in milliseconds since the epoch.
pub const NOW_MS: &str = "CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)";

pub struct SqliteStore {
    pool: SqlitePool,
    busy: Duration,
}

fn to_ms(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

fn from_ms(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or_default()
}

fn opt_time(row: &SqliteRow, i: usize) -> std::result::Result<Option<DateTime<Utc>>, sqlx::Error> {
    Ok(row.try_get::<Option<i64>, _>(i)?.map(from_ms))
}

fn ids_json(ids: &[String]) -> String {
    serde_json::to_string(ids).unwrap_or_else(|_| "[]".into())
}

const IN_IDS: &str = "id IN (SELECT value FROM json_each(?1))";

fn summary(row: &SqliteRow) -> std::result::Result<Summary, sqlx::Error> {
    Ok(Summary {
        id: row.try_get(0)?,
        reason: row.try_get(1)?,
        attempts: row.try_get(2)?,
        replayed_at: opt_time(row, 3)?,
        replay_claim_owner: row.try_get(4)?,
        replay_claim_expires_at: opt_time(row, 5)?,
        last_replay_error: row.try_get(6)?,
        event_id: row.try_get(7)?,
        error: row.try_get(8)?,
        producer: row.try_get(9)?,
        schema_version: row.try_get(10)?,
        source_queue: row.try_get(11)?,
        exchange: row.try_get(12)?,
        routing_key: row.try_get(13)?,
        dead_lettered_at: from_ms(row.try_get(14)?),
        state: State::parse(row.try_get::<&str, _>(15)?),
    })
}

impl SqliteStore {
    pub async fn connect(url: &SecretUrl, opts: &StoreOptions) -> Result<Self> {
        let mut options = SqliteConnectOptions::from_str(url.expose())
            .map_err(|e| DlqError::usage(format!("invalid SQLite URL {url}: {e}")))?
            .create_if_missing(opts.create)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(opts.busy_timeout);
        if opts.create {
            // WAL is a property of the database file: `dlq migrate` sets it once, for
            // dlq and the workers alike, and every later connection inherits it.
            options = options.journal_mode(SqliteJournalMode::Wal);
        }
        let file = options.get_filename();
        let in_memory = file.as_os_str() == ":memory:";
        if !opts.create && !in_memory && !file.exists() {
            return Err(DlqError::SchemaMissing(format!(
                "database file {} does not exist",
                file.display()
            )));
        }
        let pool = SqlitePoolOptions::new()
            .max_connections(opts.max_connections.min(4))
            .test_before_acquire(opts.long_running)
            .acquire_timeout(opts.connect_timeout + opts.busy_timeout)
            .connect_with(options)
            .await
            .map_err(db_error)?;
        Ok(SqliteStore {
            pool,
            busy: opts.busy_timeout,
        })
    }

    fn err(&self) -> impl Fn(sqlx::Error) -> DlqError + '_ {
        move |e| match db_error(e) {
            DlqError::Busy(_) => DlqError::Busy(self.busy),
            other => other,
        }
    }

    /// A write transaction that takes the write lock at once (no lock upgrade to deadlock on).
    async fn begin_write(&self) -> Result<sqlx::Transaction<'_, sqlx::Sqlite>> {
        self.pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(self.err())
    }

    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }
}

/// The columns of a whole row, as [`whole_rows`] reads them (also a RETURNING list).
fn whole_row_columns() -> String {
    format!("{}, headers_json, body, {NOW_MS}", summary_columns(NOW_MS))
}

fn whole_rows(rows: &[SqliteRow]) -> std::result::Result<Vec<DeadLetter>, sqlx::Error> {
    rows.iter()
        .map(|row| {
            Ok(DeadLetter {
                summary: summary(row)?,
                headers_json: row.try_get(16)?,
                body: row.try_get(17)?,
                db_now: from_ms(row.try_get(18)?),
            })
        })
        .collect()
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
                .push_bind(e.action)
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
        let applied: Vec<i64> = sqlx::query_scalar("SELECT version FROM _sqlx_migrations")
            .fetch_all(&self.pool)
            .await
            .unwrap_or_default();
        MIGRATOR.run(&self.pool).await.map_err(migration_error)?;
        Ok(newly_applied(&MIGRATOR, &applied))
    }

    async fn check_schema(&self) -> Result<()> {
        // One round trip: fails to parse unless both tables and the derived columns exist.
        sqlx::query(
            "SELECT d.eff_producer, h.seq FROM dead_letters d, dead_letter_history h WHERE false",
        )
        .execute(&self.pool)
        .await
        .map_err(self.err())?;
        Ok(())
    }

    async fn now(&self) -> Result<DateTime<Utc>> {
        let ms: i64 = sqlx::query_scalar(&format!("SELECT {NOW_MS}"))
            .fetch_one(&self.pool)
            .await
            .map_err(self.err())?;
        Ok(from_ms(ms))
    }

    async fn list(&self, filter: &Filter, limit: i64) -> Result<(Vec<Summary>, i64)> {
        let mut qb = QueryBuilder::new(format!(
            "SELECT {} FROM dead_letters",
            summary_columns(NOW_MS)
        ));
        push_filter!(qb, filter, NOW_MS, to_ms);
        qb.push(" ORDER BY dead_lettered_at DESC, id LIMIT ");
        qb.push_bind(limit);
        let rows = qb.build().fetch_all(&self.pool).await.map_err(self.err())?;
        let items = rows
            .iter()
            .map(summary)
            .collect::<Result<Vec<_>, _>>()
            .map_err(self.err())?;
        let total = if (items.len() as i64) < limit {
            items.len() as i64
        } else {
            let mut qb = QueryBuilder::new("SELECT count(*) FROM dead_letters");
            push_filter!(qb, filter, NOW_MS, to_ms);
            qb.build_query_scalar::<i64>()
                .fetch_one(&self.pool)
                .await
                .map_err(self.err())?
        };
        Ok((items, total))
    }

    async fn aggregate(&self, dims: &[Dimension], filter: &Filter) -> Result<Vec<Group>> {
        let exprs: Vec<String> = dims
            .iter()
            .map(|d| {
                dimension_expr(*d, |unit| {
                    let size = if unit == "hour" {
                        3_600_000
                    } else {
                        86_400_000
                    };
                    format!("(dead_lettered_at / {size}) * {size}")
                })
            })
            .collect();
        let n = dims.len();
        let mut qb = QueryBuilder::new(format!(
            "SELECT {}, count(*), \
             sum(replayed_at IS NULL AND (replay_claim_expires_at IS NULL OR replay_claim_expires_at <= {NOW_MS})), \
             sum(replayed_at IS NULL AND replay_claim_expires_at > {NOW_MS}), \
             sum(replayed_at IS NOT NULL), \
             min(dead_lettered_at), max(dead_lettered_at) FROM dead_letters",
            exprs.join(", ")
        ));
        push_filter!(qb, filter, NOW_MS, to_ms);
        let positions: Vec<String> = (1..=n).map(|i| i.to_string()).collect();
        qb.push(format!(
            " GROUP BY {} ORDER BY {} DESC, {}",
            positions.join(", "),
            n + 1,
            positions.join(", ")
        ));
        let rows = qb.build().fetch_all(&self.pool).await.map_err(self.err())?;
        rows.iter()
            .map(|row| {
                let keys = dims
                    .iter()
                    .enumerate()
                    .map(|(i, d)| {
                        Ok((
                            *d,
                            if d.is_time() {
                                GroupKey::Time(from_ms(row.try_get(i)?))
                            } else {
                                GroupKey::Text(row.try_get(i)?)
                            },
                        ))
                    })
                    .collect::<Result<Vec<_>, sqlx::Error>>()?;
                Ok(Group {
                    keys,
                    count: row.try_get(n)?,
                    pending: row.try_get(n + 1)?,
                    claimed: row.try_get(n + 2)?,
                    replayed: row.try_get(n + 3)?,
                    first_seen: from_ms(row.try_get(n + 4)?),
                    last_seen: from_ms(row.try_get(n + 5)?),
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(self.err())
    }

    async fn load(&self, ids: &[String]) -> Result<Vec<DeadLetter>> {
        let rows = sqlx::query(&format!(
            "SELECT {} FROM dead_letters WHERE {IN_IDS}",
            whole_row_columns()
        ))
        .bind(ids_json(ids))
        .fetch_all(&self.pool)
        .await
        .map_err(self.err())?;
        whole_rows(&rows).map_err(self.err())
    }

    async fn summaries(&self, ids: &[String]) -> Result<Vec<Summary>> {
        let rows = sqlx::query(&format!(
            "SELECT {} FROM dead_letters WHERE {IN_IDS}",
            summary_columns(NOW_MS)
        ))
        .bind(ids_json(ids))
        .fetch_all(&self.pool)
        .await
        .map_err(self.err())?;
        rows.iter()
            .map(summary)
            .collect::<Result<_, _>>()
            .map_err(self.err())
    }

    async fn history(&self, id: &str) -> Result<Vec<HistoryEntry>> {
        let rows = sqlx::query(
            "SELECT at, operator, action, outcome, detail, target, plan_id, token \
             FROM dead_letter_history WHERE dead_letter_id = ?1 ORDER BY seq",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await
        .map_err(self.err())?;
        rows.iter()
            .map(|r| {
                Ok(HistoryEntry {
                    at: from_ms(r.try_get(0)?),
                    operator: r.try_get(1)?,
                    action: r.try_get(2)?,
                    outcome: r.try_get(3)?,
                    detail: r.try_get(4)?,
                    token: r.try_get(7)?,
                    target: r.try_get(5)?,
                    plan_id: r.try_get(6)?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(self.err())
    }

    async fn import(&self, rows: Vec<NewDeadLetter>, skip_existing: bool) -> Result<ImportReport> {
        let mut tx = self.begin_write().await?;
        let mut report = ImportReport::default();
        let sql = format!(
            "INSERT {} INTO dead_letters (id, body, reason, attempts, headers_json, replayed_at, \
             replay_claim_owner, replay_claim_expires_at, last_replay_error, event_id, error, \
             producer, schema_version, source_queue, exchange, routing_key, dead_lettered_at) \
             VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,COALESCE(?17, {NOW_MS}))",
            if skip_existing { "OR IGNORE" } else { "" }
        );
        for r in rows {
            let res = sqlx::query(&sql)
                .bind(&r.id)
                .bind(&r.body)
                .bind(&r.reason)
                .bind(r.attempts)
                .bind(&r.headers_json)
                .bind(r.replayed_at.map(to_ms))
                .bind(&r.replay_claim_owner)
                .bind(r.replay_claim_expires_at.map(to_ms))
                .bind(&r.last_replay_error)
                .bind(&r.event_id)
                .bind(&r.error)
                .bind(&r.producer)
                .bind(&r.schema_version)
                .bind(&r.source_queue)
                .bind(&r.exchange)
                .bind(&r.routing_key)
                .bind(r.dead_lettered_at.map(to_ms))
                .execute(&mut *tx)
                .await;
            match res {
                Ok(done) if done.rows_affected() == 0 => report.skipped_existing += 1,
                Ok(_) => report.imported += 1,
                Err(e)
                    if e.as_database_error()
                        .map(|d| d.is_unique_violation())
                        .unwrap_or(false) =>
                {
                    return Err(DlqError::usage(format!(
                        "line {}: field id: a dead letter with id {:?} already exists (nothing was imported; use --skip-existing to keep the existing rows)",
                        r.line, r.id
                    )));
                }
                Err(e) => {
                    return Err(DlqError::other(format!(
                        "line {}: {} (nothing was imported)",
                        r.line,
                        self.err()(e)
                    )))
                }
            }
        }
        tx.commit().await.map_err(self.err())?;
        Ok(report)
    }

    async fn plan_candidates(&self, filter: &Filter, limit: i64) -> Result<Vec<PlanCandidate>> {
        let mut qb = QueryBuilder::new(
            "SELECT id, reason, eff_producer, eff_schema_version, body FROM dead_letters",
        );
        push_filter!(qb, filter, NOW_MS, to_ms);
        qb.push(" ORDER BY dead_lettered_at, id LIMIT ");
        qb.push_bind(limit);
        let q = qb.build();
        let mut stream = q.fetch(&self.pool);
        let mut out = Vec::new();
        while let Some(row) = stream.try_next().await.map_err(self.err())? {
            let body: &[u8] = row.try_get(4).map_err(self.err())?;
            out.push(PlanCandidate {
                id: row.try_get(0).map_err(self.err())?,
                reason: row.try_get(1).map_err(self.err())?,
                producer: row.try_get(2).map_err(self.err())?,
                schema_version: row.try_get(3).map_err(self.err())?,
                sha256: sha256_hex(body),
            });
        }
        Ok(out)
    }

    async fn claim(
        &self,
        ids: &[String],
        token: &str,
        lease: Duration,
        history: &[NewHistory],
    ) -> Result<Vec<DeadLetter>> {
        let mut tx = self.begin_write().await?;
        let rows = sqlx::query(&format!(
            "UPDATE dead_letters SET replay_claim_owner = ?2, \
                 replay_claim_expires_at = {NOW_MS} + ?3 \
             WHERE {IN_IDS} AND replayed_at IS NULL \
               AND (replay_claim_expires_at IS NULL OR replay_claim_expires_at <= {NOW_MS}) \
             RETURNING {}",
            whole_row_columns()
        ))
        .bind(ids_json(ids))
        .bind(token)
        .bind(lease.as_millis() as i64)
        .fetch_all(&mut *tx)
        .await
        .map_err(self.err())?;
        let claimed = whole_rows(&rows).map_err(self.err())?;
        let ids: HashSet<&str> = claimed.iter().map(|r| r.summary.id.as_str()).collect();
        insert_history(&mut tx, &only_for(history, &ids))
            .await
            .map_err(self.err())?;
        tx.commit().await.map_err(self.err())?;
        Ok(claimed)
    }

    async fn live_leases(&self, ids: &[String], token: &str) -> Result<Vec<String>> {
        sqlx::query_scalar(&format!(
            "SELECT id FROM dead_letters WHERE {IN_IDS} AND replay_claim_owner = ?2 \
             AND replayed_at IS NULL AND replay_claim_expires_at > {NOW_MS}"
        ))
        .bind(ids_json(ids))
        .bind(token)
        .fetch_all(&self.pool)
        .await
        .map_err(self.err())
    }

    async fn mark_replayed(
        &self,
        ids: &[String],
        token: &str,
        history: &[NewHistory],
    ) -> Result<Vec<String>> {
        let mut tx = self.begin_write().await?;
        let marked: Vec<String> = sqlx::query_scalar(&format!(
            "UPDATE dead_letters SET replayed_at = {NOW_MS}, replay_claim_expires_at = NULL, \
                 last_replay_error = NULL \
             WHERE {IN_IDS} AND replay_claim_owner = ?2 AND replayed_at IS NULL \
               AND replay_claim_expires_at > {NOW_MS} \
             RETURNING id"
        ))
        .bind(ids_json(ids))
        .bind(token)
        .fetch_all(&mut *tx)
        .await
        .map_err(self.err())?;
        let ids: HashSet<&str> = marked.iter().map(String::as_str).collect();
        insert_history(&mut tx, &only_for(history, &ids))
            .await
            .map_err(self.err())?;
        tx.commit().await.map_err(self.err())?;
        Ok(marked)
    }

    async fn release(
        &self,
        ids: &[String],
        token: &str,
        error: Option<&str>,
    ) -> Result<Vec<String>> {
        sqlx::query_scalar(&format!(
            "UPDATE dead_letters SET replay_claim_owner = NULL, replay_claim_expires_at = NULL, \
                 last_replay_error = COALESCE(?3, last_replay_error) \
             WHERE {IN_IDS} AND replay_claim_owner = ?2 AND replayed_at IS NULL \
               AND replay_claim_expires_at > {NOW_MS} \
             RETURNING id"
        ))
        .bind(ids_json(ids))
        .bind(token)
        .bind(error)
        .fetch_all(&self.pool)
        .await
        .map_err(self.err())
    }

    async fn note_uncertain(&self, ids: &[String], token: &str, error: &str) -> Result<()> {
        sqlx::query(&format!(
            "UPDATE dead_letters SET last_replay_error = ?3 \
             WHERE {IN_IDS} AND replay_claim_owner = ?2 AND replayed_at IS NULL"
        ))
        .bind(ids_json(ids))
        .bind(token)
        .bind(error)
        .execute(&self.pool)
        .await
        .map_err(self.err())?;
        Ok(())
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

    async fn dead_lettered_since(
        &self,
        since: DateTime<Utc>,
        limit: i64,
    ) -> Result<Vec<(String, String, DateTime<Utc>)>> {
        let rows: Vec<(String, String, i64)> = sqlx::query_as(
            "SELECT id, eff_event_id, dead_lettered_at FROM dead_letters \
             WHERE dead_lettered_at >= ?1 AND eff_event_id IS NOT NULL \
             ORDER BY dead_lettered_at LIMIT ?2",
        )
        .bind(to_ms(since))
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .map_err(self.err())?;
        Ok(rows
            .into_iter()
            .map(|(id, e, t)| (id, e, from_ms(t)))
            .collect())
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
                Err(e) if is_row_error(&e, true) => {
                    for i in chunk {
                        out[*i] = Some(match insert_captured(&mut tx, &[&rows[*i]]).await {
                            Ok(()) => CaptureOutcome::Inserted,
                            Err(e) if is_row_error(&e, true) => {
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
}

/// One INSERT of captured rows (a multi-row VALUES list).
async fn insert_captured(
    conn: &mut SqliteConnection,
    rows: &[&CapturedLetter],
) -> std::result::Result<(), sqlx::Error> {
    let mut qb = QueryBuilder::new(
        "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, event_id, error, \
         producer, schema_version, source_queue, exchange, routing_key, dead_lettered_at, \
         capture_key) ",
    );
    qb.push_values(rows, |mut b, c| {
        let r = &c.row;
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
            .push_bind_unseparated(r.dead_lettered_at.map(to_ms))
            .push_unseparated(format!(", {NOW_MS})"))
            .push_bind(&c.capture_key);
    });
    qb.build().execute(&mut *conn).await?;
    Ok(())
}
