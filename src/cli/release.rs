//! `dlq release ID --token T`: gives back a lease; only its holder can.

use super::claim::{emit, StepReport};
use super::Ctx;
use clap::Args;
use dlq::error::Result;
use dlq::model::{validate_id, NewHistory, Outcome};
use dlq::replay::explain_unavailable;

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
    let released = store
        .release(std::slice::from_ref(&args.id), &args.token, None)
        .await?;
    let report = if !released.is_empty() {
        StepReport {
            id: args.id.clone(),
            outcome: Outcome::Released,
            detail: "lease released; the dead letter can be replayed again".into(),
            token: None,
            expires_at: None,
        }
    } else {
        match store
            .summaries(std::slice::from_ref(&args.id))
            .await?
            .first()
        {
            None => StepReport {
                id: args.id.clone(),
                outcome: Outcome::NotFound,
                detail: format!("no dead letter with id {:?}", args.id),
                token: None,
                expires_at: None,
            },
            Some(row) => {
                let (_, why) = explain_unavailable(row, store.now().await?);
                StepReport {
                    id: args.id.clone(),
                    outcome: Outcome::NotReleased,
                    detail: format!(
                        "this token does not hold a live lease: {}",
                        why.replace("; nothing was published", "")
                    ),
                    token: None,
                    expires_at: None,
                }
            }
        }
    };
    if report.outcome != Outcome::NotFound {
        let h = NewHistory {
            dead_letter_id: args.id.clone(),
            operator,
            action: "release",
            outcome: report.outcome,
            detail: report.detail.clone(),
            token: Some(args.token.clone()),
            target: None,
            plan_id: None,
        };
        if let Err(e) = store.append_history(&[h]).await {
            tracing::warn!("could not record the history: {e}");
        }
    }
    store.close().await;
    Ok(emit(ctx, &report))
}
