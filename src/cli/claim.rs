//! `dlq claim ID`: takes the replay lease by hand (a runbook step before `replay --token`).

use super::{Ctx, Format};
use clap::Args;
use dlq::error::Result;
use dlq::model::{validate_id, NewHistory, Outcome};
use dlq::replay::{new_token, why_unavailable};
use dlq::store::Store;
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

impl StepReport {
    pub fn new(id: &str, outcome: Outcome, detail: impl Into<String>) -> Self {
        StepReport {
            id: id.to_string(),
            outcome,
            detail: detail.into(),
            token: None,
            expires_at: None,
        }
    }

    /// The report for an ID whose claim or release did not happen: `not_found`, or
    /// `outcome` with who holds it or who replayed it.
    pub async fn unavailable(
        store: &dyn Store,
        id: &str,
        outcome: Outcome,
        prefix: &str,
    ) -> Result<Self> {
        Ok(match store.summaries(&[id.to_string()]).await?.first() {
            None => StepReport::new(
                id,
                Outcome::NotFound,
                format!("no dead letter with id {id:?}"),
            ),
            Some(row) => StepReport::new(
                id,
                outcome,
                format!("{prefix}{}", why_unavailable(row, store.now().await?)),
            ),
        })
    }

    /// The step as a history entry.
    pub fn history(
        &self,
        operator: &str,
        action: &'static str,
        token: Option<String>,
    ) -> NewHistory {
        NewHistory {
            dead_letter_id: self.id.clone(),
            operator: operator.to_string(),
            action,
            outcome: self.outcome,
            detail: self.detail.clone(),
            token,
            target: None,
            plan_id: None,
        }
    }

    /// Appends the step to the dead letter's history (an unknown ID has none).
    pub async fn record(
        &self,
        store: &dyn Store,
        operator: &str,
        action: &'static str,
        token: Option<String>,
    ) {
        if self.outcome == Outcome::NotFound {
            return;
        }
        let h = self.history(operator, action, token);
        if let Err(e) = store.append_history(&[h]).await {
            tracing::warn!("could not record the history: {e}");
        }
    }
}

/// Prints a claim/release/replay report and returns its exit code.
pub fn emit(ctx: &Ctx, r: &StepReport) -> u8 {
    match ctx.format {
        Format::Json => ctx.out.json(r),
        Format::Table | Format::Markdown => {
            // One line per report: a newline in the detail (it can quote stored text)
            // must not start a line that looks like another report.
            let line = dlq::sanitize::line(&format!("{}: {} ({})", r.id, r.outcome, r.detail))
                .into_owned();
            let mut s = format!("{line}\n");
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
    let history = claimed.history(&operator, "claim", Some(token.clone()));
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
            r.record(store.as_ref(), &operator, "claim", None).await;
            r
        }
    };
    store.close().await;
    if args.token_only {
        match &report.token {
            Some(t) => ctx.out.text(&format!("{t}\n")),
            None => eprintln!(
                "{}",
                dlq::sanitize::line(&format!(
                    "dlq: {}: {} ({})",
                    report.id, report.outcome, report.detail
                ))
            ),
        }
        return Ok(report.outcome.exit_code());
    }
    Ok(emit(ctx, &report))
}
