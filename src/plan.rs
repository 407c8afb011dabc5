//! Group replay: a frozen, reviewed plan, replayed in batches through [`crate::replay`].
//!
//! A plan pins each item to the SHA-256 of the body a person reviewed, so the run replays
//! exactly that. Batches let claims and marks share one SQL statement and confirms be
//! pipelined; each row still goes claim → confirm → mark, so a crash at any point leaves
//! every row either replayed (confirmed) or claimed/pending, and a rerun of the same plan
//! skips what is done.

use crate::error::{DlqError, Result};
use crate::model::{validate_id, Filter, Outcome, UNKNOWN};
use crate::publisher::{unless_stopped, Broker};
use crate::replay::{replay_batch, Item, ItemReport, ReplayOptions};
use crate::spell::{words, Cmd, Flag, Spell};
use crate::store::{PlanCandidate, Store};

mod pace;
mod summary;
mod watch;
use chrono::{DateTime, Utc};
use pace::CanaryPhase;
pub use pace::{depth_target, Canary, DepthGate, Pacing, RunEvent, DEFAULT_CANARY_WAIT};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
pub use summary::{RunSummary, StopReason, Unavailable};
use watch::Watch;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PlanItem {
    pub id: String,
    pub sha256: String,
}

/// The frozen selection, as `dlq plan` prints it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Plan {
    pub plan_id: String,
    pub created_at: DateTime<Utc>,
    pub created_by: String,
    /// The database the plan was made on (`dlq_meta.database_id`): it runs only there.
    #[serde(default)]
    pub database_id: Option<String>,
    pub filters: Filter,
    pub allow_mixed: bool,
    /// Counts per reason / producer / schema version in the selection.
    pub mix: BTreeMap<String, BTreeMap<String, usize>>,
    pub count: usize,
    /// How many dead letters the filters selected; `count` of them were taken (`--limit`).
    #[serde(default)]
    pub matched: Option<usize>,
    /// SHA-256 of the plan without this field: a plan edited after `dlq plan` wrote it
    /// (its filters, items or counts) no longer matches and is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    pub items: Vec<PlanItem>,
}

impl Plan {
    /// Reads a plan file (`-`: stdin), refusing one that lists an ID twice, whose count
    /// disagrees with its items, or whose digest does not match (edited, or made by an
    /// older `dlq`). See [`Plan::load`] for the database check.
    pub fn read(path: &std::path::Path) -> Result<Plan> {
        let text = if path.as_os_str() == "-" {
            std::io::read_to_string(std::io::stdin())
                .map_err(|e| DlqError::usage(format!("cannot read the plan from stdin: {e}")))?
        } else {
            std::fs::read_to_string(path)
                .map_err(|e| DlqError::usage(format!("cannot read plan {}: {e}", path.display())))?
        };
        let plan: Plan = serde_json::from_str(&text).map_err(|e| {
            DlqError::usage(
                words(format!("{} is not a plan written by ", path.display()))
                    .cmd(Cmd::Plan)
                    .text(format!(": {e}")),
            )
        })?;
        let mut seen = std::collections::HashMap::new();
        for (n, item) in plan.items.iter().enumerate() {
            validate_id(&item.id)?;
            if let Some(first) = seen.insert(item.id.as_str(), n + 1) {
                return Err(DlqError::usage(
                    words(format!(
                        "{} lists dead letter {:?} twice (items {first} and {}); ",
                        path.display(),
                        item.id,
                        n + 1
                    ))
                    .cmd(Cmd::Plan)
                    .text(" never does: write the plan again"),
                ));
            }
        }
        if plan.count != plan.items.len() {
            return Err(DlqError::usage(format!(
                "{} says {} dead letters but lists {}: it was edited or cut; write the plan again",
                path.display(),
                plan.count,
                plan.items.len()
            )));
        }
        match &plan.digest {
            None => {
                return Err(DlqError::usage(format!(
                    "{} has no digest (made by an older dlq, or edited): write the plan again",
                    path.display()
                )))
            }
            Some(d) if *d != plan.compute_digest() => {
                return Err(DlqError::usage(
                    words(format!("{} was edited after ", path.display()))
                        .cmd(Cmd::Plan)
                        .text(" wrote it (its filters, items or counts no longer match its digest): write the plan again"),
                ))
            }
            Some(_) => {}
        }
        Ok(plan)
    }

