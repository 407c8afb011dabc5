//! `dlq discard`: an operator sets dead letters aside, with a note, so that no claim,
//! plan or replay ever takes them. Only `pending` rows; the row is kept byte for byte
//! and `dlq restore` makes it pending again.

use super::filters::{select, FilterArgs};
use super::output::thousands;
use super::prompt::{confirm, require_consent};
use super::report::{apply_change, emit, Change, StepReport};
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
    if sel.ids.is_empty() {
        eprintln!("no pending dead letters match; nothing to discard");
        return Ok(dlq::exit::OK);
    }
    if require_consent(ctx, args.yes, "discard")? {
        let what = match sel.single {
            true => sel.ids[0].clone(),
            false => format!("{} dead letters", thousands(sel.ids.len() as i64)),
        };
        eprintln!(
            "About to discard {what} (never replayed until restored): {}",
            args.note
        );
        if !confirm(ctx, "Discard?").await? {
            if sel.single {
                return Ok(emit(
                    ctx,
                    &StepReport::new(
                        &sel.ids[0],
                        Outcome::NotDiscarded,
                        "declined at the prompt; nothing was changed",
                    ),
                ));
            }
            eprintln!("declined; nothing was changed");
            return Ok(dlq::exit::NOT_DONE);
        }
    }
    let change = Change {
        action: "discard",
        done: Outcome::Discarded,
        not_done: Outcome::NotDiscarded,
        detail: format!("set aside, never replayed until restored: {}", args.note),
        refused: "not discarded: only a pending dead letter can be; ",
        plan_id: sel.plan_id.clone(),
    };
    let s = store.as_ref();
    let note = args.note.as_str();
    let code = apply_change(
        ctx,
        s,
        &operator,
        &sel.ids,
        sel.single,
        &change,
        |ids, history| async move { s.discard(&ids, note, &history).await },
    )
    .await?;
    store.close().await;
    Ok(code)
}
