//! The come-back watch of a plan run: the events the run sent, and the dead letters
//! written since it started, read a page at a time, until one of those events comes back
//! as a new dead letter (the consumer still fails it: the cause is not fixed). The runner
//! looks after every batch and through every wait, and stops on the first.

use crate::error::Result;
use crate::model::Outcome;
use crate::replay::ItemReport;
use crate::store::Store;
use chrono::{DateTime, Utc};
use std::collections::HashSet;

/// What a run watches, and how far it has read.
pub(super) struct Watch {
    /// The last new dead letter read: pages go in (dead_lettered_at, id) order, so each
    /// look reads only what is new.
    after: (DateTime<Utc>, String),
    /// The events this run replayed.
    events: HashSet<String>,
}

/// A new dead letter of an event the run sent.
pub(super) struct CameBack {
    /// The new dead letter.
    pub id: String,
    pub event: String,
}

impl Watch {
    /// Watches the dead letters written after `started`.
    pub(super) fn new(started: DateTime<Utc>) -> Self {
        Watch {
            after: (started, String::new()),
            events: HashSet::new(),
        }
    }

    /// Watches the events of these settled items too.
    pub(super) fn add(&mut self, reports: &[ItemReport]) {
        let replayed = reports
            .iter()
            .filter(|r| r.outcome == Outcome::Replayed)
            .filter_map(|r| r.event_id.clone());
        self.events.extend(replayed);
    }

    /// The first new dead letter, since the last look, of an event this run sent.
    pub(super) async fn came_back(&mut self, store: &dyn Store) -> Result<Option<CameBack>> {
        loop {
            let page = store.dead_lettered_since(&self.after, 1000).await?;
            let full = page.len() == 1000;
            for (id, event, at) in page {
                self.after = (at, id.clone());
                if self.events.contains(&event) {
                    return Ok(Some(CameBack { id, event }));
                }
            }
            if !full {
                return Ok(None);
            }
        }
    }
}
