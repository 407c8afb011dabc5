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

use crate::error::Result;
use crate::model::{sha256_hex, DeadLetter, NewHistory, Outcome, State, Summary};
use crate::publisher::{
    replay_headers, to_field_table, unless_stopped, Broker, NoConnection, OutgoingMessage,
    PublishResult, Sent, Target, Turn,
};
use crate::store::{is_transient, Store};
use chrono::{DateTime, Utc};
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
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

fn fmt_time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Why a row cannot be claimed (or is no longer the caller's), for the operator.
pub fn why_unavailable(row: &Summary, now: DateTime<Utc>) -> String {
    let by = row.replay_claim_owner.as_deref().unwrap_or("unknown");
    match row.state {
        State::Replayed => format!(
            "already replayed at {} by {by}",
            row.replayed_at.map(fmt_time).unwrap_or_default()
        ),
        State::Discarded => format!(
            "discarded at {}: {}",
            row.discarded_at.map(fmt_time).unwrap_or_default(),
            row.discard_note.as_deref().unwrap_or("")
        ),
        State::Uncertain => format!(
            "uncertain: a replay by {by} at {} may have published it ({}); check the consumers, then `dlq resolve`",
            row.replay_attempt_at.map(fmt_time).unwrap_or_default(),
            row.last_replay_error.as_deref().unwrap_or("outcome unknown")
        ),
        State::Claimed => {
            let until = row.replay_claim_expires_at.unwrap_or(now);
            let left = (until - now).num_seconds().max(0);
            match row.replay_attempt_at {
                Some(at) => format!(
                    "a replay by {by} is publishing it (attempt at {}; lease until {}, {left}s left)",
                    fmt_time(at),
                    fmt_time(until)
                ),
                None => format!("claimed by {by} until {} ({left}s left)", fmt_time(until)),
            }
        }
        State::Pending => "nobody holds a claim on it".into(),
    }
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
    let mut batch = Batch::new(items, opts);
    batch.claim(store).await?;
    batch.check(store).await;
    let (sent, turn) = batch.attempt_and_send(store, broker, stop).await;
    let results = match broker.publisher() {
        Some(p) if !sent.is_empty() => p.settle(sent, stop).await,
        _ => Vec::new(),
    };
    drop(turn);
    batch.settle(store, results, stop).await;
    batch.record(store).await;
    Ok(batch.into_reports())
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
                let claimed = store
                    .claim(&ids, &self.token, self.opts.lease, &entries)
                    .await?;
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
        let found: HashMap<String, Summary> = store
            .summaries(&unavailable)
            .await?
            .into_iter()
            .map(|s| (s.id.clone(), s))
            .collect();
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
                    // A replay still in flight holds a live lease (another live claim: 3);
                    // once its lease has ended an open attempt is uncertain (6).
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
        let until = self.lease_end.min(Instant::now() + HELD_READ_RETRY);
        let held = retrying(until, &AtomicBool::new(false), || {
            store.held(ids, &self.token)
        })
        .await;
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
        for (id, target) in chunk {
            if !attempted.contains(&id) {
                let why = format!(
                    "not attempted: the lease ends within {} (the confirm wait and sending), or the token no longer holds it; nothing was published",
                    humantime::format_duration(outlive)
                );
                self.release(
                    store,
                    std::slice::from_ref(&id),
                    &token,
                    Outcome::NotReplayed,
                    &why,
                )
                .await;
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
    async fn settle(
        &mut self,
        store: &dyn Store,
        results: Vec<(String, PublishResult)>,
        stop: &AtomicBool,
    ) {
        let confirmed: Vec<String> = results
            .iter()
            .filter(|(_, r)| *r == PublishResult::Confirmed)
            .map(|(id, _)| id.clone())
            .collect();
        self.mark(store, &confirmed, stop).await;
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
                    self.uncertain(store, &[id], &token, &why, !in_flight, stop)
                        .await;
                }
            }
        }
    }

    /// 4. Mark replayed, grouped by token; a confirmed row that cannot be marked stays
    ///    `uncertain`, saying that it WAS published.
    async fn mark(&mut self, store: &dyn Store, confirmed: &[String], stop: &AtomicBool) {
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
            let result = retrying(self.lease_end, stop, || {
                store.mark_replayed(&ids, &token, &entries)
            })
            .await;
            let (mut marked, cause): (HashSet<String>, String) = match result {
                Ok(m) => (
                    m.into_iter().collect(),
                    "the row is no longer held by this replay".into(),
                ),
                Err(e) => (HashSet::new(), e.to_string()),
            };
            // A mark whose reply was lost and was retried finds the row already marked.
            let unmarked: Vec<String> = ids
                .iter()
                .filter(|i| !marked.contains(*i))
                .cloned()
                .collect();
            if !unmarked.is_empty() {
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
                self.uncertain(store, std::slice::from_ref(&id), &token, &why, true, stop)
                    .await;
            }
        }
    }

    /// 5. Clear lease and attempt: nothing was published.
    async fn release(
        &mut self,
        store: &dyn Store,
        ids: &[String],
        token: &str,
        outcome: Outcome,
        why: &str,
    ) {
        if ids.is_empty() {
            return;
        }
        if self.opts.token.as_deref() == Some(token) {
            // A claim taken by hand (`dlq claim`) stays with its holder: this run did not
            // take it, and nothing was attempted with it.
            let why = format!("{why}; the claim given with --token stays held until its lease ends (`dlq release` gives it back)");
            for id in ids {
                let e = self.entry(id, "replay", outcome, &why, token);
                self.history.push(e);
                self.report(id, outcome, why.clone());
            }
            return;
        }
        let entries: Vec<NewHistory> = ids
            .iter()
            .map(|id| self.entry(id, "release", outcome, why, token))
            .collect();
        let released = retrying(self.lease_end, &AtomicBool::new(false), || {
            store.release(ids, token, Some(why), &entries)
        })
        .await;
        for id in ids {
            let note = match &released {
                Ok(r) if r.contains(id) => String::new(),
                Ok(_) => {
                    // Nothing held it any more (the lease had lapsed): still recorded.
                    let e = self.entry(id, "replay", outcome, why, token);
                    self.history.push(e);
                    String::new()
                }
                Err(e) => format!(
                    "; the release could not be written ({e}): if it shows uncertain, nothing was published: `dlq resolve {id} --not-delivered`"
                ),
            };
            self.report(id, outcome, format!("{why}{note}"));
        }
    }

    /// 6. Keep the attempt, end the lease (unless the message may still be on its way
    ///    out of this process), say what is unknown.
    async fn uncertain(
        &mut self,
        store: &dyn Store,
        ids: &[String],
        token: &str,
        why: &str,
        end_lease: bool,
        stop: &AtomicBool,
    ) {
        let entries: Vec<NewHistory> = ids
            .iter()
            .map(|id| {
                let mut e = self.entry(id, "replay", Outcome::Uncertain, why, token);
                e.target = self.reports.get(id).and_then(|r| r.target.clone());
                e
            })
            .collect();
        let noted = retrying(self.lease_end, stop, || {
            store.settle_uncertain(ids, token, why, end_lease, &entries)
        })
        .await;
        if let Err(e) = noted {
            tracing::warn!("could not record why the outcome is unknown: {e}");
        }
        for id in ids {
            self.report(id, Outcome::Uncertain, why.to_string());
        }
    }

    /// The refusals' history (the steps wrote their own with them).
    async fn record(&self, store: &dyn Store) {
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

/// Runs a protocol write until it succeeds, a non-transient error, `stop`, or `until`
/// (the lease end): a busy or briefly unreachable database must not turn a confirmed
/// publish into doubt. The writes are token-guarded and idempotent, so a retry after a
/// lost reply is safe. At least one try.
async fn retrying<T, F, Fut>(until: Instant, stop: &AtomicBool, mut op: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut pause = Duration::from_millis(50);
    loop {
        match op().await {
            Err(e)
                if is_transient(&e)
                    && !stop.load(Ordering::SeqCst)
                    && Instant::now() + pause < until =>
            {
                tracing::debug!("retrying in {pause:?}: {e}");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
            r => return r,
        }
    }
}
