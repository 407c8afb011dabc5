//! The replay protocol: claim → attempt → publish with confirm → settle.
//!
//! [`replay`] is the only code that publishes a dead letter; a single `dlq replay ID` is a
//! batch of one and `dlq replay --plan` feeds it batches, so both carry the same promise:
//! a dead letter is never published twice and never marked replayed without a confirm.
//! The order is what keeps it:
//! - **claim**: one conditional UPDATE on the database clock takes only `pending` rows, so
//!   two operators can never both hold one row;
//! - **attempt**: right before the first byte goes to the broker, a second conditional
//!   UPDATE, guarded by the token and by a lease that outlives the confirm wait, records
//!   the attempt and swaps the token. From then on the row is `uncertain` until settled,
//!   whatever its lease does, and the old token can never start another publish;
//! - **publish** (mandatory, persistent) and wait, bounded, for the confirm;
//! - **settle**: mark replayed only after a confirm (retried while the database is busy),
//!   release only when the publish certainly failed, and otherwise leave the row
//!   `uncertain` for an operator to `dlq resolve`.
//!
//! The body and event ID are never changed: consumers deduplicate on the event ID.

mod attempt;
mod claim;
mod reason;
mod retry;
mod settle;
mod why;
pub use reason::{InWords, NextStep, Reason, Spell};
pub use retry::{cause_text, Notice, Notices, Step, DEFAULT_SETTLE_TIMEOUT};
pub use why::{why_unavailable, RowUnavailable};

use crate::error::Result;
use crate::model::{DeadLetter, HistoryAction, NewHistory, Outcome, Summary};
use crate::publisher::{
    as_delivered, replay_headers, to_field_table, Broker, OutgoingMessage, Target,
};
use crate::store::{EventInContent, Store};
use chrono::{DateTime, Utc};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// One dead letter to replay, optionally pinned to a reviewed body.
#[derive(Debug, Clone)]
pub struct Item {
    pub id: String,
    pub expected_sha256: Option<String>,
}

/// How to replay, the same for every item of a batch.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    pub operator: String,
    pub lease: Duration,
    /// A claim taken earlier (`dlq claim`); no new claim is taken.
    pub token: Option<String>,
    pub exchange: Option<String>,
    pub routing_key: Option<String>,
    pub plan_id: Option<String>,
    /// How long a mark, release or note of doubt (and a claim on a busy SQLite file) is
    /// retried while the database does not answer (`--settle-timeout`).
    pub settle_timeout: Duration,
    /// Signals seen (SIGINT, SIGTERM): one that arrives while a write is retried ends
    /// the wait at once, the rows left `uncertain`.
    pub interrupts: Arc<AtomicUsize>,
    /// Where what the operator must hear at once goes.
    pub notices: Notices,
    /// How the next steps are spelled in the reports' and the history's details.
    pub spell: Arc<dyn Spell>,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            operator: String::new(),
            lease: Duration::from_secs(300),
            token: None,
            exchange: None,
            routing_key: None,
            plan_id: None,
            settle_timeout: DEFAULT_SETTLE_TIMEOUT,
            interrupts: Arc::default(),
            notices: Notices::default(),
            spell: Arc::new(InWords),
        }
    }
}

/// What happened to one item: its outcome and why ([`Reason::render`] words it, and
/// [`Reason::next`] says what the operator can do next).
#[derive(Debug, Clone)]
pub struct ItemReport {
    pub id: String,
    pub outcome: Outcome,
    pub reason: Reason,
    pub event_id: Option<String>,
    /// The event IDs its headers or body name that are not `event_id` (a revision made
    /// with `--new-event-id`, a worker's column that differs): stored again, by capture
    /// say, the message comes back under one of these.
    pub event_in_content: EventInContent,
    pub target: Option<String>,
    pub plan_id: Option<String>,
}

/// Where a row's replay goes: the overrides, else the row's exchange and routing key,
/// else the default exchange and the source queue.
pub fn resolve_target(row: &Summary, opts: &ReplayOptions) -> Option<Target> {
    let exchange = opts
        .exchange
        .clone()
        .or_else(|| row.exchange.clone())
        .unwrap_or_default();
    let routing_key = opts
        .routing_key
        .clone()
        .or_else(|| row.routing_key.clone())
        .or_else(|| row.source_queue.clone())?;
    Some(Target {
        exchange,
        routing_key,
    })
}

/// The message a replay publishes for `row`.
pub fn build_message<'a>(row: &'a DeadLetter, operator: &str) -> OutgoingMessage<'a> {
    let headers = replay_headers(
        &row.headers(),
        &row.summary.id,
        &row.summary.reason,
        operator,
    );
    OutgoingMessage {
        body: &row.body,
        headers: to_field_table(&headers),
        message_id: row.summary.event_id.clone(),
    }
}

/// `OPERATOR:UUIDv4`, unguessable.
pub fn new_token(operator: &str) -> String {
    format!("{operator}:{}", uuid::Uuid::new_v4())
}

/// Room between a send and the end of its lease beyond the confirm wait, for the time
/// statements and frames take on the way.
pub const LEASE_MARGIN: Duration = Duration::from_secs(2);

/// The protocol for a batch of items. Returns one report per distinct ID, in input order
/// (an ID given twice is replayed once). An error means the database could not be used
/// before anything was published.
pub async fn replay(
    store: &dyn Store,
    broker: &mut Broker,
    items: &[Item],
    opts: &ReplayOptions,
    stop: &AtomicBool,
) -> Result<Vec<ItemReport>> {
    Ok(replay_batch(store, broker, items, opts, stop)
        .await?
        .reports)
}

