//! SQLite: all of its SQL. Times are INTEGER milliseconds since the epoch (UTC), one
//! format everywhere, so comparisons are numeric; the clock is [`NOW_MS`]. The database
//! runs in WAL mode with a busy timeout; write transactions begin IMMEDIATE (a claim or a
//! mark is one UPDATE plus its history), so two processes never deadlock on a lock upgrade.
//! ID sets are bound as one JSON array (`json_each`), so a batch needs one parameter.

use super::{
    check_prune_filter, db_error, decode_state, dimension_expr, is_row_error, migration_error,
    newly_applied, push_filter, state_counts, state_predicate, summary_columns, CaptureOutcome,
    CapturedLetter, ImportReport, NewDeadLetter, PlanCandidate, Store, StoreOptions,
};
use crate::error::{DlqError, Result};
use crate::model::{
    sha256_hex, token_operator, token_ref, ContentMatch, DeadLetter, Dimension, Filter, Group,
    GroupKey, HistoryEntry, NewHistory, State, Summary,
};
use crate::secret::SecretUrl;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use futures_util::TryStreamExt;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteRow, SqliteSynchronous,
};
use sqlx::AssertSqlSafe;
use sqlx::{ConnectOptions, QueryBuilder, Row};
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

fn ids_json(ids: &[String]) -> String {
    serde_json::to_string(ids).unwrap_or_else(|_| "[]".into())
}

const IN_IDS: &str = "id IN (SELECT value FROM json_each(?1))";

/// The WHERE clause of a filter: the shared conditions, then the content filters. Every
/// value is a bound parameter; `--header` and `--field` first look for their texts in
/// the raw bytes (a cheap test that never rules out a match, see
/// [`ContentMatch::needles`]), then check the JSON with `json_valid` (which never raises)
/// before reading it.
fn push_where(qb: &mut QueryBuilder<sqlx::Sqlite>, f: &Filter) {
    push_filter!(qb, f, NOW_MS, to_ms);
    if let Some(g) = &f.grep {
        qb.push(" AND instr(body, ");
        qb.push_bind(g.as_bytes().to_vec());
        qb.push(") > 0");
    }
    if let Some(e) = &f.error_contains {
        qb.push(" AND instr(error, ");
        qb.push_bind(e.clone());
        qb.push(") > 0");
    }
    // The byte tests come first: SQLite evaluates AND from the left and stops early.
    for m in &f.headers {
        qb.push(" AND CASE WHEN 1");
        for n in m.needles(false) {
            qb.push(" AND (instr(headers_json, ");
            qb.push_bind(n);
            qb.push(") > 0 OR instr(headers_json, '\\') > 0)");
        }
        qb.push(" AND json_valid(headers_json) THEN");
        push_json_match(qb, "headers_json", &[m.key.as_str()], m);
        qb.push(" ELSE 0 END");
    }
    for m in &f.fields {
        qb.push(" AND CASE WHEN 1");
        for n in m.needles(true) {
            qb.push(" AND (instr(body, ");
            qb.push_bind(n.into_bytes());
            qb.push(") > 0 OR instr(body, X'5c') > 0)");
        }
        qb.push(
            " AND json_valid(CAST(body AS TEXT)) \
             AND json_type(CAST(body AS TEXT)) = 'object' THEN",
        );
        push_json_match(qb, "CAST(body AS TEXT)", &m.path(), m);
        qb.push(" ELSE 0 END");
    }
}

