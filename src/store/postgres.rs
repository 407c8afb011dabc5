//! PostgreSQL: all of its SQL. Times are `timestamptz`; the clock is `now()`.

use super::protocol::{self, LeaseAfter, Resolution, WriteDialect};
use super::read::{
    claimed_row, push_where, Backend, Bind, Bucket, Dialect, Doc, Fold, NotUtf8, Rollup, Sql,
    TimeCol,
};
use super::{
    check_prune_filter, db_error, migration_error, newly_applied, CaptureOutcome, CapturedLetter,
    Claimed, ImportReport, NewDeadLetter, OnExisting, Store, StoreOptions,
};
use crate::error::{DlqError, Result};
use crate::model::{ContentMatch, Filter, NewHistory};
use crate::secret::SecretUrl;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use futures_util::stream::BoxStream;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions, PgRow};
use sqlx::query::Query;
use sqlx::Postgres;
use sqlx::{ConnectOptions, QueryBuilder, Row};
use std::str::FromStr;
use std::time::Duration;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("migrations/postgres");

const NOW: &str = "now()";

/// The token `dlq migrate` gave a v1 claim ends in `:v1-` and a UUID (36 characters); a
/// token of this dlq ends in `:` and a UUID, so never matches.
const V1_TOKEN: &str = "right(replay_claim_owner, 40) LIKE ':v1-%'";

/// Orders imports' live-pair checks (advisory lock "dlq_impt"). An import that inserted
/// rows takes it right before [`live_pair`] and holds it to its commit, so two imports (an
/// original, its revision) cannot both pass a check blind to the other's uncommitted rows;
/// `restore` takes it before its guard ([`WriteDialect::BEFORE_RESTORE`]). The check is a
/// new statement under READ COMMITTED ([`Dialect::BEGIN_WRITE`]; under REPEATABLE READ both
/// imports committed), so it sees the rows of the import that held the lock. Taken after
/// the inserts: never held while waiting on another import's row, so no deadlock.
const IMPORT_CHECK_LOCK: &str = "SELECT pg_advisory_xact_lock(x'646c715f696d7074'::bigint)";

pub struct PgStore {
    pool: PgPool,
}

fn ms(d: Duration) -> String {
    format!("{}ms", d.as_millis().max(1))
}

/// The URL's connection options, or a usage error naming it (without its password).
pub(crate) fn options(url: &SecretUrl) -> Result<PgConnectOptions> {
    PgConnectOptions::from_str(url.expose()).map_err(|e| {
        DlqError::usage(format!(
            "invalid PostgreSQL URL {url}: {}",
            crate::secret::scrub(&e.to_string())
        ))
    })
}

impl PgStore {
    pub async fn connect(url: &SecretUrl, opts: &StoreOptions) -> Result<Self> {
        let options = options(url)?
            .application_name("dlq")
            .options([
                ("statement_timeout", ms(opts.statement_timeout)),
                ("lock_timeout", ms(opts.lock_timeout)),
                ("TimeZone", "UTC".to_string()),
                // dlq's statements are short; the planner prices the copies check (a
                // recursive CTE) in billions; compiling it took 2.4 s of a 2.5 s restore.
                ("jit", "off".to_string()),
            ])
            // A long statement (an export, an aggregate over millions of rows) is not a
            // warning for the operator; `-v` shows it.
            .log_slow_statements(log::LevelFilter::Info, Duration::from_secs(1));
        let host = options.get_host().to_string();
        let tcp = (options.get_socket().is_none() && !host.starts_with('/'))
            .then(|| (host, options.get_port()));
        let refused = refused_probe(tcp);
        let pool = PgPoolOptions::new()
            .max_connections(opts.max_connections)
            .test_before_acquire(opts.long_running)
            .acquire_timeout(opts.connect_timeout)
            .connect_with(options);
        // sqlx retries a refused connection until the timeout (a server that restarts);
        // a port nobody listens on is said at once instead, as for the broker.
        let pool = tokio::select! {
            pool = pool => pool.map_err(db_error)?,
            Some(why) = refused => return Err(DlqError::other(why)),
        };
        Ok(PgStore { pool })
    }
}