    /// Reads a plan file and checks that it was made on the database of `store`.
    pub async fn load(path: &std::path::Path, store: &dyn Store) -> Result<Plan> {
        let plan = Plan::read(path)?;
        plan.check_database(store).await?;
        Ok(plan)
    }

    /// Refuses a plan made on another database: its IDs and hashes mean nothing here.
    pub async fn check_database(&self, store: &dyn Store) -> Result<()> {
        let here = store.database_id().await?;
        match &self.database_id {
            Some(id) if *id == here => Ok(()),
            Some(id) => Err(DlqError::usage(format!(
                "plan {} was made on another database (database_id {id}; this one is {here}): make a plan here",
                self.plan_id
            ))),
            None => Err(DlqError::usage(format!(
                "plan {} does not say which database it was made on: make a plan here",
                self.plan_id
            ))),
        }
    }

    /// Sets the digest over everything else: what `dlq plan` does last. (Tests and tools
    /// that build a plan by other means seal it the same way.)
    pub fn seal(&mut self) {
        self.digest = Some(self.compute_digest());
    }

    /// SHA-256 of the plan as JSON without its digest.
    fn compute_digest(&self) -> String {
        let mut p = self.clone();
        p.digest = None;
        crate::model::sha256_hex(&serde_json::to_vec(&p).unwrap_or_default())
    }

    pub fn ids(&self) -> Vec<String> {
        self.items.iter().map(|i| i.id.clone()).collect()
    }
}

fn mix_of(c: &[PlanCandidate]) -> BTreeMap<String, BTreeMap<String, usize>> {
    let mut mix: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    for x in c {
        for (dim, v) in [
            ("reason", Some(&x.reason)),
            ("producer", x.producer.as_ref()),
            ("schema_version", x.schema_version.as_ref()),
        ] {
            *mix.entry(dim.into())
                .or_default()
                .entry(v.cloned().unwrap_or_else(|| UNKNOWN.into()))
                .or_default() += 1;
        }
    }
    mix
}

/// Whether a plan may mix reasons, producers or schema versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mix {
    Refuse,
    Allow,
}

/// Freezes the selection; refuses a mix of reasons, producers or schema versions unless
/// [`Mix::Allow`].
pub async fn make_plan(
    store: &dyn Store,
    filter: Filter,
    limit: i64,
    mix_ok: Mix,
    operator: &str,
) -> Result<Plan> {
    let candidates = store.plan_candidates(&filter, limit).await?;
    if candidates.is_empty() {
        return Err(DlqError::usage(
            "the filters select no dead letters; nothing to plan",
        ));
    }
    let mix = mix_of(&candidates);
    let mixed: Vec<String> = mix
        .iter()
        .filter(|(_, values)| values.len() > 1)
        .map(|(dim, values)| {
            let counts: Vec<String> = values.iter().map(|(v, n)| format!("{v}={n}")).collect();
            format!("{dim}: {}", counts.join(", "))
        })
        .collect();
    if !mixed.is_empty() && mix_ok == Mix::Refuse {
        return Err(DlqError::usage(
            words(format!(
                "the selection is not homogeneous ({}); narrow the filters or pass ",
                mixed.join("; ")
            ))
            .flag(Flag::AllowMixed),
        ));
    }
    let matched = if (candidates.len() as i64) < limit {
        candidates.len()
    } else {
        store.count(&filter).await?.max(candidates.len() as i64) as usize
    };
    let mut plan = Plan {
        plan_id: uuid::Uuid::new_v4().to_string(),
        created_at: store.now().await?,
        created_by: operator.to_string(),
        filters: filter,
        allow_mixed: mix_ok == Mix::Allow,
        mix,
        count: candidates.len(),
        items: candidates
            .into_iter()
            .map(|c| PlanItem {
                id: c.id,
                sha256: c.sha256,
            })
            .collect(),
        database_id: Some(store.database_id().await?),
        matched: Some(matched),
        digest: None,
    };
    plan.seal();
    Ok(plan)
}

