//! PostgreSQL: all of its SQL. Times are `timestamptz`; the clock is `now()`.

use super::{
    check_prune_filter, db_error, decode_state, dimension_expr, is_row_error, migration_error,
    newly_applied, push_filter, state_counts, state_predicate, summary_columns, CaptureOutcome,
    CapturedLetter, ImportReport, NewDeadLetter, PlanCandidate, Store, StoreOptions,
};
use crate::error::{DlqError, Result};
use crate::model::{
    sha256_hex, token_operator, token_ref, DeadLetter, Dimension, Filter, Group, GroupKey,
    HistoryEntry, NewHistory, State, Summary,
};
use crate::secret::SecretUrl;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use futures_util::TryStreamExt;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};
use sqlx::AssertSqlSafe;
use sqlx::{ConnectOptions, QueryBuilder, Row};
use std::str::FromStr;
use std::time::Duration;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/postgres");

const NOW: &str = "now()";

pub struct PgStore {
    pool: PgPool,
}

fn ms(d: Duration) -> String {
    format!("{}ms", d.as_millis().max(1))
}

/// The WHERE clause of a filter: the shared conditions, then the content filters. Every
/// value is a bound parameter; `--header` and `--field` first look for their texts in
/// the raw bytes (a cheap test that never rules out a match, see
/// [`crate::model::ContentMatch::needles`]), and only then parse the JSON, and only where
/// the columns derived at write time say it parses (no exception per row).
fn push_where(qb: &mut QueryBuilder<sqlx::Postgres>, f: &Filter) {
    push_filter!(qb, f, NOW, |t: DateTime<Utc>| t);
    if let Some(g) = &f.grep {
        qb.push(" AND position(");
        qb.push_bind(g.as_bytes().to_vec());
        qb.push("::bytea IN body) > 0");
    }
    if let Some(e) = &f.error_contains {
        qb.push(" AND strpos(error, ");
        qb.push_bind(e.clone());
        qb.push(") > 0");
    }
    for m in &f.headers {
        qb.push(" AND CASE WHEN headers_are_json");
        for n in m.needles(false) {
            qb.push(" AND (strpos(headers_json, ");
            qb.push_bind(n);
            qb.push(") > 0 OR strpos(headers_json, '\\') > 0)");
        }
        qb.push(" THEN dlq_json_match(headers_json, ");
        qb.push_bind(vec![m.key.clone()]);
        push_match_value(qb, m);
    }
    for m in &f.fields {
        qb.push(" AND CASE WHEN body_is_json");
        for n in m.needles(true) {
            qb.push(" AND (position(");
            qb.push_bind(n.into_bytes());
            qb.push("::bytea IN body) > 0 OR position('\\x5c'::bytea IN body) > 0)");
        }
        qb.push(" THEN dlq_json_match(convert_from(body, 'UTF8'), ");
        qb.push_bind(m.path().into_iter().map(str::to_string).collect::<Vec<_>>());
        push_match_value(qb, m);
    }
}

fn push_match_value(qb: &mut QueryBuilder<sqlx::Postgres>, m: &crate::model::ContentMatch) {
    qb.push(", ");
    qb.push_bind(m.value.clone());
    qb.push(", ");
    qb.push_bind(m.value_json().map(str::to_string));
    qb.push(") ELSE false END");
}

/// A time as the export prints it: to the millisecond, the precision both stores keep.
fn whole_ms(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(t.timestamp_millis()).unwrap_or(t)
}

