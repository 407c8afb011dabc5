//! `dlq capture`: the messages of a RabbitMQ dead-letter queue become rows of
//! `dead_letters`, at least once and never twice.
//!
//! - A delivery is acked only after the transaction holding its row has committed: a batch
//!   is one transaction, then one `multiple` ack. A crash, a lost broker connection or a
//!   lost database anywhere before the ack leaves the messages in the queue, and the broker
//!   delivers them again flagged `redelivered`.
//! - Each row carries a capture key ([`capture_key`]). For a delivery flagged
//!   `redelivered` the store first looks for the key and inserts nothing when a row has
//!   it; a first delivery is inserted without looking, so two identical but distinct
//!   messages still make two rows. What the key covers, and the limits of that rule, are
//!   in docs/capture.md.
//! - A message that cannot be stored (over the body limit, refused by the database) is
//!   never acked in a loop nor dropped: it is published to the parking queue (confirmed)
//!   and then acked, or the capture stops with an error and the message stays queued.
//! - What is held in memory is bounded in bytes, not only in messages: the broker counts a
//!   prefetch in messages only, so the prefetch follows the largest body seen, within
//!   `--max-held-bytes` (see `intake`).

mod ack;
mod batch;
mod intake;
mod key;
mod letter;
mod park;
pub use park::Copy as ParkCopy;
mod session;

pub use batch::STORING;
pub use key::capture_key;
pub use letter::{map_reason, to_letter};

use crate::broker::connect::ConnectOptions;
use crate::broker::Publisher;
use crate::error::{DlqError, Result};
use crate::secret::SecretUrl;
use crate::spell::{InWords, Spell};
use crate::store::Store;
use crate::topology::BrokerTopology;
use serde::Serialize;
use session::{open_session, SessionEnd, Which};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// The largest body stored unless told otherwise (`--max-body-bytes`).
pub const DEFAULT_MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

/// A batch is committed once its bodies reach this many bytes, even if it is not full:
/// bounds a transaction (and a PostgreSQL statement) when messages are large. A smaller
/// `--max-held-bytes` lowers it to its share.
pub const MAX_BATCH_BYTES: usize = 32 * 1024 * 1024;

/// The bodies capture holds at once unless told otherwise (`--max-held-bytes`): the
/// prefetch is lowered so that the unacked messages stay about this size.
pub const DEFAULT_MAX_HELD_BYTES: usize = 256 * 1024 * 1024;

/// The header a parked message gets, saying why it could not be stored.
pub const PARK_ERROR_HEADER: &str = "x-dlq-capture-error";
/// The header a park carries when this run parked a message with its key before (its
/// batch's ack lost): the parking queue may hold it twice.
pub const POSSIBLE_DUPLICATE_HEADER: &str = "x-dlq-possible-duplicate";

#[derive(Debug, Clone)]
pub struct CaptureOptions {
    /// The broker: the nodes of one cluster, tried in order (one URL for now).
    pub urls: Vec<SecretUrl>,
    pub queue: String,
    /// Stored as every row's reason instead of the one mapped from `x-death`.
    pub reason: Option<String>,
    /// Stop after this many messages (stored, found already there, or parked).
    pub max: Option<u64>,
    /// Keep consuming (and reconnecting) until stopped, instead of until the queue is empty.
    pub follow: bool,
    /// Messages per transaction and ack.
    pub batch: std::num::NonZeroUsize,
    /// Where a message that cannot be stored goes; without it the capture stops there.
    pub park_queue: Option<String>,
    pub max_body_bytes: usize,
    /// About the most bytes of bodies held at once: the prefetch follows the largest body.
    pub max_held_bytes: usize,
    pub connect: ConnectOptions,
    /// Bounds a publish to the parking queue, and every other wait on the broker.
    pub confirm_timeout: Duration,
    /// What the operator says of the broker (the parking publish's nack wording).
    pub topology: BrokerTopology,
    /// How long a batch that is not full waits for more messages before it is committed.
    pub linger: Duration,
    /// Longest wait between two reconnection attempts (`--follow`).
    pub max_backoff: Duration,
    /// How the caller spells the options a parked message's reason names.
    pub spell: Arc<dyn Spell>,
}

impl CaptureOptions {
    pub fn new(urls: Vec<SecretUrl>, queue: impl Into<String>, connect: ConnectOptions) -> Self {
        CaptureOptions {
            urls,
            queue: queue.into(),
            reason: None,
            max: None,
            follow: false,
            batch: std::num::NonZeroUsize::new(500).expect("not zero"),
            park_queue: None,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_held_bytes: DEFAULT_MAX_HELD_BYTES,
            connect,
            confirm_timeout: Duration::from_secs(10),
            topology: BrokerTopology::Unknown,
            linger: Duration::from_millis(50),
            max_backoff: Duration::from_secs(15),
            spell: Arc::new(InWords),
        }
    }
}

/// Why a capture ended without an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stopped {
    /// The queue was empty (without `--follow`).
    Empty,
    /// `--max` messages were taken.
    Max,
    /// SIGINT / SIGTERM: the batch in hand was finished first.
    Interrupted,
}

/// Counts of one run, printed at its end (and shown as progress).
#[derive(Debug, Clone, Serialize)]
pub struct CaptureSummary {
    pub queue: String,
    /// Rows inserted by this run.
    pub captured: u64,
    /// Redeliveries of messages that already had a row: acked, nothing inserted.
    pub already_there: u64,
    /// Messages that could not be stored, moved to the parking queue.
    pub parked: u64,
    /// Times the broker or database connection was lost and opened again.
    pub reconnects: u64,
    pub stopped: Option<Stopped>,
    pub seconds: f64,
}

