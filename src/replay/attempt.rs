//! Steps 2 and 3, the attempt and the publish: chunk by chunk, record the attempt
//! (swapping the token, only while the lease outlives the confirm wait), then hand what
//! it took to the broker, paced, never past the time the attempt's lease check covered.

use super::reason::Reason;
use super::why::why_unavailable;
use super::{build_message, new_token, Batch, LEASE_MARGIN};
use crate::model::{HistoryAction, NewHistory, Outcome, State, Summary};
use crate::publisher::{unless_stopped, Broker, NoConnection, Sent, Target, Turn};
use crate::store::Store;
use chrono::Utc;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// What became of a chunk's attempt.
enum Chunk {
    /// Recorded (for the rows it took), and those rows handed on.
    Attempted,
    /// The attempt could not be written: the database is in trouble, the batch stops.
    NotRecorded,
}

/// How long one chunk may take, from its attempt on.
struct Window {
    /// For waiting on this connection's turn (zero when it has it or takes none).
    allowance: Duration,
    /// For sending the chunk.
    budget: Duration,
    /// What the lease must outlive at the attempt.
    outlive: Duration,
    wait_turn: bool,
}

impl<'a> Batch<'a> {
    /// 2 and 3. Connect, wait for this connection's turn, then chunk by chunk: attempt
    ///    and publish. Returns what was handed to the broker, and the turn, held until
    ///    its confirms are in.
    pub(super) async fn attempt_and_send(
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
        if let Err(NoConnection::Failed(cause)) = &connected {
            let ids: Vec<String> = ready.iter().map(|(id, _)| id.clone()).collect();
            let why = Reason::NoConnection {
                cause: cause.render(&*self.opts.spell),
            };
            self.release(store, &ids, &token, Outcome::PublishFailed, why)
                .await;
            return (Vec::new(), None);
        }
        let mut sent = Vec::new();
        while !ready.is_empty() {
            if stop.load(Ordering::SeqCst) || connected.is_err() {
                let ids: Vec<String> = ready.drain(..).map(|(id, _)| id).collect();
                self.release(
                    store,
                    &ids,
                    &token,
                    Outcome::Interrupted,
                    Reason::Interrupted,
                )
                .await;
                break;
            }
            let rest = ready.split_off(broker.chunk_len(ready.len()).min(ready.len()));
            let chunk = std::mem::replace(&mut ready, rest);
            let done = self
                .send_chunk(store, broker, chunk, &mut sent, &mut turn, stop)
                .await;
            if let Chunk::NotRecorded = done {
                let ids: Vec<String> = ready.drain(..).map(|(id, _)| id).collect();
                let why = Reason::AttemptNotTried;
                self.release(store, &ids, &token, Outcome::NotReplayed, why)
                    .await;
            }
        }
        (sent, turn)
    }

    /// The time a chunk of `chunk` may take, and what its lease must outlive.
    fn window(&self, broker: &Broker, chunk: &[(String, Target)], turn: &Option<Turn>) -> Window {
        let bytes = chunk.iter().map(|(id, _)| self.rows[id].body.len()).sum();
        let budget = broker.send_budget(chunk.len(), bytes);
        // Waiting for the turn: the other connection's sending and confirm wait.
        let wait_turn = turn.is_none() && broker.takes_turns();
        let allowance = match wait_turn {
            true => broker.confirm_timeout() + budget,
            false => Duration::ZERO,
        };
        Window {
            allowance,
            budget,
            outlive: broker.confirm_timeout() + budget + LEASE_MARGIN + allowance,
            wait_turn,
        }
    }

    /// One chunk: its attempt, then (once this connection has its turn, if it takes
    /// turns) its publishes.
    async fn send_chunk(
        &mut self,
        store: &dyn Store,
        broker: &Broker,
        chunk: Vec<(String, Target)>,
        sent: &mut Vec<Sent>,
        turn: &mut Option<Turn>,
        stop: &AtomicBool,
    ) -> Chunk {
        let new = new_token(&self.opts.operator);
        let w = self.window(broker, &chunk, turn);
        let started = Instant::now();
        let Some(attempted) = self.attempt(store, &chunk, &new, w.outlive).await else {
            return Chunk::NotRecorded;
        };
        if w.wait_turn && !attempted.is_empty() {
            *turn = broker.turn(stop).await;
        }
        let (token, ids) = (self.token.clone(), chunk.iter().map(|(id, _)| id.clone()));
        let skipped: Vec<String> = ids.filter(|id| !attempted.contains(id)).collect();
        let why = Reason::LeaseTooShort { outlive: w.outlive };
        self.not_attempted(store, &skipped, &token, why).await;
        let took: Vec<(String, Target)> = chunk
            .into_iter()
            .filter(|(id, _)| attempted.contains(id))
            .collect();
        let deadline = started + w.allowance + w.budget + LEASE_MARGIN / 2;
        self.publish(store, broker, took, &new, deadline, sent, stop)
            .await;
        Chunk::Attempted
    }

