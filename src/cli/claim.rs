//! `dlq claim ID`: takes the replay lease by hand (a runbook step before `replay --token`).

use super::{Ctx, Format};
use clap::Args;
use dlq::error::Result;
use dlq::model::{validate_id, NewHistory, Outcome};
use dlq::replay::{explain_unavailable, new_token};
use serde::Serialize;
use std::time::Duration;

#[derive(Debug, Args)]
pub struct ClaimArgs {
    /// The dead-letter ID
    pub id: String,
    /// How long the lease lasts
    #[arg(long, default_value = "5m", value_parser = dlq::timeparse::duration_arg)]
    pub lease: Duration,
    /// Print only the token (for `TOKEN=$(dlq claim ID --token-only)`); details go to stderr
    #[arg(long)]
    pub token_only: bool,
}

#[derive(Serialize)]
pub struct StepReport {
    pub id: String,
    pub outcome: Outcome,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
}

/// Prints a claim/release/replay report and returns its exit code.
pub fn emit(ctx: &Ctx, r: &StepReport) -> u8 {
    match ctx.format {
        Format::Json => ctx.out.json(r),
        Format::Table | Format::Markdown => {
            let mut s = format!("{}: {} ({})\n", r.id, r.outcome, r.detail);
            if let Some(t) = &r.token {
                s.push_str(&format!("token:      {t}\n"));
            }
            if let Some(e) = &r.expires_at {
                s.push_str(&format!("expires at: {e}\n"));
            }
            ctx.out.text(&s);
        }
    }
    r.outcome.exit_code()
}

pub async fn run(ctx: &Ctx, args: ClaimArgs) -> Result<u8> {
    validate_id(&args.id)?;
    let operator = ctx.operator()?;
    let store = ctx.store_for_writes().await?;
    let token = new_token(&operator);
    let claimed = store
        .claim(std::slice::from_ref(&args.id), &token, args.lease)
        .await?;
    let report = match claimed.first() {
        Some((_, until)) => StepReport {
            id: args.id.clone(),
            outcome: Outcome::Claimed,
            detail: format!(
                "lease held by {operator} for {}; pass the token to `dlq replay --token` or `dlq release --token`",
                humantime::format_duration(args.lease)
            ),
            token: Some(token.clone()),
            expires_at: Some(super::output::time(*until)),
        },
        None => match store.summaries(std::slice::from_ref(&args.id)).await?.first() {
            None => StepReport {
                id: args.id.clone(),
                outcome: Outcome::NotFound,
                detail: format!("no dead letter with id {:?}", args.id),
                token: None,
                expires_at: None,
            },
            Some(row) => {
                let (_, detail) = explain_unavailable(row, store.now().await?);
                StepReport {
                    id: args.id.clone(),
                    outcome: Outcome::NotClaimed,
                    detail: detail.replace("; nothing was published", ""),
                    token: None,
                    expires_at: None,
                }
            }
        },
    };
    if report.outcome != Outcome::NotFound {
        let h = NewHistory {
            dead_letter_id: args.id.clone(),
            operator,
            action: "claim",
            outcome: report.outcome,
            detail: report.detail.clone(),
            token: report.token.clone(),
            target: None,
            plan_id: None,
        };
        if let Err(e) = store.append_history(&[h]).await {
            tracing::warn!("could not record the history: {e}");
        }
    }
    store.close().await;
    if args.token_only {
        match &report.token {
            Some(t) => ctx.out.text(&format!("{t}\n")),
            None => eprintln!("dlq: {}: {} ({})", report.id, report.outcome, report.detail),
        }
        return Ok(report.outcome.exit_code());
    }
    Ok(emit(ctx, &report))
}
