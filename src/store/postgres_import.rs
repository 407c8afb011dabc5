//! PostgreSQL's `dlq import`: one transaction, its rows inserted a chunk at a time as one
//! INSERT of arrays (their history by one more) (one round trip per row made a million-row import take minutes), each
//! chunk behind a savepoint. When the database refuses some row of a chunk, the chunk is
//! inserted again row by row, so the error names the line as before.

use super::{PgStore, IMPORT_CHECK_LOCK};
use crate::error::{DlqError, Result};
use crate::store::copies::{live_pair, live_pair_refused, Arriving};
use crate::store::read::{carried_history, import_history, Dialect, Rollup};
use crate::store::{
    already_exists, db_error, is_postgres_row_error, ImportReport, NewDeadLetter, OnExisting,
};
use sqlx::{Connection, PgConnection, Postgres};

/// At most this many rows per INSERT, and about this many bytes of values
/// ([`NewDeadLetter::bytes`]; a larger row goes alone).
const CHUNK_ROWS: usize = 1000;
const CHUNK_BYTES: usize = 8 << 20;

pub(super) async fn import(
    store: &PgStore,
    rows: Vec<NewDeadLetter>,
    existing: OnExisting,
) -> Result<ImportReport> {
    let mut tx = store
        .pool
        .begin_with(<Postgres as Dialect>::BEGIN_WRITE)
        .await
        .map_err(db_error)?;
    let mut report = ImportReport::default();
    let mut imported = Vec::new();
    for chunk in chunks(&rows) {
        let mut sp = Connection::begin(&mut *tx).await.map_err(db_error)?;
        let ids = match insert_chunk(&mut sp, chunk, existing).await {
            Ok(ids) => ids,
            Err(Refused::Row) => {
                // Again row by row, behind a fresh savepoint: the error names its line.
                sp.rollback().await.map_err(db_error)?;
                sp = Connection::begin(&mut *tx).await.map_err(db_error)?;
                insert_each(&mut sp, chunk, existing).await?
            }
            Err(Refused::Other(e)) => return Err(chunk_error(chunk, e)),
        };
        sp.commit().await.map_err(db_error)?;
        report.skipped_existing += (chunk.len() - ids.len()) as u64;
        report.imported += ids.len() as u64;
        imported.extend(ids);
    }
    if !imported.is_empty() {
        sqlx::query(IMPORT_CHECK_LOCK)
            .execute(&mut *tx)
            .await
            .map_err(db_error)?;
    }
    if let Some(pair) = live_pair::<Postgres>(&mut tx, Arriving::Imported(&imported))
        .await
        .map_err(db_error)?
    {
        return Err(live_pair_refused(pair));
    }
    tx.commit().await.map_err(db_error)?;
    // Counted now, not by the next read (about 4 s a million rows); committed whatever
    // the fold does.
    if report.imported > 0 {
        if let Err(e) = Rollup::fold(store).await {
            tracing::warn!(error = %e, "imported; the kept counts will count the rows later");
        }
    }
    Ok(report)
}

