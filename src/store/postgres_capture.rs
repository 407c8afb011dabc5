//! PostgreSQL's capture inserts: the batch as one INSERT of arrays, ordered with other
//! captures by an advisory lock, and the fallback of one savepoint per row when some row
//! is refused. Apart from the store's other SQL because capture alone has a lock order
//! and a second path.

use crate::error::Result;
use crate::store::read::Dialect;
use crate::store::{db_error, is_postgres_row_error, CaptureOutcome, CapturedLetter};
use sqlx::postgres::PgPool;

/// The batch in one transaction; when some row is refused, [`capture_each`].
pub(super) async fn capture(pool: &PgPool, rows: &[CapturedLetter]) -> Result<Vec<CaptureOutcome>> {
    if rows.is_empty() {
        sqlx::query("SELECT capture_key FROM dead_letters WHERE false")
            .execute(pool)
            .await
            .map_err(db_error)?;
        return Ok(Vec::new());
    }
    let mut tx = begin_capture(pool, rows).await?;
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
        Err(e) if is_postgres_row_error(&e) => {
            // Some row is refused: again, each row behind its own savepoint.
            tx.rollback().await.map_err(db_error)?;
            capture_each(pool, rows).await
        }
        Err(e) => Err(db_error(e)),
    }
}

/// Each row behind its own savepoint, so that the batch still commits once with every
/// row the database takes.
async fn capture_each(pool: &PgPool, rows: &[CapturedLetter]) -> Result<Vec<CaptureOutcome>> {
    let mut tx = begin_capture(pool, rows).await?;
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
        sqlx::query_scalar("SELECT capture_key FROM dead_letters WHERE capture_key = ANY($1)")
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
            Err(e) if is_postgres_row_error(&e) => {
                sp.rollback().await.map_err(db_error)?;
                out.push(CaptureOutcome::Refused(db_error(e).to_string()));
            }
            Err(e) => return Err(db_error(e)),
        }
    }
    tx.commit().await.map_err(db_error)?;
    Ok(out)
}

/// The advisory lock that orders capture transactions (any value; "dlq_capt").
const CAPTURE_LOCK: i64 = 0x646c_715f_6361_7074;

/// A capture transaction. Every one first takes the capture lock shared; one with a
/// redelivered row takes it exclusive instead, which waits until every other capture
/// transaction has ended: a capture whose broker connection died while its commit was in
/// flight has then committed (or not) before this one looks for the key, in a snapshot
/// taken after the lock (READ COMMITTED, said by [`Dialect::BEGIN_WRITE`] whatever the
/// database's default: under REPEATABLE READ the look used the snapshot of the lock's own
/// statement, and a redelivered message got a second row). Advisory locks
/// need no right on the table beyond the INSERT and SELECT that capture uses anyway.
async fn begin_capture<'c>(
    pool: &'c PgPool,
    rows: &[CapturedLetter],
) -> Result<sqlx::Transaction<'c, sqlx::Postgres>> {
    let mut tx = pool
        .begin_with(<sqlx::Postgres as Dialect>::BEGIN_WRITE)
        .await
        .map_err(db_error)?;
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
