//! Step 1, the claim: take the `pending` rows (or the rows a claim given to the run
//! holds), read the large bodies that do not come with it, say why each other row is
//! not replayed, and check what was claimed (the reviewed body, a target).

use super::reason::Reason;
use super::retry::{cause_text, retrying, transient, Bounds, Settled, Step};
use super::why::why_unavailable;
use super::{lease_left, resolve_target, Batch, HELD_READ_RETRY};
use crate::error::{DlqError, Result};
use crate::model::{sha256_hex, DeadLetter, HistoryAction, NewHistory, Outcome, State, Summary};
use crate::store::Store;
use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use tokio::time::Instant;

impl<'a> Batch<'a> {
    /// 1. Claim the `pending` rows (or take over a claim taken by `dlq claim`), and say
    ///    why each other one is not replayed.
    pub(super) async fn claim(&mut self, store: &dyn Store) -> Result<()> {
        let ids = self.ids();
        let (rows, unreadable) = match self.opts.token.clone() {
            Some(t) => {
                let asked = Instant::now();
                let rows = store.held(&ids, &t).await?;
                self.lease_end = asked + lease_left(rows.iter().map(|r| (&r.summary, r.db_now)));
                (rows, Vec::new())
            }
            None => self.take(store, &ids).await?,
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
        self.refuse(store, unavailable).await
    }

    /// The claim itself: its rows, and those claimed whose large body could not be read
    /// after it (released).
    async fn take(
        &mut self,
        store: &dyn Store,
        ids: &[String],
    ) -> Result<(Vec<DeadLetter>, Vec<String>)> {
        let asked = Instant::now();
        let lease = format!("lease {}", humantime::format_duration(self.opts.lease));
        let entries: Vec<NewHistory> = ids
            .iter()
            .map(|id| {
                self.entry(
                    id,
                    HistoryAction::Claim,
                    Outcome::Claimed,
                    &lease,
                    &self.token,
                )
            })
            .collect();
        let bounds = self.bounds(Step::Claim, ids.len(), None);
        let claimed = match retrying(bounds, || {
            store.claim(ids, &self.token, self.opts.lease, &entries)
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
        // A large body does not come with the claim (its row locks would last while it is
        // read): such rows are read after it, from rows the lease now holds.
        let (mut rows, mut to_read) = (Vec::new(), Vec::new());
        for c in claimed {
            match c.into_whole() {
                Ok(row) => rows.push(row),
                Err(id) => to_read.push(id),
            }
        }
        match self.read_large(store, &to_read).await {
            Some(large) => rows.extend(large),
            None => return Ok((rows, to_read)),
        }
        Ok((rows, Vec::new()))
    }

    /// Why each row of `unavailable` was not claimed: reported, and recorded (an unknown
    /// ID has no history).
    async fn refuse(&mut self, store: &dyn Store, unavailable: Vec<String>) -> Result<()> {
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
            let Some(row) = found.get(&id) else {
                self.report(&id, Outcome::NotFound, Reason::NotFound);
                continue;
            };
            let why = Reason::Unavailable {
                why: why_unavailable(row, now),
                token_refused: self.opts.token.is_some()
                    && matches!(row.state, State::Claimed | State::Uncertain),
            };
            // An open attempt is uncertain (6) whatever its lease: a rerun right after a
            // crash tells the truth at once. Another live claim: 3.
            let outcome = match row.state {
                State::Uncertain => Outcome::Uncertain,
                _ => Outcome::NotReplayed,
            };
            let e = self.entry(
                &id,
                HistoryAction::Replay,
                outcome,
                &self.words(&id, &why),
                &self.token,
            );
            self.history.push(e);
            self.report(&id, outcome, why);
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
        let cause = match retrying(bounds, || store.held(ids, &self.token)).await {
            Settled::Done(rows) => return Some(rows),
            Settled::Failed(e) => cause_text(&e, &*self.opts.spell),
            Settled::Abandoned => "interrupted".to_string(),
        };
        let token = self.token.clone();
        let why = Reason::BodyUnreadable { cause };
        self.release(store, ids, &token, Outcome::NotReplayed, why)
            .await;
        None
    }

    /// Check each claimed row: the body a person reviewed, a target. Release the others.
    pub(super) async fn check(&mut self, store: &dyn Store) {
        let mut refused = Vec::new();
        for (id, expected) in &self.items {
            let Some(row) = self.rows.get(id) else {
                continue;
            };
            let sha = sha256_hex(&row.body);
            match (expected, resolve_target(&row.summary, self.opts)) {
                (Some(e), _) if !e.eq_ignore_ascii_case(&sha) => refused.push((
                    id.clone(),
                    Reason::BodyChanged {
                        stored: sha,
                        reviewed: e.clone(),
                    },
                )),
                (_, None) => refused.push((id.clone(), Reason::NoTarget)),
                (_, Some(target)) => self.ready.push((id.clone(), target)),
            }
        }
        let token = self.token.clone();
        for (id, why) in refused {
            self.release(store, &[id], &token, Outcome::NotReplayed, why)
                .await;
        }
    }
}