impl CaptureSummary {
    /// Nothing taken yet from `queue`.
    pub fn new(queue: &str) -> Self {
        CaptureSummary {
            queue: queue.to_string(),
            captured: 0,
            already_there: 0,
            parked: 0,
            reconnects: 0,
            stopped: None,
            seconds: 0.0,
        }
    }

    pub(crate) fn handled(&self) -> u64 {
        self.captured + self.already_there + self.parked
    }
}

/// What a run tells its caller as it goes.
pub enum Event<'a> {
    /// A batch was committed and acked; the counts so far.
    Batch(&'a CaptureSummary),
    /// A message that cannot be stored is being published to the parking queue: until
    /// its batch is acked it may be there and still in its own queue.
    Parking,
    /// A message could not be stored and was moved to the parking queue; `copy`:
    /// whether this run had parked a message with its key before (a lost ack).
    Parked { why: &'a str, copy: ParkCopy },
    /// The broker or the database went away; the next attempt is in `wait`.
    Reconnecting { why: &'a str, wait: Duration },
    /// Consuming (again) from `host`.
    Connected { host: &'a str },
}

/// Runs `dlq capture`. `stop` turns true on SIGINT / SIGTERM: the batch in hand is
/// committed and acked, then the run ends.
pub async fn capture(
    store: Arc<dyn Store>,
    opts: &CaptureOptions,
    mut stop: watch::Receiver<bool>,
    mut on_event: impl FnMut(Event<'_>),
) -> Result<CaptureSummary> {
    // Checks that `dlq migrate` has added the capture key, before taking any message.
    store.capture(&[]).await?;
    let started = Instant::now();
    let mut summary = CaptureSummary::new(&opts.queue);
    // A parking queue that does not exist is said before any message is taken.
    let mut parker: Option<Publisher> = match &opts.park_queue {
        Some(park) => Some(park::connect(opts, park).await?),
        None => None,
    };
    let mut run = Run {
        store: &store,
        opts,
        stop: &mut stop,
        summary: &mut summary,
        parker: &mut parker,
        parked: park::Parked::default(),
        backoff: Duration::from_millis(250),
        which: Which::First,
        largest: None,
    };
    let result = run.sessions(&mut on_event).await;
    if let Some(p) = parker.take() {
        p.close().await;
    }
    summary.seconds = started.elapsed().as_secs_f64();
    summary.stopped = Some(result?);
    Ok(summary)
}

/// The state one capture run carries from session to session.
pub(crate) struct Run<'a> {
    pub store: &'a Arc<dyn Store>,
    pub opts: &'a CaptureOptions,
    pub stop: &'a mut watch::Receiver<bool>,
    pub summary: &'a mut CaptureSummary,
    pub parker: &'a mut Option<Publisher>,
    /// What this run parked, so that a redelivery is not parked twice.
    parked: park::Parked,
    /// The wait before the next reconnection attempt; reset by each acked batch.
    pub backoff: Duration,
    which: Which,
    /// The largest body seen this run: the prefetch follows it, from session to session.
    pub largest: Option<usize>,
}

impl Run<'_> {
    /// Sessions one after the other until the run is done, fails, or (without
    /// `--follow`) loses its broker or database.
    async fn sessions(&mut self, on_event: &mut impl FnMut(Event<'_>)) -> Result<Stopped> {
        loop {
            if *self.stop.borrow() {
                return Ok(Stopped::Interrupted);
            }
            let end = match open_session(self.opts, self.summary, self.which, self.largest).await {
                Ok(Some(session)) => {
                    self.which = Which::Reconnect;
                    on_event(Event::Connected {
                        host: &session.host,
                    });
                    let end = batch::run_session(self, &session, on_event).await;
                    session.close(self.opts.confirm_timeout).await;
                    end
                }
                Ok(None) => Ok(SessionEnd::Done(Stopped::Empty)),
                Err(e) if self.which == Which::First => Err(e),
                Err(e) => Ok(SessionEnd::Lost(e.render(&*self.opts.spell))),
            };
            match end? {
                SessionEnd::Done(why) => return Ok(why),
                SessionEnd::Lost(why) if !self.opts.follow => {
                    return Err(DlqError::other(format!(
                        "{why}; stopped: every message not yet acked is still in {} (run again to go on)",
                        self.opts.queue
                    )))
                }
                SessionEnd::Lost(why) => {
                    self.wait_for_database(&why, on_event).await;
                    self.summary.reconnects += 1;
                }
            }
        }
    }

    /// Waits, and waits again until the database answers: no point taking messages that
    /// cannot be stored.
    async fn wait_for_database(&mut self, why: &str, on_event: &mut impl FnMut(Event<'_>)) {
        loop {
            on_event(Event::Reconnecting {
                why,
                wait: self.backoff,
            });
            tokio::select! {
                _ = tokio::time::sleep(self.backoff) => {}
                _ = self.stop.wait_for(|s| *s) => {}
            }
            self.backoff = (self.backoff * 2).min(self.opts.max_backoff);
            if *self.stop.borrow() {
                return;
            }
            match self.store.now().await {
                Ok(_) => return,
                Err(e) => tracing::debug!(error = %e, "database still unreachable"),
            }
        }
    }
}
