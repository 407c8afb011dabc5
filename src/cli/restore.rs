//! `dlq restore`: a discarded dead letter becomes `pending` again (replayable), with a
//! note in its history saying why.

use super::filters::{select, FilterArgs};
use super::report::{confirm_and_apply, Change};
use super::Ctx;
use super::Result;
use clap::Args;
use dlq::error::DlqError;
use dlq::model::{Outcome, State};
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
    let change = Change {
        action: "restore",
        from: State::Discarded,
        meaning: "pending again: a plan or replay may publish it",
        done: Outcome::Restored,
        not_done: Outcome::NotRestored,
        detail: format!("pending again: {}", args.note),
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
