//! The replay protocol: claim → publish with confirm → mark, or release.
//!
//! [`replay`] is the only code that moves a dead letter to `replayed`; a single `dlq
//! replay ID` is a batch of one and `dlq replay --plan` feeds it batches, so both carry
//! the same guarantees. The order is what makes it safe:
//! - the claim (one conditional UPDATE on the database clock) comes first, so two
//!   operators can never both publish the same row;
//! - the lease is re-checked just before publishing, so a lease that lapsed while a
//!   person read a prompt is never used;
//! - the row is marked only after the broker's ack (and no return), so `replayed`
//!   always means "the broker has it";
//! - a publish that certainly failed releases the claim so the row can be retried; one
//!   whose outcome is unknown keeps it until the lease lapses, so nobody replays it again
//!   at once while the operator checks the consumers' receipts for the event ID.
//!
//! The body and event ID are never changed: consumers deduplicate on the event ID.

use crate::error::Result;
use crate::model::{sha256_hex, DeadLetter, NewHistory, Outcome, Summary};
use crate::publisher::{
    replay_headers, to_field_table, OutgoingMessage, PublishResult, Publisher, PublisherOptions,
    Target,
};
use crate::secret::SecretUrl;
use crate::store::Store;
use chrono::{DateTime, Utc};
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
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

/// The broker connection, opened on first use (or early, in the background) and reopened
/// if it died.
pub struct Broker {
    url: SecretUrl,
    opts: PublisherOptions,
    publisher: Option<Publisher>,
    connecting: Option<tokio::task::JoinHandle<std::result::Result<Publisher, String>>>,
    /// Publishes at most this often (`--rate`), shared by all the brokers of a run.
    pacer: Option<Arc<Pacer>>,
    /// Held from a batch's first publish to its last confirm; see [`Broker::taking_turns`].
    turns: Option<Arc<tokio::sync::Mutex<()>>>,
}

/// A publish rate shared by several connections.
pub struct Pacer(tokio::sync::Mutex<tokio::time::Interval>);

impl Pacer {
    pub fn per_second(rate: f64) -> Arc<Pacer> {
        let mut i = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
        i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Arc::new(Pacer(tokio::sync::Mutex::new(i)))
    }

    async fn wait(&self) {
        self.0.lock().await.tick().await;
    }
}

/// Why there is no connection to publish on.
enum NoConnection {
    Failed(String),
    Interrupted,
}

/// Waits for `fut`, giving up as soon as `interrupted` is set.
async fn unless_interrupted<T>(
    interrupted: &AtomicBool,
    fut: impl std::future::Future<Output = T>,
) -> Option<T> {
    tokio::pin!(fut);
    loop {
        tokio::select! {
            v = &mut fut => return Some(v),
            _ = tokio::time::sleep(Duration::from_millis(25)) => {
                if interrupted.load(Ordering::SeqCst) {
                    return None;
                }
            }
        }
    }
}

impl Broker {
    pub fn new(url: SecretUrl, opts: PublisherOptions, pacer: Option<Arc<Pacer>>) -> Self {
        Broker {
            url,
            opts,
            publisher: None,
            connecting: None,
            pacer,
            turns: None,
        }
    }

    /// Makes this connection take turns with the others sharing `turns`: one batch at a
    /// time is in the broker, from its first publish to its last confirm. RabbitMQ confirms
    /// persistent messages once the queue has stored them and has nothing else to do, so
    /// batches published side by side are confirmed together, and their connections then
    /// run their SQL together while the broker idles. Taking turns, one connection's mark
    /// and next claim overlap another's publishing.
    pub fn taking_turns(mut self, turns: Arc<tokio::sync::Mutex<()>>) -> Self {
        self.turns = Some(turns);
        self
    }

