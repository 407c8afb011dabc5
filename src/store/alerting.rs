//! The reads behind `dlq metrics` and `dlq check`: what an alert needs, in a few cheap
//! statements whatever the size of the table, since a scrape that outlasts its timeout
//! says nothing at the moment (a flood) the alert matters.
//!
//! The rows per state of each reason/producer pair and its oldest pending row come, on
//! PostgreSQL, from the per-group counts the store keeps for `aggregate` (the read side's
//! `rollup`, which reads only the few rows the counts cannot tell); SQLite keeps no
//! counts, and a filter the counts cannot answer (a state, a content filter, an event)
//! or a role that may not read them has the rows read: one `GROUP BY reason,
//! eff_producer` (both indexed, both short texts) that counts every state and finds the
//! oldest pending row in one pass. Both answer alike, to the row and the microsecond. One
//! `GROUP BY outcome` over the history counts the settled replays. States are the
//! store's own rule (`read::state_of`), never spelled here, so a change of that rule
//! reaches the alerts too.

use super::read::{
    all, kept_pair_counts, required, state_of, text, where_sql, Backend, Dialect, Reads, Sql,
    TimeCol,
};
use crate::error::Result;
use crate::model::{Filter, Outcome, State};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::QueryBuilder;

/// The history outcomes `dlq_replay_outcomes_total` counts: how replays ended.
pub const REPLAY_OUTCOMES: [Outcome; 3] = [
    Outcome::Replayed,
    Outcome::PublishFailed,
    Outcome::Uncertain,
];

/// The rows of one reason/producer pair.
#[derive(Debug, Clone, PartialEq)]
pub struct PairCounts {
    pub reason: String,
    /// `None`: the row names no producer.
    pub producer: Option<String>,
    /// Rows per state, in [`State::ALL`] order.
    pub by_state: [i64; 5],
    /// When the oldest pending row was dead-lettered (`None`: none is pending).
    pub oldest_pending: Option<DateTime<Utc>>,
}

impl PairCounts {
    pub fn count(&self, state: State) -> i64 {
        let i = State::ALL.iter().position(|s| *s == state).unwrap_or(0);
        self.by_state[i]
    }

    pub fn total(&self) -> i64 {
        self.by_state.iter().sum()
    }
}

/// What the alerts read, at one moment of the database clock.
#[derive(Debug, Clone)]
pub struct Gauges {
    /// The database's clock when read: ages are measured against it.
    pub now: DateTime<Utc>,
    /// Largest pair first (then by reason and producer).
    pub pairs: Vec<PairCounts>,
    /// Entries of the history per outcome of [`REPLAY_OUTCOMES`], zeros included.
    pub outcomes: Vec<(Outcome, i64)>,
}

impl Gauges {
    pub fn total(&self, state: State) -> i64 {
        self.pairs.iter().map(|p| p.count(state)).sum()
    }

    /// The age of the oldest pending row of all pairs (`None`: nothing is pending).
    pub fn oldest_pending_age(&self) -> Option<std::time::Duration> {
        self.pairs
            .iter()
            .filter_map(|p| p.oldest_pending)
            .min()
            .map(|t| age(self.now, t))
    }
}

/// `reads` within `limit` on the client's clock too: a database that stops answering
/// mid-statement (a cut network) never lets its server-side timeout reach the client.
pub async fn bounded<T>(
    limit: std::time::Duration,
    reads: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    tokio::time::timeout(limit, reads)
        .await
        .unwrap_or_else(|_| {
            Err(crate::error::DlqError::Unavailable {
                what: "statement timed out".into(),
                source: None,
            })
        })
}

/// How long before `now` `t` was; zero for a time ahead of the clock.
pub fn age(now: DateTime<Utc>, t: DateTime<Utc>) -> std::time::Duration {
    (now - t).to_std().unwrap_or_default()
}

#[async_trait]
pub trait AlertReads: Send + Sync {
    /// The counts per reason/producer pair and per replay outcome of the rows that
    /// match `filter` (the history of those rows only, when it selects some).
    async fn gauges(&self, filter: &Filter) -> Result<Gauges>;
}

#[async_trait]
impl<B: Backend> AlertReads for B {
    async fn gauges(&self, filter: &Filter) -> Result<Gauges> {
        let now = self.now().await?;
        let pairs = pair_counts(self, filter).await?;
        let outcomes = outcome_counts(self, filter).await?;
        Ok(Gauges {
            now,
            pairs,
            outcomes,
        })
    }
}

async fn pair_counts<B: Backend>(b: &B, filter: &Filter) -> Result<Vec<PairCounts>> {
    let sql = match kept_pair_counts(b, filter).await? {
        Some(sql) => sql,
        None => scanned_pair_counts::<B::Db>(filter),
    };
    let mut qb = sql.into_builder();
    let mut pairs = all(b, &mut qb, |row| {
        let mut by_state = [0i64; 5];
        for (i, st) in State::ALL.iter().enumerate() {
            by_state[i] = B::Db::int(row, st.as_str())?;
        }
        Ok(PairCounts {
            reason: required(text::<B::Db>(row, "reason")?, "reason")?,
            producer: text::<B::Db>(row, "producer")?,
            by_state,
            oldest_pending: B::Db::time(row, "oldest_pending")?,
        })
    })
    .await?;
    pairs.sort_by(|a, b| {
        b.total()
            .cmp(&a.total())
            .then_with(|| a.reason.cmp(&b.reason))
            .then_with(|| a.producer.cmp(&b.producer))
    });
    Ok(pairs)
}