    /// 2. Record the attempt of `chunk`, swapping the token for `new`, where the lease
    ///    outlives `outlive`. The rows it took; `None` when it could not be written (its
    ///    rows are released: nothing was sent).
    async fn attempt(
        &mut self,
        store: &dyn Store,
        chunk: &[(String, Target)],
        new: &str,
        outlive: Duration,
    ) -> Option<HashSet<String>> {
        let token = self.token.clone();
        let ids: Vec<String> = chunk.iter().map(|(id, _)| id.clone()).collect();
        let entries: Vec<NewHistory> = chunk
            .iter()
            .map(|(id, t)| {
                let detail = format!("publishing to {t}");
                let mut e =
                    self.entry(id, HistoryAction::Attempt, Outcome::Attempted, &detail, new);
                e.target = Some(t.to_string());
                e
            })
            .collect();
        match store.attempt(&ids, &token, new, outlive, &entries).await {
            Ok(a) => Some(a.into_iter().collect()),
            Err(e) => {
                // It may have committed: undo with either token (nothing was sent).
                let why = Reason::AttemptFailed {
                    cause: e.render(&*self.opts.spell),
                };
                self.release(store, &ids, new, Outcome::NotReplayed, why.clone())
                    .await;
                self.release(store, &ids, &token, Outcome::NotReplayed, why)
                    .await;
                None
            }
        }
    }

    /// 3. Hand the attempted rows to the broker, paced, until `deadline` (the end of
    ///    what the attempt's lease check covered). What is not sent by then, or when a
    ///    signal comes, is released.
    #[allow(clippy::too_many_arguments)]
    async fn publish(
        &mut self,
        store: &dyn Store,
        broker: &Broker,
        took: Vec<(String, Target)>,
        new: &str,
        deadline: Instant,
        sent: &mut Vec<Sent>,
        stop: &AtomicBool,
    ) {
        let publisher = broker.publisher().expect("connected before attempting");
        let mut unsent = Vec::new();
        for (id, target) in took {
            self.attempt_tokens.insert(id.clone(), new.to_string());
            if stop.load(Ordering::SeqCst) || Instant::now() > deadline {
                unsent.push(id);
                continue;
            }
            if unless_stopped(stop, broker.pace()).await.is_none() {
                unsent.push(id);
                continue;
            }
            let message = build_message(&self.rows[&id], &self.opts.operator);
            sent.push(publisher.send(&id, &target, &message).await);
            self.report(&id, Outcome::Uncertain, Reason::AwaitingConfirm)
                .target = Some(target.to_string());
        }
        self.unsent(store, unsent, new, stop).await;
    }

    /// Rows attempted but not sent: released, nothing was published.
    async fn unsent(
        &mut self,
        store: &dyn Store,
        unsent: Vec<String>,
        new: &str,
        stop: &AtomicBool,
    ) {
        if unsent.is_empty() {
            return;
        }
        let (outcome, why) = match stop.load(Ordering::SeqCst) {
            true => (Outcome::Interrupted, Reason::Interrupted),
            false => (Outcome::NotReplayed, Reason::SendTooSlow),
        };
        for id in &unsent {
            self.reports.remove(id);
        }
        self.release(store, &unsent, new, outcome, why).await;
    }

    /// Rows the attempt step did not take (step 2, zero rows): released as
    /// `not_replayed`, unless another run's attempt is open on one now (two holders of one
    /// hand-taken token both passed the claim): that row is `uncertain`, as a claim that
    /// finds an open attempt says, never "not replayed" for what may be out.
    async fn not_attempted(&mut self, store: &dyn Store, ids: &[String], token: &str, why: Reason) {
        if ids.is_empty() {
            return;
        }
        let open: HashMap<String, Summary> = match store.summaries(ids).await {
            Ok(rows) => rows
                .into_iter()
                .filter(|s| s.state == State::Uncertain)
                .map(|s| (s.id.clone(), s))
                .collect(),
            Err(_) => HashMap::new(),
        };
        let now = match open.is_empty() {
            true => Utc::now(),
            false => store.now().await.unwrap_or_else(|_| Utc::now()),
        };
        let mut rest = Vec::new();
        for id in ids {
            let Some(row) = open.get(id) else {
                rest.push(id.clone());
                continue;
            };
            let first = Reason::AttemptedFirst(why_unavailable(row, now));
            let e = self.entry(
                id,
                HistoryAction::Replay,
                Outcome::Uncertain,
                &self.words(id, &first),
                token,
            );
            self.history.push(e);
            self.report(id, Outcome::Uncertain, first);
        }
        self.release(store, &rest, token, Outcome::NotReplayed, why)
            .await;
    }
}