    /// Waits for this connection's turn to publish, if it takes turns; gives up when
    /// interrupted (the caller sees the flag).
    async fn turn(&self, interrupted: &AtomicBool) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        let turns = self.turns.clone()?;
        unless_interrupted(interrupted, turns.lock_owned()).await
    }

    /// Starts connecting in the background, so that the connection is ready when the
    /// claim is. Connecting publishes nothing.
    pub fn connect_early(&mut self) {
        if self.publisher.is_none() && self.connecting.is_none() {
            let (url, opts) = (self.url.clone(), self.opts.clone());
            self.connecting = Some(tokio::spawn(
                async move { Publisher::connect(&url, opts).await },
            ));
        }
    }

    async fn connect(&mut self, interrupted: &AtomicBool) -> std::result::Result<(), NoConnection> {
        if self.publisher.as_ref().is_some_and(|p| !p.is_usable()) {
            if let Some(p) = self.publisher.take() {
                p.close().await;
            }
        }
        if self.publisher.is_some() {
            return Ok(());
        }
        self.connect_early();
        let handle = self.connecting.as_mut().expect("connect_early set it");
        let joined = unless_interrupted(interrupted, handle).await;
        let Some(joined) = joined else {
            return Err(NoConnection::Interrupted);
        };
        self.connecting = None;
        match joined {
            Ok(Ok(p)) => {
                self.publisher = Some(p);
                Ok(())
            }
            Ok(Err(why)) => Err(NoConnection::Failed(why)),
            Err(e) => Err(NoConnection::Failed(format!(
                "connecting to RabbitMQ failed: {e}"
            ))),
        }
    }

    pub async fn close(&mut self) {
        if let Some(h) = self.connecting.take() {
            h.abort();
        }
        if let Some(p) = self.publisher.take() {
            p.close().await;
        }
    }
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
pub fn build_message(row: &DeadLetter, operator: &str) -> OutgoingMessage {
    let headers = replay_headers(
        &row.headers(),
        &row.summary.id,
        &row.summary.reason,
        operator,
    );
    OutgoingMessage {
        body: row.body.clone(),
        headers: to_field_table(&headers),
        message_id: row.summary.event_id.clone(),
    }
}

/// `OPERATOR:UUIDv4`, unguessable.
pub fn new_token(operator: &str) -> String {
    format!("{operator}:{}", uuid::Uuid::new_v4())
}

/// The operator part of a claim token.
pub fn token_operator(token: &str) -> &str {
    token.rsplit_once(':').map(|(op, _)| op).unwrap_or(token)
}

fn fmt_time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Why a row cannot be claimed by the caller (or is no longer theirs), for the operator:
/// who replayed it and when, or who holds the lease and until when.
pub fn why_unavailable(row: &Summary, now: DateTime<Utc>) -> String {
    if let Some(at) = row.replayed_at {
        let by = row
            .replay_claim_owner
            .as_deref()
            .map(token_operator)
            .unwrap_or("unknown");
        return format!("already replayed at {} by {by}", fmt_time(at));
    }
    match (&row.replay_claim_owner, row.replay_claim_expires_at) {
        (Some(owner), Some(until)) if until > now => format!(
            "claimed by {} until {} ({}s left)",
            token_operator(owner),
            fmt_time(until),
            (until - now).num_seconds().max(0)
        ),
        (Some(_), Some(until)) => format!(
            "the claim lapsed at {} (or was taken over)",
            fmt_time(until)
        ),
        _ => "nobody holds a claim on it".into(),
    }
}

/// Below this much lease left (as far as the local clock can tell), the database is asked
/// again before publishing.
const LEASE_MARGIN: Duration = Duration::from_secs(1);

/// Whether `token` holds a live lease on `row`, as of the database time it was read at.
fn holds_live_lease(row: &DeadLetter, token: &str) -> bool {
    let s = &row.summary;
    s.replayed_at.is_none()
        && s.replay_claim_owner.as_deref() == Some(token)
        && s.replay_claim_expires_at
            .is_some_and(|until| until > row.db_now)
}

/// Whether the lease on `row`, read at most `elapsed` ago, is surely still live: the
/// database said how long it had left, the local monotonic clock how much has passed.
fn surely_live(row: &DeadLetter, elapsed: Duration) -> bool {
    let left = row
        .summary
        .replay_claim_expires_at
        .and_then(|until| (until - row.db_now).to_std().ok());
    left.is_some_and(|left| elapsed + LEASE_MARGIN < left)
}

