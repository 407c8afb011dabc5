//! `edit --plan FILE`: the same change on each item of a reviewed plan. An item whose
//! body drifted from the plan's SHA-256, or on which the change fails, is `not_edited`
//! and left as it was; `--plan-out` writes a plan of the revisions for `replay --plan`.

use super::{
    body_change, consent, header_edits, options, print, report, Consent, EditArgs, EditReport,
};
use super::{Ctx, Format, Result};
use dlq::error::DlqError;
use dlq::model::Outcome;
use dlq::plan::{Plan, PlanItem};
use dlq::revise::{self, Change, EditOutcome};
use dlq::store::Store;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Serialize)]
struct Summary {
    plan_id: String,
    items: usize,
    /// Counts per outcome.
    outcomes: BTreeMap<&'static str, usize>,
    worst: Option<Outcome>,
    plan_out: Option<String>,
}

pub async fn run(
    ctx: &Ctx,
    store: &dyn Store,
    args: &EditArgs,
    path: &Path,
    operator: &str,
) -> Result<u8> {
    let plan = Plan::load(path, store).await?;
    let Some(body) = body_change(args)? else {
        if args.headers.is_empty() && args.drop_headers.is_empty() && !args.new_event_id {
            return Err(DlqError::usage(
                "edit --plan needs the change: --jq, --set, --delete, --header or --drop-header",
            )
            .into());
        }
        return edit_all(ctx, store, args, &plan, revise::BodyChange::Keep, operator).await;
    };
    edit_all(ctx, store, args, &plan, body, operator).await
}

async fn edit_all(
    ctx: &Ctx,
    store: &dyn Store,
    args: &EditArgs,
    plan: &Plan,
    body: revise::BodyChange,
    operator: &str,
) -> Result<u8> {
    let change = Change {
        body,
        headers: header_edits(args)?,
    };
    if let Some(out) = args.plan_out.as_deref().filter(|_| !args.dry_run) {
        writable(out)?;
    }
    if !args.dry_run && !consent(ctx, Consent::of(args.yes), plan.items.len()).await? {
        return Err(DlqError::usage("not confirmed: nothing was edited").into());
    }
    let mut opts = options(args, operator);
    opts.plan_id = Some(plan.plan_id.clone());
    let rows = store.load(&plan.ids()).await?;
    let mut reports: Vec<EditReport> = Vec::with_capacity(plan.items.len());
    let mut revisions = Vec::new();
    for item in &plan.items {
        opts.expect_sha256 = Some(item.sha256.clone());
        let outcome = match rows.iter().find(|r| r.summary.id == item.id) {
            None => EditOutcome::NotFound,
            Some(row) => revise::edit_row(store, row, &change, &opts).await?,
        };
        if let EditOutcome::Edited {
            revision_id,
            sha256,
            ..
        } = &outcome
        {
            revisions.push(PlanItem {
                id: revision_id.clone(),
                sha256: sha256.clone(),
            });
        }
        let r = report(store, &item.id, &outcome).await?;
        if ctx.format == Format::Json {
            ctx.out.json_line(&r);
        } else {
            print(ctx, std::slice::from_ref(&r));
        }
        reports.push(r);
    }
    let plan_out = match (&args.plan_out, revisions.is_empty()) {
        (Some(out), false) => Some(write_plan(store, plan, revisions, operator, out).await?),
        (Some(_), true) => {
            super::super::say("dlq: no revision was made: no plan written");
            None
        }
        (None, _) => None,
    };
    Ok(finish(ctx, plan, &reports, plan_out))
}

/// The summary line (or JSON line) of a plan edit; its exit code, the worst item's.
fn finish(ctx: &Ctx, plan: &Plan, reports: &[EditReport], plan_out: Option<String>) -> u8 {
    let code = super::worst(reports);
    let mut outcomes = BTreeMap::new();
    for r in reports {
        *outcomes.entry(r.outcome.as_str()).or_insert(0) += 1;
    }
    let summary = Summary {
        plan_id: plan.plan_id.clone(),
        items: reports.len(),
        worst: reports
            .iter()
            .map(|r| r.outcome)
            .max_by_key(|o| o.severity()),
        outcomes,
        plan_out,
    };
    match ctx.format {
        Format::Json => ctx
            .out
            .json_line(&serde_json::json!({ "summary": summary })),
        _ => {
            let counts: Vec<String> = summary
                .outcomes
                .iter()
                .map(|(k, v)| format!("{v} {k}"))
                .collect();
            let written = summary
                .plan_out
                .as_ref()
                .map(|p| format!("; plan of the revisions: {p}"))
                .unwrap_or_default();
            ctx.out.text(&format!(
                "{} items: {}{written}\n",
                summary.items,
                counts.join(", ")
            ));
        }
    }
    code
}

/// Fails unless `out` can be written, before anything is edited: a plan of revisions
/// that cannot be written after they were made leaves them with no plan to replay.
fn writable(out: &Path) -> Result<()> {
    let existed = out.exists();
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(out)
        .map_err(|e| {
            DlqError::usage(format!(
                "cannot write --plan-out {}: {e} (nothing was edited)",
                out.display()
            ))
        })?;
    if !existed {
        let _ = std::fs::remove_file(out);
    }
    Ok(())
}

/// A plan of the revisions made, bound to this database, sealed as `dlq plan` seals one.
async fn write_plan(
    store: &dyn Store,
    source: &Plan,
    items: Vec<PlanItem>,
    operator: &str,
    out: &Path,
) -> Result<String> {
    let ids: Vec<String> = items.iter().map(|i| i.id.clone()).collect();
    let mut mix: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    for s in store.summaries(&ids).await? {
        for (dim, v) in [
            ("reason", Some(s.reason)),
            ("producer", s.producer),
            ("schema_version", s.schema_version),
        ] {
            let v = v.unwrap_or_else(|| dlq::model::UNKNOWN.into());
            *mix.entry(dim.into()).or_default().entry(v).or_default() += 1;
        }
    }
    let mut plan = Plan {
        plan_id: uuid::Uuid::new_v4().to_string(),
        created_at: store.now().await?,
        created_by: operator.to_string(),
        database_id: Some(store.database_id().await?),
        filters: dlq::model::Filter {
            revisions: true,
            ..Default::default()
        },
        allow_mixed: source.allow_mixed,
        mix,
        count: items.len(),
        matched: Some(items.len()),
        digest: None,
        items,
    };
    plan.seal();
    let text = serde_json::to_string_pretty(&plan).map_err(|e| DlqError::other(e.to_string()))?;
    std::fs::write(out, format!("{text}\n"))
        .map_err(|e| DlqError::usage(format!("cannot write --plan-out {}: {e}", out.display())))?;
    Ok(out.display().to_string())
}