pub struct RunOptions {
    pub replay: ReplayOptions,
    pub batch_size: usize,
    pub max_failures: Option<usize>,
    /// Batches worked on at once, each on its own broker connection; they take turns
    /// publishing, so that one batch's SQL overlaps another's publishing.
    pub workers: usize,
    /// Rate, ramp, canary and depth gate.
    pub pacing: Pacing,
}

/// What the workers of a run share.
struct Shared<F> {
    summary: RunSummary,
    /// The next plan item to hand out.
    next: usize,
    in_flight: usize,
    failures: usize,
    replayed: usize,
    /// Items that went out, or may have (replayed or uncertain): what a canary counts.
    sent: usize,
    canary: CanaryPhase,
    /// Why a worker could not go on (the first such error) and what was gone: the run's
    /// end decides whether it is the run's error or a stop with a summary (see
    /// [`Run::cannot_go_on`]).
    failed: Option<(Unavailable, DlqError)>,
    on_event: F,
}

/// Whether a signal asked the run to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signal {
    Received,
    NotReceived,
}

impl<F> Shared<F> {
    /// How many more items may be taken now. With `--max-failures N` a run in which every
    /// item fails attempts at most N + 10: items in flight and failures never exceed
    /// N + 10, plus one more for each confirmed replay (the window widens as confirms
    /// come back).
    fn room(&self, opts: &RunOptions) -> usize {
        let room = match opts.max_failures {
            None => usize::MAX,
            Some(max) => (max.saturating_sub(self.failures) + 10 + self.replayed)
                .saturating_sub(self.in_flight),
        };
        room.min(opts.batch_size.max(1))
            .min(opts.pacing.batch_cap())
            .min(self.canary.room(self.sent, self.in_flight))
            .min(self.summary.total - self.next)
    }

    /// The run's end, once every worker has settled what it had in flight: only now is
    /// it known whether anything came of a run that could not go on (another worker's
    /// batch may have been out, unconfirmed, when one worker's claim failed).
    fn end(mut self, signal: Signal, spell: &dyn Spell) -> Result<RunSummary> {
        if let Some((what, e)) = self.failed.take() {
            if self.summary.done == 0 {
                return Err(e);
            }
            let cause = crate::replay::cause_text(&e, spell);
            let detail = match what {
                Unavailable::TargetQueue => format!(
                    "{cause}; stopping: the items not reached were not published"
                ),
                _ => format!(
                    "the database could not be used ({cause}); stopping: the items not reached were not published"
                ),
            };
            self.summary.stop_unavailable(what, detail);
        }
        if signal == Signal::Received && self.summary.done < self.summary.total {
            self.summary.stop(
                StopReason::Interrupted,
                "interrupted; the items in flight were settled".into(),
            );
        }
        self.summary.close();
        Ok(self.summary)
    }
}

