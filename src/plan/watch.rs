//! The come-back watch of a plan run: the events the run sent, and the dead letters
//! written since it started, read a page at a time, until one of those events comes back
//! as a new dead letter (the consumer still fails it: the cause is not fixed). The runner
//! looks after every batch and through every wait, and stops on the first.
//!
//! "Sent" is what a canary counts ([`pace::sent`]): replayed, or uncertain. An uncertain
//! publish may well have reached the consumer; left unwatched, its coming back would go
//! unseen and the run would go on into a consumer that still fails.

use super::pace;
use crate::error::Result;
use crate::model::Outcome;
use crate::replay::ItemReport;
use crate::spell::{NextStep, Spell};
use crate::store::Store;
use chrono::{DateTime, Utc};
use std::collections::hash_map::Entry;
use std::collections::HashMap;

/// What a run watches, and how far it has read.
pub(super) struct Watch {
    /// The last new dead letter read: pages go in (dead_lettered_at, id) order, so each
    /// look reads only what is new.
    after: (DateTime<Utc>, String),
    /// The events this run sent, each with the item that sent it.
    events: HashMap<String, Sent>,
}

/// The item of the run that sent an event.
#[derive(Debug, Clone)]
struct Sent {
    /// Its dead letter.
    id: String,
    /// `replayed` or `uncertain`.
    outcome: Outcome,
}

/// A new dead letter of an event the run sent.
pub(super) struct CameBack {
    /// The new dead letter.
    id: String,
    event: String,
    sent: Sent,
}

impl Watch {
    /// Watches the dead letters written after `started`.
    pub(super) fn new(started: DateTime<Utc>) -> Self {
        Watch {
            after: (started, String::new()),
            events: HashMap::new(),
        }
    }

    /// Watches the events of these settled items too: each one that went out or may
    /// have. Of two items of one event, a replayed one is kept (it surely went out).
    pub(super) fn add(&mut self, reports: &[ItemReport]) {
        for r in reports.iter().filter(|r| pace::sent(r.outcome)) {
            let Some(event) = &r.event_id else {
                continue;
            };
            let sent = Sent {
                id: r.id.clone(),
                outcome: r.outcome,
            };
            match self.events.entry(event.clone()) {
                Entry::Vacant(e) => _ = e.insert(sent),
                Entry::Occupied(mut e) if r.outcome == Outcome::Replayed => _ = e.insert(sent),
                Entry::Occupied(_) => {}
            }
        }
    }

    /// The first new dead letter, since the last look, of an event this run sent.
    pub(super) async fn came_back(&mut self, store: &dyn Store) -> Result<Option<CameBack>> {
        loop {
            let page = store.dead_lettered_since(&self.after, 1000).await?;
            let full = page.len() == 1000;
            for (id, event, at) in page {
                self.after = (at, id.clone());
                if let Some(sent) = self.events.get(&event) {
                    let sent = sent.clone();
                    return Ok(Some(CameBack { id, event, sent }));
                }
            }
            if !full {
                return Ok(None);
            }
        }
    }
}

impl CameBack {
    /// Why the run stops, spelled by `s`. An uncertain item whose event came back may be
    /// what reached the consumer (or another copy of the event was): the new dead
    /// letter's `x-dead-letter-id` header tells. Its row stays uncertain; the operator
    /// resolves it.
    pub(super) fn detail(&self, s: &dyn Spell) -> String {
        let CameBack { id, event, sent } = self;
        match sent.outcome {
            Outcome::Uncertain => format!(
                "event {event} (dead letter {row}, whose replay was uncertain) came back as new dead letter {id}: the consumer still fails the event; the cause is not fixed; stopping; {row} stays uncertain: if {id}'s x-dead-letter-id header is {row}, that replay did reach the consumer: {next}",
                row = sent.id,
                next = s.next(&NextStep::ResolveDelivered { id: sent.id.clone() }),
            ),
            _ => format!(
                "replayed event {event} came back as new dead letter {id}: the cause is not fixed; stopping"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::Reason;
    use crate::spell::InWords;

    fn report(id: &str, event: &str, outcome: Outcome) -> ItemReport {
        ItemReport {
            id: id.into(),
            outcome,
            reason: Reason::NotFound,
            event_id: Some(event.into()),
            target: None,
            plan_id: None,
        }
    }

    #[test]
    fn what_went_out_or_may_have_is_watched_and_a_replay_wins() {
        let mut w = Watch::new(Utc::now());
        w.add(&[
            report("a", "e1", Outcome::Uncertain),
            report("b", "e2", Outcome::PublishFailed),
            report("c", "e3", Outcome::NotReplayed),
            report("d", "e4", Outcome::Replayed),
        ]);
        let mut watched: Vec<_> = w.events.keys().cloned().collect();
        watched.sort();
        assert_eq!(watched, ["e1", "e4"]);
        // e1 replayed by another item: the detail says "replayed", not "uncertain".
        w.add(&[report("x", "e1", Outcome::Replayed)]);
        w.add(&[report("y", "e1", Outcome::Uncertain)]);
        let sent = w.events["e1"].clone();
        assert_eq!((sent.id.as_str(), sent.outcome), ("x", Outcome::Replayed));
    }

    #[test]
    fn an_uncertain_item_that_came_back_is_said_so() {
        let back = |outcome| CameBack {
            id: "n1".into(),
            event: "e1".into(),
            sent: Sent {
                id: "a".into(),
                outcome,
            },
        };
        let d = back(Outcome::Uncertain).detail(&InWords);
        assert!(d.starts_with("event e1 (dead letter a, whose replay was uncertain) came back as new dead letter n1: the consumer still fails the event"), "{d}");
        assert!(
            d.ends_with(
                "a stays uncertain: if n1's x-dead-letter-id header is a, that replay did reach the consumer: resolve it delivered"
            ),
            "{d}"
        );
        let d = back(Outcome::Replayed).detail(&InWords);
        assert!(
            d.starts_with("replayed event e1 came back as new dead letter n1"),
            "{d}"
        );
    }
}
