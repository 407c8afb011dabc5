//! Group replay: a frozen, reviewed plan, replayed in batches through [`crate::replay`].
//!
//! A plan pins each item to the SHA-256 of the body a person reviewed, so the run replays
//! exactly that. Batches let claims and marks share one SQL statement and confirms be
//! pipelined; each row still goes claim → confirm → mark, so a crash at any point leaves
//! every row either replayed (confirmed) or claimed/pending, and a rerun of the same plan
//! skips what is done.

use crate::error::{DlqError, Result};
use crate::model::{Filter, Outcome, UNKNOWN};
use crate::replay::{replay, Broker, Item, ItemReport, ReplayOptions};
use crate::store::{PlanCandidate, Store};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

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
    pub filters: Filter,
    pub allow_mixed: bool,
    /// Counts per reason / producer / schema version in the selection.
    pub mix: BTreeMap<String, BTreeMap<String, usize>>,
    pub count: usize,
    pub items: Vec<PlanItem>,
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

/// Freezes the selection; refuses a mix of reasons, producers or schema versions unless
/// `allow_mixed`.
pub async fn make_plan(
    store: &dyn Store,
    filter: Filter,
    limit: i64,
    allow_mixed: bool,
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
    if !mixed.is_empty() && !allow_mixed {
        return Err(DlqError::usage(format!(
            "the selection is not homogeneous ({}); narrow the filters or pass --allow-mixed",
            mixed.join("; ")
        )));
    }
    Ok(Plan {
        plan_id: uuid::Uuid::new_v4().to_string(),
        created_at: store.now().await?,
        created_by: operator.to_string(),
        filters: filter,
        allow_mixed,
        mix,
        count: candidates.len(),
        items: candidates
            .into_iter()
            .map(|c| PlanItem {
                id: c.id,
                sha256: c.sha256,
            })
            .collect(),
    })
}

/// Why a run stopped early.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    MaxFailures,
    CameBack,
    Interrupted,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    pub plan_id: String,
    pub total: usize,
    pub done: usize,
    pub counts: BTreeMap<String, usize>,
    pub stopped: Option<StopReason>,
    pub stop_detail: Option<String>,
    pub worst: Option<Outcome>,
}

pub struct RunOptions {
    pub replay: ReplayOptions,
    pub batch_size: usize,
    pub max_failures: Option<usize>,
    /// Batches worked on at once, each on its own broker connection; they take turns
    /// publishing, so that one batch's SQL overlaps another's publishing.
    pub workers: usize,
}

/// What the workers of a run share.
struct Shared<F> {
    summary: RunSummary,
    failures: usize,
    on_item: F,
}

/// Replays the plan's items batch by batch. `on_item` sees every report as it settles.
/// `make_broker` gives each worker its own connection.
pub async fn run_plan(
    store: &dyn Store,
    make_broker: impl Fn() -> Broker,
    plan: &Plan,
    opts: &RunOptions,
    interrupted: &AtomicBool,
    on_item: impl FnMut(&ItemReport),
) -> Result<RunSummary> {
    let started = store.now().await?;
    let shared = Mutex::new(Shared {
        summary: RunSummary {
            plan_id: plan.plan_id.clone(),
            total: plan.items.len(),
            done: 0,
            counts: BTreeMap::new(),
            stopped: None,
            stop_detail: None,
            worst: None,
        },
        failures: 0,
        on_item,
    });
    let watch = tokio::sync::Mutex::new((NewDeadLetters::new(started), HashSet::new()));
    let batches: Vec<&[PlanItem]> = plan.items.chunks(opts.batch_size.max(1)).collect();
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);

    let turns = Arc::new(tokio::sync::Mutex::new(()));
    let worker = || async {
        let mut broker = make_broker().taking_turns(turns.clone());
        broker.connect_early();
        let result = run_worker(
            store,
            &mut broker,
            &batches,
            &next,
            &stop,
            &shared,
            &watch,
            opts,
            interrupted,
        )
        .await;
        broker.close().await;
        result
    };
    let results = futures_util::future::join_all((0..opts.workers.max(1)).map(|_| worker())).await;
    let mut shared = shared.into_inner().unwrap_or_else(|e| e.into_inner());
    if shared.summary.stopped.is_none()
        && interrupted.load(Ordering::SeqCst)
        && shared.summary.done < shared.summary.total
    {
        shared.summary.stopped = Some(StopReason::Interrupted);
        shared.summary.stop_detail = Some("interrupted; the items in flight were settled".into());
    }
    for r in results {
        r?;
    }
    Ok(shared.summary)
}