fn replayed_detail(target: &Target) -> String {
    format!("published to {target}, confirmed by the broker, marked replayed")
}

/// The protocol for a batch of items. Returns one report per distinct ID, in input order
/// (an ID given twice is replayed once).
pub async fn replay(
    store: &dyn Store,
    broker: &mut Broker,
    items: &[Item],
    opts: &ReplayOptions,
    interrupted: &AtomicBool,
) -> Result<Vec<ItemReport>> {
    let mut distinct = HashSet::new();
    let items: Vec<&Item> = items.iter().filter(|i| distinct.insert(&i.id)).collect();
    let mut reports: HashMap<String, ItemReport> = HashMap::new();
    let mut history: Vec<NewHistory> = Vec::new();
    let ids: Vec<String> = items.iter().map(|i| i.id.clone()).collect();
    let report = |id: &str, outcome: Outcome, detail: String| ItemReport {
        id: id.to_string(),
        outcome,
        detail,
        event_id: None,
        target: None,
        plan_id: opts.plan_id.clone(),
    };

    // 1. Claim: one conditional UPDATE on the database clock, returning the rows and
    //    recording the claims in the same transaction (or verify a claim taken earlier).
    let started = Instant::now();
    let (token, mine, others) = match &opts.token {
        Some(t) => {
            let (mine, others): (Vec<DeadLetter>, Vec<DeadLetter>) = store
                .load(&ids)
                .await?
                .into_iter()
                .partition(|r| holds_live_lease(r, t));
            (t.clone(), mine, Some(others))
        }
        None => {
            let t = new_token(&opts.operator);
            let lease = format!("lease {}", humantime::format_duration(opts.lease));
            let claims: Vec<NewHistory> = ids
                .iter()
                .map(|id| entry(opts, id, "claim", Outcome::Claimed, &lease, &t, None))
                .collect();
            let mine = store.claim(&ids, &t, opts.lease, &claims).await?;
            (t, mine, None)
        }
    };
    let rows: HashMap<String, DeadLetter> = mine
        .into_iter()
        .map(|r| (r.summary.id.clone(), r))
        .collect();
    match opts.token {
        Some(_) => tracing::debug!("the given token holds {} of {}", rows.len(), ids.len()),
        None => tracing::debug!(
            "claimed {} of {} for {}",
            rows.len(),
            ids.len(),
            humantime::format_duration(opts.lease)
        ),
    }
    let unavailable: Vec<String> = ids
        .iter()
        .filter(|id| !rows.contains_key(id.as_str()))
        .cloned()
        .collect();
    if !unavailable.is_empty() {
        let found: HashMap<String, (Summary, DateTime<Utc>)> = match others {
            Some(others) => others
                .into_iter()
                .map(|r| (r.summary.id.clone(), (r.summary, r.db_now)))
                .collect(),
            None => {
                let now = store.now().await?;
                store
                    .summaries(&unavailable)
                    .await?
                    .into_iter()
                    .map(|s| (s.id.clone(), (s, now)))
                    .collect()
            }
        };
        for id in &unavailable {
            let (outcome, mut detail) = match found.get(id) {
                None => (Outcome::NotFound, format!("no dead letter with id {id:?}")),
                Some((row, now)) => (
                    Outcome::NotReplayed,
                    format!("{}; nothing was published", why_unavailable(row, *now)),
                ),
            };
            if opts.token.is_some() && found.contains_key(id) {
                detail = format!("the token does not hold a live lease on it: {detail}");
            }
            if outcome != Outcome::NotFound {
                history.push(entry(opts, id, "replay", outcome, &detail, &token, None));
            }
            reports.insert(id.clone(), report(id, outcome, detail));
        }
    }

    // 2. Check what was claimed: the reviewed body, a target.
    let mut to_release: Vec<(String, Outcome, String)> = Vec::new();
    let mut ready: Vec<(&DeadLetter, Target)> = Vec::new();
    for item in &items {
        let Some(row) = rows.get(&item.id) else {
            continue;
        };
        let sha = sha256_hex(&row.body);
        match (&item.expected_sha256, resolve_target(&row.summary, opts)) {
            (Some(expected), _) if !expected.eq_ignore_ascii_case(&sha) => to_release.push((
                item.id.clone(),
                Outcome::NotReplayed,
                format!("the stored body's sha256 is {sha}, not the reviewed {expected}; nothing was published"),
            )),
            (_, None) => to_release.push((
                item.id.clone(),
                Outcome::NotReplayed,
                "no target: the row has no exchange, routing key or source queue; give --routing-key".into(),
            )),
            (_, Some(target)) => ready.push((row, target)),
        }
    }

    // 3. Connect (it may have started early) and wait for this connection's turn; then,
    //    just before publishing, stop if asked to and make sure the lease is still live
    //    (asking the database when in doubt).
    let connection = if ready.is_empty() {
        Ok(())
    } else {
        broker.connect(interrupted).await
    };
    let mut turn = None;
    if connection.is_ok() && !ready.is_empty() {
        turn = broker.turn(interrupted).await;
    }
    if interrupted.load(Ordering::SeqCst) || matches!(connection, Err(NoConnection::Interrupted)) {
        for (row, _) in ready.drain(..) {
            to_release.push((
                row.summary.id.clone(),
                Outcome::Interrupted,
                "interrupted before publishing; nothing was published".into(),
            ));
        }
    }
    let elapsed = started.elapsed();
    let doubtful: Vec<String> = ready
        .iter()
        .filter(|(row, _)| !surely_live(row, elapsed))
        .map(|(row, _)| row.summary.id.clone())
        .collect();
    if !doubtful.is_empty() {
        let live: HashSet<String> = store
            .live_leases(&doubtful, &token)
            .await?
            .into_iter()
            .collect();
        let doubtful: HashSet<String> = doubtful.into_iter().collect();
        ready.retain(|(row, _)| {
            let id = &row.summary.id;
            let ok = !doubtful.contains(id) || live.contains(id);
            if !ok {
                let detail =
                    "the lease lapsed before publishing; nothing was published".to_string();
                history.push(entry(
                    opts,
                    id,
                    "replay",
                    Outcome::NotReplayed,
                    &detail,
                    &token,
                    None,
                ));
                reports.insert(id.clone(), report(id, Outcome::NotReplayed, detail));
            }
            ok
        });
    }
    for (id, outcome, detail) in &to_release {
        store
            .release(std::slice::from_ref(id), &token, Some(detail))
            .await?;
        history.push(entry(opts, id, "release", *outcome, detail, &token, None));
        reports.insert(id.clone(), report(id, *outcome, detail.clone()));
    }

    // 4. Publish (mandatory, persistent) and wait for every confirm, bounded. Ctrl-C
    //    while waiting for a confirm makes the outcome uncertain, never a failure.
    let mut results: Vec<(&DeadLetter, Target, PublishResult)> = Vec::new();
    match (connection, broker.publisher.as_ref()) {
        _ if ready.is_empty() => {}
        (Err(NoConnection::Failed(why)), _) => {
            for (row, target) in ready {
                let why = format!("{why}; nothing was published");
                results.push((row, target, PublishResult::Failed(why)));
            }
        }
        (_, None) | (Err(NoConnection::Interrupted), _) => {}
        (Ok(()), Some(p)) => {
            let mut pending = Vec::with_capacity(ready.len());
            for (row, target) in ready {
                if let Some(pacer) = &broker.pacer {
                    pacer.wait().await;
                }
                let sent = p.send(&target, &build_message(row, &opts.operator)).await;
                pending.push((row, target, sent));
            }
            let deadline = Instant::now() + p.confirm_timeout();
            for (row, target, sent) in pending {
                let result = match unless_interrupted(interrupted, p.settle(sent, deadline)).await {
                    Some(r) => r,
                    None => PublishResult::Uncertain(
                        "interrupted after publishing, before the broker's confirm: the message may or may not have been published".into(),
                    ),
                };
                results.push((row, target, result));
            }
        }
    }
    drop(turn);
    if !results.is_empty() {
        let count = |f: fn(&PublishResult) -> bool| results.iter().filter(|r| f(&r.2)).count();
        tracing::debug!(
            "published {}: {} confirmed, {} failed, {} uncertain",
            results.len(),
            count(|r| *r == PublishResult::Confirmed),
            count(|r| matches!(r, PublishResult::Failed(_))),
            count(|r| matches!(r, PublishResult::Uncertain(_)))
        );
    }

    // 5. Mark what the broker confirmed (its history in the same transaction); release
    //    what certainly failed; keep the claim on what is unknown.
    let confirmed: Vec<NewHistory> = results
        .iter()
        .filter(|(_, _, r)| *r == PublishResult::Confirmed)
        .map(|(row, target, _)| {
            let id = &row.summary.id;
            let detail = replayed_detail(target);
            let target = Some(target.to_string());
            entry(
                opts,
                id,
                "replay",
                Outcome::Replayed,
                &detail,
                &token,
                target,
            )
        })
        .collect();
    let marked: std::result::Result<HashSet<String>, String> = if confirmed.is_empty() {
        Ok(HashSet::new())
    } else {
        let ids: Vec<String> = confirmed.iter().map(|e| e.dead_letter_id.clone()).collect();
        match store.mark_replayed(&ids, &token, &confirmed).await {
            Ok(m) => Ok(m.into_iter().collect()),
            Err(e) => Err(e.to_string()),
        }
    };
    if let Ok(m) = &marked {
        tracing::debug!("marked {} of {} replayed", m.len(), confirmed.len());
    }
    for (row, target, result) in results {
        let id = row.summary.id.clone();
        let (outcome, detail) = match result {
            PublishResult::Confirmed => match &marked {
                Ok(m) if m.contains(&id) => (Outcome::Replayed, replayed_detail(&target)),
                Ok(_) => (
                    Outcome::Uncertain,
                    format!("published to {target} and confirmed, but the lease lapsed before it could be marked replayed: it WAS published; check before replaying again"),
                ),
                Err(e) => (
                    Outcome::Uncertain,
                    format!("published to {target} and confirmed, but marking it replayed failed ({e}): it WAS published; check before replaying again"),
                ),
            },
            PublishResult::Failed(why) => {
                let released = store.release(std::slice::from_ref(&id), &token, Some(&why)).await;
                let note = match released {
                    Ok(r) if !r.is_empty() => "claim released",
                    Ok(_) => "the claim had already lapsed",
                    Err(_) => "the claim could not be released (database unreachable) and lapses with its lease",
                };
                (Outcome::PublishFailed, format!("{why}; {note}"))
            }
            PublishResult::Uncertain(why) => {
                let detail = format!("{why}; the claim is kept until its lease lapses: check the consumers' receipts for event {} before acting again", row.summary.event_id.as_deref().unwrap_or("(unknown)"));
                let _ = store.note_uncertain(std::slice::from_ref(&id), &token, &detail).await;
                (Outcome::Uncertain, detail)
            }
        };
        if outcome != Outcome::Replayed {
            // (A replay's entry went in with its mark.)
            history.push(entry(
                opts,
                &id,
                "replay",
                outcome,
                &detail,
                &token,
                Some(target.to_string()),
            ));
        }
        let mut r = report(&id, outcome, detail);
        r.event_id = row.summary.event_id.clone();
        r.target = Some(target.to_string());
        reports.insert(id, r);
    }

    if let Err(e) = store.append_history(&history).await {
        tracing::warn!("could not record the history of this replay: {e}");
    }
    Ok(ids.iter().filter_map(|id| reports.remove(id)).collect())
}

fn entry(
    opts: &ReplayOptions,
    id: &str,
    action: &'static str,
    outcome: Outcome,
    detail: &str,
    token: &str,
    target: Option<String>,
) -> NewHistory {
    NewHistory {
        dead_letter_id: id.to_string(),
        operator: opts.operator.clone(),
        action,
        outcome,
        detail: detail.to_string(),
        token: Some(token.to_string()),
        target,
        plan_id: opts.plan_id.clone(),
    }
}
