//! SQLite `dlq import` in short write transactions (issue 26): one transaction for the
//! whole import made every worker's INSERT wait for all of it (past Python's 5 s busy
//! timeout for a large import). The import is still all or nothing:
//!
//! - each batch (about [`BATCH_TIME`]) inserts its rows held by the import's own claim:
//!   owner [`STAGED`] and a UUID, lease end [`STAGED_UNTIL`] (TEXT, so that a Python
//!   worker's comparison reads it as live too). No replay, plan, discard or worker's
//!   replayer takes such a row; `list` shows it `claimed` by `dlq-import`. The row's own
//!   claim and times wait in `dlq_import_rows`;
//! - one small transaction marks the import released: the commit point. Then batches
//!   give every row its own values and the import is forgotten; an importer killed
//!   in between leaves that to the next dlq that opens the file (never an undo);
//! - a failed import undoes its rows, in batches; a dead one (killed, its machine lost)
//!   is undone by the next dlq that opens the file: its process is gone (same boot and
//!   PID namespace, no process of that PID and start time), or its lease, renewed by
//!   each batch on the database clock, has ended. The undo first marks the import dead
//!   in one transaction, and the last transaction requires it live, so an import is
//!   either released whole or undone whole, never both.
//!
//! Giving the rows back is batched because it rewrites each row (SQLite writes a changed
//! row anew): one transaction for it held the lock as long as the inserts (measured in
//! docs/performance.md). Until a row's batch, it shows `claimed` by `dlq-import`.

use super::*;
use crate::store::copies::{live_pair, live_pair_refused, Arriving};
use crate::store::sqlite_time::to_us;
use std::time::Instant;

/// The prefix of the claim owner an importing `dlq` holds its rows by.
pub use crate::store::IMPORT_OWNER as STAGED;
/// The lease end of a staged row: never reached, read as live by every reader (an
/// INTEGER would be read as lapsed by a worker comparing with a text time).
use crate::store::IMPORT_UNTIL as STAGED_UNTIL;
/// How long one batch holds the write lock, about.
const BATCH_TIME: Duration = Duration::from_millis(250);
/// Bytes of values per batch at most ([`NewDeadLetter::bytes`]), whatever the time.
const BATCH_BYTES: usize = 32 * 1024 * 1024;
/// The lock left free between batches: SQLite's busy handler polls (at most 100 ms
/// apart), it does not queue, so a waiting writer must find the lock free when it looks.
const PAUSE: Duration = Duration::from_millis(100);
/// An import whose lease has ended for this long is taken for dead.
const LEASE: Duration = Duration::from_secs(60);
/// Rows undone per transaction.
const UNDO_BATCH: i64 = 500;

/// Rows per INSERT into `dlq_import_rows` (7 values each, far below SQLite's 32,766).
const KEPT_PER_STATEMENT: usize = 1000;

/// A staged row's own claim and times, given back after the release.
struct Kept {
    /// Of the import file, for an error.
    line: usize,
    id: String,
    replay_claim_owner: Option<String>,
    replay_claim_expires_at: Option<i64>,
    replayed_at: Option<i64>,
    replay_attempt_at: Option<i64>,
    discarded_at: Option<i64>,
    /// What the line carried, written with the batch.
    history: Vec<crate::model::HistoryEntry>,
}

/// What an import did, for `-v`.
#[derive(Default)]
struct Staged {
    report: ImportReport,
    batches: usize,
    longest: Duration,
}

