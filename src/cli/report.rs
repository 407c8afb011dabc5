//! The one report of a step on one dead letter (claim, release, replay, resolve, ...)
//! and the one place that prints it.

use super::filters::Selection;
use super::output::say;
use super::output::thousands;
use super::prompt::{confirm, require_consent, Consent};
use super::spell::Commands;
use super::Result;
use super::{Ctx, Format};
use dlq::model::{HistoryAction, IdStorage, NewHistory, Outcome, State};
use dlq::replay::{why_unavailable, ItemReport};
use dlq::store::Store;
use serde::Serialize;

/// Why `row` is not available, with the commands to type.
pub fn unavailable_words(row: &dlq::model::Summary, now: chrono::DateTime<chrono::Utc>) -> String {
    why_unavailable(row, now).render(&Commands)
}

/// A replay item's report as printed (JSON lines and `--output json` alike).
#[derive(Serialize)]
pub struct ItemView<'a> {
    pub id: &'a str,
    pub outcome: Outcome,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan_id: Option<&'a str>,
}

impl<'a> ItemView<'a> {
    pub fn of(r: &'a ItemReport) -> Self {
        ItemView {
            id: &r.id,
            outcome: r.outcome,
            detail: r.reason.render(&r.id, &Commands),
            event_id: r.event_id.as_deref(),
            target: r.target.as_deref(),
            plan_id: r.plan_id.as_deref(),
        }
    }

