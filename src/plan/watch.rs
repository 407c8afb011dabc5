//! The come-back watch of a plan run: what the run sent, and the dead letters written
//! since it started, read a page at a time, until one of them is a message the run sent
//! coming back (the consumer still fails it: the cause is not fixed). The runner looks
//! after every batch and through every wait, and stops on the first. Pages go in time
//! order, and a row can be stored after a newer one was read: before the canary passes,
//! and every few seconds, the whole window is swept by event and header.
//!
//! A new dead letter is this run's message coming back when its `x-dead-letter-id`
//! header names a row the run sent (a consumer that keeps the headers of what it
//! dead-letters says so exactly, also for a row with no event ID), or when it carries the
//! event ID of one (another copy of the event matches too: it is the event the consumer
//! still fails either way), or the event ID its headers or body name: stored again with
//! no `event_id` column (as capture stores it), a message comes back under that one.
//!
//! "Sent" is what went out or may have ([`pace::sent`]): replayed, or uncertain. An
//! uncertain publish may well have reached the consumer; left unwatched, its coming back
//! would go unseen and the run would go on into a consumer that still fails.

use super::pace;
use crate::error::Result;
use crate::model::Outcome;
use crate::replay::ItemReport;
use crate::spell::{NextStep, Spell};
use crate::store::{HeaderSweep, NewArrival, Store};
use chrono::{DateTime, Utc};
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// What a run watches, and how far it has read.
pub(super) struct Watch {
    /// The start of the window: the run's start less [`BEFORE_START`].
    since: DateTime<Utc>,
    /// When the window was last swept ([`Watch::swept`]).
    swept_at: Instant,
    /// The last new dead letter read: pages go in (dead_lettered_at, id) order, so each
    /// look reads only what is new.
    after: (DateTime<Utc>, String),
    /// The rows this run sent, by ID.
    rows: HashMap<String, Sent>,
    /// The events this run sent, each with the item that sent it.
    events: HashMap<String, Sent>,
}

/// The item of the run that sent a message.
#[derive(Debug, Clone)]
struct Sent {
    /// Its dead letter.
    id: String,
    event: Option<String>,
    /// `replayed` or `uncertain`.
    outcome: Outcome,
}

/// How a new dead letter was known for a message the run sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Known {
    /// Its `x-dead-letter-id` header names the row: this run's message, exactly.
    ByHeader,
    /// Its event ID is the row's: this message, or another copy of the event.
    ByEvent,
}

/// A new dead letter of a message the run sent.
pub(super) struct CameBack {
    /// The new dead letter.
    id: String,
    sent: Sent,
    known: Known,
}

/// How far before the run's start the watch reads: a broker's `x-death` time, which
/// capture stores, is whole seconds by the broker's clock, so a message the run sent
/// and dead-lettered in its first second was stamped before the database's start.
const BEFORE_START: chrono::Duration = chrono::Duration::seconds(5);

/// How often a look sweeps the whole window too, for come-backs stored after a newer
/// row was read: a probe of the event index per few hundred events sent.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// At most this many pages of 1,000 new dead letters a look.
const PAGES_PER_LOOK: usize = 10;

impl Watch {
    /// Watches the dead letters written after `started` (less [`BEFORE_START`]).
    pub(super) fn new(started: DateTime<Utc>) -> Self {
        Watch {
            since: started - BEFORE_START,
            swept_at: Instant::now(),
            after: (started - BEFORE_START, String::new()),
            rows: HashMap::new(),
            events: HashMap::new(),
        }
    }

    /// Watches these settled items too: each one that went out or may have. Of two items
    /// of one event, a replayed one is kept (it surely went out).
    pub(super) fn add(&mut self, reports: &[ItemReport]) {
        for r in reports.iter().filter(|r| pace::sent(r.outcome)) {
            let sent = Sent {
                id: r.id.clone(),
                event: r.event_id.clone(),
                outcome: r.outcome,
            };
            self.rows.insert(r.id.clone(), sent.clone());
            for event in r.event_id.iter().chain(r.event_in_content.ids()) {
                match self.events.entry(event.clone()) {
                    Entry::Vacant(e) => _ = e.insert(sent.clone()),
                    Entry::Occupied(mut e) if r.outcome == Outcome::Replayed => {
                        _ = e.insert(sent.clone())
                    }
                    Entry::Occupied(_) => {}
                }
            }
        }
    }

