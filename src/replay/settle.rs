//! Steps 4 to 6, settling what was handed to the broker: mark what it confirmed,
//! release what certainly failed (or was never sent), leave the rest `uncertain` with
//! its [`Reason`]. Each write is retried while the database does not answer
//! ([`super::retry`]); once the database is given up on, later writes are not tried.

use super::reason::{Miss, Reason};
use super::retry::{busy, cause_text, retrying, transient, Bounds, Settled, Step};
use super::{Batch, Notice};
use crate::model::{HistoryAction, NewHistory, Outcome, State};
use crate::publisher::{Judged, PublishResult};
use crate::store::{LeaseAfter, Store};
use std::collections::{HashMap, HashSet};
use tokio::time::Instant;

impl<'a> Batch<'a> {
    /// How a settle write of `rows` rows is retried: for the settle timeout, and never
    /// past `lease` when it needs the lease.
    pub(super) fn bounds(&self, step: Step, rows: usize, lease: Option<Instant>) -> Bounds<'a> {
        let until = Instant::now() + self.opts.settle_timeout;
        Bounds {
            until: lease.map_or(until, |l| l.min(until)),
            interrupts: &self.opts.interrupts,
            notices: &self.opts.notices,
            step,
            rows,
            retry: if step == Step::Claim { busy } else { transient },
        }
    }

    /// What a retried write came to: `Err` with the cause when it did not happen (or
    /// may not have); gives the database up for this batch when it should be.
    pub(super) fn settled<T>(&mut self, r: Settled<T>) -> std::result::Result<T, String> {
        match r {
            Settled::Done(v) => Ok(v),
            Settled::Failed(e) => {
                let cause = cause_text(&e, &*self.opts.spell);
                if transient(&e) {
                    self.gave_up = Some(cause.clone());
                }
                Err(cause)
            }
            Settled::Abandoned => {
                let cause = "interrupted while it was being written".to_string();
                self.gave_up = Some(cause.clone());
                Err(cause)
            }
        }
    }

    /// The end of the batch: say once what could not be recorded.
    pub(super) fn finish(&mut self) {
        if self.not_recorded > 0 {
            let cause = self.gave_up.clone().unwrap_or_default();
            let n = Notice::NotRecorded {
                rows: self.not_recorded,
                cause,
            };
            self.opts.notices.send(&n);
        }
    }

    /// 4, 5 and 6. Mark what the broker confirmed, release what certainly failed, and
    ///    leave the rest `uncertain`, recording why.
    pub(super) async fn settle(&mut self, store: &dyn Store, results: Vec<Judged>) {
        let confirmed: Vec<String> = results
            .iter()
            .filter(|j| j.result == PublishResult::Confirmed)
            .map(|j| j.id.clone())
            .collect();
        self.mark(store, &confirmed).await;
        for Judged {
            id,
            target,
            result,
            nowhere,
        } in results
        {
            let token = self.attempt_tokens[&id].clone();
            let ids = std::slice::from_ref(&id);
            let miss = nowhere.map(|nowhere| Miss { target, nowhere });
            let (cause, in_flight) = match result {
                PublishResult::Confirmed => continue,
                PublishResult::Failed(cause) => {
                    let why = Reason::PublishFailed { cause, miss };
                    self.release(store, ids, &token, Outcome::PublishFailed, why)
                        .await;
                    continue;
                }
                PublishResult::Uncertain(cause) => (cause, false),
                PublishResult::Stalled(cause) => (cause, true),
            };
            let why = Reason::Unconfirmed {
                cause,
                event_id: self.rows[&id].summary.event_id.clone(),
                in_flight,
                miss,
            };
            let lease = match in_flight {
                true => LeaseAfter::RunsOut,
                false => LeaseAfter::EndsNow,
            };
            self.uncertain(store, ids, &token, why, lease).await;
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
                    let detail = self.words(id, &self.replayed(id));
                    let mut e = self.entry(
                        id,
                        HistoryAction::Replay,
                        Outcome::Replayed,
                        &detail,
                        &token,
                    );
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
            let (marked, cause) = self.marked(store, &ids, result).await;
            tracing::debug!("marked {} of {} replayed", marked.len(), ids.len());
            for id in ids {
                if marked.contains(&id) {
                    let why = self.replayed(&id);
                    self.report(&id, Outcome::Replayed, why);
                    continue;
                }
                let why = Reason::MarkFailed {
                    cause: cause.clone(),
                };
                let ids = std::slice::from_ref(&id);
                self.uncertain(store, ids, &token, why, LeaseAfter::EndsNow)
                    .await;
            }
        }
    }

    /// The rows of `ids` that are marked, and why the others are not. A mark whose reply
    /// was lost and was retried finds the row already marked.
    async fn marked(
        &self,
        store: &dyn Store,
        ids: &[String],
        result: Result<Vec<String>, String>,
    ) -> (HashSet<String>, String) {
        let (mut marked, cause): (HashSet<String>, String) = match result {
            Ok(m) => (
                m.into_iter().collect(),
                "the row is no longer held by this replay".into(),
            ),
            Err(e) => (HashSet::new(), e),
        };
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
        (marked, cause)
    }

    fn replayed(&self, id: &str) -> Reason {
        Reason::Replayed {
            target: self.reports.get(id).and_then(|r| r.target.clone()),
        }
    }

    /// 5. Clear lease and attempt: nothing was published.
    pub(super) async fn release(
        &mut self,
        store: &dyn Store,
        ids: &[String],
        token: &str,
        outcome: Outcome,
        why: Reason,
    ) {
        if ids.is_empty() {
            return;
        }
        if self.opts.token.as_deref() == Some(token) {
            // A claim taken by hand (`dlq claim`) stays with its holder: this run did not
            // take it, and nothing was attempted with it.
            let why = Reason::ClaimKept(Box::new(why));
            for id in ids {
                let e = self.entry(
                    id,
                    HistoryAction::Replay,
                    outcome,
                    &self.words(id, &why),
                    token,
                );
                self.history.push(e);
                self.report(id, outcome, why.clone());
            }
            return;
        }
        let words: HashMap<&String, String> =
            ids.iter().map(|id| (id, self.words(id, &why))).collect();
        let entries: Vec<NewHistory> = ids
            .iter()
            .map(|id| self.entry(id, HistoryAction::Release, outcome, &words[id], token))
            .collect();
        let released = match &self.gave_up {
            Some(cause) => Err(cause.clone()),
            None => {
                let error = words.get(&ids[0]).map(String::as_str);
                let bounds = self.bounds(Step::Release, ids.len(), Some(self.lease_end));
                let r = retrying(bounds, || store.release(ids, token, error, &entries)).await;
                self.settled(r)
            }
        };
        for id in ids {
            let why = match &released {
                Ok(r) if r.contains(id) => why.clone(),
                Ok(_) => {
                    // Nothing held it any more (the lease had lapsed): still recorded.
                    let e = self.entry(id, HistoryAction::Replay, outcome, &words[id], token);
                    self.history.push(e);
                    why.clone()
                }
                Err(cause) => Reason::ReleaseNotWritten {
                    why: Box::new(why.clone()),
                    cause: cause.clone(),
                },
            };
            self.report(id, outcome, why);
        }
    }

    /// 6. Keep the attempt, end the lease (unless the message may still be on its way
    ///    out of this process), say what is unknown.
    pub(super) async fn uncertain(
        &mut self,
        store: &dyn Store,
        ids: &[String],
        token: &str,
        why: Reason,
        lease: LeaseAfter,
    ) {
        if ids.is_empty() {
            return;
        }
        let entries: Vec<NewHistory> = ids
            .iter()
            .map(|id| {
                let detail = self.words(id, &why);
                let mut e = self.entry(
                    id,
                    HistoryAction::Replay,
                    Outcome::Uncertain,
                    &detail,
                    token,
                );
                e.target = self.reports.get(id).and_then(|r| r.target.clone());
                e
            })
            .collect();
        let noted = match &self.gave_up {
            Some(cause) => Err(cause.clone()),
            None => {
                let error = entries[0].detail.clone();
                let bounds = self.bounds(Step::Uncertain, ids.len(), None);
                let r = retrying(bounds, || {
                    store.settle_uncertain(ids, token, &error, lease, &entries)
                })
                .await;
                self.settled(r)
            }
        };
        if let Err(e) = noted {
            tracing::debug!("could not record why the outcome is unknown: {e}");
            self.not_recorded += ids.len();
        }
        for id in ids {
            self.report(id, Outcome::Uncertain, why.clone());
        }
    }
}
