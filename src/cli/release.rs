//! `dlq release ID --token T`: gives back a lease; only its holder can.

use super::report::{emit, StepReport};
use super::Ctx;
use super::Result;
use clap::Args;
use dlq::model::{validate_id, HistoryAction, Outcome};

#[derive(Debug, Args)]
pub struct ReleaseArgs {
    /// The dead-letter ID
    pub id: String,
    /// The token `dlq claim` printed
    #[arg(long)]
    pub token: String,
}

pub async fn run(ctx: &Ctx, args: ReleaseArgs) -> Result<u8> {
    validate_id(&args.id)?;
    let operator = ctx.operator()?;
    let store = ctx.store_for_writes().await?;
    let done = StepReport::new(
        &args.id,
        Outcome::Released,
        "lease released; the dead letter can be replayed again",
    );
    let entry = done.history(&operator, HistoryAction::Release, Some(args.token.clone()));
    let released = store
        .release(std::slice::from_ref(&args.id), &args.token, None, &[entry])
        .await?;
    let report = if !released.is_empty() {
        done
    } else {
        let r = StepReport::unavailable(
            store.as_ref(),
            &args.id,
            Outcome::NotReleased,
            "this token does not hold a live lease (or was used by a replay): ",
        )
        .await?;
        r.record(
            store.as_ref(),
            &operator,
            HistoryAction::Release,
            Some(args.token.clone()),
        )
        .await;
        r
    };
    store.close().await;
    Ok(emit(ctx, &report))
}
