//! How carefully a plan run goes, beyond its rate: a canary (the first N items sent,
//! then a wait watching for them to come back as new dead letters), the start of a
//! `--ramp` (once the canary has passed), and a gate on the target queue's depth
//! (`--max-target-depth`) before each batch. The runner asks this module before it hands
//! out items; what the run waits for goes to the caller as a [`RunEvent`], for it to show.

use super::{Run, RunSummary, Unavailable};
use crate::error::{DlqError, Result};
use crate::model::Outcome;
use crate::publisher::{unless_stopped, Broker, NoConnection, Pacer};
use crate::replay::{resolve_target, ItemReport, Reason, ReplayOptions};
use crate::spell::{words, Flag, Words};
use crate::store::Store;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// `--canary N --canary-wait D`.
#[derive(Debug, Clone)]
pub struct Canary {
    /// How many items must be sent (replayed or uncertain) before the wait.
    pub items: usize,
    pub wait: Duration,
}

/// The contract's default `--canary-wait`.
pub const DEFAULT_CANARY_WAIT: Duration = Duration::from_secs(120);

/// `--max-target-depth N` on the plan's one target queue.
#[derive(Debug, Clone)]
pub struct DepthGate {
    pub queue: String,
    /// Batches wait while the queue holds more than this many ready messages.
    pub max: u64,
}

/// The careful parts of a run; the default is none of them.
#[derive(Default, Clone)]
pub struct Pacing {
    /// `--rate` or `--ramp`, shared by all the run's connections.
    pub pacer: Option<Arc<Pacer>>,
    pub canary: Option<Canary>,
    pub depth: Option<DepthGate>,
}

/// How often a wait looks again (for come-backs, at the queue's depth).
const LOOK_EVERY: Duration = Duration::from_millis(500);

impl Pacing {
    /// The largest batch now: a second's worth at the current rate, and no more than
    /// the depth allowed, so that a batch sent into a queue at its limit adds at most
    /// that much again.
    pub(super) fn batch_cap(&self) -> usize {
        let paced = self
            .pacer
            .as_ref()
            .map_or(usize::MAX, |p| (p.rate_now().ceil() as usize).max(1));
        let deep = self.depth.as_ref().map_or(usize::MAX, |d| {
            (d.max.max(1)).try_into().unwrap_or(usize::MAX)
        });
        paced.min(deep)
    }
}

/// What a run reports as it goes.
#[derive(Debug)]
pub enum RunEvent<'a> {
    /// An item settled.
    Item(&'a ItemReport, &'a RunSummary),
    /// The canary's items are out (`sent` of them replayed or uncertain): the run waits
    /// `wait`, watching for any of them to come back.
    CanaryWait { sent: usize, wait: Duration },
    /// None came back: the run goes on (and a ramp starts).
    CanaryPassed,
    /// The next batch waits: the target queue holds `ready` (more than `max`).
    DepthWait {
        queue: &'a str,
        ready: u32,
        max: u64,
    },
    /// The queue is back at or under its limit: the run goes on.
    DepthBelow { queue: &'a str, ready: u32 },
}

/// Where the canary of a run is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum CanaryPhase {
    /// No canary, or it passed: nothing held back.
    Open,
    /// Items are handed out until this many are sent.
    Sending(usize),
    /// Sent; one worker waits and watches, the others wait for it.
    Watching,
}

impl CanaryPhase {
    pub(super) fn of(pacing: &Pacing) -> Self {
        match &pacing.canary {
            Some(c) => CanaryPhase::Sending(c.items),
            None => CanaryPhase::Open,
        }
    }

    /// How many items may be handed out now, with `sent` sent and `in_flight` out.
    pub(super) fn room(&self, sent: usize, in_flight: usize) -> usize {
        match *self {
            CanaryPhase::Open => usize::MAX,
            CanaryPhase::Sending(n) => n.saturating_sub(sent + in_flight),
            CanaryPhase::Watching => 0,
        }
    }

    /// Whether the canary is out and settled: time for its wait.
    pub(super) fn due(&self, sent: usize, in_flight: usize) -> bool {
        matches!(*self, CanaryPhase::Sending(n) if sent >= n && in_flight == 0)
    }
}

/// Whether an outcome means the item went out (or may have): what the come-back watch
/// watches, whoever published it.
pub(super) fn sent(o: Outcome) -> bool {
    matches!(o, Outcome::Replayed | Outcome::Uncertain)
}

/// Whether this run's own publish of the item went out or may have: what a canary
/// counts. A row found `uncertain` already (an earlier run's attempt), attempted first by
/// another run, or whose certain failure could not be written back, was not published by
/// this run: a rerun's canary is again N items it published.
pub(super) fn sent_by_run(r: &ItemReport) -> bool {
    sent(r.outcome)
        && !matches!(
            r.reason,
            Reason::Unavailable { .. }
                | Reason::AttemptedFirst(_)
                | Reason::ReleaseNotWritten { .. }
        )
}

