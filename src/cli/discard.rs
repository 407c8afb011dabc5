//! `dlq discard`: an operator sets dead letters aside, with a note, so that no claim,
//! plan or replay ever takes them. Only `pending` rows; the row is kept byte for byte
//! and `dlq restore` makes it pending again.

use super::filters::{select, FilterArgs};
use super::report::{confirm_and_apply, Change};
use super::Ctx;
use super::Result;
use clap::Args;
use dlq::error::DlqError;
use dlq::model::{Outcome, State};
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct DiscardArgs {
    /// The dead-letter ID (or --plan FILE, or filters)
    #[arg(conflicts_with = "plan")]
    pub id: Option<String>,
    /// Discard the items of this plan (made on this database)
    #[arg(long)]
    pub plan: Option<PathBuf>,
    /// Why it must never be replayed (a ticket, what you checked); kept in the history
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

pub async fn run(ctx: &Ctx, args: DiscardArgs) -> Result<u8> {
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
        State::Pending,
        args.limit,
        "discarded",
    )
    .await?;
    let change = Change {
        action: "discard",
        from: State::Pending,
        meaning: "never replayed until restored",
        done: Outcome::Discarded,
        not_done: Outcome::NotDiscarded,
        detail: format!("set aside, never replayed until restored: {}", args.note),
        detail_of: Default::default(),
        refused: "not discarded: only a pending dead letter can be; ",
        plan_id: sel.plan_id.clone(),
    };
    let s = store.as_ref();
    let note = args.note.as_str();
    let code = confirm_and_apply(
        ctx,
        s,
        &operator,
        &sel,
        args.yes,
        &args.note,
        &change,
        |ids, history| async move { s.discard(&ids, note, &history).await },
    )
    .await?;
    store.close().await;
    Ok(code)
}
