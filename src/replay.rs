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

mod settle;
mod why;
pub use settle::{cause_text, Notice, Notices, Step, DEFAULT_SETTLE_TIMEOUT};
pub use why::why_unavailable;

use crate::error::{DlqError, Result};
use crate::model::{sha256_hex, DeadLetter, NewHistory, Outcome, State, Summary};
use crate::publisher::{
    replay_headers, to_field_table, unless_stopped, Broker, NoConnection, OutgoingMessage,
    PublishResult, Sent, Target, Turn,
};
use crate::store::{LeaseAfter, Store};
use chrono::{DateTime, Utc};
use serde::Serialize;
use settle::{retrying, transient, Bounds, Settled};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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
        }
    }
}

/// What happened to one item.
#[derive(Debug, Clone, Serialize)]
pub struct ItemReport {
    pub id: String,
    pub outcome: Outcome,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
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

/// What kind of publish result, for settling.
enum Kind {
    Stalled,
    Other,
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

    /// 1. Claim the `pending` rows (or take over a claim taken by `dlq claim`), and say
    ///    why each other one is not replayed.
    async fn claim(&mut self, store: &dyn Store) -> Result<()> {
        let ids = self.ids();
        let asked = Instant::now();
        // A large body does not come with the claim (its row locks would last while it is
        // read): such rows are read after it, from rows the lease now holds.
        let mut unreadable = Vec::new();
        let rows = match &self.opts.token {
            Some(t) => {
                let rows = store.held(&ids, t).await?;
                self.lease_end = asked + lease_left(rows.iter().map(|r| (&r.summary, r.db_now)));
                rows
            }
            None => {
                let lease = format!("lease {}", humantime::format_duration(self.opts.lease));
                let entries: Vec<NewHistory> = ids
                    .iter()
                    .map(|id| self.entry(id, "claim", Outcome::Claimed, &lease, &self.token))
                    .collect();
                let bounds = self.bounds(Step::Claim, ids.len(), None);
                let claimed = match retrying(bounds, || {
                    store.claim(&ids, &self.token, self.opts.lease, &entries)
                })
                .await
                {
                    Settled::Done(c) => c,
                    Settled::Failed(e) => return Err(e),
                    Settled::Abandoned => {
                        return Err(DlqError::other(
                            "interrupted while claiming; nothing was published",
                        ))
                    }
                };
                self.lease_end = asked + lease_left(claimed.iter().map(|c| (&c.summary, c.db_now)));
                let (mut rows, mut to_read) = (Vec::new(), Vec::new());
                for c in claimed {
                    match c.into_whole() {
                        Ok(row) => rows.push(row),
                        Err(id) => to_read.push(id),
                    }
                }
                match self.read_large(store, &to_read).await {
                    Some(large) => rows.extend(large),
                    None => unreadable = to_read,
                }
                rows
            }
        };
        tracing::debug!(
            "claimed {} of {}, lease {}",
            rows.len(),
            ids.len(),
            humantime::format_duration(self.opts.lease)
        );
        self.rows = rows
            .into_iter()
            .map(|r| (r.summary.id.clone(), r))
            .collect();
        let unavailable: Vec<String> = ids
            .into_iter()
            .filter(|id| !self.rows.contains_key(id) && !unreadable.contains(id))
            .collect();
        if unavailable.is_empty() {
            return Ok(());
        }
        let now = store.now().await?;
        // Of two rows shown as one ID, the first (a TEXT id) says why.
        let mut found: HashMap<String, Summary> = HashMap::new();
        for s in store.summaries(&unavailable).await? {
            found.entry(s.id.clone()).or_insert(s);
        }
        for id in unavailable {
            let (outcome, detail) = match found.get(&id) {
                None => (Outcome::NotFound, format!("no dead letter with id {id:?}")),
                Some(row) => {
                    let why = why_unavailable(row, now);
                    let why = match &self.opts.token {
                        Some(_) if row.state == State::Claimed || row.state == State::Uncertain => {
                            format!("the token does not hold it (or was already used): {why}")
                        }
                        _ => why,
                    };
                    // An open attempt is uncertain (6) whatever its lease: a rerun right
                    // after a crash tells the truth at once. Another live claim: 3.
                    let outcome = match row.state {
                        State::Uncertain => Outcome::Uncertain,
                        _ => Outcome::NotReplayed,
                    };
                    (outcome, format!("{why}; nothing was published"))
                }
            };
            if outcome != Outcome::NotFound {
                let e = self.entry(&id, "replay", outcome, &detail, &self.token);
                self.history.push(e);
            }
            self.report(&id, outcome, detail);
        }
        Ok(())
    }