impl PgStore {
    pub async fn connect(url: &SecretUrl, opts: &StoreOptions) -> Result<Self> {
        let options = PgConnectOptions::from_str(url.expose())
            .map_err(|e| {
                DlqError::usage(format!(
                    "invalid PostgreSQL URL {url}: {}",
                    crate::secret::scrub(&e.to_string())
                ))
            })?
            .application_name("dlq")
            .options([
                ("statement_timeout", ms(opts.statement_timeout)),
                ("lock_timeout", ms(opts.lock_timeout)),
                ("TimeZone", "UTC".to_string()),
            ])
            // A long statement (an export, an aggregate over millions of rows) is not a
            // warning for the operator; `-v` shows it.
            .log_slow_statements(log::LevelFilter::Info, Duration::from_secs(1));
        let pool = PgPoolOptions::new()
            .max_connections(opts.max_connections)
            .test_before_acquire(opts.long_running)
            .acquire_timeout(opts.connect_timeout)
            .connect_with(options)
            .await
            .map_err(db_error)?;
        Ok(PgStore { pool })
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}

fn summary(row: &PgRow) -> std::result::Result<Summary, sqlx::Error> {
    Ok(Summary {
        id: row.try_get("id")?,
        reason: row.try_get("reason")?,
        attempts: row.try_get::<i32, _>("attempts")? as i64,
        replayed_at: row.try_get("replayed_at")?,
        replay_claim_owner: row
            .try_get::<Option<&str>, _>("replay_claim_owner")?
            .map(|t| token_operator(t).to_string()),
        replay_claim_expires_at: row.try_get("replay_claim_expires_at")?,
        last_replay_error: row.try_get("last_replay_error")?,
        event_id: row.try_get("eff_event_id")?,
        error: row.try_get("error")?,
        producer: row.try_get("eff_producer")?,
        schema_version: row.try_get("eff_schema_version")?,
        source_queue: row.try_get("source_queue")?,
        exchange: row.try_get("exchange")?,
        routing_key: row.try_get("routing_key")?,
        dead_lettered_at: row.try_get("dead_lettered_at")?,
        replay_attempt_at: row.try_get("replay_attempt_at")?,
        discarded_at: row.try_get("discarded_at")?,
        discard_note: row.try_get("discard_note")?,
        state: decode_state(row.try_get("state")?)?,
    })
}

/// The columns of a whole row, as [`whole_rows`] reads them (also a RETURNING list).
fn whole_row_columns() -> String {
    format!(
        "{}, headers_json, body, now() AS db_now",
        summary_columns(NOW)
    )
}

fn whole_rows(rows: &[PgRow]) -> Result<Vec<DeadLetter>> {
    rows.iter()
        .map(|row| {
            Ok(DeadLetter {
                summary: summary(row)?,
                headers_json: row.try_get("headers_json")?,
                body: row.try_get("body")?,
                db_now: row.try_get("db_now")?,
            })
        })
        .collect::<Result<_, sqlx::Error>>()
        .map_err(db_error)
}

/// One INSERT of history entries bound as eight arrays from parameter `$first` on, however
/// many entries. With `only_for`, just the entries whose dead letter the CTE of that name
/// returned, so a step and its history commit together.
fn insert_history(first: usize, only_for: Option<&str>) -> String {
    let arrays: Vec<String> = (first..first + 8)
        .map(|i| format!("${i}::text[]"))
        .collect();
    let filter = only_for
        .map(|cte| format!(" WHERE e.dead_letter_id IN (SELECT id FROM {cte})"))
        .unwrap_or_default();
    format!(
        "INSERT INTO dead_letter_history \
         (dead_letter_id, operator, action, outcome, detail, token, target, plan_id) \
         SELECT e.* FROM UNNEST({}) AS e(dead_letter_id, operator, action, outcome, detail, \
         token, target, plan_id){filter}",
        arrays.join(", ")
    )
}

/// Binds the eight arrays of [`insert_history`].
fn bind_history<'q>(
    query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    entries: &[NewHistory],
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    let col = |f: fn(&NewHistory) -> Option<String>| entries.iter().map(f).collect::<Vec<_>>();
    query
        .bind(col(|e| Some(e.dead_letter_id.clone())))
        .bind(col(|e| Some(e.operator.clone())))
        .bind(col(|e| Some(e.action.to_string())))
        .bind(col(|e| Some(e.outcome.as_str().to_string())))
        .bind(col(|e| Some(e.detail.clone())))
        .bind(col(|e| e.token.clone()))
        .bind(col(|e| e.target.clone()))
        .bind(col(|e| e.plan_id.clone()))
}

/// A protocol step: `update` (an UPDATE ... RETURNING id, parameters $1..$n) and the
/// history entries of the rows it changed, in one statement, so both commit together.
fn step_sql(update: &str, n: usize) -> String {
    format!(
        "WITH c AS ({update}), h AS ({}) SELECT id FROM c",
        insert_history(n + 1, Some("c"))
    )
}