#[allow(clippy::too_many_arguments)]
async fn run_worker<F: FnMut(&ItemReport)>(
    store: &dyn Store,
    broker: &mut Broker,
    batches: &[&[PlanItem]],
    next: &AtomicUsize,
    stop: &AtomicBool,
    shared: &Mutex<Shared<F>>,
    watch: &tokio::sync::Mutex<(NewDeadLetters, HashSet<String>)>,
    opts: &RunOptions,
    interrupted: &AtomicBool,
) -> Result<()> {
    loop {
        if stop.load(Ordering::SeqCst) || interrupted.load(Ordering::SeqCst) {
            return Ok(());
        }
        let Some(batch) = batches.get(next.fetch_add(1, Ordering::SeqCst)) else {
            return Ok(());
        };
        let items: Vec<Item> = batch
            .iter()
            .map(|p| Item {
                id: p.id.clone(),
                expected_sha256: Some(p.sha256.clone()),
            })
            .collect();
        let reports = match replay(store, broker, &items, &opts.replay, interrupted).await {
            Ok(r) => r,
            Err(e) => {
                stop.store(true, Ordering::SeqCst);
                return Err(e);
            }
        };
        let replayed: Vec<String> = reports
            .iter()
            .filter(|r| r.outcome == Outcome::Replayed)
            .filter_map(|r| r.event_id.clone())
            .collect();
        {
            let mut sh = shared.lock().unwrap_or_else(|e| e.into_inner());
            for r in &reports {
                sh.summary.done += 1;
                *sh.summary
                    .counts
                    .entry(r.outcome.as_str().into())
                    .or_default() += 1;
                if sh
                    .summary
                    .worst
                    .is_none_or(|w| r.outcome.severity() > w.severity())
                {
                    sh.summary.worst = Some(r.outcome);
                }
                if matches!(r.outcome, Outcome::PublishFailed | Outcome::Uncertain) {
                    sh.failures += 1;
                }
                (sh.on_item)(r);
            }
            if let Some(max) = opts.max_failures {
                if sh.failures >= max && sh.summary.stopped.is_none() {
                    sh.summary.stopped = Some(StopReason::MaxFailures);
                    sh.summary.stop_detail = Some(format!(
                        "stopped after {} failures (--max-failures {max})",
                        sh.failures
                    ));
                    stop.store(true, Ordering::SeqCst);
                    return Ok(());
                }
            }
        }
        let mut w = watch.lock().await;
        let (tracker, events) = &mut *w;
        events.extend(replayed);
        if let Some((id, event)) = tracker.came_back(store, events).await? {
            let mut sh = shared.lock().unwrap_or_else(|e| e.into_inner());
            if sh.summary.stopped.is_none() {
                sh.summary.stopped = Some(StopReason::CameBack);
                sh.summary.stop_detail = Some(format!(
                    "replayed event {event} came back as new dead letter {id}: the cause is not fixed; stopping"
                ));
            }
            stop.store(true, Ordering::SeqCst);
            return Ok(());
        }
    }
}

/// Follows the dead letters written since the run started, a page at a time, so each
/// check reads only what is new.
struct NewDeadLetters {
    watermark: DateTime<Utc>,
    seen: HashSet<String>,
}

impl NewDeadLetters {
    fn new(started: DateTime<Utc>) -> Self {
        NewDeadLetters {
            watermark: started,
            seen: HashSet::new(),
        }
    }

    /// The first new dead letter whose event this run replayed: (id, event_id).
    async fn came_back(
        &mut self,
        store: &dyn Store,
        replayed: &HashSet<String>,
    ) -> Result<Option<(String, String)>> {
        loop {
            let page = store.dead_lettered_since(self.watermark, 1000).await?;
            let full = page.len() == 1000;
            let mut advanced = false;
            for (id, event, at) in page {
                if !self.seen.insert(id.clone()) {
                    continue;
                }
                advanced = true;
                if at > self.watermark {
                    self.watermark = at;
                }
                if replayed.contains(&event) {
                    return Ok(Some((id, event)));
                }
            }
            if !full || !advanced {
                return Ok(None);
            }
        }
    }
}