/// Resolves to a message when the server's TCP port (`tcp`: none for a Unix socket)
/// refuses connections; never resolves otherwise (a socket, a port that answers, a host
/// that does not). It waits a little first, so that a server that answers is never probed.
async fn refused_probe(tcp: Option<(String, u16)>) -> Option<String> {
    if let Some((host, port)) = tcp {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let probe = tokio::net::TcpStream::connect((host.as_str(), port)).await;
        if probe.is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused) {
            return Some(format!(
                "database: connection refused by {host}:{port} (is PostgreSQL running there?)"
            ));
        }
    }
    std::future::pending().await
}

impl Backend for PgStore {
    type Db = Postgres;
    fn pool(&self) -> &PgPool {
        &self.pool
    }
    fn db_err(&self, e: sqlx::Error) -> DlqError {
        db_error(e)
    }
    fn rollup(&self) -> Option<&dyn Rollup> {
        Some(self)
    }
}

/// Folds the deltas and the rows not yet counted into the counts (`dlq_rollup_fold`, with
/// the migrating role's rights; it returns at once when another fold is under way, and the
/// read sums what is left), and says whether this role may read them. The counts only make
/// the answer faster: when the fold fails (a standby, a role that may not run it, a
/// timeout), the read sums what is left; a schema older than the counts, counts turned off
/// (`dlq_rollup_disable()`) or a role that may not read them has the rows read instead.
#[async_trait]
impl Rollup for PgStore {
    async fn fold(&self) -> Result<Fold> {
        // Kept (turned on by `dlq_rollup_enable()`, and its four triggers firing for
        // every writer) and readable.
        const READABLE: &str = "has_table_privilege('dead_letter_rollup', 'SELECT') \
             AND has_table_privilege('dead_letter_rollup_unfolded', 'SELECT') \
             AND has_table_privilege('dead_letter_rollup_swept', 'SELECT') \
             AND dlq_rollup_is_kept()";
        let folded = sqlx::query_scalar::<_, bool>(&format!(
            "SELECT {READABLE} FROM (SELECT dlq_rollup_fold()) AS folded"
        ))
        .fetch_one(&self.pool)
        .await;
        let e = match folded {
            Ok(readable) => return Ok(Fold::readable(readable)),
            Err(e) => e,
        };
        let Some(code) = e.as_database_error().and_then(|d| d.code()) else {
            return Err(db_error(e));
        };
        if matches!(code.as_ref(), "42883" | "42P01") {
            return Ok(Fold::Unavailable);
        }
        // 42501: a role that may not fold; 25006: a read-only database (a standby).
        if !matches!(code.as_ref(), "42501" | "25006") {
            tracing::warn!(sqlstate = %code, "could not fold the kept counts; reading them unfolded");
        }
        let readable = sqlx::query_scalar::<_, bool>(&format!("SELECT {READABLE}"))
            .fetch_one(&self.pool)
            .await
            .map_err(db_error)?;
        Ok(Fold::readable(readable))
    }
}