/// The one queue the plan's items go to, for `--max-target-depth`. Refused (usage) when
/// they go through a named exchange (whose queues dlq cannot see) or to several queues.
pub async fn depth_target(
    store: &dyn Store,
    ids: &[String],
    opts: &ReplayOptions,
) -> Result<String> {
    if let Some(x) = opts.exchange.as_deref().filter(|x| !x.is_empty()) {
        return Err(not_one_queue(
            Words::default()
                .flag(Flag::Exchange)
                .text(format!(" {x:?} is a named exchange")),
        ));
    }
    let mut exchanges = BTreeSet::new();
    let mut queues = BTreeSet::new();
    for page in ids.chunks(1000) {
        for row in store.summaries(page).await? {
            if let Some(t) = resolve_target(&row, opts) {
                match t.exchange.is_empty() {
                    true => queues.insert(t.routing_key),
                    false => exchanges.insert(t.exchange),
                };
            }
        }
    }
    if let Some(x) = exchanges.first() {
        return Err(not_one_queue(words(format!(
            "items of the plan publish to the named exchange {x:?}"
        ))));
    }
    let mut queues = queues.into_iter();
    match (queues.next(), queues.next()) {
        (Some(q), None) => Ok(q),
        (Some(a), Some(b)) => Err(not_one_queue(words(format!(
            "items of the plan go to several queues ({a:?}, {b:?}, ...); make one plan per queue"
        )))),
        (None, _) => Err(not_one_queue(words(
            "no item of the plan has a target queue",
        ))),
    }
}

fn not_one_queue(why: Words) -> DlqError {
    DlqError::usage(
        Words::default()
            .flag(Flag::MaxTargetDepth)
            .text(" reads the ready count of the one queue the replay goes to, but ")
            .and(why)
            .text(": the depth of what an exchange routes to is not one queue's"),
    )
}

/// The ready count of `queue`; `Ok(None)` when interrupted while connecting.
async fn ready_count(
    broker: &mut Broker,
    queue: &str,
    stop: &std::sync::atomic::AtomicBool,
) -> std::result::Result<Option<u32>, String> {
    match broker.connect(stop).await {
        Ok(()) => {}
        Err(NoConnection::Interrupted) => return Ok(None),
        Err(NoConnection::Failed(e)) => return Err(e.to_string()),
    }
    let publisher = broker.publisher().expect("connected");
    match publisher.queue_ready(queue).await? {
        Some(n) => Ok(Some(n)),
        None => Err(format!("the target queue {queue:?} does not exist")),
    }
}

impl<F: FnMut(RunEvent<'_>)> Run<'_, F> {
    /// The canary's wait: watches for its items to come back until the wait is over (the
    /// run goes on, a ramp starts) or one does (the run stops, see [`Run::came_back`]).
    pub(super) async fn canary_wait(&self) {
        let Some(c) = &self.opts.pacing.canary else {
            return;
        };
        let sent = self.lock().sent;
        self.event(RunEvent::CanaryWait { sent, wait: c.wait });
        let end = Instant::now() + c.wait;
        while !self.stopping() {
            let left = end.saturating_duration_since(Instant::now());
            unless_stopped(self.interrupted, tokio::time::sleep(left.min(LOOK_EVERY))).await;
            if let Err(e) = self.came_back(&[]).await {
                return self.cannot_go_on(Unavailable::Database, 0, e);
            }
            if left <= LOOK_EVERY {
                break;
            }
        }
        if !self.stopping() {
            if let Err(e) = self.swept().await {
                return self.cannot_go_on(Unavailable::Database, 0, e);
            }
        }
        if !self.stopping() {
            self.lock().canary = CanaryPhase::Open;
            if let Some(p) = &self.opts.pacing.pacer {
                p.start_ramp();
            }
            self.event(RunEvent::CanaryPassed);
        }
        // The other workers wait for the canary: to go on, or to see the run stop.
        self.settled.notify_waiters();
    }

    /// Before a batch of `taken` items: waits while the target queue holds more than its
    /// limit, watching for come-backs. False when the run stops instead (the items were
    /// not claimed: they count as not reached).
    pub(super) async fn depth_gate(&self, broker: &mut Broker, taken: usize) -> bool {
        let Some(gate) = &self.opts.pacing.depth else {
            return true;
        };
        let mut waiting = false;
        loop {
            if self.stopping() {
                self.untake(taken);
                return false;
            }
            let ready = match ready_count(broker, &gate.queue, self.interrupted).await {
                Ok(Some(n)) => n,
                Ok(None) => continue,
                Err(why) => {
                    let why = format!("could not read the depth of the target queue: {why}");
                    self.cannot_go_on(Unavailable::TargetQueue, taken, DlqError::other(why));
                    return false;
                }
            };
            if u64::from(ready) <= gate.max {
                if waiting {
                    self.event(RunEvent::DepthBelow {
                        queue: &gate.queue,
                        ready,
                    });
                }
                return true;
            }
            waiting = true;
            self.event(RunEvent::DepthWait {
                queue: &gate.queue,
                ready,
                max: gate.max,
            });
            unless_stopped(self.interrupted, tokio::time::sleep(LOOK_EVERY)).await;
            if let Err(e) = self.came_back(&[]).await {
                self.cannot_go_on(Unavailable::Database, taken, e);
                return false;
            }
        }
    }
}
