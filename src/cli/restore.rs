//! `dlq restore`: a discarded dead letter becomes `pending` again (replayable), with a
//! note in its history saying why.

use super::filters::{select, FilterArgs};
use super::output::say;
use super::report::{confirm_and_apply, Change};
use super::Ctx;
use super::Result;
use clap::Args;
use dlq::error::DlqError;
use dlq::model::{Outcome, State};
use dlq::store::Store;
use std::collections::HashMap;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// The dead-letter ID (or --plan FILE, or filters with --state discarded)
    #[arg(conflicts_with = "plan")]
    pub id: Option<String>,
    /// Restore the discarded items of this plan (made on this database)
    #[arg(long)]
    pub plan: Option<PathBuf>,
    /// Why it may be replayed after all; kept in the history
    #[arg(long)]
    pub note: String,
    /// Do not ask (required when there is no terminal)
    #[arg(short = 'y', long)]
    pub yes: bool,
    /// With filters: at most this many dead letters
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(i64).range(1..=1_000_000))]
    pub limit: i64,
    #[command(flatten)]
    pub filters: FilterArgs,
}

pub async fn run(ctx: &Ctx, args: RestoreArgs) -> Result<u8> {
    if args.note.trim().is_empty() {
        return Err(DlqError::usage("--note is empty: say why (it is kept in the history)").into());
    }
    let operator = ctx.operator()?;
    let store = ctx.store_for_writes().await?;
    let sel = select(
        store.as_ref(),
        args.id.as_deref(),
        args.plan.as_deref(),
        &args.filters,
        State::Discarded,
        args.limit,
        "restored",
    )
    .await?;
    let detail_of = open_attempts(store.as_ref(), &sel.ids, &args.note).await?;
    if !detail_of.is_empty() && !sel.single {
        say(&format!(
            "{} of these had a publish attempted before the discard, never settled: restored, they are uncertain, not pending (check the consumers, then `dlq resolve`)",
            detail_of.len()
        ));
    }
    let change = Change {
        action: "restore",
        from: State::Discarded,
        meaning: "pending again: a plan or replay may publish it",
        done: Outcome::Restored,
        not_done: Outcome::NotRestored,
        detail: format!("pending again: {}", args.note),
        detail_of,
        refused: "not restored: only a discarded dead letter can be; ",
        plan_id: sel.plan_id.clone(),
    };
    let s = store.as_ref();
    let code = confirm_and_apply(
        ctx,
        s,
        &operator,
        &sel,
        args.yes,
        &args.note,
        &change,
        |ids, history| async move { s.restore(&ids, &history).await },
    )
    .await?;
    store.close().await;
    Ok(code)
}

/// What a restore says of the rows with an open publish attempt (a row imported so, or
/// discarded by an older `dlq`): restored, they are `uncertain`, not `pending`. A
/// discarded row's attempt does not change meanwhile: nothing claims a discarded row.
async fn open_attempts(
    store: &dyn Store,
    ids: &[String],
    note: &str,
) -> dlq::error::Result<HashMap<String, String>> {
    let mut out = HashMap::new();
    for chunk in ids.chunks(1000) {
        for row in store.summaries(chunk).await? {
            if row.replay_attempt_at.is_some() && row.replayed_at.is_none() {
                let detail = format!(
                    "uncertain, not pending: a publish attempted before the discard was never settled and may have been delivered; check the consumers, then `dlq resolve {} --delivered|--not-delivered`: {note}",
                    row.id
                );
                out.insert(row.id, detail);
            }
        }
    }
    Ok(out)
}
