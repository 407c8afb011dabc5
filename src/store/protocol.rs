//! The writes that move a row from one state to another (the replay protocol's steps,
//! discard and restore), each written once over the dialect. Each is one guarded UPDATE:
//! its WHERE says which state the row must be in, so of two runs racing for a row exactly
//! one changes it, and the IDs (or rows) it RETURNs are the ones changed. A store runs
//! it with the history of those rows in the same commit ([`WriteDialect::STEP_OPEN`]).
//!
//! The clock is always the database's ([`Dialect::NOW`]): lease ends are compared on one
//! clock, however far apart the hosts of two operators are.

use super::copies::push_no_live_copy;
use super::read::{claimed_columns, Bind, Dialect};
use super::{state_predicate_at, unsettleable, NOT_REVISED};
use crate::model::State;
use sqlx::QueryBuilder;
use std::time::Duration;

/// What the protocol's writes need of a dialect beyond the reads'.
pub(crate) trait WriteDialect: Dialect {
    /// The lease end as SQL of the clock's type.
    const LEASE_END: &'static str;
    /// The test of a token `dlq migrate` gave a v1 claim.
    const V1_TOKEN: &'static str;
    /// Pushed before the UPDATE: the store's way of committing the history with it
    /// (PostgreSQL wraps the UPDATE in a CTE; SQLite runs both in one transaction).
    const STEP_OPEN: &'static str;
    /// Run first in a restore's transaction, before its UPDATE (`None`: the UPDATE alone).
    /// A restore makes a row live again, as an import may: PostgreSQL takes the lock an
    /// import holds from its live-pair check to its COMMIT, so the guard (a new statement,
    /// READ COMMITTED) sees a revision that import brought. SQLite's BEGIN IMMEDIATE
    /// already serialises the restore with the import's commit point.
    const BEFORE_RESTORE: Option<&'static str>;
    /// The earlier of the lease end and now: a lease ended now, never lengthened.
    fn lease_ended_now() -> String;
    /// The clock plus `d`.
    fn push_now_plus(qb: &mut QueryBuilder<'static, Self>, d: Duration);
}

/// An UPDATE of `dead_letters` under construction.
type Update<D> = QueryBuilder<'static, D>;

fn update<D: WriteDialect>(set: &str) -> Update<D> {
    let mut qb = QueryBuilder::new(D::STEP_OPEN);
    qb.push("UPDATE dead_letters SET ");
    qb.push(set);
    qb
}

fn push_where<D: WriteDialect>(qb: &mut Update<D>, ids: &[String]) {
    qb.push(" WHERE ");
    D::push_exact_ids(qb, ids);
}

fn push_text<D: WriteDialect>(qb: &mut Update<D>, sql: &str, value: &str) {
    qb.push(sql);
    D::bind(qb, Bind::Text(value.to_string()));
}

fn push_state<D: WriteDialect>(qb: &mut Update<D>, state: State) {
    qb.push(" AND ");
    qb.push(state_predicate_at(state, D::NOW, D::LEASE_END));
}

/// Step 1: a lease on each pending row, to `token`, until now + `lease`. Returns the
/// claimed rows' columns ([`claimed_columns`]).
pub(crate) fn claim<D: WriteDialect>(ids: &[String], token: &str, lease: Duration) -> Update<D> {
    let mut qb = update::<D>("");
    push_text(&mut qb, "replay_claim_owner = ", token);
    qb.push(", replay_claim_expires_at = ");
    D::push_now_plus(&mut qb, lease);
    push_where(&mut qb, ids);
    push_state(&mut qb, State::Pending);
    qb.push(" RETURNING ");
    qb.push(claimed_columns::<D>());
    qb
}

/// Step 2: the attempt recorded, where `token` holds the row, nothing is open and the
/// lease outlives `outlive`; the token becomes `new_token`. Only these may be published.
pub(crate) fn attempt<D: WriteDialect>(
    ids: &[String],
    token: &str,
    new_token: &str,
    outlive: Duration,
) -> Update<D> {
    let mut qb = update::<D>("replay_attempt_at = ");
    qb.push(D::NOW);
    push_text(&mut qb, ", replay_claim_owner = ", new_token);
    push_where(&mut qb, ids);
    push_text(&mut qb, " AND replay_claim_owner = ", token);
    qb.push(" AND replayed_at IS NULL AND discarded_at IS NULL AND replay_attempt_at IS NULL AND ");
    qb.push(D::LEASE_END);
    qb.push(" > ");
    D::push_now_plus(&mut qb, outlive);
    qb.push(" RETURNING id");
    qb
}

/// Step 4: replayed, where `token` holds an attempted, unreplayed row (after a confirm).
pub(crate) fn mark_replayed<D: WriteDialect>(ids: &[String], token: &str) -> Update<D> {
    let mut qb = update::<D>("replayed_at = ");
    qb.push(D::NOW);
    qb.push(", replay_claim_expires_at = NULL, last_replay_error = NULL");
    push_where(&mut qb, ids);
    push_text(&mut qb, " AND replay_claim_owner = ", token);
    qb.push(" AND replayed_at IS NULL AND replay_attempt_at IS NOT NULL RETURNING id");
    qb
}

/// Step 5: pending again, where `token` holds the row with a live lease (a publish that
/// certainly failed, or none made). An ended lease never clears an attempt.
pub(crate) fn release<D: WriteDialect>(
    ids: &[String],
    token: &str,
    error: Option<&str>,
) -> Update<D> {
    let mut qb = update::<D>(
        "replay_claim_owner = NULL, replay_claim_expires_at = NULL, replay_attempt_at = NULL, \
         last_replay_error = COALESCE(",
    );
    D::bind(&mut qb, Bind::OptText(error.map(str::to_string)));
    qb.push(", last_replay_error)");
    push_where(&mut qb, ids);
    push_text(&mut qb, " AND replay_claim_owner = ", token);
    qb.push(" AND replayed_at IS NULL AND ");
    qb.push(D::LEASE_END);
    qb.push(" > ");
    qb.push(D::NOW);
    qb.push(" RETURNING id");
    qb
}

/// What becomes of the lease of a row left uncertain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseAfter {
    /// Ended now: nothing of this run can still be on its way.
    EndsNow,
    /// Left to run out: the message may still be on its way.
    RunsOut,
}