/// What a batch came to.
pub struct BatchOutcome {
    pub reports: Vec<ItemReport>,
    /// Why the database was given up on while settling (retried for the settle timeout,
    /// or a signal ended the wait): a run cannot go on.
    pub gave_up: Option<String>,
}

/// [`replay`], also saying whether the database was given up on.
pub async fn replay_batch(
    store: &dyn Store,
    broker: &mut Broker,
    items: &[Item],
    opts: &ReplayOptions,
    stop: &AtomicBool,
) -> Result<BatchOutcome> {
    let mut batch = Batch::new(items, opts);
    batch.claim(store).await?;
    batch.check(store).await;
    let (sent, turn) = batch.attempt_and_send(store, broker, stop).await;
    let results = match broker.publisher() {
        Some(p) if !sent.is_empty() => p.settle(sent, stop).await,
        _ => Vec::new(),
    };
    drop(turn);
    batch.settle(store, results).await;
    batch.record(store).await;
    batch.finish();
    let gave_up = batch.gave_up.clone();
    Ok(BatchOutcome {
        reports: batch.into_reports(),
        gave_up,
    })
}

/// How long `replay` keeps trying to read rows it has just claimed while the database is
/// briefly unavailable, before it releases them (`not_replayed`).
const HELD_READ_RETRY: Duration = Duration::from_secs(10);

/// How long the shortest of these leases still runs, by the database's clock.
fn lease_left<'r>(rows: impl Iterator<Item = (&'r Summary, DateTime<Utc>)>) -> Duration {
    rows.filter_map(|(s, now)| (s.replay_claim_expires_at? - now).to_std().ok())
        .min()
        .unwrap_or_default()
}

/// One batch on its way through the protocol.
struct Batch<'a> {
    opts: &'a ReplayOptions,
    /// Distinct IDs, in input order, with the reviewed body hash.
    items: Vec<(String, Option<String>)>,
    /// The claim token, shared by the batch until its attempt.
    token: String,
    rows: HashMap<String, DeadLetter>,
    /// Claimed and checked, with where each goes.
    ready: Vec<(String, Target)>,
    /// The token each attempted row holds now (swapped at the attempt).
    attempt_tokens: HashMap<String, String>,
    /// Until when (locally) the shortest lease of the batch surely holds.
    lease_end: Instant,
    reports: HashMap<String, ItemReport>,
    /// Entries not written with their step (refusals), appended at the end.
    history: Vec<NewHistory>,
    /// Why the database is given up on for the rest of this batch: a write was retried
    /// for the settle timeout, or a signal ended the wait. Later writes are not tried.
    gave_up: Option<String>,
    /// Rows whose doubt could not be written (said once, with the count).
    not_recorded: usize,
}

impl<'a> Batch<'a> {
    fn new(items: &[Item], opts: &'a ReplayOptions) -> Self {
        let mut distinct = HashSet::new();
        Batch {
            opts,
            items: items
                .iter()
                .filter(|i| distinct.insert(i.id.clone()))
                .map(|i| (i.id.clone(), i.expected_sha256.clone()))
                .collect(),
            token: opts
                .token
                .clone()
                .unwrap_or_else(|| new_token(&opts.operator)),
            rows: HashMap::new(),
            ready: Vec::new(),
            attempt_tokens: HashMap::new(),
            lease_end: Instant::now(),
            reports: HashMap::new(),
            history: Vec::new(),
            gave_up: None,
            not_recorded: 0,
        }
    }

    fn ids(&self) -> Vec<String> {
        self.items.iter().map(|(id, _)| id.clone()).collect()
    }

    /// The refusals' history (the steps wrote their own with them).
    async fn record(&self, store: &dyn Store) {
        if self.gave_up.is_some() || self.history.is_empty() {
            return;
        }
        if let Err(e) = store.append_history(&self.history).await {
            tracing::warn!("could not record the history of this replay: {e}");
        }
    }

    /// The words of `why` for row `id`, as its history entry records them.
    fn words(&self, id: &str, why: &Reason) -> String {
        why.render(id, &*self.opts.spell)
    }

    /// The report of `id`, set to `outcome` (keeping what is known of it).
    fn report(&mut self, id: &str, outcome: Outcome, reason: Reason) -> &mut ItemReport {
        let rows = &self.rows;
        let r = self.reports.entry(id.to_string()).or_insert_with(|| {
            let row = rows.get(id);
            let event_id = row.and_then(|r| r.summary.event_id.clone());
            // As sent: a consumer that stores it again stores these headers.
            let event_in_content = row
                .map(|r| EventInContent::of(&as_delivered(&r.headers_json), &r.body))
                .unwrap_or_default()
                .other_than(event_id.as_deref());
            ItemReport {
                id: id.to_string(),
                outcome,
                reason: Reason::NotFound,
                event_id,
                event_in_content,
                target: None,
                plan_id: self.opts.plan_id.clone(),
            }
        });
        r.outcome = outcome;
        r.reason = reason;
        r
    }

    fn entry(
        &self,
        id: &str,
        action: HistoryAction,
        outcome: Outcome,
        detail: &str,
        token: &str,
    ) -> NewHistory {
        NewHistory {
            dead_letter_id: id.to_string(),
            operator: self.opts.operator.clone(),
            action,
            outcome,
            detail: detail.to_string(),
            token: Some(token.to_string()),
            target: None,
            plan_id: self.opts.plan_id.clone(),
        }
    }

    fn into_reports(mut self) -> Vec<ItemReport> {
        self.items
            .iter()
            .filter_map(|(id, _)| self.reports.remove(id))
            .collect()
    }
}