/// The content filters parse JSON only where the columns derived at write time say it
/// parses (PostgreSQL 15 has no `IS JSON`, and a failing cast would need an exception
/// block per row): `dlq_json_match` does the rest.
impl Dialect for Postgres {
    const NOW: &'static str = NOW;
    const ID_ORDER: &'static str = "id COLLATE \"C\"";
    const HISTORY_JSON: &'static str = "(SELECT json_agg(json_build_object(\
         'at', floor(extract(epoch FROM h.at) * 1000000)::bigint, 'operator', h.operator, \
         'action', h.action, 'outcome', h.outcome, 'detail', h.detail, 'token', h.token, \
         'token_ref', h.token_ref, 'target', h.target, 'plan_id', h.plan_id) ORDER BY h.seq)::text \
         FROM dead_letter_history h WHERE h.dead_letter_id = dead_letters.id)";
    const UNBOUNDED: Option<&'static str> = Some("SET LOCAL statement_timeout = 0");
    const SNAPSHOT: Option<&'static str> =
        Some("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY");
    const BODY_LEN: Option<&'static str> = Some("octet_length(body)");
    const HISTORY_AT: &'static str = "at";
    // timestamptz holds only times.
    const UNREADABLE: &'static str = "NULL::text";
    const ID_STORAGE: &'static str = "CAST(0 AS BIGINT)";
    const BEGIN_WRITE: &'static str = "BEGIN ISOLATION LEVEL READ COMMITTED";
    const WRITABLE_ID: &'static str = "true";
    // The column's collation, or the database's default: C, POSIX and libc's C.UTF-8
    // sort by code point (ICU never does). `datlocprovider` is PostgreSQL 15's.
    const CODE_POINT_IDS: Option<&'static str> = Some(
        "SELECT CAST(CAST(coalesce((SELECT CASE WHEN c.collname = 'default' \
           THEN coalesce(to_jsonb(d) ->> 'datlocprovider', 'c') = 'c' \
             AND d.datcollate IN ('C', 'POSIX', 'C.UTF-8', 'C.utf8') \
           ELSE c.collprovider = 'c' AND c.collcollate IN ('C', 'POSIX', 'C.UTF-8', 'C.utf8') END \
         FROM pg_attribute a JOIN pg_collation c ON c.oid = a.attcollation \
         JOIN pg_database d ON d.datname = current_database() \
         WHERE a.attrelid = to_regclass('dead_letters') AND a.attname = 'id'), false) \
         AS INT) AS BIGINT) AS n",
    );

    fn at(col: TimeCol) -> &'static str {
        col.name()
    }

    fn bind(qb: &mut QueryBuilder<'static, Self>, value: Bind) {
        match value {
            Bind::Text(v) => qb.push_bind(v),
            Bind::OptText(v) => qb.push_bind(v),
            Bind::Int(v) => qb.push_bind(v),
            Bind::Bytes(v) => qb.push_bind(v),
            Bind::Time(v) => qb.push_bind(v),
            Bind::OptTime(v) => qb.push_bind(v),
            Bind::Texts(v) => qb.push_bind(v),
        };
    }

    fn push_ids(qb: &mut QueryBuilder<'static, Self>, ids: &[String]) {
        qb.push("id = ANY(");
        qb.push_bind(ids.to_vec());
        qb.push(")");
    }

    fn push_exact_ids(qb: &mut QueryBuilder<'static, Self>, ids: &[String]) {
        Self::push_ids(qb, ids);
    }

    // Ids are TEXT.
    fn id_named(col: &str, id: &str) -> String {
        format!("{col} = {id}")
    }

    fn id_text(col: &str) -> String {
        col.to_string()
    }

    fn bucket(unit: Bucket) -> String {
        format!("date_trunc('{}', dead_lettered_at)", unit.unit())
    }

    fn push_contains(sql: &mut Sql, doc: Doc, needle: Bind) {
        match doc {
            Doc::Body => sql.push("position("),
            Doc::Headers => sql.push("strpos(headers_json, "),
            Doc::Error => sql.push("strpos(error, "),
        };
        sql.bind(needle);
        sql.push(if doc == Doc::Body {
            "::bytea IN body) > 0"
        } else {
            ") > 0"
        });
    }

    fn backslash_in(doc: Doc) -> &'static str {
        match doc {
            Doc::Body => "position('\\x5c'::bytea IN body) > 0",
            _ => "strpos(headers_json, '\\') > 0",
        }
    }

    fn json_guard(doc: Doc) -> (&'static str, &'static str) {
        match doc {
            Doc::Body => ("body_is_json", ""),
            _ => ("headers_are_json", ""),
        }
    }

    fn push_json_match(sql: &mut Sql, doc: Doc, path: &[&str], m: &ContentMatch) {
        sql.push(match doc {
            Doc::Body => "dlq_json_match(convert_from(body, 'UTF8'), ",
            _ => "dlq_json_match(headers_json, ",
        });
        sql.bind(Bind::Texts(path.iter().map(|k| k.to_string()).collect()));
        sql.push(", ");
        sql.bind(Bind::Text(m.value.clone()));
        sql.push(", ");
        sql.bind(Bind::OptText(m.value_json().map(str::to_string)));
        sql.push(")");
    }

    fn text(
        row: &PgRow,
        col: &str,
        _: NotUtf8,
    ) -> std::result::Result<Option<String>, sqlx::Error> {
        row.try_get(col)
    }

    fn int(row: &PgRow, col: &str) -> std::result::Result<i64, sqlx::Error> {
        row.try_get(col)
    }

    /// sqlx panics on a time chrono cannot hold (a worker's `'infinity'`): such a time is
    /// a decoding error naming the column instead.
    fn time(row: &PgRow, col: &str) -> std::result::Result<Option<DateTime<Utc>>, sqlx::Error> {
        use sqlx::postgres::PgValueFormat;
        use sqlx::{Row as _, ValueRef as _};
        let raw = row.try_get_raw(col)?;
        if raw.is_null() {
            return Ok(None);
        }
        if !<DateTime<Utc> as sqlx::Type<Postgres>>::compatible(&raw.type_info()) {
            return row.try_get(col);
        }
        let micros = match (raw.format(), raw.as_bytes()) {
            (PgValueFormat::Binary, Ok(b)) => b.try_into().ok().map(i64::from_be_bytes),
            _ => None,
        };
        let Some(micros) = micros else {
            return row.try_get(col);
        };
        // PostgreSQL counts microseconds from 2000-01-01; infinity is i64::MAX (MIN).
        const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;
        PG_EPOCH_MICROS
            .checked_add(micros)
            .filter(|_| micros != i64::MAX && micros != i64::MIN)
            .and_then(DateTime::from_timestamp_micros)
            .map(Some)
            .ok_or_else(|| sqlx::Error::ColumnDecode {
                index: col.to_string(),
                source: "a time outside what dlq can show (infinity?)".into(),
            })
    }

    fn bytes<'r>(row: &'r PgRow, col: &str) -> std::result::Result<Option<&'r [u8]>, sqlx::Error> {
        row.try_get(col)
    }

    fn fetch<'e>(
        conn: &'e mut PgConnection,
        query: Query<'e, Self, <Self as sqlx::Database>::Arguments<'static>>,
    ) -> BoxStream<'e, std::result::Result<PgRow, sqlx::Error>> {
        query.fetch(conn)
    }
}