    /// 1b. Read the claimed rows whose body was too large to come with the claim (asking
    ///     again while the database is briefly unavailable). `None`: they could not be
    ///     read and were released (`not_replayed`).
    async fn read_large(&mut self, store: &dyn Store, ids: &[String]) -> Option<Vec<DeadLetter>> {
        if ids.is_empty() {
            return Some(Vec::new());
        }
        // A signal here stops nothing: the attempt step sees it and releases the rows.
        let never = AtomicUsize::new(0);
        let bounds = self.bounds(Step::Claim, ids.len(), Some(self.lease_end));
        let bounds = Bounds {
            until: bounds.until.min(Instant::now() + HELD_READ_RETRY),
            retry: transient,
            interrupts: &never,
            ..bounds
        };
        let held = match retrying(bounds, || store.held(ids, &self.token)).await {
            Settled::Done(rows) => Ok(rows),
            Settled::Failed(e) => Err(cause_text(&e)),
            Settled::Abandoned => Err("interrupted".to_string()),
        };
        match held {
            Ok(rows) => Some(rows),
            Err(e) => {
                let token = self.token.clone();
                let why = format!("its body could not be read ({e}); nothing was published");
                self.release(store, ids, &token, Outcome::NotReplayed, &why)
                    .await;
                None
            }
        }
    }

    /// Check each claimed row: the body a person reviewed, a target. Release the others.
    async fn check(&mut self, store: &dyn Store) {
        let mut refused = Vec::new();
        for (id, expected) in &self.items {
            let Some(row) = self.rows.get(id) else {
                continue;
            };
            let sha = sha256_hex(&row.body);
            match (expected, resolve_target(&row.summary, self.opts)) {
                (Some(e), _) if !e.eq_ignore_ascii_case(&sha) => refused.push((
                    id.clone(),
                    format!("the stored body's sha256 is {sha}, not the reviewed {e}; nothing was published"),
                )),
                (_, None) => refused.push((
                    id.clone(),
                    "no target: the row has no exchange, routing key or source queue; give --routing-key".into(),
                )),
                (_, Some(target)) => self.ready.push((id.clone(), target)),
            }
        }
        let token = self.token.clone();
        for (id, why) in refused {
            self.release(store, &[id], &token, Outcome::NotReplayed, &why)
                .await;
        }
    }

    /// 2 and 3. Connect, wait for this connection's turn, then chunk by chunk: record the
    ///    attempt (swapping the token) and publish what it allowed, paced, never past the
    ///    time the attempt's lease check covered. Returns what was handed to the broker,
    ///    and the turn, held until its confirms are in.
    async fn attempt_and_send(
        &mut self,
        store: &dyn Store,
        broker: &mut Broker,
        stop: &AtomicBool,
    ) -> (Vec<Sent>, Option<Turn>) {
        let mut ready = std::mem::take(&mut self.ready);
        if ready.is_empty() {
            return (Vec::new(), None);
        }
        let connected = broker.connect(stop).await;
        // The turn is taken after the first chunk's attempt is written, so that the
        // attempt's SQL overlaps the other connection's publishing.
        let mut turn = None;
        let token = self.token.clone();
        if let Err(NoConnection::Failed(why)) = &connected {
            let ids: Vec<String> = ready.iter().map(|(id, _)| id.clone()).collect();
            let why = format!("{why}; nothing was published");
            self.release(store, &ids, &token, Outcome::PublishFailed, &why)
                .await;
            return (Vec::new(), None);
        }
        let mut sent = Vec::new();
        while !ready.is_empty() {
            if stop.load(Ordering::SeqCst) || connected.is_err() {
                let ids: Vec<String> = ready.drain(..).map(|(id, _)| id).collect();
                let why = "interrupted before publishing; nothing was published";
                self.release(store, &ids, &token, Outcome::Interrupted, why)
                    .await;
                break;
            }
            let rest = ready.split_off(broker.chunk_len(ready.len()).min(ready.len()));
            let chunk = std::mem::replace(&mut ready, rest);
            if !self
                .send_chunk(store, broker, chunk, &mut sent, &mut turn, stop)
                .await
            {
                let ids: Vec<String> = ready.drain(..).map(|(id, _)| id).collect();
                let why = "not attempted: the database could not record the attempt; nothing was published";
                self.release(store, &ids, &token, Outcome::NotReplayed, why)
                    .await;
            }
        }
        (sent, turn)
    }