/// The comparison of the value at `path` in the JSON object `doc` (see
/// [`ContentMatch`]): a string as its value, an array or object as JSON, anything else
/// as its JSON text as written (`->` keeps a number's text).
fn push_json_match(
    qb: &mut QueryBuilder<sqlx::Sqlite>,
    doc: &str,
    path: &[&str],
    m: &ContentMatch,
) {
    let path: String = std::iter::once("$".to_string())
        .chain(path.iter().map(|k| format!(".\"{k}\"")))
        .collect();
    qb.push(format!(" CASE json_type({doc}, "));
    qb.push_bind(path.clone());
    qb.push(format!(") WHEN 'text' THEN json_extract({doc}, "));
    qb.push_bind(path.clone());
    qb.push(") = ");
    qb.push_bind(m.value.clone());
    for kind in ["array", "object"] {
        qb.push(format!(" WHEN '{kind}' THEN json({doc} -> "));
        qb.push_bind(path.clone());
        qb.push(") = json(");
        qb.push_bind(m.value_json().map(str::to_string));
        qb.push(")");
    }
    qb.push(format!(" ELSE ({doc} -> "));
    qb.push_bind(path);
    qb.push(") = ");
    qb.push_bind(m.value.clone());
    qb.push(" END");
}

fn opt_time(row: &SqliteRow, col: &str) -> std::result::Result<Option<DateTime<Utc>>, sqlx::Error> {
    Ok(row.try_get::<Option<i64>, _>(col)?.map(from_ms))
}

/// A text column as a worker wrote it. SQLite does not check that TEXT is UTF-8, and one
/// invalid byte must not make a whole listing fail: invalid bytes become U+FFFD (PostgreSQL
/// refuses them on insert).
fn text<T, I>(row: &SqliteRow, col: I) -> std::result::Result<T, sqlx::Error>
where
    T: LossyText,
    I: sqlx::ColumnIndex<SqliteRow> + std::fmt::Debug + Copy,
{
    T::from_bytes(row.try_get::<Option<&[u8]>, _>(col)?, &format!("{col:?}"))
}

trait LossyText: Sized {
    fn from_bytes(b: Option<&[u8]>, col: &str) -> std::result::Result<Self, sqlx::Error>;
}

impl LossyText for Option<String> {
    fn from_bytes(b: Option<&[u8]>, _: &str) -> std::result::Result<Self, sqlx::Error> {
        Ok(b.map(|b| String::from_utf8_lossy(b).into_owned()))
    }
}

impl LossyText for String {
    fn from_bytes(b: Option<&[u8]>, col: &str) -> std::result::Result<Self, sqlx::Error> {
        b.map(|b| String::from_utf8_lossy(b).into_owned())
            .ok_or_else(|| sqlx::Error::ColumnDecode {
                index: col.to_string(),
                source: "unexpected NULL".into(),
            })
    }
}

fn summary(row: &SqliteRow) -> std::result::Result<Summary, sqlx::Error> {
    Ok(Summary {
        id: text(row, "id")?,
        reason: text(row, "reason")?,
        attempts: row.try_get("attempts")?,
        replayed_at: opt_time(row, "replayed_at")?,
        replay_claim_owner: text::<Option<String>, _>(row, "replay_claim_owner")?
            .map(|t| token_operator(&t).to_string()),
        replay_claim_expires_at: opt_time(row, "replay_claim_expires_at")?,
        last_replay_error: text(row, "last_replay_error")?,
        event_id: text(row, "eff_event_id")?,
        error: text(row, "error")?,
        producer: text(row, "eff_producer")?,
        schema_version: text(row, "eff_schema_version")?,
        source_queue: text(row, "source_queue")?,
        exchange: text(row, "exchange")?,
        routing_key: text(row, "routing_key")?,
        dead_lettered_at: from_ms(row.try_get("dead_lettered_at")?),
        replay_attempt_at: opt_time(row, "replay_attempt_at")?,
        discarded_at: opt_time(row, "discarded_at")?,
        discard_note: text(row, "discard_note")?,
        state: decode_state(row.try_get("state")?)?,
    })
}