impl SqliteStore {
    pub(super) async fn import_in_batches(
        &self,
        rows: Vec<NewDeadLetter>,
        existing: OnExisting,
    ) -> Result<ImportReport> {
        // A dead import's rows were undone when the store was opened (`connect`).
        let token = format!("{STAGED}{}", uuid::Uuid::new_v4());
        let me = Process::this();
        sqlx::query(&format!(
            "INSERT INTO dlq_imports (token, state, pid, host, started, lease_end) \
             VALUES (?1, 'live', ?2, ?3, ?4, {NOW_US} + ?5)"
        ))
        .bind(&token)
        .bind(me.pid)
        .bind(&me.host)
        .bind(&me.started)
        .bind(LEASE.as_micros() as i64)
        .execute(&self.pool)
        .await
        .map_err(self.err())?;
        let done = match self.stage(&token, rows, existing).await {
            Ok(staged) => self.release_import(&token, staged).await,
            Err(e) => Err(e),
        };
        if done.is_err() {
            if let Err(e) = self.undo_import(&token, Holder::Gone).await {
                // Still held by the import's claim; the next dlq undoes them.
                tracing::warn!(error = %e, "the import's rows are undone by the next dlq");
            }
        }
        done
    }

    async fn stage(
        &self,
        token: &str,
        rows: Vec<NewDeadLetter>,
        existing: OnExisting,
    ) -> Result<Staged> {
        let mut staged = Staged::default();
        let mut rows = rows.into_iter().peekable();
        while rows.peek().is_some() {
            let mut tx = self.begin_write().await?;
            let started = Instant::now();
            let renewed = sqlx::query(&format!(
                "UPDATE dlq_imports SET lease_end = {NOW_US} + ?2 \
                 WHERE token = ?1 AND state = 'live'"
            ))
            .bind(token)
            .bind(LEASE.as_micros() as i64)
            .execute(&mut *tx)
            .await
            .map_err(self.err())?;
            if renewed.rows_affected() != 1 {
                return Err(taken_for_dead());
            }
            let (mut bytes, mut kept) = (0, Vec::new());
            while started.elapsed() < BATCH_TIME && bytes < BATCH_BYTES {
                let Some(r) = rows.next() else { break };
                bytes += r.bytes();
                match self.stage_row(&mut tx, token, r, existing).await? {
                    Some(k) => kept.push(k),
                    None => staged.report.skipped_existing += 1,
                }
            }
            self.keep_aside(&mut tx, token, &kept).await?;
            staged.report.imported += kept.len() as u64;
            tx.commit().await.map_err(self.err())?;
            staged.batches += 1;
            staged.longest = staged.longest.max(started.elapsed());
            if rows.peek().is_some() {
                tokio::time::sleep(PAUSE).await;
            }
        }
        Ok(staged)
    }

    /// Inserts one row held by the import; returns its own claim and times and its
    /// history, to be written with the batch ([`Self::keep_aside`]), or `None` when it
    /// was skipped as existing.
    async fn stage_row(
        &self,
        tx: &mut SqliteConnection,
        token: &str,
        mut r: NewDeadLetter,
        existing: OnExisting,
    ) -> Result<Option<Kept>> {
        let res = insert_staged(tx, token, &mut r, existing).await;
        match res {
            Ok(0) if existing == OnExisting::Skip => {
                // Kept only if it stays: a row another import has not released may be undone.
                if held_by_unfinished_import(tx, token, &r.id)
                    .await
                    .map_err(|e| self.line_error(r.line, e))?
                {
                    return Err(DlqError::other(format!(
                        "line {}: field id: a dead letter with id {:?} is held by another dlq import that has not finished, and may be undone (nothing was imported; run this import again once that one has ended)",
                        r.line, r.id
                    )));
                }
                return Ok(None);
            }
            // Only a BLOB id of the same bytes stops a plain INSERT without an error.
            Ok(0) => {
                return Err(crate::store::already_exists(
                    r.line,
                    &r.id,
                    ", its id stored as bytes by a worker",
                ));
            }
            Ok(_) => {}
            Err(e)
                if e.as_database_error()
                    .is_some_and(|d| d.is_unique_violation()) =>
            {
                return Err(crate::store::already_exists(r.line, &r.id, ""));
            }
            Err(e) => return Err(self.line_error(r.line, e)),
        }
        Ok(Some(Kept {
            line: r.line,
            id: r.id,
            replay_claim_owner: r.replay_claim_owner,
            replay_claim_expires_at: r.replay_claim_expires_at.map(to_us),
            replayed_at: r.replayed_at.map(to_us),
            replay_attempt_at: r.replay_attempt_at.map(to_us),
            discarded_at: r.discarded_at.map(to_us),
            history: r.history.unwrap_or_default(),
        }))
    }