    /// The one text line of the report.
    pub fn line(&self) -> String {
        dlq::sanitize::line(&format!("{}: {} ({})", self.id, self.outcome, self.detail))
            .into_owned()
    }
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
        let rows = store.summaries(&[id.to_string()]).await?;
        Ok(match rows.first() {
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
                format!("{prefix}{}", unavailable_words(row, store.now().await?)),
            ),
        })
    }

    /// The step as a history entry.
    pub fn history(
        &self,
        operator: &str,
        action: HistoryAction,
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
        action: HistoryAction,
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
        Format::Table | Format::Wide | Format::Markdown | Format::Tsv => {
            // One line per report: a newline in the detail (it can quote stored text)
            // must not start a line that looks like another report.
            ctx.out
                .report_line(&r.id, &r.outcome.to_string(), &r.detail);
            let mut s = String::new();
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
    let view = ItemView::of(r);
    match ctx.format {
        Format::Json => ctx.out.json(&view),
        _ => ctx
            .out
            .report_line(view.id, &view.outcome.to_string(), &view.detail),
    }
    r.outcome.exit_code()
}

/// A change an operator applies to a selection (`discard`, `restore`).
pub struct Change {
    /// The history action, also the prompt's verb (`discard`).
    pub action: HistoryAction,
    /// The state a row must be in (`pending` for a discard).
    pub from: State,
    /// What the change means, for the prompt ("never replayed until restored").
    pub meaning: &'static str,
    pub done: Outcome,
    pub not_done: Outcome,
    /// The report and history detail of a row changed.
    pub detail: String,
    /// Rows whose change ends elsewhere than `detail` says, with what to say instead.
    pub detail_of: std::collections::HashMap<String, String>,
    /// What a row not changed reports, before why it is unavailable.
    pub refused: &'static str,
    pub plan_id: Option<String>,
}

impl Change {
    /// The report and history detail of `id`, once changed.
    fn detail_for(&self, id: &str) -> String {
        self.detail_of.get(id).unwrap_or(&self.detail).to_string()
    }
}

/// The flow `discard` and `restore` share: nothing to do, ask on a terminal (or take
/// `--yes`), then [`apply_change`]. `note` is the operator's reason, shown at the prompt.
#[allow(clippy::too_many_arguments)]
pub async fn confirm_and_apply<F, Fut>(
    ctx: &Ctx,
    store: &dyn Store,
    operator: &str,
    sel: &Selection,
    consent: Consent,
    note: &str,
    change: &Change,
    act: F,
) -> Result<u8>
where
    F: FnMut(Vec<String>, Vec<NewHistory>) -> Fut,
    Fut: std::future::Future<Output = dlq::error::Result<Applied>>,
{
    let (verb, from) = (change.action.as_str(), change.from.as_str());
    if sel.ids.is_empty() {
        say(&format!("no {from} dead letters match; nothing to {verb}"));
        return Ok(dlq::exit::OK);
    }
    if require_consent(ctx, consent, verb)? {
        let what = match sel.single {
            true => sel.ids[0].clone(),
            false => format!("{} dead letters", thousands(sel.ids.len() as i64)),
        };
        say(&format!(
            "About to {verb} {what} ({}): {note}",
            change.meaning
        ));
        say(&format!("  database:        {}", ctx.database_url()?));
        if !sel.single {
            super::output::say_lines(&super::breakdown::lines(store, &sel.ids).await?);
        }
        let mut question = verb.to_string();
        question[..1].make_ascii_uppercase();
        if !confirm(ctx, &format!("{question}?")).await? {
            let declined = "declined at the prompt; nothing was changed";
            if sel.single {
                let r = StepReport::new(&sel.ids[0], change.not_done, declined);
                return Ok(emit(ctx, &r));
            }
            say("declined; nothing was changed");
            return Ok(dlq::exit::NOT_DONE);
        }
    }
    apply_change(ctx, store, operator, sel, change, act).await
}

/// What a store step did to a chunk of rows: the rows it changed, and what to say of
/// those it left as they were for a reason of their own (else why each is unavailable).
#[derive(Default)]
pub struct Applied {
    pub changed: Vec<String>,
    pub refused: std::collections::HashMap<String, String>,
}

impl From<Vec<String>> for Applied {
    fn from(changed: Vec<String>) -> Self {
        Applied {
            changed,
            ..Applied::default()
        }
    }
}

/// The report of a row `change` left as it was: not found, or why it is unavailable.
async fn refusal(store: &dyn Store, id: &str, change: &Change) -> Result<StepReport> {
    Ok(match store.summaries(&[id.to_string()]).await?.first() {
        None => StepReport::new(
            id,
            Outcome::NotFound,
            format!("no dead letter with id {id:?}"),
        ),
        Some(row) => {
            let why = match (row.state, row.id_storage) {
                (State::Pending, IdStorage::Text) => "it is pending".to_string(),
                _ => unavailable_words(row, store.now().await?),
            };
            StepReport::new(id, change.not_done, format!("{}{why}", change.refused))
        }
    })
}

/// Applies `act` (the store step, which records the history of the rows it changes) to
/// `ids` a thousand at a time, records the refusals, prints one report per row (JSON
/// lines for a selection) and returns the exit code of the worst.
pub async fn apply_change<F, Fut>(
    ctx: &Ctx,
    store: &dyn Store,
    operator: &str,
    sel: &Selection,
    change: &Change,
    mut act: F,
) -> Result<u8>
where
    F: FnMut(Vec<String>, Vec<NewHistory>) -> Fut,
    Fut: std::future::Future<Output = dlq::error::Result<Applied>>,
{
    let mut worst: Option<Outcome> = None;
    let mut changed_total = 0usize;
    let (ids, single) = (&sel.ids, sel.single);
    for chunk in ids.chunks(1000) {
        let entries: Vec<NewHistory> = chunk
            .iter()
            .map(|id| {
                let mut h = StepReport::new(id, change.done, change.detail_for(id)).history(
                    operator,
                    change.action,
                    None,
                );
                h.plan_id = change.plan_id.clone();
                h
            })
            .collect();
        let applied = act(chunk.to_vec(), entries).await?;
        let changed: std::collections::HashSet<&String> = applied.changed.iter().collect();
        changed_total += changed.len();
        for id in chunk {
            let report = if changed.contains(id) {
                StepReport::new(id, change.done, change.detail_for(id))
            } else {
                let r = match applied.refused.get(id) {
                    Some(why) => StepReport::new(id, change.not_done, why.as_str()),
                    // The rows changed are committed: report them whatever this read does.
                    None => refusal(store, id, change).await.unwrap_or_else(|e| {
                        let why = format!(
                            "{}: why could not be read ({e}); `dlq show {id}` says its state",
                            change.not_done.as_str()
                        );
                        StepReport::new(id, change.not_done, why)
                    }),
                };
                r.record(store, operator, change.action, None).await;
                r
            };
            match (single, ctx.format) {
                (false, Format::Json) => ctx.out.json_line(&report),
                _ => {
                    emit(ctx, &report);
                }
            }
            if worst.is_none_or(|w| report.outcome.severity() > w.severity()) {
                worst = Some(report.outcome);
            }
        }
    }
    if !single {
        say(&format!(
            "{} {} of {} dead letters",
            change.done,
            thousands(changed_total as i64),
            thousands(ids.len() as i64)
        ));
    }
    Ok(worst.map(|o| o.exit_code()).unwrap_or(dlq::exit::OK))
}
