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
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

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
}

/// Replays the plan's items batch by batch. `on_item` sees every report as it settles.
pub async fn run_plan(
    store: &dyn Store,
    broker: &mut Broker,
    plan: &Plan,
    opts: &RunOptions,
    interrupted: &AtomicBool,
    mut on_item: impl FnMut(&ItemReport),
) -> Result<RunSummary> {
    let started = store.now().await?;
    let mut summary = RunSummary {
        plan_id: plan.plan_id.clone(),
        total: plan.items.len(),
        done: 0,
        counts: BTreeMap::new(),
        stopped: None,
        stop_detail: None,
        worst: None,
    };
    let mut failures = 0usize;
    let mut replayed_events: Vec<String> = Vec::new();
    for batch in plan.items.chunks(opts.batch_size.max(1)) {
        if interrupted.load(Ordering::SeqCst) {
            summary.stopped = Some(StopReason::Interrupted);
            summary.stop_detail = Some("interrupted; the items in flight were settled".into());
            break;
        }
        let items: Vec<Item> = batch
            .iter()
            .map(|p| Item {
                id: p.id.clone(),
                expected_sha256: Some(p.sha256.clone()),
            })
            .collect();
        let reports = replay(store, broker, &items, &opts.replay, interrupted).await?;
        for r in &reports {
            summary.done += 1;
            *summary.counts.entry(r.outcome.as_str().into()).or_default() += 1;
            if summary
                .worst
                .is_none_or(|w| r.outcome.severity() > w.severity())
            {
                summary.worst = Some(r.outcome);
            }
            if matches!(r.outcome, Outcome::PublishFailed | Outcome::Uncertain) {
                failures += 1;
            }
            if r.outcome == Outcome::Replayed {
                if let Some(e) = &r.event_id {
                    replayed_events.push(e.clone());
                }
            }
            on_item(r);
        }
        if let Some(max) = opts.max_failures {
            if failures >= max {
                summary.stopped = Some(StopReason::MaxFailures);
                summary.stop_detail = Some(format!(
                    "stopped after {failures} failures (--max-failures {max})"
                ));
                break;
            }
        }
        let back = store.dead_lettered_again(&replayed_events, started).await?;
        if let Some((id, event)) = back.first() {
            summary.stopped = Some(StopReason::CameBack);
            summary.stop_detail = Some(format!(
                "replayed event {event} came back as new dead letter {id}: the cause is not fixed; stopping"
            ));
            break;
        }
    }
    Ok(summary)
}
