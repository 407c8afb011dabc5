//! SQLite's export, stepped in bulk on one thread of its own.
//!
//! Through sqlx, each row of an export crossed from its SQLite worker thread one channel
//! message at a time, every one of its 23 values copied and allocated on the way: most
//! of an export's time went to that hand-over, not to SQLite (docs/performance.md). Here
//! the export's one statement (the SQL the read side built, bound with the same values)
//! is stepped through rusqlite on sqlx's own connection handle, locked for the whole
//! statement so sqlx's worker waits. Stepping is the export's slowest part, so that
//! thread only copies each row's values into a batch (one buffer for their bytes); the
//! caller decodes them with the shared decoder ([`exported`]) and writes the lines while
//! the next batch is stepped. One statement is still one snapshot.

use super::read::{exported, Bind, Col, Columns, Decoded, NotUtf8, Sql};
use super::sqlite_read::{stored, Stored};
use super::sqlite_time::from_int;
use super::NewDeadLetter;
use crate::error::{DlqError, Result};
use crate::model::shown_id::escaped;
use chrono::{DateTime, Utc};
use rusqlite::types::{Type, ValueRef};
use sqlx::pool::PoolConnection;
use sqlx::Sqlite;
use std::borrow::Cow;
use std::ops::Range;
use tokio::sync::mpsc;

/// Rows handed over at once, unless their values' bytes reach [`BATCH_BYTES`] first.
const BATCH_ROWS: usize = 256;
const BATCH_BYTES: usize = 1 << 20;

type Sink<'a> = &'a mut (dyn FnMut(NewDeadLetter) -> Result<()> + Send);

/// Runs the export's statement on `conn`, each row to `sink` in order; returns how many.
/// A row that cannot be read ends the export after the rows before it, as before.
pub(crate) async fn export(
    conn: PoolConnection<Sqlite>,
    sql: Sql,
    stepping_err: impl FnOnce(rusqlite::Error) -> DlqError + Send + 'static,
    sink: Sink<'_>,
) -> Result<u64> {
    let (text, values) = sql.positional();
    // Two batches wait at most: memory stays flat whatever the table's size.
    let (tx, mut rx) = mpsc::channel::<Batch>(2);
    let stepper = tokio::task::spawn_blocking(move || {
        step(conn, &text, values, &tx).map_err(|e| e.into_dlq(stepping_err))
    });
    let mut n = 0;
    let mut written = Ok(());
    'batches: while let Some(batch) = rx.recv().await {
        for row in batch.rows() {
            // A row that cannot be read ends the export after the rows before it.
            written = exported(&row).and_then(&mut *sink);
            if written.is_err() {
                break 'batches;
            }
            n += 1;
        }
    }
    // The stepper sees the channel closed and stops.
    drop(rx);
    let stepped = stepper
        .await
        .map_err(|e| DlqError::other(format!("the export's reader stopped: {e}")))?;
    written?;
    stepped?;
    Ok(n)
}

/// Why stepping stopped early.
enum Stop {
    Driver(rusqlite::Error),
    Row(DlqError),
}

impl Stop {
    fn into_dlq(self, driver: impl FnOnce(rusqlite::Error) -> DlqError) -> DlqError {
        match self {
            Stop::Driver(e) => driver(e),
            Stop::Row(e) => e,
        }
    }
}

impl From<rusqlite::Error> for Stop {
    fn from(e: rusqlite::Error) -> Stop {
        Stop::Driver(e)
    }
}

fn step(
    mut conn: PoolConnection<Sqlite>,
    text: &str,
    values: Vec<Bind>,
    tx: &mpsc::Sender<Batch>,
) -> std::result::Result<(), Stop> {
    let mut locked = tokio::runtime::Handle::current()
        .block_on(conn.lock_handle())
        .map_err(|e| Stop::Row(super::db_error(e)))?;
    // SAFETY: the handle is sqlx's open connection, locked (sqlx's worker waits on the
    // lock) until `locked` drops, which is after `db`: declared before it. rusqlite does
    // not close a handle it did not open.
    let db = unsafe { rusqlite::Connection::from_handle(locked.as_raw_handle().as_ptr()) }?;
    let mut stmt = db.prepare(text)?;
    for (i, v) in values.into_iter().enumerate() {
        match stored(v) {
            Stored::Text(v) => stmt.raw_bind_parameter(i + 1, v)?,
            Stored::Int(v) => stmt.raw_bind_parameter(i + 1, v)?,
            Stored::Bytes(v) => stmt.raw_bind_parameter(i + 1, v)?,
        }
    }
    let at = positions(&stmt)?;
    let mut rows = stmt.raw_query();
    let mut batch = Batch::default();
    loop {
        let row = match rows.next() {
            Ok(Some(row)) => row,
            Ok(None) => break,
            Err(e) => {
                // The rows before it are written, then the export fails on it.
                let _ = tx.blocking_send(batch);
                return Err(e.into());
            }
        };
        if let Err(e) = batch.copy(row, &at, &db) {
            let _ = tx.blocking_send(batch);
            return Err(Stop::Row(super::db_error(e)));
        }
        let full = batch.len() == BATCH_ROWS || batch.bytes.len() >= BATCH_BYTES;
        if full && tx.blocking_send(std::mem::take(&mut batch)).is_err() {
            // The caller stopped reading (it said why).
            return Ok(());
        }
    }
    if batch.len() > 0 {
        let _ = tx.blocking_send(batch);
    }
    Ok(())
}

/// Each [`Col`]'s position in the statement, found once by its name.
type Positions = [usize; Col::ALL.len()];