/// The history of an imported row, restored as it was exported (a row that comes without
/// its history has none here).
async fn import_history(
    conn: &mut sqlx::PgConnection,
    r: &NewDeadLetter,
) -> std::result::Result<(), sqlx::Error> {
    for h in r.history.as_deref().unwrap_or_default() {
        sqlx::query(
            "INSERT INTO dead_letter_history (dead_letter_id, at, operator, action, \
             outcome, detail, target, plan_id, token_ref) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
        .bind(&r.id)
        .bind(h.at)
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

type PgQuery<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

impl PgStore {
    async fn step(&self, query: PgQuery<'_>, history: &[NewHistory]) -> Result<Vec<String>> {
        let rows = bind_history(query, history)
            .fetch_all(&self.pool)
            .await
            .map_err(db_error)?;
        rows.iter()
            .map(|r| r.try_get("id"))
            .collect::<Result<_, sqlx::Error>>()
            .map_err(db_error)
    }
}

#[async_trait]
impl Store for PgStore {
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
        .map_err(db_error)?;
        Ok(())
    }

    async fn now(&self) -> Result<DateTime<Utc>> {
        sqlx::query_scalar("SELECT now()")
            .fetch_one(&self.pool)
            .await
            .map_err(db_error)
    }

    async fn list(&self, filter: &Filter, limit: i64) -> Result<(Vec<Summary>, i64)> {
        let mut qb =
            QueryBuilder::new(format!("SELECT {} FROM dead_letters", summary_columns(NOW)));
        push_where(&mut qb, filter);
        qb.push(" ORDER BY dead_lettered_at DESC, id LIMIT ");
        qb.push_bind(limit);
        let rows = qb.build().fetch_all(&self.pool).await.map_err(db_error)?;
        let items = rows
            .iter()
            .map(summary)
            .collect::<Result<Vec<_>, _>>()
            .map_err(db_error)?;
        let total = if (items.len() as i64) < limit {
            items.len() as i64
        } else {
            let mut qb = QueryBuilder::new("SELECT count(*) FROM dead_letters");
            push_where(&mut qb, filter);
            qb.build_query_scalar::<i64>()
                .fetch_one(&self.pool)
                .await
                .map_err(db_error)?
        };
        Ok((items, total))
    }

    async fn aggregate(&self, dims: &[Dimension], filter: &Filter) -> Result<Vec<Group>> {
        let exprs: Vec<String> = dims
            .iter()
            .map(|d| dimension_expr(*d, |unit| format!("date_trunc('{unit}', dead_lettered_at)")))
            .collect();
        let n = dims.len();
        let mut qb = QueryBuilder::new(format!(
            "SELECT {}, count(*), \
             {}, min(dead_lettered_at), max(dead_lettered_at) FROM dead_letters",
            exprs.join(", "),
            state_counts(NOW, |p| format!("count(*) FILTER (WHERE {p})"))
        ));
        push_where(&mut qb, filter);
        let positions: Vec<String> = (1..=n).map(|i| i.to_string()).collect();
        qb.push(format!(
            " GROUP BY {} ORDER BY {} DESC, {}",
            positions.join(", "),
            n + 1,
            positions.join(", ")
        ));
        let rows = qb.build().fetch_all(&self.pool).await.map_err(db_error)?;
        rows.iter()
            .map(|row| {
                let keys = dims
                    .iter()
                    .enumerate()
                    .map(|(i, d)| {
                        Ok((
                            *d,
                            if d.is_time() {
                                GroupKey::Time(row.try_get(i)?)
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
                    uncertain: row.try_get(n + 3)?,
                    replayed: row.try_get(n + 4)?,
                    discarded: row.try_get(n + 5)?,
                    first_seen: row.try_get(n + 6)?,
                    last_seen: row.try_get(n + 7)?,
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(db_error)
    }

    async fn load(&self, ids: &[String]) -> Result<Vec<DeadLetter>> {
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT {} FROM dead_letters WHERE id = ANY($1)",
            whole_row_columns()
        )))
        .bind(ids)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)?;
        whole_rows(&rows)
    }

    async fn summaries(&self, ids: &[String]) -> Result<Vec<Summary>> {
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT {} FROM dead_letters WHERE id = ANY($1)",
            summary_columns(NOW)
        )))
        .bind(ids)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)?;
        rows.iter()
            .map(summary)
            .collect::<Result<_, _>>()
            .map_err(db_error)
    }

    async fn history(&self, id: &str) -> Result<Vec<HistoryEntry>> {
        let rows = sqlx::query(
            "SELECT at, operator, action, outcome, detail, target, plan_id, token, token_ref \
             FROM dead_letter_history WHERE dead_letter_id = $1 ORDER BY seq",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)?;
        rows.iter()
            .map(|r| {
                Ok(HistoryEntry {
                    at: r.try_get("at")?,
                    operator: r.try_get("operator")?,
                    action: r.try_get("action")?,
                    outcome: r.try_get("outcome")?,
                    detail: r.try_get("detail")?,
                    token_ref: match r.try_get::<Option<&str>, _>("token")? {
                        Some(t) => Some(token_ref(t)),
                        None => r.try_get("token_ref")?,
                    },
                    target: r.try_get("target")?,
                    plan_id: r.try_get("plan_id")?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(db_error)
    }

    async fn import(&self, rows: Vec<NewDeadLetter>, skip_existing: bool) -> Result<ImportReport> {
        let mut tx = self.pool.begin().await.map_err(db_error)?;
        let mut report = ImportReport::default();
        for mut r in rows {
            let sql = format!(
                "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, replayed_at, \
                 replay_claim_owner, replay_claim_expires_at, last_replay_error, event_id, error, \
                 producer, schema_version, source_queue, exchange, routing_key, dead_lettered_at, \
                 replay_attempt_at, discarded_at, discard_note) \
                 VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,COALESCE($17, now()),\
                 $18,$19,$20){}",
                if skip_existing { " ON CONFLICT (id) DO NOTHING" } else { "" }
            );
            let attempts = i32::try_from(r.attempts).map_err(|_| {
                DlqError::usage(format!(
                    "line {}: field attempts: {} is out of range",
                    r.line, r.attempts
                ))
            })?;
            let res = sqlx::query(AssertSqlSafe(sql.as_str()))
                .bind(&r.id)
                // Moved, not copied: a body may be tens of MiB.
                .bind(std::mem::take(&mut r.body))
                .bind(&r.reason)
                .bind(attempts)
                .bind(&r.headers_json)
                .bind(r.replayed_at)
                .bind(&r.replay_claim_owner)
                .bind(r.replay_claim_expires_at)
                .bind(&r.last_replay_error)
                .bind(&r.event_id)
                .bind(&r.error)
                .bind(&r.producer)
                .bind(&r.schema_version)
                .bind(&r.source_queue)
                .bind(&r.exchange)
                .bind(&r.routing_key)
                .bind(r.dead_lettered_at)
                .bind(r.replay_attempt_at)
                .bind(r.discarded_at)
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
                            db_error(e)
                        ))
                    })?;
                }
                Err(e)
                    if e.as_database_error().and_then(|d| d.code()).as_deref() == Some("23505") =>
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
                        db_error(e)
                    )))
                }
            }
        }
        tx.commit().await.map_err(db_error)?;
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
        while let Some(row) = stream.try_next().await.map_err(db_error)? {
            let body: &[u8] = row.try_get(4).map_err(db_error)?;
            out.push(PlanCandidate {
                id: row.try_get(0).map_err(db_error)?,
                reason: row.try_get(1).map_err(db_error)?,
                producer: row.try_get(2).map_err(db_error)?,
                schema_version: row.try_get(3).map_err(db_error)?,
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
        let sql = format!(
            "WITH c AS (UPDATE dead_letters \
                 SET replay_claim_owner = $2, \
                     replay_claim_expires_at = now() + make_interval(secs => $3::float8 / 1000.0) \
                 WHERE id = ANY($1) AND {} \
                 RETURNING {}), \
             h AS ({}) \
             SELECT * FROM c",
            state_predicate(State::Pending, NOW),
            whole_row_columns(),
            insert_history(4, Some("c"))
        );
        let query = sqlx::query(AssertSqlSafe(sql.as_str()))
            .bind(ids)
            .bind(token)
            .bind(lease.as_millis() as i64);
        let rows = bind_history(query, history)
            .fetch_all(&self.pool)
            .await
            .map_err(db_error)?;
        whole_rows(&rows)
    }

    async fn held(&self, ids: &[String], token: &str) -> Result<Vec<DeadLetter>> {
        let rows = sqlx::query(AssertSqlSafe(format!(
            "SELECT {} FROM dead_letters WHERE id = ANY($1) AND replay_claim_owner = $2 \
             AND replay_attempt_at IS NULL AND {}",
            whole_row_columns(),
            state_predicate(State::Claimed, NOW)
        )))
        .bind(ids)
        .bind(token)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)?;
        whole_rows(&rows)
    }

    async fn attempt(
        &self,
        ids: &[String],
        token: &str,
        new_token: &str,
        outlive: Duration,
        history: &[NewHistory],
    ) -> Result<Vec<String>> {
        let sql = step_sql(
            "UPDATE dead_letters SET replay_attempt_at = now(), replay_claim_owner = $3 \
             WHERE id = ANY($1) AND replay_claim_owner = $2 AND replayed_at IS NULL \
               AND discarded_at IS NULL AND replay_attempt_at IS NULL \
               AND replay_claim_expires_at > now() + make_interval(secs => $4::float8 / 1000.0) \
             RETURNING id",
            4,
        );
        let query = sqlx::query(AssertSqlSafe(sql.as_str()))
            .bind(ids)
            .bind(token)
            .bind(new_token)
            .bind(outlive.as_millis() as i64);
        self.step(query, history).await
    }

    async fn mark_replayed(
        &self,
        ids: &[String],
        token: &str,
        history: &[NewHistory],
    ) -> Result<Vec<String>> {
        let sql = step_sql(
            "UPDATE dead_letters SET replayed_at = now(), \
                 replay_claim_expires_at = NULL, last_replay_error = NULL \
             WHERE id = ANY($1) AND replay_claim_owner = $2 AND replayed_at IS NULL \
               AND replay_attempt_at IS NOT NULL \
             RETURNING id",
            2,
        );
        self.step(
            sqlx::query(AssertSqlSafe(sql.as_str()))
                .bind(ids)
                .bind(token),
            history,
        )
        .await
    }

    async fn release(
        &self,
        ids: &[String],
        token: &str,
        error: Option<&str>,
        history: &[NewHistory],
    ) -> Result<Vec<String>> {
        let sql = step_sql(
            "UPDATE dead_letters SET replay_claim_owner = NULL, replay_claim_expires_at = NULL, \
                 replay_attempt_at = NULL, last_replay_error = COALESCE($3, last_replay_error) \
             WHERE id = ANY($1) AND replay_claim_owner = $2 AND replayed_at IS NULL \
               AND replay_claim_expires_at > now() \
             RETURNING id",
            3,
        );
        let query = sqlx::query(AssertSqlSafe(sql.as_str()))
            .bind(ids)
            .bind(token)
            .bind(error);
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
        let sql = step_sql(
            "UPDATE dead_letters SET last_replay_error = $3, \
                 replay_claim_expires_at = CASE WHEN $4 \
                     THEN LEAST(replay_claim_expires_at, now()) \
                     ELSE replay_claim_expires_at END \
             WHERE id = ANY($1) AND replay_claim_owner = $2 AND replayed_at IS NULL \
               AND replay_attempt_at IS NOT NULL \
             RETURNING id",
            4,
        );
        let query = sqlx::query(AssertSqlSafe(sql.as_str()))
            .bind(ids)
            .bind(token)
            .bind(error)
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
            "replayed_at = now(), replay_claim_expires_at = NULL"
        } else {
            "replay_attempt_at = NULL, replay_claim_owner = NULL, replay_claim_expires_at = NULL"
        };
        let sql = step_sql(
            &format!(
                "UPDATE dead_letters SET {set} \
                 WHERE id = ANY($1) AND {} \
                 RETURNING id",
                state_predicate(State::Uncertain, NOW)
            ),
            1,
        );
        self.step(sqlx::query(AssertSqlSafe(sql.as_str())).bind(ids), history)
            .await
    }

    async fn append_history(&self, entries: &[NewHistory]) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        bind_history(sqlx::query(AssertSqlSafe(insert_history(1, None))), entries)
            .execute(&self.pool)
            .await
            .map_err(db_error)?;
        Ok(())
    }

    async fn dead_lettered_since(
        &self,
        after: &(DateTime<Utc>, String),
        limit: i64,
    ) -> Result<Vec<(String, String, DateTime<Utc>)>> {
        sqlx::query_as(
            "SELECT id, eff_event_id, dead_lettered_at FROM dead_letters \
             WHERE (dead_lettered_at, id) > ($1, $2) AND eff_event_id IS NOT NULL \
             ORDER BY dead_lettered_at, id LIMIT $3",
        )
        .bind(after.0)
        .bind(&after.1)
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .map_err(db_error)
    }

    async fn close(&self) {
        self.pool.close().await;
    }

    async fn capture(&self, rows: &[CapturedLetter]) -> Result<Vec<CaptureOutcome>> {
        if rows.is_empty() {
            sqlx::query("SELECT capture_key FROM dead_letters WHERE false")
                .execute(&self.pool)
                .await
                .map_err(db_error)?;
            return Ok(Vec::new());
        }
        let mut tx = begin_capture(&self.pool, rows).await?;
        match insert_captured(&mut tx, rows).await {
            Ok(inserted) => {
                tx.commit().await.map_err(db_error)?;
                Ok(rows
                    .iter()
                    .map(|r| {
                        if inserted.contains(&r.row.id) {
                            CaptureOutcome::Inserted
                        } else {
                            CaptureOutcome::AlreadyThere
                        }
                    })
                    .collect())
            }
            Err(e) if is_row_error(&e, false) => {
                // Some row is refused: again, each row behind its own savepoint, so that
                // the batch still commits once with every row the database takes.
                tx.rollback().await.map_err(db_error)?;
                let mut tx = begin_capture(&self.pool, rows).await?;
                // The keys of redelivered rows are looked up once, before any insert: a
                // row inserted by this loop must not make an identical message that came
                // with it look "already there" (two identical messages make two rows).
                let keys: Vec<&str> = rows
                    .iter()
                    .filter(|r| r.redelivered)
                    .map(|r| r.capture_key.as_str())
                    .collect();
                let existing: std::collections::HashSet<String> = if keys.is_empty() {
                    Default::default()
                } else {
                    sqlx::query_scalar(
                        "SELECT capture_key FROM dead_letters WHERE capture_key = ANY($1)",
                    )
                    .bind(&keys)
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(db_error)?
                    .into_iter()
                    .collect()
                };
                let mut out = Vec::with_capacity(rows.len());
                for r in rows {
                    if r.redelivered && existing.contains(&r.capture_key) {
                        out.push(CaptureOutcome::AlreadyThere);
                        continue;
                    }
                    let fresh = CapturedLetter {
                        redelivered: false,
                        ..r.clone()
                    };
                    let mut sp = sqlx::Connection::begin(&mut *tx).await.map_err(db_error)?;
                    match insert_captured(&mut sp, std::slice::from_ref(&fresh)).await {
                        Ok(ids) => {
                            sp.commit().await.map_err(db_error)?;
                            out.push(if ids.is_empty() {
                                CaptureOutcome::AlreadyThere
                            } else {
                                CaptureOutcome::Inserted
                            });
                        }
                        Err(e) if is_row_error(&e, false) => {
                            sp.rollback().await.map_err(db_error)?;
                            out.push(CaptureOutcome::Refused(db_error(e).to_string()));
                        }
                        Err(e) => return Err(db_error(e)),
                    }
                }
                tx.commit().await.map_err(db_error)?;
                Ok(out)
            }
            Err(e) => Err(db_error(e)),
        }
    }

    async fn database_id(&self) -> Result<String> {
        sqlx::query_scalar::<_, String>("SELECT value FROM dlq_meta WHERE key = 'database_id'")
            .fetch_optional(&self.pool)
            .await
            .map_err(db_error)?
            .ok_or_else(|| DlqError::SchemaMissing("no database_id in dlq_meta".into()))
    }

    async fn count(&self, filter: &Filter) -> Result<i64> {
        let mut qb = QueryBuilder::new("SELECT count(*) FROM dead_letters");
        push_where(&mut qb, filter);
        qb.build_query_scalar::<i64>()
            .fetch_one(&self.pool)
            .await
            .map_err(db_error)
    }

    async fn discard(
        &self,
        ids: &[String],
        note: &str,
        history: &[NewHistory],
    ) -> Result<Vec<String>> {
        let sql = step_sql(
            &format!(
                "UPDATE dead_letters SET discarded_at = now(), discard_note = $2 \
                 WHERE id = ANY($1) AND {} RETURNING id",
                state_predicate(State::Pending, NOW)
            ),
            2,
        );
        self.step(
            sqlx::query(AssertSqlSafe(sql.as_str()))
                .bind(ids)
                .bind(note),
            history,
        )
        .await
    }

    async fn restore(&self, ids: &[String], history: &[NewHistory]) -> Result<Vec<String>> {
        let sql = step_sql(
            &format!(
                "UPDATE dead_letters SET discarded_at = NULL, discard_note = NULL \
                 WHERE id = ANY($1) AND {} RETURNING id",
                state_predicate(State::Discarded, NOW)
            ),
            1,
        );
        self.step(sqlx::query(AssertSqlSafe(sql.as_str())).bind(ids), history)
            .await
    }

    async fn prune_batch(
        &self,
        filter: &Filter,
        after: Option<&str>,
        window: i64,
    ) -> Result<(Option<String>, u64)> {
        check_prune_filter(filter)?;
        // The window walks the primary key, so each statement reads a bounded stretch of
        // the table and the whole run reads it once. The DELETE repeats the filter, so a
        // row restored meanwhile is rechecked on its new version and kept.
        let mut qb = QueryBuilder::new("WITH w AS (SELECT id FROM dead_letters");
        if let Some(a) = after {
            qb.push(" WHERE id > ");
            qb.push_bind(a.to_string());
        }
        qb.push(" ORDER BY id LIMIT ");
        qb.push_bind(window);
        qb.push("), d AS (DELETE FROM dead_letters");
        push_where(&mut qb, filter);
        qb.push(
            " AND id IN (SELECT id FROM w) RETURNING id), \
             h AS (DELETE FROM dead_letter_history WHERE dead_letter_id IN (SELECT id FROM d)) \
             SELECT (SELECT max(id) FROM w), (SELECT count(*) FROM d)",
        );
        let (last, deleted): (Option<String>, i64) = qb
            .build_query_as()
            .fetch_one(&self.pool)
            .await
            .map_err(db_error)?;
        Ok((last, deleted as u64))
    }

    async fn export(
        &self,
        filter: &Filter,
        sink: &mut (dyn FnMut(NewDeadLetter) -> Result<()> + Send),
    ) -> Result<u64> {
        // One statement streams every row; it is not bound by --statement-timeout, which
        // is meant for statements that hold locks (this one takes none that writers wait on).
        let mut tx = self.pool.begin().await.map_err(db_error)?;
        sqlx::query("SET LOCAL statement_timeout = 0")
            .execute(&mut *tx)
            .await
            .map_err(db_error)?;
        let mut qb = QueryBuilder::new(
            "SELECT id, body, reason, attempts, headers_json, replayed_at, replay_claim_owner, \
             replay_claim_expires_at, last_replay_error, event_id, error, producer, \
             schema_version, source_queue, exchange, routing_key, dead_lettered_at, \
             replay_attempt_at, discarded_at, discard_note, \
             (SELECT json_agg(json_build_object('at', floor(extract(epoch FROM h.at) * 1000)::bigint, \
                 'operator', h.operator, 'action', h.action, 'outcome', h.outcome, \
                 'detail', h.detail, 'token', h.token, 'token_ref', h.token_ref, \
                 'target', h.target, 'plan_id', h.plan_id) ORDER BY h.seq)::text \
              FROM dead_letter_history h WHERE h.dead_letter_id = dead_letters.id) AS history \
             FROM dead_letters",
        );
        push_where(&mut qb, filter);
        qb.push(" ORDER BY dead_lettered_at, id COLLATE \"C\"");
        let mut n = 0u64;
        {
            let mut rows = qb.build().fetch(&mut *tx);
            while let Some(row) = rows.try_next().await.map_err(db_error)? {
                let t = |c: &str| -> std::result::Result<Option<DateTime<Utc>>, sqlx::Error> {
                    Ok(row.try_get::<Option<DateTime<Utc>>, _>(c)?.map(whole_ms))
                };
                let r = (|| -> std::result::Result<NewDeadLetter, sqlx::Error> {
                    Ok(NewDeadLetter {
                        line: 0,
                        id: row.try_get("id")?,
                        body: row.try_get("body")?,
                        reason: row.try_get("reason")?,
                        attempts: row.try_get::<i32, _>("attempts")? as i64,
                        headers_json: row.try_get("headers_json")?,
                        replayed_at: t("replayed_at")?,
                        replay_claim_owner: row
                            .try_get::<Option<&str>, _>("replay_claim_owner")?
                            .map(|o| token_operator(o).to_string()),
                        replay_claim_expires_at: t("replay_claim_expires_at")?,
                        last_replay_error: row.try_get("last_replay_error")?,
                        event_id: row.try_get("event_id")?,
                        error: row.try_get("error")?,
                        producer: row.try_get("producer")?,
                        schema_version: row.try_get("schema_version")?,
                        source_queue: row.try_get("source_queue")?,
                        exchange: row.try_get("exchange")?,
                        routing_key: row.try_get("routing_key")?,
                        dead_lettered_at: t("dead_lettered_at")?,
                        replay_attempt_at: t("replay_attempt_at")?,
                        discarded_at: t("discarded_at")?,
                        discard_note: row.try_get("discard_note")?,
                        history: None,
                    })
                })()
                .map_err(db_error)?;
                let history: Option<&str> = row.try_get("history").map_err(db_error)?;
                sink(NewDeadLetter {
                    history: Some(super::parse_history_json(history)?),
                    ..r
                })?;
                n += 1;
            }
        }
        tx.rollback().await.map_err(db_error)?;
        Ok(n)
    }
}