impl SqliteStore {
    pub async fn connect(url: &SecretUrl, opts: &StoreOptions) -> Result<Self> {
        let mut options = SqliteConnectOptions::from_str(url.expose())
            .map_err(|e| DlqError::usage(format!("invalid SQLite URL {url}: {e}")))?
            .create_if_missing(opts.create)
            // FULL: a committed mark survives a power loss (NORMAL in WAL mode may undo
            // the last commits), so `replayed` never reverts to a state that replays again.
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(opts.busy_timeout)
            // A long statement (an export, an aggregate over millions of rows) is not a
            // warning for the operator; `-v` shows it.
            .log_slow_statements(log::LevelFilter::Info, Duration::from_secs(1));
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

    /// A protocol step: `query` (an UPDATE ... RETURNING id) and the history entries of
    /// the rows it changed, in one write transaction.
    async fn step<'q>(
        &self,
        query: sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments>,
        history: &[NewHistory],
    ) -> Result<Vec<String>> {
        let mut tx = self.begin_write().await?;
        let changed: Vec<String> = query
            .fetch_all(&mut *tx)
            .await
            .map_err(self.err())?
            .iter()
            .map(|r| r.try_get("id"))
            .collect::<std::result::Result<_, sqlx::Error>>()
            .map_err(self.err())?;
        let ids: HashSet<&str> = changed.iter().map(String::as_str).collect();
        insert_history(&mut tx, &only_for(history, &ids))
            .await
            .map_err(self.err())?;
        tx.commit().await.map_err(self.err())?;
        Ok(changed)
    }
}

/// The columns of a whole row, as [`whole_rows`] reads them (also a RETURNING list).
fn whole_row_columns() -> String {
    format!(
        "{}, headers_json, body, {NOW_MS} AS db_now",
        summary_columns(NOW_MS)
    )
}

