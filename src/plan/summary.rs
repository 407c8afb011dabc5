//! A plan run's summary: counts per outcome, why it stopped, and the worst outcome, whose
//! code is the exit code (one rule for both, so they can never disagree).

use crate::model::Outcome;
use serde::Serialize;
use std::collections::BTreeMap;

/// Why a run stopped early: the contract's `stopped` values.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    MaxFailures,
    CameBack,
    Interrupted,
    /// The run could go no further: see [`Unavailable`] for what was gone.
    Unavailable,
}

/// What made a run [`StopReason::Unavailable`] (`unavailable` in the summary).
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum Unavailable {
    /// The database, past the settle timeout (or a claim that could not be made).
    Database,
    /// No node of the broker answers.
    Broker,
    /// A publish did not complete and the link is still up: stopping so that nothing
    /// queued here goes out later.
    PublishStalled,
    /// The ready count of the target queue (`--max-target-depth`) could not be read.
    TargetQueue,
}

#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    pub plan_id: String,
    pub total: usize,
    pub done: usize,
    pub counts: BTreeMap<String, usize>,
    pub stopped: Option<StopReason>,
    /// With `stopped: unavailable`: what was gone.
    pub unavailable: Option<Unavailable>,
    pub stop_detail: Option<String>,
    /// Items the run did not get to (counted as `not_replayed` too).
    pub not_reached: usize,
    /// The outcome whose code is the exit code.
    pub worst: Option<Outcome>,
    /// How many times a connection moved to another node of the cluster.
    pub node_switches: usize,
}

impl RunSummary {
    /// Whether anything of this run reached, or may have reached, a queue.
    pub fn anything_out(&self) -> bool {
        [Outcome::Replayed, Outcome::Uncertain]
            .iter()
            .any(|o| self.counts.get(o.as_str()).is_some_and(|n| *n > 0))
    }

    /// The run's worst outcome, whose code is the exit code. An interrupted run is
    /// `interrupted` (130) only when nothing went out; otherwise its worst outcome,
    /// counting the items it did not get to as `not_replayed` (never "nothing was sent"
    /// when something was).
    pub fn worst_outcome(&self) -> Option<Outcome> {
        let seen = |o: Outcome| self.counts.get(o.as_str()).is_some_and(|n| *n > 0);
        let interrupted =
            self.stopped == Some(StopReason::Interrupted) || seen(Outcome::Interrupted);
        if interrupted && !self.anything_out() {
            return Some(Outcome::Interrupted);
        }
        let mut worst = Outcome::ALL
            .into_iter()
            .filter(|o| *o != Outcome::Interrupted && seen(*o))
            .max_by_key(|o| o.severity());
        let cut_short = interrupted || (self.stopped.is_some() && self.done < self.total);
        if cut_short && worst.is_none_or(|w| w.severity() < Outcome::NotReplayed.severity()) {
            worst = Some(Outcome::NotReplayed);
        }
        worst
    }

    pub fn exit_code(&self) -> u8 {
        self.worst_outcome()
            .map(|o| o.exit_code())
            .unwrap_or(crate::exit::OK)
    }

    /// Says why the run stopped, unless an earlier reason was said.
    pub(super) fn stop(&mut self, why: StopReason, detail: String) {
        if self.stopped.is_none() {
            self.stopped = Some(why);
            self.stop_detail = Some(detail);
        }
    }

    /// Stops as `unavailable` because `what` was gone (the first thing found gone stays).
    pub(super) fn stop_unavailable(&mut self, what: Unavailable, detail: String) {
        self.unavailable.get_or_insert(what);
        self.stop(StopReason::Unavailable, detail);
    }

    /// The end of a run: the items not reached count as `not_replayed`, and `worst` is
    /// the outcome of the exit code.
    pub(super) fn close(&mut self) {
        self.not_reached = self.total.saturating_sub(self.done);
        if self.not_reached > 0 {
            *self
                .counts
                .entry(Outcome::NotReplayed.as_str().into())
                .or_default() += self.not_reached;
        }
        self.worst = self.worst_outcome();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(
        stopped: Option<StopReason>,
        done: usize,
        counts: &[(Outcome, usize)],
    ) -> RunSummary {
        RunSummary {
            plan_id: "p".into(),
            total: 10,
            done,
            counts: counts
                .iter()
                .map(|(o, n)| (o.as_str().to_string(), *n))
                .collect(),
            stopped,
            unavailable: None,
            stop_detail: None,
            not_reached: 0,
            worst: None,
            node_switches: 0,
        }
    }

    #[test]
    fn worst_is_the_outcome_of_the_exit_code() {
        use Outcome::*;
        // Once broke: SIGINT after some replays gave `"worst": "interrupted"`, exit 3.
        let mut s = summary(
            Some(StopReason::Interrupted),
            6,
            &[(Replayed, 5), (Interrupted, 1)],
        );
        s.close();
        assert_eq!(s.worst, Some(NotReplayed));
        assert_eq!(s.exit_code(), 3);
        assert_eq!(s.not_reached, 4);
        assert_eq!(s.counts["not_replayed"], 4);
        let mut s = summary(Some(StopReason::Interrupted), 2, &[(Interrupted, 2)]);
        s.close();
        assert_eq!((s.worst, s.exit_code()), (Some(Interrupted), 130));
        let mut s = summary(None, 10, &[(Replayed, 10)]);
        s.close();
        assert_eq!((s.worst, s.exit_code()), (Some(Replayed), 0));
        let mut s = summary(
            Some(StopReason::Unavailable),
            3,
            &[(Replayed, 2), (Uncertain, 1)],
        );
        s.close();
        assert_eq!((s.worst, s.exit_code()), (Some(Uncertain), 6));
    }

    #[test]
    fn exit_codes_of_a_run() {
        use Outcome::*;
        let int = Some(StopReason::Interrupted);
        assert_eq!(summary(None, 10, &[(Replayed, 10)]).exit_code(), 0);
        assert_eq!(
            summary(int.clone(), 3, &[(Interrupted, 3)]).exit_code(),
            130
        );
        assert_eq!(summary(None, 10, &[(Interrupted, 10)]).exit_code(), 130);
        // Something went out: never 130.
        assert_eq!(summary(int.clone(), 5, &[(Replayed, 5)]).exit_code(), 3);
        assert_eq!(
            summary(int.clone(), 6, &[(Replayed, 5), (Interrupted, 1)]).exit_code(),
            3
        );
        assert_eq!(
            summary(int, 6, &[(Replayed, 4), (Uncertain, 1), (Interrupted, 1)]).exit_code(),
            6
        );
        let max = Some(StopReason::MaxFailures);
        assert_eq!(
            summary(max, 4, &[(PublishFailed, 3), (Replayed, 1)]).exit_code(),
            5
        );
        assert_eq!(
            summary(None, 10, &[(Replayed, 9), (NotFound, 1)]).exit_code(),
            4
        );
    }
}