impl WriteDialect for Postgres {
    const LEASE_END: &'static str = "replay_claim_expires_at";
    const V1_TOKEN: &'static str = V1_TOKEN;
    const STEP_OPEN: &'static str = "WITH c AS (";
    const BEFORE_RESTORE: Option<&'static str> = Some(IMPORT_CHECK_LOCK);

    fn lease_ended_now() -> String {
        "LEAST(replay_claim_expires_at, now())".into()
    }

    fn push_now_plus(qb: &mut QueryBuilder<'static, Self>, d: Duration) {
        qb.push("now() + make_interval(secs => ");
        qb.push_bind(d.as_millis() as i64);
        qb.push("::float8 / 1000.0)");
    }
}

impl PgStore {
    /// Runs a write of [`protocol`] and the history of the rows it changed as one
    /// statement (the UPDATE is the CTE `c` that [`WriteDialect::STEP_OPEN`] opened);
    /// with `first`, after it in one transaction ([`Dialect::BEGIN_WRITE`]).
    async fn step(
        &self,
        first: Option<&str>,
        mut qb: QueryBuilder<'static, Postgres>,
        history: &[NewHistory],
    ) -> Result<Vec<PgRow>> {
        qb.push("), h AS (");
        push_history(&mut qb, history);
        qb.push(" WHERE e.dead_letter_id IN (SELECT id FROM c)) SELECT * FROM c");
        let Some(first) = first else {
            return qb.build().fetch_all(&self.pool).await.map_err(db_error);
        };
        let mut tx = self
            .pool
            .begin_with(<Postgres as Dialect>::BEGIN_WRITE)
            .await
            .map_err(db_error)?;
        sqlx::query(first)
            .execute(&mut *tx)
            .await
            .map_err(db_error)?;
        let rows = qb.build().fetch_all(&mut *tx).await.map_err(db_error)?;
        tx.commit().await.map_err(db_error)?;
        Ok(rows)
    }