    /// One chunk: its attempt, then (once this connection has its turn, if it takes
    /// turns) its publishes. False when the attempt could not be written (the database is
    /// in trouble: the caller stops).
    async fn send_chunk(
        &mut self,
        store: &dyn Store,
        broker: &Broker,
        chunk: Vec<(String, Target)>,
        sent: &mut Vec<Sent>,
        turn: &mut Option<Turn>,
        stop: &AtomicBool,
    ) -> bool {
        let (token, new) = (self.token.clone(), new_token(&self.opts.operator));
        let bytes = chunk.iter().map(|(id, _)| self.rows[id].body.len()).sum();
        let budget = broker.send_budget(chunk.len(), bytes);
        // Waiting for the turn: the other connection's sending and confirm wait.
        let wait_turn = turn.is_none() && broker.takes_turns();
        let allowance = match wait_turn {
            true => broker.confirm_timeout() + budget,
            false => Duration::ZERO,
        };
        let outlive = broker.confirm_timeout() + budget + LEASE_MARGIN + allowance;
        let ids: Vec<String> = chunk.iter().map(|(id, _)| id.clone()).collect();
        let entries: Vec<NewHistory> = chunk
            .iter()
            .map(|(id, t)| {
                let detail = format!("publishing to {t}");
                let mut e = self.entry(id, "attempt", Outcome::Attempted, &detail, &new);
                e.target = Some(t.to_string());
                e
            })
            .collect();
        let started = Instant::now();
        let attempted: HashSet<String> =
            match store.attempt(&ids, &token, &new, outlive, &entries).await {
                Ok(a) => a.into_iter().collect(),
                Err(e) => {
                    // It may have committed: undo with either token (nothing was sent).
                    let why = format!("recording the attempt failed ({e}); nothing was published");
                    self.release(store, &ids, &new, Outcome::NotReplayed, &why)
                        .await;
                    self.release(store, &ids, &token, Outcome::NotReplayed, &why)
                        .await;
                    return false;
                }
            };
        if wait_turn && !attempted.is_empty() {
            *turn = broker.turn(stop).await;
        }
        let publisher = broker.publisher().expect("connected before attempting");
        let mut unsent = Vec::new();
        let skipped: Vec<String> = ids
            .iter()
            .filter(|id| !attempted.contains(*id))
            .cloned()
            .collect();
        let why = format!(
            "not attempted: the lease ends within {} (the confirm wait and sending), or the token no longer holds it; nothing was published",
            humantime::format_duration(outlive)
        );
        self.not_attempted(store, &skipped, &token, &why).await;
        for (id, target) in chunk {
            if !attempted.contains(&id) {
                continue;
            }
            self.attempt_tokens.insert(id.clone(), new.clone());
            if stop.load(Ordering::SeqCst)
                || started.elapsed() > allowance + budget + LEASE_MARGIN / 2
            {
                unsent.push(id);
                continue;
            }
            if unless_stopped(stop, broker.pace()).await.is_none() {
                unsent.push(id);
                continue;
            }
            let row = &self.rows[&id];
            sent.push(
                publisher
                    .send(&id, &target, &build_message(row, &self.opts.operator))
                    .await,
            );
            let detail = "published; awaiting the confirm".to_string();
            self.report(&id, Outcome::Uncertain, detail).target = Some(target.to_string());
        }
        if !unsent.is_empty() {
            let (outcome, why) = if stop.load(Ordering::SeqCst) {
                (
                    Outcome::Interrupted,
                    "interrupted before publishing; nothing was published",
                )
            } else {
                (Outcome::NotReplayed, "sending took longer than the attempt's lease check allowed; nothing was published")
            };
            for id in &unsent {
                self.reports.remove(id);
            }
            self.release(store, &unsent, &new, outcome, why).await;
        }
        true
    }