    /// The first new dead letter, since the last look, of a message this run sent; every
    /// [`SWEEP_EVERY`], any stored late in the whole window too.
    pub(super) async fn came_back(&mut self, store: &dyn Store) -> Result<Option<CameBack>> {
        // Bounded: in a flood that outpaces the reads, the next look goes on from here
        // (and a sweep finds what the pages have not reached).
        for _ in 0..PAGES_PER_LOOK {
            let page = store.dead_lettered_since(&self.after, 1000).await?;
            let full = page.len() == 1000;
            for arrival in page {
                self.after = (arrival.at, arrival.id.clone());
                if let Some(back) = self.known(arrival) {
                    return Ok(Some(back));
                }
            }
            if !full {
                break;
            }
        }
        if self.swept_at.elapsed() < SWEEP_EVERY {
            return Ok(None);
        }
        self.swept_at = Instant::now();
        self.swept(store).await
    }

    /// Every come-back of what the run sent so far, however late it was stored: the
    /// pages of [`Watch::came_back`] go in time order, so a row stored after a newer one
    /// was read (a capture behind its queue stamps the broker's time) is found only here.
    /// Read before the canary lets the rest go out, and every [`SWEEP_EVERY`].
    pub(super) async fn swept(&self, store: &dyn Store) -> Result<Option<CameBack>> {
        let events: Vec<String> = self.events.keys().cloned().collect();
        let by_header = self.rows.values().any(|sent| sent.event.is_none());
        let headers = if by_header {
            HeaderSweep::Window
        } else {
            HeaderSweep::NotNeeded
        };
        let arrivals = store.came_back_among(self.since, &events, headers).await?;
        Ok(arrivals.into_iter().find_map(|a| self.known(a)))
    }

    /// Whether a new dead letter is a message this run sent: by its header first. A row
    /// the run sent itself (read again: it was written just before the start) is not.
    fn known(&self, a: NewArrival) -> Option<CameBack> {
        if self.rows.contains_key(&a.id) {
            return None;
        }
        let by_header = a.replayed_from.as_ref().and_then(|r| self.rows.get(r));
        let (sent, known) = match by_header {
            Some(sent) => (sent, Known::ByHeader),
            None => (self.events.get(a.event_id.as_ref()?)?, Known::ByEvent),
        };
        Some(CameBack {
            id: a.id,
            sent: sent.clone(),
            known,
        })
    }
}