    /// A step that returns the IDs it changed.
    async fn ids_step(
        &self,
        qb: QueryBuilder<'static, Postgres>,
        history: &[NewHistory],
    ) -> Result<Vec<String>> {
        self.ids_step_after(None, qb, history).await
    }

    /// [`Self::ids_step`], after `first` in the same transaction.
    async fn ids_step_after(
        &self,
        first: Option<&str>,
        qb: QueryBuilder<'static, Postgres>,
        history: &[NewHistory],
    ) -> Result<Vec<String>> {
        self.step(first, qb, history)
            .await?
            .iter()
            .map(|r| r.try_get("id"))
            .collect::<Result<_, sqlx::Error>>()
            .map_err(db_error)
    }
}

/// The INSERT of history entries bound as eight arrays, however many entries.
fn push_history(qb: &mut QueryBuilder<'static, Postgres>, entries: &[NewHistory]) {
    let col = |f: fn(&NewHistory) -> Option<String>| entries.iter().map(f).collect::<Vec<_>>();
    qb.push(
        "INSERT INTO dead_letter_history \
         (dead_letter_id, operator, action, outcome, detail, token, target, plan_id) \
         SELECT e.* FROM UNNEST(",
    );
    let columns = [
        col(|e| Some(e.dead_letter_id.clone())),
        col(|e| Some(e.operator.clone())),
        col(|e| Some(e.action.to_string())),
        col(|e| Some(e.outcome.as_str().to_string())),
        col(|e| Some(e.detail.clone())),
        col(|e| e.token.clone()),
        col(|e| e.target.clone()),
        col(|e| e.plan_id.clone()),
    ];
    for (i, c) in columns.into_iter().enumerate() {
        if i > 0 {
            qb.push(", ");
        }
        qb.push_bind(c);
        qb.push("::text[]");
    }
    qb.push(") AS e(dead_letter_id, operator, action, outcome, detail, token, target, plan_id)");
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

    async fn import(&self, rows: Vec<NewDeadLetter>, existing: OnExisting) -> Result<ImportReport> {
        import::import(self, rows, existing).await
    }

    async fn claim(
        &self,
        ids: &[String],
        token: &str,
        lease: Duration,
        history: &[NewHistory],
    ) -> Result<Vec<Claimed>> {
        let rows = self
            .step(None, protocol::claim(ids, token, lease), history)
            .await?;
        rows.iter()
            .map(claimed_row::<Postgres>)
            .collect::<std::result::Result<_, _>>()
            .map_err(db_error)
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
        let mut qb = QueryBuilder::new("");
        push_history(&mut qb, entries);
        qb.build().execute(&self.pool).await.map_err(db_error)?;
        Ok(())
    }

    async fn close(&self) {
        self.pool.close().await;
    }

    /// Two: one inserts while the other waits for its commit.
    fn capture_transactions(&self) -> usize {
        2
    }

    async fn capture(&self, rows: &[CapturedLetter]) -> Result<Vec<CaptureOutcome>> {
        capture::capture(&self.pool, rows).await
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
        let first = <Postgres as WriteDialect>::BEFORE_RESTORE;
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
}

#[path = "postgres_capture.rs"]
mod capture;
#[path = "postgres_import.rs"]
mod import;