/// Replays the plan's items batch by batch. `on_item` sees every report as it settles.
/// `make_broker` gives each worker its own connection.
pub async fn run_plan(
    store: &dyn Store,
    make_broker: impl Fn() -> Broker,
    plan: &Plan,
    opts: &RunOptions,
    interrupted: &AtomicBool,
    on_event: impl FnMut(RunEvent<'_>),
) -> Result<RunSummary> {
    let started = store.now().await?;
    let shared = Mutex::new(Shared {
        summary: RunSummary {
            plan_id: plan.plan_id.clone(),
            total: plan.items.len(),
            done: 0,
            counts: BTreeMap::new(),
            stopped: None,
            unavailable: None,
            stop_detail: None,
            not_reached: 0,
            worst: None,
            node_switches: 0,
        },
        next: 0,
        in_flight: 0,
        failures: 0,
        replayed: 0,
        sent: 0,
        canary: CanaryPhase::of(&opts.pacing),
        failed: None,
        on_event,
    });
    // With a canary, a ramp starts once the canary has passed.
    if let (Some(p), None) = (&opts.pacing.pacer, &opts.pacing.canary) {
        p.start_ramp();
    }
    let run = Run {
        store,
        plan,
        opts,
        interrupted,
        shared: &shared,
        settled: tokio::sync::Notify::new(),
        stop: AtomicBool::new(false),
        watch: tokio::sync::Mutex::new(Watch::new(started)),
    };
    let turns = Arc::new(tokio::sync::Mutex::new(()));
    let worker = || async {
        // One worker has nobody to take turns with.
        let mut broker = match opts.workers > 1 {
            true => make_broker().taking_turns(turns.clone()),
            false => make_broker(),
        };
        broker.connect_early();
        run.worker(&mut broker).await;
        broker.close().await;
    };
    futures_util::future::join_all((0..opts.workers.max(1)).map(|_| worker())).await;
    let shared = shared.into_inner().unwrap_or_else(|e| e.into_inner());
    let signal = match interrupted.load(Ordering::SeqCst) {
        true => Signal::Received,
        false => Signal::NotReceived,
    };
    shared.end(signal, &*opts.replay.spell)
}

/// One run of a plan, shared by its workers.
struct Run<'a, F> {
    store: &'a dyn Store,
    plan: &'a Plan,
    opts: &'a RunOptions,
    interrupted: &'a AtomicBool,
    shared: &'a Mutex<Shared<F>>,
    /// Woken whenever a batch settles (room may have opened).
    settled: tokio::sync::Notify,
    stop: AtomicBool,
    /// The come-back watch, shared by the workers and the waits.
    watch: tokio::sync::Mutex<Watch>,
}

