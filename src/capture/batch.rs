//! The consume → commit → ack loop of one session: batches are received while earlier
//! ones are stored, each by its own task, and settled (acked) in delivery order.

use super::ack::{settle, Parking};
use super::intake::{batch_bytes, Intake};
use super::letter::to_letter;
use super::session::{queue_is_empty, Held, Session, SessionEnd};
use super::Run;
use super::{Event, Stopped};
use crate::error::{DlqError, Result};
use crate::spell::Flag;
use crate::store::{CaptureOutcome, CapturedLetter, Store};
use serde_json::Value;
use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// A batch being stored by its own task.
struct StoreTask {
    task: tokio::task::JoinHandle<Result<StoredBatch>>,
    messages: usize,
    company: Company,
    /// The capture keys of its rows.
    keys: HashSet<String>,
}

/// Whether a batch may be stored beside another of the run. One with a redelivered
/// message is stored alone: the store makes its transaction wait until every other
/// capture transaction has ended (so that a crashed capture's commit is settled before
/// it looks for the key), and it must not wait for the run's own, out of the lock
/// timeout. One that holds a message identical to one being stored (the same capture
/// key) waits for the batches in flight: were the older to fail and the younger commit,
/// both redeliveries would find the younger's row, and one message would have none.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Company {
    Shared,
    Alone,
}

impl Company {
    fn of(batch: &Prepared, storing: &Storing) -> Company {
        let twin = storing
            .0
            .iter()
            .any(|t| batch.rows.iter().any(|r| t.keys.contains(&r.capture_key)));
        match batch.redelivered() || twin || storing.alone() {
            true => Company::Alone,
            false => Company::Shared,
        }
    }
}

async fn joined(task: StoreTask) -> Result<StoredBatch> {
    task.task
        .await
        .map_err(|e| DlqError::other(format!("storing a batch failed: {e}")))?
}

/// How the receiving of one batch ended.
enum Filled {
    /// `want` messages or its share of the budget ([`batch_bytes`]).
    Full,
    /// The broker had no more to give when the wait for a full batch ran out.
    Drained,
    Interrupted,
    Lost(String),
}

/// Batches stored at once at most (as many as the store allows, see
/// [`Store::capture_transactions`]), each in its own transaction on its own connection,
/// while the next one is received: storing is most of a capture's time, and two
/// transactions keep the database busy while one of them waits for its commit.
pub const STORING: usize = 2;