    /// The batch's rows' own claim and times, in `dlq_import_rows`, and their history: a
    /// statement per [`KEPT_PER_STATEMENT`] rows, not one per row (each statement costs a
    /// trip to sqlx's SQLite thread).
    async fn keep_aside(
        &self,
        tx: &mut SqliteConnection,
        token: &str,
        kept: &[Kept],
    ) -> Result<()> {
        for rows in kept.chunks(KEPT_PER_STATEMENT) {
            let mut qb = sqlx::QueryBuilder::<Sqlite>::new(
                "INSERT INTO dlq_import_rows (token, id, replay_claim_owner, \
                 replay_claim_expires_at, replayed_at, replay_attempt_at, discarded_at) ",
            );
            qb.push_values(rows, |mut b, k| {
                b.push_bind(token)
                    .push_bind(&k.id)
                    .push_bind(&k.replay_claim_owner)
                    .push_bind(k.replay_claim_expires_at)
                    .push_bind(k.replayed_at)
                    .push_bind(k.replay_attempt_at)
                    .push_bind(k.discarded_at);
            });
            qb.build()
                .execute(&mut *tx)
                .await
                .map_err(|e| self.line_error(rows[0].line, e))?;
            let history: Vec<_> = rows
                .iter()
                .flat_map(|k| k.history.iter().map(|h| (k.id.as_str(), h)))
                .collect();
            import_history::<Sqlite>(&mut *tx, &history)
                .await
                .map_err(|e| self.line_error(rows[0].line, e))?;
        }
        Ok(())
    }

    fn line_error(&self, line: usize, e: sqlx::Error) -> DlqError {
        DlqError::other(format!(
            "line {line}: {} (nothing was imported)",
            self.err()(e)
        ))
    }

    /// The commit point: one small transaction marks the import released, if it is
    /// still live (not taken for dead). Its rows then get their own claim and times in
    /// batches ([`Self::roll_forward`]); a dead importer's are finished by the next dlq.
    /// (One transaction giving every row back rewrote each row: 3.7 s for 50,000 rows.)
    async fn release_import(&self, token: &str, staged: Staged) -> Result<ImportReport> {
        let started = Instant::now();
        let mut tx = self.begin_write().await?;
        if let Some(pair) = live_pair::<Sqlite>(&mut tx, Arriving::Staged(token))
            .await
            .map_err(self.err())?
        {
            return Err(live_pair_refused(pair));
        }
        let live = sqlx::query(
            "UPDATE dlq_imports SET state = 'released' WHERE token = ?1 AND state = 'live'",
        )
        .bind(token)
        .execute(&mut *tx)
        .await
        .map_err(self.err())?;
        if live.rows_affected() != 1 {
            return Err(taken_for_dead());
        }
        tx.commit().await.map_err(self.err())?;
        let committed = started.elapsed();
        if let Err(e) = self.roll_forward(token).await {
            // Released: the next dlq that opens the file finishes it.
            tracing::warn!(error = %e, "the import's last rows are released by the next dlq");
        }
        tracing::info!(
            rows = staged.report.imported,
            batches = staged.batches,
            "import: write lock held at most {:?} per batch, released in {:?} ({:?} in all)",
            staged.longest,
            committed,
            started.elapsed()
        );
        Ok(staged.report)
    }

