//! `dlq claim ID`: takes the replay lease by hand (a runbook step before `replay --token`).

use super::output::say;
use super::report::{emit, StepReport};
use super::Ctx;
use super::Result;
use clap::Args;
use dlq::model::{validate_id, HistoryAction, Outcome};
use dlq::replay::new_token;
use std::time::Duration;

#[derive(Debug, Args)]
pub struct ClaimArgs {
    /// The dead-letter ID
    pub id: String,
    /// How long the lease lasts
    #[arg(long, default_value = "5m", value_parser = dlq::timeparse::lease_arg)]
    pub lease: Duration,
    /// Print only the token (for `TOKEN=$(dlq claim ID --token-only)`); details go to stderr
    #[arg(long)]
    pub token_only: bool,
}

pub async fn run(ctx: &Ctx, args: ClaimArgs) -> Result<u8> {
    validate_id(&args.id)?;
    let operator = ctx.operator()?;
    let store = ctx.store_for_writes().await?;
    let token = new_token(&operator);
    let claimed = StepReport {
        token: Some(token.clone()),
        ..StepReport::new(
            &args.id,
            Outcome::Claimed,
            format!(
                "lease held by {operator} for {}; pass the token to `dlq replay --token` or `dlq release --token`",
                humantime::format_duration(args.lease)
            ),
        )
    };
    let history = claimed.history(&operator, HistoryAction::Claim, Some(token.clone()));
    let rows = store
        .claim(
            std::slice::from_ref(&args.id),
            &token,
            args.lease,
            &[history],
        )
        .await?;
    let report = match rows.first().and_then(|r| r.summary.replay_claim_expires_at) {
        Some(until) => StepReport {
            expires_at: Some(super::output::time(until)),
            ..claimed
        },
        None => {
            let r =
                StepReport::unavailable(store.as_ref(), &args.id, Outcome::NotClaimed, "").await?;
            r.record(store.as_ref(), &operator, HistoryAction::Claim, None)
                .await;
            r
        }
    };
    store.close().await;
    if args.token_only {
        match &report.token {
            Some(t) => ctx.out.text(&format!("{t}\n")),
            None => say(&format!(
                "{}",
                dlq::sanitize::line(&format!(
                    "dlq: {}: {} ({})",
                    report.id, report.outcome, report.detail
                ))
            )),
        }
        return Ok(report.outcome.exit_code());
    }
    Ok(emit(ctx, &report))
}