    /// 4, 5 and 6. Mark what the broker confirmed, release what certainly failed, and
    ///    leave the rest `uncertain`, recording why.
    async fn settle(&mut self, store: &dyn Store, results: Vec<(String, PublishResult)>) {
        let confirmed: Vec<String> = results
            .iter()
            .filter(|(_, r)| *r == PublishResult::Confirmed)
            .map(|(id, _)| id.clone())
            .collect();
        self.mark(store, &confirmed).await;
        for (id, result) in results {
            let token = self.attempt_tokens[&id].clone();
            let result_kind = match result {
                PublishResult::Stalled(_) => Kind::Stalled,
                _ => Kind::Other,
            };
            match result {
                PublishResult::Confirmed => {}
                PublishResult::Failed(why) => {
                    self.release(
                        store,
                        std::slice::from_ref(&id),
                        &token,
                        Outcome::PublishFailed,
                        &why,
                    )
                    .await
                }
                PublishResult::Uncertain(why) | PublishResult::Stalled(why) => {
                    let in_flight = matches!(result_kind, Kind::Stalled);
                    let event = self.rows[&id].summary.event_id.clone();
                    let why = format!(
                        "{why}; check the consumers' receipts for event {}, then `dlq resolve {id} --delivered|--not-delivered`{}",
                        event.as_deref().unwrap_or("(unknown)"),
                        if in_flight { " once its lease has ended" } else { "" }
                    );
                    let lease = if in_flight {
                        LeaseAfter::RunsOut
                    } else {
                        LeaseAfter::EndsNow
                    };
                    self.uncertain(store, &[id], &token, &why, lease).await;
                }
            }
        }
    }

    /// 4. Mark replayed, grouped by token; a confirmed row that cannot be marked stays
    ///    `uncertain`, saying that it WAS published.
    async fn mark(&mut self, store: &dyn Store, confirmed: &[String]) {
        let mut by_token: HashMap<String, Vec<String>> = HashMap::new();
        for id in confirmed {
            let t = self.attempt_tokens[id].clone();
            by_token.entry(t).or_default().push(id.clone());
        }
        for (token, ids) in by_token {
            let entries: Vec<NewHistory> = ids
                .iter()
                .map(|id| {
                    let detail = self.replayed_detail(id);
                    let mut e = self.entry(id, "replay", Outcome::Replayed, &detail, &token);
                    e.target = self.reports[id].target.clone();
                    e
                })
                .collect();
            let result = match &self.gave_up {
                Some(why) => Err(why.clone()),
                None => {
                    let bounds = self.bounds(Step::Mark, ids.len(), None);
                    let r = retrying(bounds, || store.mark_replayed(&ids, &token, &entries)).await;
                    self.settled(r)
                }
            };
            let (mut marked, cause): (HashSet<String>, String) = match result {
                Ok(m) => (
                    m.into_iter().collect(),
                    "the row is no longer held by this replay".into(),
                ),
                Err(e) => (HashSet::new(), e),
            };
            // A mark whose reply was lost and was retried finds the row already marked.
            let unmarked: Vec<String> = ids
                .iter()
                .filter(|i| !marked.contains(*i))
                .cloned()
                .collect();
            if !unmarked.is_empty() && self.gave_up.is_none() {
                if let Ok(rows) = store.summaries(&unmarked).await {
                    marked.extend(
                        rows.into_iter()
                            .filter(|r| r.state == State::Replayed)
                            .map(|r| r.id),
                    );
                }
            }
            tracing::debug!("marked {} of {} replayed", marked.len(), ids.len());
            for id in ids {
                if marked.contains(&id) {
                    let detail = self.replayed_detail(&id);
                    self.report(&id, Outcome::Replayed, detail);
                    continue;
                }
                let why = format!(
                    "published and confirmed by the broker, but the mark could not be written ({cause}): it WAS published; `dlq resolve {id} --delivered`"
                );
                self.uncertain(
                    store,
                    std::slice::from_ref(&id),
                    &token,
                    &why,
                    LeaseAfter::EndsNow,
                )
                .await;
            }
        }
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

    fn replayed_detail(&self, id: &str) -> String {
        let target = self.reports.get(id).and_then(|r| r.target.clone());
        format!(
            "published to {}, confirmed by the broker, marked replayed",
            target.as_deref().unwrap_or("(unknown)")
        )
    }

    /// The report of `id`, set to `outcome` (keeping what is known of it).
    fn report(&mut self, id: &str, outcome: Outcome, detail: String) -> &mut ItemReport {
        let event_id = self.rows.get(id).and_then(|r| r.summary.event_id.clone());
        let r = self
            .reports
            .entry(id.to_string())
            .or_insert_with(|| ItemReport {
                id: id.to_string(),
                outcome,
                detail: String::new(),
                event_id,
                target: None,
                plan_id: self.opts.plan_id.clone(),
            });
        r.outcome = outcome;
        r.detail = detail;
        r
    }

    fn entry(
        &self,
        id: &str,
        action: &'static str,
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