    /// The next batch of the import's staged IDs (as [`exact_ids_json`]); with none left,
    /// the import is forgotten (in `tx`) and `None` is returned.
    async fn next_staged(&self, tx: &mut SqliteConnection, token: &str) -> Result<Option<String>> {
        let ids: Vec<String> =
            sqlx::query_scalar("SELECT id FROM dlq_import_rows WHERE token = ?1 LIMIT ?2")
                .bind(token)
                .bind(UNDO_BATCH)
                .fetch_all(&mut *tx)
                .await
                .map_err(self.err())?;
        if !ids.is_empty() {
            return Ok(Some(exact_ids_json(&ids)));
        }
        sqlx::query("DELETE FROM dlq_imports WHERE token = ?1")
            .bind(token)
            .execute(&mut *tx)
            .await
            .map_err(self.err())?;
        Ok(None)
    }

    /// Gives the rows of a released import their own claim and times, then forgets the
    /// import: [`UNDO_BATCH`] rows per statement, as many as fit in about [`BATCH_TIME`]
    /// per transaction (a transaction per 500 rows, each with its pause, made the pauses
    /// most of a large import's time: 20 s of 39 s for 100,000 rows).
    async fn roll_forward(&self, token: &str) -> Result<()> {
        loop {
            let started = Instant::now();
            let mut tx = self.begin_write().await?;
            sqlx::query(&format!(
                "UPDATE dlq_imports SET lease_end = {NOW_US} + ?2 WHERE token = ?1"
            ))
            .bind(token)
            .bind(LEASE.as_micros() as i64)
            .execute(&mut *tx)
            .await
            .map_err(self.err())?;
            while started.elapsed() < BATCH_TIME {
                let Some(ids) = self.next_staged(&mut tx, token).await? else {
                    tx.commit().await.map_err(self.err())?;
                    return Ok(());
                };
                self.give_back(&mut tx, token, &ids).await?;
            }
            tx.commit().await.map_err(self.err())?;
            tokio::time::sleep(PAUSE).await;
        }
    }

    /// The staged rows `ids` (as [`exact_ids_json`]) get their own claim and times.
    async fn give_back(&self, tx: &mut SqliteConnection, token: &str, ids: &str) -> Result<()> {
        sqlx::query(
            "UPDATE dead_letters SET replay_claim_owner = s.replay_claim_owner, \
                 replay_claim_expires_at = s.replay_claim_expires_at, \
                 replayed_at = s.replayed_at, replay_attempt_at = s.replay_attempt_at, \
                 discarded_at = s.discarded_at \
             FROM dlq_import_rows AS s \
             WHERE dead_letters.id IN (SELECT value FROM json_each(?1)) \
               AND s.token = ?2 AND s.id = dead_letters.id \
               AND dead_letters.replay_claim_owner = ?2",
        )
        .bind(ids)
        .bind(token)
        .execute(&mut *tx)
        .await
        .map_err(self.err())?;
        forget_rows(tx, token, ids).await.map_err(self.err())
    }

    /// Undoes the imports that died (see the module docs). Returns how many.
    pub(super) async fn undo_dead_imports(&self) -> Result<usize> {
        let rows = sqlx::query(&format!(
            "SELECT token, state = 'released' AS released, \
                 state = 'dead' OR lease_end < {NOW_US} AS dead, pid, host, started \
             FROM dlq_imports"
        ))
        .fetch_all(&self.pool)
        .await
        .map_err(self.err())?;
        let mut undone = 0;
        for row in rows {
            use sqlx::Row;
            let token: String = row.try_get("token").map_err(self.err())?;
            let holder = match (Process {
                pid: row.try_get("pid").map_err(self.err())?,
                host: row.try_get("host").map_err(self.err())?,
                started: row.try_get("started").map_err(self.err())?,
            }
            .is_gone())
            {
                true => Holder::Gone,
                false => Holder::MayRun,
            };
            let dead: bool = row.try_get("dead").map_err(self.err())?;
            let released: bool = row.try_get("released").map_err(self.err())?;
            if !dead && holder == Holder::MayRun {
                continue;
            }
            if released {
                self.roll_forward(&token).await?;
                undone += 1;
            } else if self.undo_import(&token, holder).await? {
                undone += 1;
            }
        }
        Ok(undone)
    }