impl CameBack {
    /// Why the run stops, spelled by `s`. An uncertain item known by its header was
    /// delivered to its target (and dead-lettered again: by a consumer, a TTL, a length
    /// limit); known by its event only, it may have been (or another copy of the event). Either way its row stays uncertain: the operator resolves it.
    pub(super) fn detail(&self, s: &dyn Spell) -> String {
        let CameBack { id, sent, known } = self;
        let row = &sent.id;
        let what = match &sent.event {
            Some(e) => format!("event {e}"),
            None => format!("dead letter {row}"),
        };
        let resolve = || s.next(&NextStep::ResolveDelivered { id: row.clone() });
        match (sent.outcome, known) {
            (Outcome::Uncertain, Known::ByHeader) => format!(
                "{what} (dead letter {row}, whose replay was uncertain) came back as new dead letter {id}, whose x-dead-letter-id header names {row}: that replay was delivered to its target and dead-lettered again (see {id}'s reason); stopping; {row} stays uncertain: {}",
                resolve()
            ),
            (Outcome::Uncertain, Known::ByEvent) => format!(
                "{what} (dead letter {row}, whose replay was uncertain) came back as new dead letter {id}: the consumer still fails the event; the cause is not fixed; stopping; {row} stays uncertain: if {id}'s x-dead-letter-id header is {row}, that replay was delivered to its target: {}",
                resolve()
            ),
            _ => format!(
                "replayed {what} came back as new dead letter {id}: the cause is not fixed; stopping"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::Reason;
    use crate::spell::InWords;

    fn report(id: &str, event: Option<&str>, outcome: Outcome) -> ItemReport {
        ItemReport {
            id: id.into(),
            outcome,
            reason: Reason::NotFound,
            event_id: event.map(Into::into),
            event_in_content: Default::default(),
            target: None,
            plan_id: None,
        }
    }

    fn arrival(id: &str, event: Option<&str>, from: Option<&str>) -> NewArrival {
        NewArrival {
            id: id.into(),
            event_id: event.map(Into::into),
            replayed_from: from.map(Into::into),
            at: Utc::now(),
        }
    }

    #[test]
    fn what_went_out_or_may_have_is_watched_and_a_replay_wins() {
        let mut w = Watch::new(Utc::now());
        w.add(&[
            report("a", Some("e1"), Outcome::Uncertain),
            report("b", Some("e2"), Outcome::PublishFailed),
            report("c", Some("e3"), Outcome::NotReplayed),
            report("d", Some("e4"), Outcome::Replayed),
            report("f", None, Outcome::Replayed),
        ]);
        let mut watched: Vec<_> = w.events.keys().cloned().collect();
        watched.sort();
        assert_eq!(watched, ["e1", "e4"]);
        let mut rows: Vec<_> = w.rows.keys().cloned().collect();
        rows.sort();
        assert_eq!(rows, ["a", "d", "f"]);
        // e1 replayed by another item: the detail says "replayed", not "uncertain".
        w.add(&[report("x", Some("e1"), Outcome::Replayed)]);
        w.add(&[report("y", Some("e1"), Outcome::Uncertain)]);
        let sent = w.events["e1"].clone();
        assert_eq!((sent.id.as_str(), sent.outcome), ("x", Outcome::Replayed));
    }

    /// Once broke: a row with no event ID was never watched, so a canary of such rows
    /// always passed; a header naming the row is known first, whatever the event.
    #[test]
    fn a_new_dead_letter_is_known_by_its_header_then_by_its_event() {
        let mut w = Watch::new(Utc::now());
        w.add(&[
            report("a", Some("e1"), Outcome::Uncertain),
            report("f", None, Outcome::Replayed),
        ]);
        let known = |a| w.known(a).map(|b| (b.sent.id, b.known));
        assert_eq!(
            known(arrival("n1", None, Some("f"))),
            Some(("f".into(), Known::ByHeader))
        );
        assert_eq!(
            known(arrival("n2", Some("e1"), None)),
            Some(("a".into(), Known::ByEvent))
        );
        assert_eq!(
            known(arrival("n3", Some("e9"), Some("a"))),
            Some(("a".into(), Known::ByHeader))
        );
        assert_eq!(known(arrival("n4", Some("e9"), Some("zz"))), None);
        assert_eq!(known(arrival("n5", None, None)), None);
    }

    #[test]
    fn an_uncertain_item_that_came_back_is_said_so() {
        let back = |outcome, known| CameBack {
            id: "n1".into(),
            sent: Sent {
                id: "a".into(),
                event: Some("e1".into()),
                outcome,
            },
            known,
        };
        let d = back(Outcome::Uncertain, Known::ByEvent).detail(&InWords);
        assert!(d.starts_with("event e1 (dead letter a, whose replay was uncertain) came back as new dead letter n1: the consumer still fails the event"), "{d}");
        assert!(
            d.ends_with(
                "a stays uncertain: if n1's x-dead-letter-id header is a, that replay was delivered to its target: resolve it delivered"
            ),
            "{d}"
        );
        let d = back(Outcome::Uncertain, Known::ByHeader).detail(&InWords);
        assert!(
            d.contains(
                "whose x-dead-letter-id header names a: that replay was delivered to its target"
            ),
            "{d}"
        );
        let d = back(Outcome::Replayed, Known::ByEvent).detail(&InWords);
        assert!(
            d.starts_with("replayed event e1 came back as new dead letter n1"),
            "{d}"
        );
    }
}