/// The advisory lock that orders capture transactions (any value; "dlq_capt").
const CAPTURE_LOCK: i64 = 0x646c_715f_6361_7074;

/// A capture transaction. Every one first takes the capture lock shared; one with a
/// redelivered row takes it exclusive instead, which waits until every other capture
/// transaction has ended: a capture whose broker connection died while its commit was in
/// flight has then committed (or not) before this one looks for the key. Advisory locks
/// need no right on the table beyond the INSERT and SELECT that capture uses anyway.
async fn begin_capture<'c>(
    pool: &'c PgPool,
    rows: &[CapturedLetter],
) -> Result<sqlx::Transaction<'c, sqlx::Postgres>> {
    let mut tx = pool.begin().await.map_err(db_error)?;
    let lock = if rows.iter().any(|r| r.redelivered) {
        "SELECT pg_advisory_xact_lock($1)"
    } else {
        "SELECT pg_advisory_xact_lock_shared($1)"
    };
    sqlx::query(lock)
        .bind(CAPTURE_LOCK)
        .execute(&mut *tx)
        .await
        .map_err(db_error)?;
    Ok(tx)
}

/// One INSERT of the whole batch, each column bound as one array. A redelivered row is
/// skipped when its capture key already has a row. Returns the inserted IDs.
async fn insert_captured(
    conn: &mut sqlx::PgConnection,
    rows: &[CapturedLetter],
) -> std::result::Result<std::collections::HashSet<String>, sqlx::Error> {
    // Every column bound as one array of borrowed values: no copy of the bodies.
    let text =
        |f: for<'a> fn(&'a CapturedLetter) -> &'a str| rows.iter().map(f).collect::<Vec<_>>();
    let opt = |f: for<'a> fn(&'a CapturedLetter) -> &'a Option<String>| {
        rows.iter()
            .map(|r| f(r).as_deref())
            .collect::<Vec<Option<&str>>>()
    };
    let attempts: Vec<i32> = rows
        .iter()
        .map(|r| i32::try_from(r.row.attempts).unwrap_or(i32::MAX))
        .collect();
    let ids: Vec<String> = sqlx::query_scalar(
        "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, event_id, error, \
             producer, schema_version, source_queue, exchange, routing_key, dead_lettered_at, \
             capture_key) \
         SELECT u.id, u.body, u.reason, u.attempts, u.headers_json, u.event_id, u.error, \
             u.producer, u.schema_version, u.source_queue, u.exchange, u.routing_key, \
             COALESCE(u.at, now()), u.capture_key \
         FROM UNNEST($1::text[], $2::bytea[], $3::text[], $4::int4[], $5::text[], $6::text[], \
             $7::text[], $8::text[], $9::text[], $10::text[], $11::text[], $12::text[], \
             $13::timestamptz[], $14::text[], $15::bool[]) \
           AS u(id, body, reason, attempts, headers_json, event_id, error, producer, \
             schema_version, source_queue, exchange, routing_key, at, capture_key, redelivered) \
         WHERE NOT (u.redelivered AND EXISTS \
             (SELECT 1 FROM dead_letters d WHERE d.capture_key = u.capture_key)) \
         RETURNING id",
    )
    .bind(text(|r| &r.row.id))
    .bind(
        rows.iter()
            .map(|r| r.row.body.as_slice())
            .collect::<Vec<&[u8]>>(),
    )
    .bind(text(|r| &r.row.reason))
    .bind(attempts)
    .bind(text(|r| &r.row.headers_json))
    .bind(opt(|r| &r.row.event_id))
    .bind(opt(|r| &r.row.error))
    .bind(opt(|r| &r.row.producer))
    .bind(opt(|r| &r.row.schema_version))
    .bind(opt(|r| &r.row.source_queue))
    .bind(opt(|r| &r.row.exchange))
    .bind(opt(|r| &r.row.routing_key))
    .bind(
        rows.iter()
            .map(|r| r.row.dead_lettered_at)
            .collect::<Vec<_>>(),
    )
    .bind(text(|r| &r.capture_key))
    .bind(rows.iter().map(|r| r.redelivered).collect::<Vec<bool>>())
    .fetch_all(&mut *conn)
    .await?;
    Ok(ids.into_iter().collect())
}