/// Step 6: the attempt kept (the row stays uncertain), with why.
pub(crate) fn settle_uncertain<D: WriteDialect>(
    ids: &[String],
    token: &str,
    error: &str,
    lease: LeaseAfter,
) -> Update<D> {
    let mut qb = update::<D>("");
    push_text(&mut qb, "last_replay_error = ", error);
    if lease == LeaseAfter::EndsNow {
        qb.push(", replay_claim_expires_at = ");
        qb.push(D::lease_ended_now());
    }
    push_where(&mut qb, ids);
    push_text(&mut qb, " AND replay_claim_owner = ", token);
    qb.push(" AND replayed_at IS NULL AND replay_attempt_at IS NOT NULL RETURNING id");
    qb
}

/// The operator's word on uncertain rows (`dlq resolve`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// The consumers got it: replayed.
    Delivered,
    /// They did not: pending again.
    NotDelivered,
}

/// Step 7: uncertain rows that no run can still settle, decided by an operator.
pub(crate) fn resolve<D: WriteDialect>(ids: &[String], resolution: Resolution) -> Update<D> {
    let mut qb = match resolution {
        Resolution::Delivered => {
            let mut qb = update::<D>("replayed_at = ");
            qb.push(D::NOW);
            qb.push(", replay_claim_expires_at = NULL");
            qb
        }
        Resolution::NotDelivered => update::<D>(
            "replay_attempt_at = NULL, replay_claim_owner = NULL, replay_claim_expires_at = NULL",
        ),
    };
    push_where(&mut qb, ids);
    push_state(&mut qb, State::Uncertain);
    qb.push(" AND ");
    qb.push(unsettleable(D::NOW, D::LEASE_END, D::V1_TOKEN));
    qb.push(" RETURNING id");
    qb
}

/// Pending rows set aside with `note`.
pub(crate) fn discard<D: WriteDialect>(ids: &[String], note: &str) -> Update<D> {
    let mut qb = update::<D>("discarded_at = ");
    qb.push(D::NOW);
    push_text(&mut qb, ", discard_note = ", note);
    push_where(&mut qb, ids);
    push_state(&mut qb, State::Pending);
    qb.push(" RETURNING id");
    qb
}

/// Discarded rows pending again, unless a revision was made of them (its revision
/// carries the event) or another copy of their event is live (or restored with them):
/// both could then be replayed. Run after [`WriteDialect::BEFORE_RESTORE`], in its
/// transaction.
pub(crate) fn restore<D: WriteDialect>(ids: &[String]) -> Update<D> {
    let mut qb = update::<D>("discarded_at = NULL, discard_note = NULL");
    push_where(&mut qb, ids);
    push_state(&mut qb, State::Discarded);
    qb.push(" AND ");
    qb.push(NOT_REVISED);
    qb.push(" AND ");
    push_no_live_copy(&mut qb, ids);
    qb.push(" RETURNING id");
    qb
}