    /// Marks the import dead (when its holder is gone, or its lease has ended) and deletes
    /// the rows it still holds, with their history, a batch per transaction. Returns
    /// whether it was dead (else nothing is changed: it was released, or is live).
    async fn undo_import(&self, token: &str, holder: Holder) -> Result<bool> {
        let marked = sqlx::query(&format!(
            "UPDATE dlq_imports SET state = 'dead' \
             WHERE token = ?1 AND state <> 'released' \
               AND (state = 'dead' OR ?2 OR lease_end < {NOW_US})"
        ))
        .bind(token)
        .bind(holder == Holder::Gone)
        .execute(&self.pool)
        .await
        .map_err(self.err())?;
        if marked.rows_affected() == 0 {
            return Ok(false);
        }
        loop {
            let mut tx = self.begin_write().await?;
            let Some(ids) = self.next_staged(&mut tx, token).await? else {
                tx.commit().await.map_err(self.err())?;
                return Ok(true);
            };
            // Only rows the import still holds: never one it released.
            let deleted: Vec<String> = sqlx::query_scalar(&format!(
                "DELETE FROM dead_letters WHERE {}?1{} AND replay_claim_owner = ?2 \
                 RETURNING id",
                EXACT_IDS[0], EXACT_IDS[1]
            ))
            .bind(&ids)
            .bind(token)
            .fetch_all(&mut *tx)
            .await
            .map_err(self.err())?;
            sqlx::query(
                "DELETE FROM dead_letter_history \
                 WHERE dead_letter_id IN (SELECT value FROM json_each(?1))",
            )
            .bind(exact_ids_json(&deleted))
            .execute(&mut *tx)
            .await
            .map_err(self.err())?;
            forget_rows(&mut tx, token, &ids)
                .await
                .map_err(self.err())?;
            tx.commit().await.map_err(self.err())?;
            tokio::time::sleep(PAUSE).await;
        }
    }
}

/// Drops the kept values of the rows `ids` (a JSON array) of the import.
async fn forget_rows(
    tx: &mut SqliteConnection,
    token: &str,
    ids: &str,
) -> std::result::Result<(), sqlx::Error> {
    sqlx::query(
        "DELETE FROM dlq_import_rows \
         WHERE token = ?1 AND id IN (SELECT value FROM json_each(?2))",
    )
    .bind(token)
    .bind(ids)
    .execute(&mut *tx)
    .await
    .map(drop)
}

/// Whether the row `id` (as text or a worker's bytes) is held by an import other than
/// `token` that has not reached its commit point (live, or being undone).
async fn held_by_unfinished_import(
    tx: &mut SqliteConnection,
    token: &str,
    id: &str,
) -> std::result::Result<bool, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM dead_letters d JOIN dlq_imports i \
             ON i.token = d.replay_claim_owner \
         WHERE (d.id = ?1 OR d.id = ?2) AND i.token <> ?3 AND i.state <> 'released')",
    )
    .bind(id)
    .bind(id_bytes(id))
    .bind(token)
    .fetch_one(&mut *tx)
    .await
}

fn taken_for_dead() -> DlqError {
    DlqError::other(format!(
        "another dlq took this import for dead (it stalled past its {} s lease) and undid it: nothing was imported; run it again",
        LEASE.as_secs()
    ))
}

/// Where a process runs, as far as another process on the same machine can tell whether
/// it is still there (Linux: `/proc`; elsewhere only the lease tells).
/// What is known of the process that ran an import.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holder {
    /// It is gone: its import is dead whatever its lease says.
    Gone,
    /// It may still run: only its lease's end makes its import dead.
    MayRun,
}