impl<F: FnMut(RunEvent<'_>)> Run<'_, F> {
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst) || self.interrupted.load(Ordering::SeqCst)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared<F>> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tells the caller.
    fn event(&self, e: RunEvent<'_>) {
        (self.lock().on_event)(e);
    }

    /// Gives back items taken but never claimed: they count as not reached.
    fn untake(&self, taken: usize) {
        self.lock().in_flight -= taken;
        self.settled.notify_waiters();
    }

    /// The next items this worker may replay; `None` when the run is over for it.
    async fn take(&self) -> Option<Vec<Item>> {
        loop {
            if self.stopping() {
                return None;
            }
            let notified = self.settled.notified();
            let canary_due = {
                let mut sh = self.lock();
                if sh.next >= sh.summary.total {
                    return None;
                }
                let n = sh.room(self.opts);
                if n > 0 {
                    let items = self.plan.items[sh.next..sh.next + n]
                        .iter()
                        .map(|p| Item {
                            id: p.id.clone(),
                            expected_sha256: Some(p.sha256.clone()),
                        })
                        .collect();
                    sh.next += n;
                    sh.in_flight += n;
                    return Some(items);
                }
                let due = sh.canary.due(sh.sent, sh.in_flight);
                if due {
                    sh.canary = CanaryPhase::Watching;
                }
                due
            };
            match canary_due {
                true => self.canary_wait().await,
                false => _ = unless_stopped(self.interrupted, notified).await,
            }
        }
    }

    async fn worker(&self, broker: &mut Broker) {
        while let Some(items) = self.take().await {
            if !self.depth_gate(broker, items.len()).await {
                return;
            }
            let switches = broker.switches;
            let result = replay_batch(
                self.store,
                broker,
                &items,
                &self.opts.replay,
                self.interrupted,
            )
            .await;
            self.lock().summary.node_switches += broker.switches - switches;
            let batch = match result {
                Ok(b) => b,
                Err(e) => return self.cannot_go_on(Unavailable::Database, items.len(), e),
            };
            let reports = batch.reports;
            self.account(items.len(), &reports);
            if let Some(why) = batch.gave_up {
                self.stop_unavailable(
                    Unavailable::Database,
                    format!("the database could not be used ({why}); stopping: what was sent is settled as far as it could be"),
                );
            }
            if broker.unreachable {
                self.stop_unavailable(
                    Unavailable::Broker,
                    "no node of the broker answers; what was not sent is pending".into(),
                );
            }
            // Frames queued on a connection that is still up could go out later; on a
            // dead one they are gone with it, and the run goes on through the next node.
            if broker.stalled() && broker.publisher().is_some_and(|p| p.is_connected()) {
                self.stop_unavailable(
                    Unavailable::PublishStalled,
                    "a publish did not complete (the broker or the link stopped taking messages); stopping so that nothing queued here goes out later".into(),
                );
            }
            self.settled.notify_waiters();
            if self.stopping() {
                return;
            }
            if let Err(e) = self.came_back(&reports).await {
                return self.cannot_go_on(Unavailable::Database, 0, e);
            }
        }
    }

    /// The database failed a batch before it published anything (its claim), or the
    /// come-back check, or the target queue's depth could not be read (`what` was gone):
    /// the run stops taking items, and the other workers settle what
    /// they have in flight. Whether that makes the run fail (nothing came of it: exit 1)
    /// or stop as `unavailable` with its summary is decided once they all have (in
    /// [`run_plan`]): at this point another worker's batch may be out, unconfirmed.
    fn cannot_go_on(&self, what: Unavailable, taken: usize, e: DlqError) {
        {
            let mut sh = self.lock();
            sh.in_flight -= taken;
            sh.failed.get_or_insert((what, e));
        }
        self.stop.store(true, Ordering::SeqCst);
        self.settled.notify_waiters();
    }

    fn stop_unavailable(&self, what: Unavailable, detail: String) {
        self.lock().summary.stop_unavailable(what, detail);
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Counts the settled items and stops the run at `--max-failures`.
    fn account(&self, taken: usize, reports: &[ItemReport]) {
        let mut sh = self.lock();
        sh.in_flight -= taken;
        for r in reports {
            sh.summary.done += 1;
            *sh.summary
                .counts
                .entry(r.outcome.as_str().into())
                .or_default() += 1;
            let worst = sh.summary.worst_outcome();
            sh.summary.worst = worst;
            match r.outcome {
                Outcome::PublishFailed | Outcome::Uncertain => sh.failures += 1,
                Outcome::Replayed => sh.replayed += 1,
                _ => {}
            }
            sh.sent += usize::from(pace::sent_by_run(r));
            let Shared {
                on_event, summary, ..
            } = &mut *sh;
            on_event(RunEvent::Item(r, summary));
        }
        if let Some(max) = self.opts.max_failures {
            if sh.failures >= max && sh.summary.stopped.is_none() {
                sh.summary.stopped = Some(StopReason::MaxFailures);
                sh.summary.stop_detail = Some(format!(
                    "stopped after {} failures ({} {max})",
                    sh.failures,
                    self.opts.replay.spell.flag(Flag::MaxFailures)
                ));
                self.stop.store(true, Ordering::SeqCst);
            }
        }
    }

    /// Stops the run when an event it sent (replayed, or uncertain: it may have gone
    /// out) came back as a new dead letter. Rows stay as they are.
    async fn came_back(&self, reports: &[ItemReport]) -> Result<()> {
        let mut watch = self.watch.lock().await;
        watch.add(reports);
        if let Some(back) = watch.came_back(self.store).await? {
            self.stop_came_back(&back);
        }
        Ok(())
    }

    /// As [`Run::came_back`], over the whole window (see [`watch::Watch::swept`]).
    async fn swept(&self) -> Result<()> {
        let watch = self.watch.lock().await;
        if let Some(back) = watch.swept(self.store).await? {
            self.stop_came_back(&back);
        }
        Ok(())
    }

    fn stop_came_back(&self, back: &watch::CameBack) {
        let detail = back.detail(&*self.opts.replay.spell);
        self.lock().summary.stop(StopReason::CameBack, detail);
        self.stop.store(true, Ordering::SeqCst);
        // A worker waiting for room must see the stop, not wait for a settle.
        self.settled.notify_waiters();
    }
}
