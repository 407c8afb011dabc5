//! `dlq import` into SQLite: staged outside the write lock, then moved in one short
//! transaction.
//!
//! SQLite has one writer at a time: a worker's INSERT waits for dlq's write lock, up to
//! its busy timeout (5 s in Python's `sqlite3`), then fails and loses a dead letter. The
//! import was one write transaction that held the lock while it bound and inserted row
//! after row, with a round trip and a trigger each (a worker waited 2.1 s during a 20k x
//! 8 KB import). Now:
//!
//! 1. **Stage.** Every row and its history go into TEMP tables of dlq's own connection.
//!    The temp database is a separate file: writing it takes no lock on the database the
//!    workers write, however long it takes. A row the table's constraints refuse is
//!    reported here by its line, before any lock.
//! 2. **Move.** One IMMEDIATE transaction checks the IDs against the table (an existing
//!    one refuses the import, or is skipped with `--skip-existing`), copies every staged
//!    row with one `INSERT ... SELECT` and their history with another, and commits. The
//!    lock is held only for that copy, which runs inside SQLite (docs/performance.md has
//!    the worst worker insert measured during a 50,000-row import).
//!
//! All or nothing still holds: the rows reach the table in that one transaction. A
//! failure or a crash while staging leaves nothing (temp tables go with their
//! connection); a crash during the move is rolled back by SQLite when the file is next
//! opened. Readers see the table before or after the move, never a part of it. The move
//! is deliberately not cut into several commits: a reader, or a replay, would then see
//! and act on rows of an import that may still fail.

use super::sqlite::hint;
use super::sqlite_time::{to_us, NOW_US};
use super::{ImportReport, NewDeadLetter};
use crate::error::{DlqError, Result};
use sqlx::sqlite::SqliteConnection;
use sqlx::{Connection, Row};
use std::time::Instant;

const COLUMNS: &str = "id, body, reason, attempts, headers_json, replayed_at, \
     replay_claim_owner, replay_claim_expires_at, last_replay_error, event_id, error, producer, \
     schema_version, source_queue, exchange, routing_key, dead_lettered_at, replay_attempt_at, \
     discarded_at, discard_note, eff_producer, eff_schema_version, eff_event_id";

const HISTORY_COLUMNS: &str =
    "dead_letter_id, at, operator, action, outcome, detail, target, plan_id, token_ref";

/// The staging tables, with the constraints of `dead_letters` that a row can fail.
const STAGE: [&str; 4] = [
    "DROP TABLE IF EXISTS temp.dlq_import_rows",
    "DROP TABLE IF EXISTS temp.dlq_import_history",
    "CREATE TEMP TABLE dlq_import_rows (line INTEGER NOT NULL, \
         id TEXT PRIMARY KEY NOT NULL CHECK (length(id) > 0), body BLOB NOT NULL, \
         reason TEXT NOT NULL, attempts INTEGER NOT NULL, headers_json TEXT NOT NULL, \
         replayed_at INTEGER, replay_claim_owner TEXT, replay_claim_expires_at INTEGER, \
         last_replay_error TEXT, event_id TEXT, error TEXT, producer TEXT, \
         schema_version TEXT, source_queue TEXT, exchange TEXT, routing_key TEXT, \
         dead_lettered_at INTEGER NOT NULL, replay_attempt_at INTEGER, discarded_at INTEGER, \
         discard_note TEXT, eff_producer TEXT, eff_schema_version TEXT, eff_event_id TEXT)",
    "CREATE TEMP TABLE dlq_import_history (seq INTEGER PRIMARY KEY, \
         dead_letter_id TEXT NOT NULL, at INTEGER NOT NULL, operator TEXT NOT NULL, \
         action TEXT NOT NULL, outcome TEXT NOT NULL, detail TEXT, target TEXT, \
         plan_id TEXT, token_ref TEXT)",
];

/// Whether an ID already in the table refuses the import or is skipped.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Existing {
    Refuse,
    Skip,
}

/// Stages `rows` and moves them into `dead_letters` (see the module docs). `err` words a
/// driver error as the store does.
pub(crate) async fn import(
    conn: &mut SqliteConnection,
    rows: Vec<NewDeadLetter>,
    existing: Existing,
    err: &(dyn Fn(sqlx::Error) -> DlqError + Sync),
) -> Result<ImportReport> {
    for sql in STAGE {
        sqlx::query(sql).execute(&mut *conn).await.map_err(err)?;
    }
    let result = async {
        let skipped = stage(conn, rows, existing, err).await?;
        let mut report = move_staged(conn, existing, err).await?;
        report.skipped_existing += skipped;
        Ok(report)
    }
    .await;
    for sql in &STAGE[..2] {
        let _ = sqlx::query(sql).execute(&mut *conn).await;
    }
    result
}

