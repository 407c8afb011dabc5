//! The one report of a step on one dead letter (claim, release, replay, resolve, ...)
//! and the one place that prints it.

use super::{Ctx, Format};
use dlq::error::Result;
use dlq::model::{NewHistory, Outcome, State};
use dlq::replay::{why_unavailable, ItemReport};
use dlq::store::Store;
use serde::Serialize;

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
                // A claim refused because a publish may be out reports that doubt.
                match (outcome, row.state) {
                    (Outcome::NotClaimed, State::Uncertain) => Outcome::Uncertain,
                    _ => outcome,
                },
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

/// Prints a replay item's report and returns its exit code.
pub fn emit_item(ctx: &Ctx, r: &ItemReport) -> u8 {
    match ctx.format {
        Format::Json => ctx.out.json(r),
        _ => ctx.out.text(&format!(
            "{}\n",
            dlq::sanitize::line(&format!("{}: {} ({})", r.id, r.outcome, r.detail))
        )),
    }
    r.outcome.exit_code()
}