struct Process {
    pid: i64,
    /// Boot ID and PID namespace: a PID means the same process only where both match.
    host: Option<String>,
    /// Its start time in clock ticks after boot: a PID used again has another.
    started: Option<String>,
}

impl Process {
    fn this() -> Process {
        let pid = std::process::id();
        Process {
            pid: pid.into(),
            host: host_id(),
            started: started_of(pid.into()),
        }
    }

    /// Certainly gone: same boot and namespace as this process, and no process of that
    /// PID and start time.
    fn is_gone(&self) -> bool {
        self.host.is_some()
            && self.started.is_some()
            && self.host == host_id()
            && started_of(self.pid) != self.started
    }
}

fn host_id() -> Option<String> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let ns = std::fs::read_link("/proc/self/ns/pid").ok()?;
    Some(format!("{}/{}", boot.trim(), ns.display()))
}

/// Field 22 of `/proc/PID/stat` (the name in field 2 may hold spaces and parentheses).
fn started_of(pid: i64) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, after_name) = stat.rsplit_once(')')?;
    after_name.split_whitespace().nth(19).map(str::to_string)
}

/// The row's INSERT, held by the import's `token` until its commit point; the number of
/// rows inserted (0: its id is taken and [`OnExisting::Skip`], or a worker's BLOB id of the
/// same bytes stopped it).
async fn insert_staged(
    tx: &mut SqliteConnection,
    token: &str,
    r: &mut NewDeadLetter,
    existing: OnExisting,
) -> std::result::Result<u64, sqlx::Error> {
    let sql = format!(
        "INSERT {} INTO dead_letters (id, body, reason, attempts, headers_json, \
         replay_claim_owner, replay_claim_expires_at, last_replay_error, event_id, error, \
         producer, schema_version, source_queue, exchange, routing_key, dead_lettered_at, \
         discard_note, eff_producer, eff_schema_version, eff_event_id, revision_of) \
         SELECT ?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,COALESCE(?16, {NOW_US}), \
         ?17,?18,?19,?20,?22 \
         WHERE NOT EXISTS (SELECT 1 FROM dead_letters WHERE id = ?21)",
        match existing {
            OnExisting::Skip => "OR IGNORE",
            OnExisting::Refuse => "",
        }
    );
    let [eff_producer, eff_schema_version, eff_event_id] = hint(r);
    sqlx::query(sql.as_str())
        .bind(&r.id)
        // Moved, not copied: a body may be tens of MiB.
        .bind(std::mem::take(&mut r.body))
        .bind(&r.reason)
        .bind(r.attempts)
        .bind(&r.headers_json)
        .bind(token)
        .bind(STAGED_UNTIL)
        .bind(&r.last_replay_error)
        .bind(&r.event_id)
        .bind(&r.error)
        .bind(&r.producer)
        .bind(&r.schema_version)
        .bind(&r.source_queue)
        .bind(&r.exchange)
        .bind(&r.routing_key)
        .bind(r.dead_lettered_at.map(to_us))
        .bind(&r.discard_note)
        .bind(eff_producer)
        .bind(eff_schema_version)
        .bind(eff_event_id)
        // A worker's BLOB id of these bytes is this dead letter too.
        .bind(id_bytes(&r.id))
        .bind(&r.revision_of)
        .execute(&mut *tx)
        .await
        .map(|done| done.rows_affected())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_not_gone_and_a_dead_pid_is() {
        let me = Process::this();
        assert!(me.host.is_some() && me.started.is_some());
        assert!(!me.is_gone());
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        let dead = Process {
            pid: pid.into(),
            host: me.host.clone(),
            started: me.started.clone(),
        };
        assert!(dead.is_gone());
        let elsewhere = Process {
            host: Some("another boot".into()),
            ..dead
        };
        assert!(!elsewhere.is_gone());
    }
}
