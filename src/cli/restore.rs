//! `dlq restore`: a discarded dead letter becomes `pending` again (replayable), with a
//! note in its history saying why.

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
    if sel.ids.is_empty() {
        eprintln!("no discarded dead letters match; nothing to restore");
        return Ok(dlq::exit::OK);
    }
    if require_consent(ctx, args.yes, "restore")? {
        let what = match sel.single {
            true => sel.ids[0].clone(),
            false => format!("{} dead letters", thousands(sel.ids.len() as i64)),
        };
        eprintln!(
            "About to restore {what} (pending again: a plan or replay may publish it): {}",
            args.note
        );
        if !confirm(ctx, "Restore?").await? {
            if sel.single {
                return Ok(emit(
                    ctx,
                    &StepReport::new(
                        &sel.ids[0],
                        Outcome::NotRestored,
                        "declined at the prompt; nothing was changed",
                    ),
                ));
            }
            eprintln!("declined; nothing was changed");
            return Ok(dlq::exit::NOT_DONE);
        }
    }
    let change = Change {
        action: "restore",
        done: Outcome::Restored,
        not_done: Outcome::NotRestored,
        detail: format!("pending again: {}", args.note),
        refused: "not restored: only a discarded dead letter can be; ",
        plan_id: sel.plan_id.clone(),
    };
    let s = store.as_ref();
    let code = apply_change(
        ctx,
        s,
        &operator,
        &sel.ids,
        sel.single,
        &change,
        |ids, history| async move { s.restore(&ids, &history).await },
    )
    .await?;
    store.close().await;
    Ok(code)
}