/// Consumes one session: receive a batch while earlier ones are stored, settle in
/// delivery order, until `--max`, an empty queue, a signal or a lost connection.
pub(super) async fn run_session(
    run: &mut Run<'_>,
    session: &Session,
    on_event: &mut impl FnMut(Event<'_>),
) -> Result<SessionEnd> {
    let mut intake = Intake::new(session);
    // Deliveries taken while making sure the queue is empty: they start the next batch.
    let mut carried: Vec<Held> = Vec::new();
    // The batches being stored, oldest first. The oldest is settled (acked) before a
    // newer one, so acks go out in delivery order.
    let mut storing = Storing::default();
    loop {
        let remaining = run.remaining(storing.messages());
        if remaining == 0 && carried.is_empty() {
            if let Some(end) = run.settle_all(session, &mut storing, on_event).await? {
                return Ok(end);
            }
            intake.cancel(session, run.opts).await;
            return Ok(SessionEnd::Done(Stopped::Max));
        }
        let want = (run.opts.batch.get() as u64).min(remaining) as usize;
        let mut batch: Vec<Held> = std::mem::take(&mut carried);
        let filled = fill(run, &mut intake, session, &mut batch, want).await;
        if let Filled::Lost(why) = filled {
            // Nothing of the batch in hand is stored or acked, nor are those being stored
            // acked: the broker has them all. Their transactions end before reconnecting.
            storing.abandon().await;
            return Ok(SessionEnd::Lost(why));
        }
        let batch = run.prepare(batch);
        let at_once = match Company::of(&batch, &storing) {
            Company::Shared => STORING.min(run.store.capture_transactions()).max(1),
            Company::Alone => 1,
        };
        while storing.0.len() >= at_once {
            if let Some(end) = run.settle_oldest(session, &mut storing, on_event).await? {
                return Ok(end);
            }
        }
        let interrupted = matches!(filled, Filled::Interrupted);
        let drained = matches!(filled, Filled::Drained);
        let last = !batch.held.is_empty() && batch.held.len() as u64 >= remaining;
        if !batch.held.is_empty() {
            storing.0.push_back(run.spawn_store(batch));
        }
        if drained || interrupted || last {
            // Nothing more to receive meanwhile: settle them all now.
            if let Some(end) = run.settle_all(session, &mut storing, on_event).await? {
                return Ok(end);
            }
        }
        if interrupted {
            intake.cancel(session, run.opts).await;
            return Ok(SessionEnd::Done(Stopped::Interrupted));
        }
        if drained && !run.opts.follow && queue_is_empty(session, run.opts).await? {
            // Up to what `--max` still allows now that the batch is stored.
            let room = run
                .remaining(storing.messages())
                .min(run.opts.batch.get() as u64);
            if room == 0 {
                continue;
            }
            if let Err(why) = take_buffered(&mut intake, &session.host, room, &mut carried) {
                storing.abandon().await;
                return Ok(SessionEnd::Lost(why));
            }
            if carried.is_empty() {
                intake.cancel(session, run.opts).await;
                return Ok(SessionEnd::Done(Stopped::Empty));
            }
        }
    }
}

/// The batches being stored, oldest first.
#[derive(Default)]
struct Storing(VecDeque<StoreTask>);

impl Storing {
    fn messages(&self) -> u64 {
        self.0.iter().map(|t| t.messages as u64).sum()
    }

    /// A batch with a redelivered message is in flight: nothing is stored beside it.
    fn alone(&self) -> bool {
        self.0.iter().any(|t| t.company == Company::Alone)
    }

    /// Waits for every transaction to end, settling none: nothing of them is acked, and
    /// the broker delivers them again (a committed one is found already there).
    async fn abandon(&mut self) {
        while let Some(task) = self.0.pop_front() {
            let _ = joined(task).await;
        }
    }
}

/// Receives into `batch` until it holds `want` messages or its share of the budget, the
/// linger (or, for an empty batch, the idle wait) runs out, a signal, or a lost stream.
/// A body larger than any before may change the prefetch ([`Intake::follow`]).
async fn fill(
    run: &mut Run<'_>,
    intake: &mut Intake,
    session: &Session,
    batch: &mut Vec<Held>,
    want: usize,
) -> Filled {
    let opts = run.opts;
    let idle = opts.linger.max(Duration::from_millis(100));
    let mut deadline = Instant::now() + if batch.is_empty() { idle } else { opts.linger };
    let mut bytes: usize = batch.iter().map(|h| h.body.len()).sum();
    let most = batch_bytes(opts);
    while batch.len() < want && bytes < most {
        let h = tokio::select! {
            biased;
            _ = run.stop.wait_for(|s| *s) => return Filled::Interrupted,
            next = intake.next(&session.host) => match next {
                Ok(h) => h,
                Err(why) => return Filled::Lost(why),
            },
            _ = tokio::time::sleep_until(deadline) => return Filled::Drained,
        };
        if batch.is_empty() {
            deadline = Instant::now() + opts.linger;
        }
        let size = h.body.len();
        bytes += size;
        batch.push(h);
        // The first body, even an empty one, sets the prefetch; then each larger one.
        if run.largest.is_none_or(|l| size > l) {
            run.largest = Some(size);
            if let Err(why) = intake.follow(session, opts, size).await {
                return Filled::Lost(why);
            }
        }
    }
    Filled::Full
}

/// Deliveries already in the consumer's buffer once the broker said the queue is empty
/// (it sends a queue's deliveries to a channel before its answer to the declare).
fn take_buffered(
    intake: &mut Intake,
    host: &str,
    want: u64,
    carried: &mut Vec<Held>,
) -> std::result::Result<(), String> {
    while (carried.len() as u64) < want {
        match intake.try_next(host) {
            None => return Ok(()),
            Some(next) => carried.push(next?),
        }
    }
    Ok(())
}

impl Run<'_> {
    /// Messages `--max` still allows, counting those of the batches being stored.
    fn remaining(&self, in_flight: u64) -> u64 {
        self.opts
            .max
            .map(|m| m.saturating_sub(self.summary.handled() + in_flight))
            .unwrap_or(u64::MAX)
    }

    /// The rows of a batch, and the messages refused before storing.
    fn prepare(&self, held: Vec<Held>) -> Prepared {
        let limit = BodyLimit {
            bytes: self.opts.max_body_bytes,
            flag: self.opts.spell.flag(Flag::MaxBodyBytes),
        };
        prepare(held, self.opts.reason.as_deref(), &limit)
    }

    /// Stores the batch in a task of its own; one with a redelivered message is marked
    /// to be stored alone (see [`Company`]).
    fn spawn_store(&self, batch: Prepared) -> StoreTask {
        let messages = batch.held.len();
        let company = match batch.redelivered() {
            true => Company::Alone,
            false => Company::Shared,
        };
        let keys = batch.rows.iter().map(|r| r.capture_key.clone()).collect();
        let task = tokio::spawn(store_batch(self.store.clone(), batch));
        StoreTask {
            task,
            messages,
            company,
            keys,
        }
    }

    /// Settles the oldest batch being stored; `Some` when the session is lost. On an
    /// error or a lost session the others are abandoned (their transactions ended,
    /// nothing of them acked) before it returns.
    async fn settle_oldest(
        &mut self,
        session: &Session,
        storing: &mut Storing,
        on_event: &mut impl FnMut(Event<'_>),
    ) -> Result<Option<SessionEnd>> {
        let Some(task) = storing.0.pop_front() else {
            return Ok(None);
        };
        let stored = joined(task).await;
        let parking = Parking {
            publisher: self.parker,
            parked: &mut self.parked,
        };
        let settled = settle(session, self.opts, stored, self.summary, parking, on_event).await;
        match settled {
            Ok(None) => {
                self.backoff = Duration::from_millis(250);
                on_event(Event::Batch(self.summary));
                Ok(None)
            }
            Ok(Some(why)) => {
                storing.abandon().await;
                Ok(Some(SessionEnd::Lost(why)))
            }
            Err(e) => {
                storing.abandon().await;
                Err(e)
            }
        }
    }

    /// Settles every batch being stored, oldest first.
    async fn settle_all(
        &mut self,
        session: &Session,
        storing: &mut Storing,
        on_event: &mut impl FnMut(Event<'_>),
    ) -> Result<Option<SessionEnd>> {
        while !storing.0.is_empty() {
            if let Some(end) = self.settle_oldest(session, storing, on_event).await? {
                return Ok(Some(end));
            }
        }
        Ok(None)
    }
}

/// The largest body stored, and the option that sets it as the caller spells it.
pub(super) struct BodyLimit {
    bytes: usize,
    flag: String,
}

/// A batch after its transaction: what was inserted, found already there, or refused.
pub(super) struct StoredBatch {
    pub batch: Vec<Held>,
    pub captured: u64,
    pub already: u64,
    /// Index in `batch` and why it cannot be stored.
    pub refused: Vec<(usize, String)>,
}

/// A batch ready to store: its rows, and which message each is.
pub(super) struct Prepared {
    held: Vec<Held>,
    rows: Vec<CapturedLetter>,
    /// For each message of `held`, its row (`None`: refused before storing).
    row_of: Vec<Option<usize>>,
    refused: Vec<(usize, String)>,
}

impl Prepared {
    /// It holds a message the broker delivered before: it is stored alone.
    fn redelivered(&self) -> bool {
        self.held.iter().any(|h| h.redelivered)
    }
}

/// Rows for the messages within the body limit; the others are refused up front.
/// A message's body moves into its row (a batch of large bodies is held once, not
/// twice); a refused message keeps its own, for the parking queue.
pub(super) fn prepare(mut batch: Vec<Held>, reason: Option<&str>, limit: &BodyLimit) -> Prepared {
    let mut refused: Vec<(usize, String)> = Vec::new();
    let mut rows: Vec<CapturedLetter> = Vec::with_capacity(batch.len());
    let mut row_of: Vec<Option<usize>> = Vec::with_capacity(batch.len());
    for (i, h) in batch.iter_mut().enumerate() {
        if h.body.len() > limit.bytes {
            refused.push((
                i,
                format!(
                    "its body of {} bytes is over the limit of {} bytes ({})",
                    h.body.len(),
                    limit.bytes,
                    limit.flag,
                ),
            ));
            row_of.push(None);
        } else {
            let letter = to_letter(&h.body, &h.properties, h.redelivered, reason);
            // Headers nested deeper than a JSON reader takes could be stored but never
            // shown or replayed as they were.
            if serde_json::from_str::<Value>(&letter.row.headers_json).is_err() {
                refused.push((
                    i,
                    "its headers nest too deeply to be read back (more than 128 levels)".into(),
                ));
                row_of.push(None);
                continue;
            }
            row_of.push(Some(rows.len()));
            rows.push(letter);
            h.body = Vec::new();
        }
    }
    Prepared {
        held: batch,
        rows,
        row_of,
        refused,
    }
}

/// Stores the batch's rows in one transaction (run as a task of its own, while the next
/// batch is being received).
pub(super) async fn store_batch(store: Arc<dyn Store>, batch: Prepared) -> Result<StoredBatch> {
    let Prepared {
        held: mut batch,
        mut rows,
        row_of,
        mut refused,
    } = batch;
    let started = Instant::now();
    let outcomes = store.capture(&rows).await;
    tracing::debug!(
        messages = batch.len(),
        store_ms = started.elapsed().as_secs_f64() * 1000.0,
        "batch stored"
    );
    let outcomes = outcomes?;
    let mut captured = 0;
    let mut already = 0;
    for (i, slot) in row_of.iter().enumerate() {
        if let Some(r) = slot {
            match &outcomes[*r] {
                CaptureOutcome::Inserted => captured += 1,
                CaptureOutcome::AlreadyThere => already += 1,
                CaptureOutcome::Refused(why) => {
                    // Parked with its body, which moved into its row.
                    batch[i].body = std::mem::take(&mut rows[*r].row.body);
                    refused.push((i, format!("the database refused it: {why}")))
                }
            }
        }
    }
    refused.sort_by_key(|(i, _)| *i);
    Ok(StoredBatch {
        batch,
        captured,
        already,
        refused,
    })
}