fn whole_rows(rows: &[SqliteRow]) -> std::result::Result<Vec<DeadLetter>, sqlx::Error> {
    rows.iter()
        .map(|row| {
            Ok(DeadLetter {
                summary: summary(row)?,
                headers_json: text(row, "headers_json")?,
                body: row.try_get("body")?,
                db_now: from_ms(row.try_get("db_now")?),
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

/// The history of an imported row, restored as it was exported (a row that comes without
/// its history has none here).
async fn import_history(
    conn: &mut SqliteConnection,
    r: &NewDeadLetter,
) -> std::result::Result<(), sqlx::Error> {
    for h in r.history.as_deref().unwrap_or_default() {
        sqlx::query(
            "INSERT INTO dead_letter_history (dead_letter_id, at, operator, action, \
             outcome, detail, target, plan_id, token_ref) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        )
        .bind(&r.id)
        .bind(to_ms(h.at))
        .bind(&h.operator)
        .bind(&h.action)
        .bind(&h.outcome)
        .bind(&h.detail)
        .bind(&h.target)
        .bind(&h.plan_id)
        .bind(&h.token_ref)
        .execute(&mut *conn)
        .await?;
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
        let ms: i64 = sqlx::query_scalar(AssertSqlSafe(format!("SELECT {NOW_MS}")))
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
        push_where(&mut qb, filter);
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
            push_where(&mut qb, filter);
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
             {}, min(dead_lettered_at), max(dead_lettered_at) FROM dead_letters",
            exprs.join(", "),
            state_counts(NOW_MS, |p| format!(
                "total(CASE WHEN {p} THEN 1 ELSE 0 END)"
            ))
        ));
        push_where(&mut qb, filter);
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
                                GroupKey::Text(text(row, i)?)
                            },
                        ))
                    })
                    .collect::<Result<Vec<_>, sqlx::Error>>()?;
                Ok(Group {
                    keys,
                    count: row.try_get(n)?,
                    pending: row.try_get::<f64, _>(n + 1)? as i64,
                    claimed: row.try_get::<f64, _>(n + 2)? as i64,
                    uncertain: row.try_get::<f64, _>(n + 3)? as i64,
                    replayed: row.try_get::<f64, _>(n + 4)? as i64,
                    discarded: row.try_get::<f64, _>(n + 5)? as i64,
                    first_seen: from_ms(row.try_get(n + 6)?),
                    last_seen: from_ms(row.try_get(n + 7)?),
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(self.err())
    }

    async fn load(&self, ids: &[String]) -> Result<Vec<DeadLetter>> {
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT {} FROM dead_letters WHERE {IN_IDS}",
            whole_row_columns()
        )))
        .bind(ids_json(ids))
        .fetch_all(&self.pool)
        .await
        .map_err(self.err())?;
        whole_rows(&rows).map_err(self.err())
    }

    async fn summaries(&self, ids: &[String]) -> Result<Vec<Summary>> {
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT {} FROM dead_letters WHERE {IN_IDS}",
            summary_columns(NOW_MS)
        )))
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
            "SELECT at, operator, action, outcome, detail, target, plan_id, token, token_ref \
             FROM dead_letter_history WHERE dead_letter_id = ?1 ORDER BY seq",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await
        .map_err(self.err())?;
        rows.iter()
            .map(|r| {
                Ok(HistoryEntry {
                    at: from_ms(r.try_get("at")?),
                    operator: text(r, "operator")?,
                    action: text(r, "action")?,
                    outcome: text(r, "outcome")?,
                    detail: text(r, "detail")?,
                    token_ref: match text::<Option<String>, _>(r, "token")? {
                        Some(t) => Some(token_ref(&t)),
                        None => text(r, "token_ref")?,
                    },
                    target: text(r, "target")?,
                    plan_id: text(r, "plan_id")?,
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
             producer, schema_version, source_queue, exchange, routing_key, dead_lettered_at, \
             replay_attempt_at, discarded_at, discard_note) \
             VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,COALESCE(?17, {NOW_MS}), \
             ?18,?19,?20)",
            if skip_existing { "OR IGNORE" } else { "" }
        );
        for mut r in rows {
            let res = sqlx::query(AssertSqlSafe(sql.as_str()))
                .bind(&r.id)
                // Moved, not copied: a body may be tens of MiB.
                .bind(std::mem::take(&mut r.body))
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
                .bind(r.replay_attempt_at.map(to_ms))
                .bind(r.discarded_at.map(to_ms))
                .bind(&r.discard_note)
                .execute(&mut *tx)
                .await;
            match res {
                Ok(done) if done.rows_affected() == 0 => report.skipped_existing += 1,
                Ok(_) => {
                    report.imported += 1;
                    import_history(&mut tx, &r).await.map_err(|e| {
                        DlqError::other(format!(
                            "line {}: {} (nothing was imported)",
                            r.line,
                            self.err()(e)
                        ))
                    })?;
                }
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
        push_where(&mut qb, filter);
        qb.push(" ORDER BY dead_lettered_at, id LIMIT ");
        qb.push_bind(limit);
        let q = qb.build();
        let mut stream = q.fetch(&self.pool);
        let mut out = Vec::new();
        while let Some(row) = stream.try_next().await.map_err(self.err())? {
            let body: &[u8] = row.try_get(4).map_err(self.err())?;
            out.push(PlanCandidate {
                id: text(&row, 0).map_err(self.err())?,
                reason: text(&row, 1).map_err(self.err())?,
                producer: text(&row, 2).map_err(self.err())?,
                schema_version: text(&row, 3).map_err(self.err())?,
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
        // RETURNING id only: SQLite materializes every RETURNING row before the first is
        // read, so returning the body would copy it once more (docs/performance.md).
        let claimed: Vec<String> = sqlx::query_scalar(AssertSqlSafe(format!(
            "UPDATE dead_letters SET replay_claim_owner = ?2, \
                 replay_claim_expires_at = {NOW_MS} + ?3 \
             WHERE {IN_IDS} AND {} \
             RETURNING id",
            state_predicate(State::Pending, NOW_MS),
        )))
        .bind(ids_json(ids))
        .bind(token)
        .bind(lease.as_millis() as i64)
        .fetch_all(&mut *tx)
        .await
        .map_err(self.err())?;
        let rows = match claimed.is_empty() {
            true => Vec::new(),
            false => sqlx::query(AssertSqlSafe(format!(
                "SELECT {} FROM dead_letters WHERE {IN_IDS}",
                whole_row_columns()
            )))
            .bind(ids_json(&claimed))
            .fetch_all(&mut *tx)
            .await
            .map_err(self.err())?,
        };
        let claimed = whole_rows(&rows).map_err(self.err())?;
        drop(rows);
        let ids: HashSet<&str> = claimed.iter().map(|r| r.summary.id.as_str()).collect();
        insert_history(&mut tx, &only_for(history, &ids))
            .await
            .map_err(self.err())?;
        tx.commit().await.map_err(self.err())?;
        Ok(claimed)
    }

    async fn held(&self, ids: &[String], token: &str) -> Result<Vec<DeadLetter>> {
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT {} FROM dead_letters WHERE {IN_IDS} AND replay_claim_owner = ?2 \
             AND replay_attempt_at IS NULL AND {}",
            whole_row_columns(),
            state_predicate(State::Claimed, NOW_MS)
        )))
        .bind(ids_json(ids))
        .bind(token)
        .fetch_all(&self.pool)
        .await
        .map_err(self.err())?;
        whole_rows(&rows).map_err(self.err())
    }

    async fn attempt(
        &self,
        ids: &[String],
        token: &str,
        new_token: &str,
        outlive: Duration,
        history: &[NewHistory],
    ) -> Result<Vec<String>> {
        let sql = format!(
            "UPDATE dead_letters SET replay_attempt_at = {NOW_MS}, replay_claim_owner = ?3 \
             WHERE {IN_IDS} AND replay_claim_owner = ?2 AND replayed_at IS NULL \
               AND discarded_at IS NULL AND replay_attempt_at IS NULL \
               AND replay_claim_expires_at > {NOW_MS} + ?4 \
             RETURNING id"
        );
        let query = sqlx::query(AssertSqlSafe(sql.as_str()))
            .bind(ids_json(ids))
            .bind(token.to_string())
            .bind(new_token.to_string())
            .bind(outlive.as_millis() as i64);
        self.step(query, history).await
    }

    async fn mark_replayed(
        &self,
        ids: &[String],
        token: &str,
        history: &[NewHistory],
    ) -> Result<Vec<String>> {
        let sql = format!(
            "UPDATE dead_letters SET replayed_at = {NOW_MS}, replay_claim_expires_at = NULL, \
                 last_replay_error = NULL \
             WHERE {IN_IDS} AND replay_claim_owner = ?2 AND replayed_at IS NULL \
               AND replay_attempt_at IS NOT NULL \
             RETURNING id"
        );
        let query = sqlx::query(AssertSqlSafe(sql.as_str()))
            .bind(ids_json(ids))
            .bind(token.to_string());
        self.step(query, history).await
    }

    async fn release(
        &self,
        ids: &[String],
        token: &str,
        error: Option<&str>,
        history: &[NewHistory],
    ) -> Result<Vec<String>> {
        let sql = format!(
            "UPDATE dead_letters SET replay_claim_owner = NULL, replay_claim_expires_at = NULL, \
                 replay_attempt_at = NULL, last_replay_error = COALESCE(?3, last_replay_error) \
             WHERE {IN_IDS} AND replay_claim_owner = ?2 AND replayed_at IS NULL \
               AND replay_claim_expires_at > {NOW_MS} \
             RETURNING id"
        );
        let query = sqlx::query(AssertSqlSafe(sql.as_str()))
            .bind(ids_json(ids))
            .bind(token.to_string())
            .bind(error.map(str::to_string));
        self.step(query, history).await
    }

    async fn settle_uncertain(
        &self,
        ids: &[String],
        token: &str,
        error: &str,
        end_lease: bool,
        history: &[NewHistory],
    ) -> Result<Vec<String>> {
        let sql = format!(
            "UPDATE dead_letters SET last_replay_error = ?3, \
                 replay_claim_expires_at = CASE WHEN ?4 \
                     THEN min(COALESCE(replay_claim_expires_at, {NOW_MS}), {NOW_MS}) \
                     ELSE replay_claim_expires_at END \
             WHERE {IN_IDS} AND replay_claim_owner = ?2 AND replayed_at IS NULL \
               AND replay_attempt_at IS NOT NULL \
             RETURNING id"
        );
        let query = sqlx::query(AssertSqlSafe(sql.as_str()))
            .bind(ids_json(ids))
            .bind(token.to_string())
            .bind(error.to_string())
            .bind(end_lease);
        self.step(query, history).await
    }

    async fn resolve(
        &self,
        ids: &[String],
        delivered: bool,
        history: &[NewHistory],
    ) -> Result<Vec<String>> {
        let set = if delivered {
            format!("replayed_at = {NOW_MS}, replay_claim_expires_at = NULL")
        } else {
            "replay_attempt_at = NULL, replay_claim_owner = NULL, replay_claim_expires_at = NULL"
                .to_string()
        };
        let sql = format!(
            "UPDATE dead_letters SET {set} \
             WHERE {IN_IDS} AND {} \
             RETURNING id",
            state_predicate(State::Uncertain, NOW_MS)
        );
        self.step(
            sqlx::query(AssertSqlSafe(sql.as_str())).bind(ids_json(ids)),
            history,
        )
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

    async fn dead_lettered_since(
        &self,
        after: &(DateTime<Utc>, String),
        limit: i64,
    ) -> Result<Vec<(String, String, DateTime<Utc>)>> {
        let rows: Vec<(String, String, i64)> = sqlx::query_as(
            "SELECT id, eff_event_id, dead_lettered_at FROM dead_letters \
             WHERE (dead_lettered_at, id) > (?1, ?2) AND eff_event_id IS NOT NULL \
             ORDER BY dead_lettered_at, id LIMIT ?3",
        )
        .bind(to_ms(after.0))
        .bind(&after.1)
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

    async fn database_id(&self) -> Result<String> {
        sqlx::query_scalar::<_, String>("SELECT value FROM dlq_meta WHERE key = 'database_id'")
            .fetch_optional(&self.pool)
            .await
            .map_err(self.err())?
            .ok_or_else(|| DlqError::SchemaMissing("no database_id in dlq_meta".into()))
    }

    async fn count(&self, filter: &Filter) -> Result<i64> {
        let mut qb = QueryBuilder::new("SELECT count(*) FROM dead_letters");
        push_where(&mut qb, filter);
        qb.build_query_scalar::<i64>()
            .fetch_one(&self.pool)
            .await
            .map_err(self.err())
    }

    async fn discard(
        &self,
        ids: &[String],
        note: &str,
        history: &[NewHistory],
    ) -> Result<Vec<String>> {
        let sql = format!(
            "UPDATE dead_letters SET discarded_at = {NOW_MS}, discard_note = ?2 \
             WHERE {IN_IDS} AND {} RETURNING id",
            state_predicate(State::Pending, NOW_MS)
        );
        let query = sqlx::query(AssertSqlSafe(sql.as_str()))
            .bind(ids_json(ids))
            .bind(note.to_string());
        self.step(query, history).await
    }

    async fn restore(&self, ids: &[String], history: &[NewHistory]) -> Result<Vec<String>> {
        let sql = format!(
            "UPDATE dead_letters SET discarded_at = NULL, discard_note = NULL \
             WHERE {IN_IDS} AND {} RETURNING id",
            state_predicate(State::Discarded, NOW_MS)
        );
        self.step(
            sqlx::query(AssertSqlSafe(sql.as_str())).bind(ids_json(ids)),
            history,
        )
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
        let mut qb = QueryBuilder::new("SELECT max(id) FROM (SELECT id FROM dead_letters");
        if let Some(a) = after {
            qb.push(" WHERE id > ");
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
            .bind(ids_json(&deleted))
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

    async fn export(
        &self,
        filter: &Filter,
        sink: &mut (dyn FnMut(NewDeadLetter) -> Result<()> + Send),
    ) -> Result<u64> {
        // One statement, so one snapshot; in WAL mode it never blocks a writer.
        let mut qb = QueryBuilder::new(
            "SELECT id, body, reason, attempts, headers_json, replayed_at, replay_claim_owner, \
             replay_claim_expires_at, last_replay_error, event_id, error, producer, \
             schema_version, source_queue, exchange, routing_key, dead_lettered_at, \
             replay_attempt_at, discarded_at, discard_note, \
             (SELECT json_group_array(json_object('at', h.at, 'operator', h.operator, \
                 'action', h.action, 'outcome', h.outcome, 'detail', h.detail, \
                 'token', h.token, 'token_ref', h.token_ref, 'target', h.target, \
                 'plan_id', h.plan_id)) \
              FROM (SELECT * FROM dead_letter_history \
                    WHERE dead_letter_id = dead_letters.id ORDER BY seq) h) AS history \
             FROM dead_letters",
        );
        push_where(&mut qb, filter);
        qb.push(" ORDER BY dead_lettered_at, id");
        let mut n = 0u64;
        let mut rows = qb.build().fetch(&self.pool);
        while let Some(row) = rows.try_next().await.map_err(self.err())? {
            let r = (|| -> std::result::Result<NewDeadLetter, sqlx::Error> {
                Ok(NewDeadLetter {
                    line: 0,
                    id: row.try_get("id")?,
                    body: row.try_get("body")?,
                    reason: row.try_get("reason")?,
                    attempts: row.try_get("attempts")?,
                    headers_json: row.try_get("headers_json")?,
                    replayed_at: opt_time(&row, "replayed_at")?,
                    replay_claim_owner: row
                        .try_get::<Option<&str>, _>("replay_claim_owner")?
                        .map(|o| token_operator(o).to_string()),
                    replay_claim_expires_at: opt_time(&row, "replay_claim_expires_at")?,
                    last_replay_error: row.try_get("last_replay_error")?,
                    event_id: row.try_get("event_id")?,
                    error: row.try_get("error")?,
                    producer: row.try_get("producer")?,
                    schema_version: row.try_get("schema_version")?,
                    source_queue: row.try_get("source_queue")?,
                    exchange: row.try_get("exchange")?,
                    routing_key: row.try_get("routing_key")?,
                    dead_lettered_at: opt_time(&row, "dead_lettered_at")?,
                    replay_attempt_at: opt_time(&row, "replay_attempt_at")?,
                    discarded_at: opt_time(&row, "discarded_at")?,
                    discard_note: row.try_get("discard_note")?,
                    history: None,
                })
            })()
            .map_err(self.err())?;
            let history: Option<&str> = row.try_get("history").map_err(self.err())?;
            sink(NewDeadLetter {
                history: Some(super::parse_history_json(history)?),
                ..r
            })?;
            n += 1;
        }
        Ok(n)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn writes_are_committed_with_synchronous_full() {
        let dir = tempfile::tempdir().unwrap();
        let url = SecretUrl::new(format!("sqlite://{}", dir.path().join("t.db").display()));
        let opts = StoreOptions {
            create: true,
            ..StoreOptions::default()
        };
        let store = SqliteStore::connect(&url, &opts).await.unwrap();
        let level: i64 = sqlx::query_scalar("PRAGMA synchronous")
            .fetch_one(&store.pool)
            .await
            .unwrap();
        assert_eq!(level, 2, "FULL: a committed mark survives a power loss");
    }
}