/// The rows in input order, cut at [`CHUNK_ROWS`] rows or [`CHUNK_BYTES`] of values.
fn chunks(rows: &[NewDeadLetter]) -> Vec<&[NewDeadLetter]> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, r) in rows.iter().enumerate() {
        let size = r.bytes();
        if i > start && (i - start == CHUNK_ROWS || bytes + size > CHUNK_BYTES) {
            out.push(&rows[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += size;
    }
    if start < rows.len() {
        out.push(&rows[start..]);
    }
    out
}

/// Why a chunk was not inserted as one statement.
enum Refused {
    /// The database refused some row (or some value is out of range): row by row tells
    /// which.
    Row,
    /// Anything else (a lost connection): the import stops.
    Other(sqlx::Error),
}

impl From<sqlx::Error> for Refused {
    fn from(e: sqlx::Error) -> Self {
        match is_postgres_row_error(&e) {
            true => Refused::Row,
            false => Refused::Other(e),
        }
    }
}

fn chunk_error(chunk: &[NewDeadLetter], e: sqlx::Error) -> DlqError {
    let (first, last) = (chunk[0].line, chunk[chunk.len() - 1].line);
    DlqError::other(format!(
        "lines {first} to {last}: {} (nothing was imported)",
        db_error(e)
    ))
}

/// The chunk as one INSERT (skipping existing IDs with `--skip-existing`), then the
/// history of the rows it inserted. Returns their IDs, in input order.
async fn insert_chunk(
    conn: &mut PgConnection,
    chunk: &[NewDeadLetter],
    existing: OnExisting,
) -> std::result::Result<Vec<String>, Refused> {
    let attempts = chunk
        .iter()
        .map(|r| i32::try_from(r.attempts))
        .collect::<std::result::Result<Vec<i32>, _>>()
        .map_err(|_| Refused::Row)?;
    // Two lines the database keeps as one ID (the input has no ID twice): the first is
    // inserted, and returned.
    let rows: Vec<&NewDeadLetter> = insert_rows(conn, chunk, attempts, existing)
        .await?
        .into_iter()
        .map(|n| &chunk[n as usize - 1])
        .collect();
    import_history::<Postgres>(conn, &carried_history(rows.iter().copied())).await?;
    Ok(rows.iter().map(|r| r.id.clone()).collect())
}

/// Each row of the chunk with its own statement, as the import did before chunks: the
/// first refused row's error names its line.
async fn insert_each(
    conn: &mut PgConnection,
    chunk: &[NewDeadLetter],
    existing: OnExisting,
) -> Result<Vec<String>> {
    let mut ids = Vec::new();
    for r in chunk {
        let attempts = i32::try_from(r.attempts).map_err(|_| {
            DlqError::usage(format!(
                "line {}: field attempts: {} is out of range",
                r.line, r.attempts
            ))
        })?;
        let line_error = |e: sqlx::Error| match e.as_database_error().and_then(|d| d.code()) {
            Some(code) if code == "23505" => already_exists(r.line, &r.id, ""),
            _ => DlqError::other(format!(
                "line {}: {} (nothing was imported)",
                r.line,
                db_error(e)
            )),
        };
        let one = std::slice::from_ref(r);
        let inserted = insert_rows(conn, one, vec![attempts], existing)
            .await
            .map_err(line_error)?;
        if !inserted.is_empty() {
            import_history::<Postgres>(conn, &carried_history(one))
                .await
                .map_err(line_error)?;
            ids.push(r.id.clone());
        }
    }
    Ok(ids)
}

/// One INSERT of `rows`, each column bound as one array of borrowed values (no copy of
/// the bodies), in input order. Returns the positions (from 1) of the rows inserted: the
/// IDs read back can differ from those sent (a database in another encoding keeps some
/// characters as others).
async fn insert_rows(
    conn: &mut PgConnection,
    rows: &[NewDeadLetter],
    attempts: Vec<i32>,
    existing: OnExisting,
) -> std::result::Result<Vec<i64>, sqlx::Error> {
    let text = |f: for<'a> fn(&'a NewDeadLetter) -> &'a str| rows.iter().map(f).collect::<Vec<_>>();
    let opt = |f: for<'a> fn(&'a NewDeadLetter) -> &'a Option<String>| {
        rows.iter().map(|r| f(r).as_deref()).collect::<Vec<_>>()
    };
    let time = |f: fn(&NewDeadLetter) -> Option<chrono::DateTime<chrono::Utc>>| {
        rows.iter().map(f).collect::<Vec<_>>()
    };
    let sql = format!(
        "WITH u AS (SELECT * FROM UNNEST($1::text[], $2::bytea[], $3::text[], $4::int4[], \
             $5::text[], $6::timestamptz[], $7::text[], $8::timestamptz[], $9::text[], \
             $10::text[], $11::text[], $12::text[], $13::text[], $14::text[], $15::text[], \
             $16::text[], $17::timestamptz[], $18::timestamptz[], $19::timestamptz[], \
             $20::text[], $21::text[]) WITH ORDINALITY \
           AS u(id, body, reason, attempts, headers_json, replayed_at, replay_claim_owner, \
             replay_claim_expires_at, last_replay_error, event_id, error, producer, \
             schema_version, source_queue, exchange, routing_key, at, replay_attempt_at, \
             discarded_at, discard_note, revision_of, n)), \
         ins AS (INSERT INTO dead_letters (id, body, reason, attempts, headers_json, \
             replayed_at, replay_claim_owner, replay_claim_expires_at, last_replay_error, \
             event_id, error, producer, schema_version, source_queue, exchange, routing_key, \
             dead_lettered_at, replay_attempt_at, discarded_at, discard_note, revision_of) \
           SELECT id, body, reason, attempts, headers_json, replayed_at, replay_claim_owner, \
             replay_claim_expires_at, last_replay_error, event_id, error, producer, \
             schema_version, source_queue, exchange, routing_key, COALESCE(at, now()), \
             replay_attempt_at, discarded_at, discard_note, revision_of \
           FROM u ORDER BY n{} RETURNING id) \
         SELECT min(u.n) FROM ins JOIN u ON u.id = ins.id GROUP BY ins.id ORDER BY 1",
        match existing {
            OnExisting::Skip => " ON CONFLICT (id) DO NOTHING",
            OnExisting::Refuse => "",
        }
    );
    sqlx::query_scalar(&sql)
        .bind(text(|r| &r.id))
        .bind(rows.iter().map(|r| r.body.as_slice()).collect::<Vec<_>>())
        .bind(text(|r| &r.reason))
        .bind(attempts)
        .bind(text(|r| &r.headers_json))
        .bind(time(|r| r.replayed_at))
        .bind(opt(|r| &r.replay_claim_owner))
        .bind(time(|r| r.replay_claim_expires_at))
        .bind(opt(|r| &r.last_replay_error))
        .bind(opt(|r| &r.event_id))
        .bind(opt(|r| &r.error))
        .bind(opt(|r| &r.producer))
        .bind(opt(|r| &r.schema_version))
        .bind(opt(|r| &r.source_queue))
        .bind(opt(|r| &r.exchange))
        .bind(opt(|r| &r.routing_key))
        .bind(time(|r| r.dead_lettered_at))
        .bind(time(|r| r.replay_attempt_at))
        .bind(time(|r| r.discarded_at))
        .bind(opt(|r| &r.discard_note))
        .bind(opt(|r| &r.revision_of))
        .fetch_all(&mut *conn)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::HistoryEntry;

    fn row(headers: usize, detail: usize) -> NewDeadLetter {
        NewDeadLetter {
            headers_json: "h".repeat(headers),
            history: Some(vec![HistoryEntry {
                at: chrono::Utc::now(),
                operator: "ops".into(),
                action: "note".into(),
                outcome: "noted".into(),
                detail: Some("d".repeat(detail)),
                token_ref: None,
                target: None,
                plan_id: None,
            }]),
            ..NewDeadLetter::default()
        }
    }

    /// Large headers or history count, not only bodies: a thousand rows of 1.1 MiB
    /// headers once went as one statement past PostgreSQL's 1 GB message limit.
    #[test]
    fn chunks_count_every_value_not_only_bodies() {
        for rows in [
            (0..1000).map(|_| row(1_100_000, 0)).collect::<Vec<_>>(),
            (0..1000).map(|_| row(0, 1_100_000)).collect(),
        ] {
            let chunks = chunks(&rows);
            assert_eq!(chunks.iter().map(|c| c.len()).sum::<usize>(), rows.len());
            for c in &chunks {
                let bytes: usize = c.iter().map(NewDeadLetter::bytes).sum();
                assert!(
                    c.len() == 1 || bytes <= CHUNK_BYTES,
                    "{} rows, {bytes} bytes",
                    c.len()
                );
            }
            assert!(chunks.len() >= 1000 * 1_100_000 / CHUNK_BYTES);
        }
    }
}