fn positions(stmt: &rusqlite::Statement<'_>) -> std::result::Result<Positions, Stop> {
    let names = stmt.column_names();
    let mut at = [0; Col::ALL.len()];
    for col in Col::ALL {
        at[col as usize] = names.iter().position(|n| *n == col.name()).ok_or_else(|| {
            Stop::Row(super::db_error(sqlx::Error::ColumnNotFound(
                col.name().to_string(),
            )))
        })?;
    }
    Ok(at)
}

/// A stored value copied out of a stepped row; its bytes are in [`Batch::bytes`].
#[derive(Debug, Clone)]
enum Slot {
    Null,
    Int(i64),
    /// With SQLite's own text of it (a REAL read as text).
    Real(Range<usize>),
    Text(Range<usize>),
    Blob(Range<usize>),
}

impl Slot {
    fn kind(&self) -> Type {
        match self {
            Slot::Null => Type::Null,
            Slot::Int(_) => Type::Integer,
            Slot::Real(_) => Type::Real,
            Slot::Text(_) => Type::Text,
            Slot::Blob(_) => Type::Blob,
        }
    }
}

/// Rows copied as stored, each its [`Col::ALL`] values in order, handed to the caller.
#[derive(Default)]
struct Batch {
    bytes: Vec<u8>,
    slots: Vec<Slot>,
}

impl Batch {
    fn len(&self) -> usize {
        self.slots.len() / Col::ALL.len()
    }

    fn bytes_of(&mut self, b: &[u8]) -> Range<usize> {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(b);
        start..self.bytes.len()
    }

    fn copy(
        &mut self,
        row: &rusqlite::Row<'_>,
        at: &Positions,
        db: &rusqlite::Connection,
    ) -> Decoded<()> {
        for col in Col::ALL {
            let value = row
                .get_ref(at[col as usize])
                .map_err(|e| decode_error(col, e))?;
            let slot = match value {
                ValueRef::Null => Slot::Null,
                ValueRef::Integer(i) => Slot::Int(i),
                // SQLite's own text of a REAL, not Rust's.
                ValueRef::Real(r) => {
                    let text = db
                        .query_row("SELECT CAST(?1 AS TEXT)", [r], |t| t.get::<_, String>(0))
                        .map_err(|e| decode_error(col, e))?;
                    Slot::Real(self.bytes_of(text.as_bytes()))
                }
                ValueRef::Text(b) => Slot::Text(self.bytes_of(b)),
                ValueRef::Blob(b) => Slot::Blob(self.bytes_of(b)),
            };
            self.slots.push(slot);
        }
        Ok(())
    }

    fn rows(&self) -> impl Iterator<Item = Copied<'_>> {
        self.slots.chunks_exact(Col::ALL.len()).map(|slots| Copied {
            slots,
            bytes: &self.bytes,
        })
    }
}

fn decode_error(col: Col, why: impl std::fmt::Display) -> sqlx::Error {
    sqlx::Error::ColumnDecode {
        index: col.name().to_string(),
        source: why.to_string().into(),
    }
}

/// A copied row, read as sqlx reads SQLite's values (see
/// [`crate::store::read::Dialect`] for SQLite): text as its bytes, escaped where not UTF-8.
struct Copied<'a> {
    slots: &'a [Slot],
    bytes: &'a [u8],
}

impl Copied<'_> {
    fn value(&self, col: Col) -> &Slot {
        &self.slots[col as usize]
    }

    /// The value's bytes as SQLite gives a number read as text or a BLOB.
    fn as_bytes(&self, col: Col) -> Option<Cow<'_, [u8]>> {
        match self.value(col) {
            Slot::Null => None,
            Slot::Real(r) | Slot::Text(r) | Slot::Blob(r) => {
                Some(Cow::Borrowed(&self.bytes[r.clone()]))
            }
            Slot::Int(i) => Some(Cow::Owned(i.to_string().into_bytes())),
        }
    }
}

impl Columns for Copied<'_> {
    fn text(&self, col: Col, bytes: NotUtf8) -> Decoded<Option<String>> {
        let Some(b) = self.as_bytes(col) else {
            return Ok(None);
        };
        match bytes {
            NotUtf8::Escape => Ok(Some(escaped(&b))),
            NotUtf8::Refuse => String::from_utf8(b.into_owned())
                .map(Some)
                .map_err(|e| decode_error(col, e)),
        }
    }

    fn int(&self, col: Col) -> Decoded<i64> {
        match self.value(col) {
            Slot::Int(i) => Ok(*i),
            other => Err(decode_error(
                col,
                format!("expected an INTEGER, found {:?}", other.kind()),
            )),
        }
    }

    fn time(&self, col: Col) -> Decoded<Option<DateTime<Utc>>> {
        // Every time is read through `Dialect::at`, so an INTEGER (or NULL).
        match self.value(col) {
            Slot::Null => Ok(None),
            Slot::Int(v) => Ok(Some(from_int(*v).unwrap_or_default())),
            other => Err(decode_error(
                col,
                format!("expected a time in µs, found {:?}", other.kind()),
            )),
        }
    }

    /// A BLOB or TEXT, as sqlx reads one: a number stored there is refused.
    fn bytes(&self, col: Col) -> Decoded<Option<Cow<'_, [u8]>>> {
        match self.value(col) {
            Slot::Null => Ok(None),
            Slot::Text(r) | Slot::Blob(r) => Ok(Some(Cow::Borrowed(&self.bytes[r.clone()]))),
            other => Err(decode_error(
                col,
                format!("expected a BLOB or TEXT, found {:?}", other.kind()),
            )),
        }
    }
}