/// The pair counts from a pass over the rows that match `filter`.
fn scanned_pair_counts<D: Dialect>(filter: &Filter) -> Sql {
    let mut columns: Vec<String> = State::ALL
        .iter()
        .map(|st| {
            let p = state_of::<D>(*st);
            format!("count(CASE WHEN {p} THEN 1 END) AS {}", st.as_str())
        })
        .collect();
    // Times through the dialect: on SQLite a worker's TEXT time is read like dlq's own.
    columns.push(format!(
        "min(CASE WHEN {} THEN {} END) AS oldest_pending",
        state_of::<D>(State::Pending),
        D::at(TimeCol::DeadLetteredAt)
    ));
    let mut sql = Sql::new(format!(
        "SELECT reason, eff_producer AS producer, {} FROM dead_letters",
        columns.join(", ")
    ));
    sql.append(where_sql::<D>(filter));
    sql.push(" GROUP BY reason, eff_producer");
    sql
}

async fn outcome_counts<B: Backend>(b: &B, filter: &Filter) -> Result<Vec<(Outcome, i64)>> {
    let mut qb: QueryBuilder<'static, B::Db> = QueryBuilder::new("");
    for (i, o) in REPLAY_OUTCOMES.iter().enumerate() {
        // Literals, not parameters: the planner matches them with the partial index
        // `dead_letter_history_outcome_idx` (migration 20261202000400), one count each.
        qb.push(format!(
            "{}SELECT '{o}' AS outcome, count(*) AS n FROM dead_letter_history \
             WHERE outcome = '{o}'{}",
            if i == 0 { "" } else { " UNION ALL " },
            settled_only(*o),
            o = o.as_str(),
        ));
        if *filter != Filter::default() {
            // The history of the selected rows only; unfiltered, no second pass over them.
            qb.push(" AND dead_letter_id IN (SELECT id FROM dead_letters");
            super::read::push_where(&mut qb, filter);
            qb.push(")");
        }
    }
    let found = all(b, &mut qb, |row| {
        Ok((
            required(text::<B::Db>(row, "outcome")?, "outcome")?,
            B::Db::int(row, "n")?,
        ))
    })
    .await?;
    Ok(REPLAY_OUTCOMES
        .iter()
        .map(|o| {
            let n = found
                .iter()
                .filter(|(name, _)| name == o.as_str())
                .map(|(_, n)| n)
                .sum();
            (*o, n)
        })
        .collect())
}

/// One entry per replay that ended so. A run that sent the row names its target; a run
/// that finds a row already `uncertain` (or attempted by another run first) sent nothing
/// and names none: its entry counts only as the first record of that doubt since the
/// row's last attempt (the run that sent it could not write its own: killed, or cut from
/// the database after the confirm).
fn settled_only(o: Outcome) -> &'static str {
    match o {
        Outcome::Uncertain => {
            " AND (target IS NOT NULL OR NOT EXISTS (SELECT 1 FROM dead_letter_history p \
             WHERE p.dead_letter_id = dead_letter_history.dead_letter_id \
             AND p.seq < dead_letter_history.seq AND p.outcome = 'uncertain' \
             AND NOT EXISTS (SELECT 1 FROM dead_letter_history a \
             WHERE a.dead_letter_id = p.dead_letter_id AND a.action = 'attempt' \
             AND a.seq > p.seq AND a.seq < dead_letter_history.seq)))"
        }
        _ => "",
    }
}

/// What `dlq check` compares with its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    Pending,
    /// In whole seconds.
    OldestPendingAge,
    Uncertain,
}

impl Check {
    /// The name in `check -o json`, the key of the same value at the top level.
    pub fn as_str(self) -> &'static str {
        match self {
            Check::Pending => "pending",
            Check::OldestPendingAge => "oldest_pending_age_seconds",
            Check::Uncertain => "uncertain",
        }
    }
}

/// The limits of `dlq check`; `None`: not checked.
#[derive(Debug, Clone, Default)]
pub struct Limits {
    pub max_pending: Option<i64>,
    pub max_age: Option<std::time::Duration>,
    pub max_uncertain: Option<i64>,
}

/// A value over its limit (an age in whole seconds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Breach {
    pub check: Check,
    pub value: i64,
    pub max: i64,
}

/// The limits `gauges` exceed, in the order pending, age, uncertain.
pub fn breaches(gauges: &Gauges, limits: &Limits) -> Vec<Breach> {
    let secs = |d: std::time::Duration| i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
    let age = gauges.oldest_pending_age().map(secs);
    [
        (
            Check::Pending,
            Some(gauges.total(State::Pending)),
            limits.max_pending,
        ),
        (Check::OldestPendingAge, age, limits.max_age.map(secs)),
        (
            Check::Uncertain,
            Some(gauges.total(State::Uncertain)),
            limits.max_uncertain,
        ),
    ]
    .into_iter()
    .filter_map(|(check, value, max)| match (value, max) {
        (Some(value), Some(max)) if value > max => Some(Breach { check, value, max }),
        _ => None,
    })
    .collect()
}