/// Writes the rows and their history into the temp tables, in one transaction that
/// locks only the temp database. Returns how many lines repeated an earlier line's ID
/// and were skipped.
async fn stage(
    conn: &mut SqliteConnection,
    rows: Vec<NewDeadLetter>,
    existing: Existing,
    err: &(dyn Fn(sqlx::Error) -> DlqError + Sync),
) -> Result<u64> {
    let sql = format!(
        "INSERT {} INTO temp.dlq_import_rows (line, {COLUMNS}) \
         VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17, \
         COALESCE(?18, {NOW_US}),?19,?20,?21,?22,?23,?24)",
        if existing == Existing::Skip {
            "OR IGNORE"
        } else {
            ""
        }
    );
    let mut tx = conn.begin().await.map_err(err)?;
    let mut skipped = 0;
    for mut r in rows {
        let [eff_producer, eff_schema_version, eff_event_id] = hint(&r);
        let res = sqlx::query(sql.as_str())
            .bind(r.line as i64)
            .bind(&r.id)
            // Moved, not copied: a body may be tens of MiB.
            .bind(std::mem::take(&mut r.body))
            .bind(&r.reason)
            .bind(r.attempts)
            .bind(&r.headers_json)
            .bind(r.replayed_at.map(to_us))
            .bind(&r.replay_claim_owner)
            .bind(r.replay_claim_expires_at.map(to_us))
            .bind(&r.last_replay_error)
            .bind(&r.event_id)
            .bind(&r.error)
            .bind(&r.producer)
            .bind(&r.schema_version)
            .bind(&r.source_queue)
            .bind(&r.exchange)
            .bind(&r.routing_key)
            .bind(r.dead_lettered_at.map(to_us))
            .bind(r.replay_attempt_at.map(to_us))
            .bind(r.discarded_at.map(to_us))
            .bind(&r.discard_note)
            .bind(eff_producer)
            .bind(eff_schema_version)
            .bind(eff_event_id)
            .execute(&mut *tx)
            .await;
        match res {
            Ok(done) if done.rows_affected() == 0 => skipped += 1,
            Ok(_) => stage_history(&mut tx, &r)
                .await
                .map_err(|e| line_error(&r, err(e)))?,
            Err(e) if is_unique_violation(&e) => return Err(exists(r.line, &r.id)),
            Err(e) => return Err(line_error(&r, err(e))),
        }
    }
    tx.commit().await.map_err(err)?;
    Ok(skipped)
}

async fn stage_history(
    conn: &mut SqliteConnection,
    r: &NewDeadLetter,
) -> std::result::Result<(), sqlx::Error> {
    let sql = format!(
        "INSERT INTO temp.dlq_import_history ({HISTORY_COLUMNS}) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"
    );
    for h in r.history.as_deref().unwrap_or_default() {
        sqlx::query(&sql)
            .bind(&r.id)
            .bind(to_us(h.at))
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

/// The one write transaction: the staged rows and their history into the table.
async fn move_staged(
    conn: &mut SqliteConnection,
    existing: Existing,
    err: &(dyn Fn(sqlx::Error) -> DlqError + Sync),
) -> Result<ImportReport> {
    let started = Instant::now();
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.map_err(err)?;
    let mut report = ImportReport::default();
    let taken = "id IN (SELECT id FROM main.dead_letters)";
    if existing == Existing::Skip {
        let gone = sqlx::query(&format!("DELETE FROM temp.dlq_import_rows WHERE {taken}"))
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        report.skipped_existing = gone.rows_affected();
    } else if let Some(row) = sqlx::query(&format!(
        "SELECT line, id FROM temp.dlq_import_rows WHERE {taken} ORDER BY line LIMIT 1"
    ))
    .fetch_optional(&mut *tx)
    .await
    .map_err(err)?
    {
        let (line, id): (i64, String) = (row.get("line"), row.get("id"));
        return Err(exists(line as usize, &id));
    }
    let copy = format!(
        "INSERT INTO main.dead_letters ({COLUMNS}) \
         SELECT {COLUMNS} FROM temp.dlq_import_rows ORDER BY line"
    );
    let done = sqlx::query(&copy)
        .execute(&mut *tx)
        .await
        .map_err(|e| nothing(err(e)))?;
    report.imported = done.rows_affected();
    let history = format!(
        "INSERT INTO main.dead_letter_history ({HISTORY_COLUMNS}) \
         SELECT {HISTORY_COLUMNS} FROM temp.dlq_import_history \
         WHERE dead_letter_id IN (SELECT id FROM temp.dlq_import_rows) ORDER BY seq"
    );
    sqlx::query(&history)
        .execute(&mut *tx)
        .await
        .map_err(|e| nothing(err(e)))?;
    tx.commit().await.map_err(err)?;
    log::info!(
        "import: {} rows moved in {:?} under the write lock",
        report.imported,
        started.elapsed()
    );
    Ok(report)
}

fn is_unique_violation(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .is_some_and(|d| d.is_unique_violation())
}

fn exists(line: usize, id: &str) -> DlqError {
    DlqError::usage(format!(
        "line {line}: field id: a dead letter with id {id:?} already exists (nothing was \
         imported; use --skip-existing to keep the existing rows)"
    ))
}

fn line_error(r: &NewDeadLetter, e: DlqError) -> DlqError {
    DlqError::other(format!("line {}: {e} (nothing was imported)", r.line))
}

fn nothing(e: DlqError) -> DlqError {
    DlqError::other(format!("{e} (nothing was imported)"))
}
