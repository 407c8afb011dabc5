//! `aggregate` from the per-group counts a store keeps as rows are written (PostgreSQL:
//! migration `20261203000300_rollup`), so that a whole table of millions answers from
//! thousands of rows (issue 24).
//!
//! The counts hold every column a group can be keyed by and the state a row has without
//! the clock; a filter on anything else (a time window, a state, a content filter) reads
//! the rows themselves, as does a store without counts. A claim's lease ends with time,
//! not with a write: rows whose claim is recorded are few, and are read one bucket at a
//! time to tell a live lease (claimed) from a lapsed one (pending).

use super::decode::group;
use super::{all, where_sql, Backend, Dialect, Sql};
use crate::error::Result;
use crate::model::{Dimension, Filter, Group, State};
use async_trait::async_trait;

/// A store that keeps the counts; `fold` makes them ready to read.
#[async_trait]
pub trait Rollup: Send + Sync {
    async fn fold(&self) -> Result<Fold>;
}

/// What [`Rollup::fold`] found.
pub enum Fold {
    /// The counts can be read (folded, or as the deltas left them: the read sums both).
    Ready,
    /// They cannot be read here (a schema without them, a role that may not read them):
    /// the rows are read instead.
    Unavailable,
}

impl Fold {
    pub fn readable(readable: bool) -> Fold {
        if readable {
            Fold::Ready
        } else {
            Fold::Unavailable
        }
    }
}

/// The bucket columns of the counts (each also a column of `dead_letters`).
const KEYS: &str = "reason, eff_producer, eff_schema_version, source_queue, eff_error_class";

/// The groups, or `None` when the counts cannot answer this filter.
pub(super) async fn aggregate<B: Backend>(
    b: &B,
    dims: &[Dimension],
    filter: &Filter,
) -> Result<Option<Vec<Group>>> {
    let Some(rollup) = b.rollup() else {
        return Ok(None);
    };
    let Some(keys) = keys_only(filter) else {
        return Ok(None);
    };
    if let Fold::Unavailable = rollup.fold().await? {
        return Ok(None);
    }
    let mut qb = query::<B::Db>(dims, &keys).into_builder();
    all(b, &mut qb, |row| group::<B::Db>(row, dims))
        .await
        .map(Some)
}

/// The filter when it selects by bucket columns only.
fn keys_only(f: &Filter) -> Option<Filter> {
    let keys = Filter {
        reason: f.reason.clone(),
        producer: f.producer.clone(),
        schema_version: f.schema_version.clone(),
        source_queue: f.source_queue.clone(),
        ..Filter::default()
    };
    (keys == *f).then_some(keys)
}

/// The column (or bucket) of the counts a dimension groups by.
fn dimension(d: Dimension) -> &'static str {
    match d {
        Dimension::Reason => "reason",
        Dimension::Producer => "eff_producer",
        Dimension::SchemaVersion => "eff_schema_version",
        Dimension::SourceQueue => "source_queue",
        Dimension::ErrorClass => "eff_error_class",
        Dimension::Hour => "hour",
        Dimension::Day => "date_trunc('day', hour)",
    }
}

/// For each bucket of the CTE `b`, `inner` over its rows of `dead_letters` where `cond`,
/// selected as `what` (of `m`): one index range (reason, time) per bucket, whatever the
/// planner guesses of their number.
fn per_bucket(b: &str, inner: &str, cond: &str, what: &str) -> String {
    format!(
        "SELECT b.reason, b.eff_producer, b.eff_schema_version, b.source_queue, \
           b.eff_error_class, b.hour, {what} FROM {b} b CROSS JOIN LATERAL (SELECT {inner} \
         FROM dead_letters d WHERE d.reason = b.reason \
           AND d.dead_lettered_at >= b.hour AND d.dead_lettered_at <= b.hour + interval '1 hour' \
           AND dlq_rollup_hour(d.dead_lettered_at) = b.hour \
           AND (d.eff_producer, d.eff_schema_version, d.source_queue, d.eff_error_class) \
               IS NOT DISTINCT FROM \
               (b.eff_producer, b.eff_schema_version, b.source_queue, b.eff_error_class) \
           AND {cond}) AS m"
    )
}

fn query<D: Dialect>(dims: &[Dimension], keys: &Filter) -> Sql {
    let claimed = super::state_of::<D>(State::Claimed);
    let columns = format!("{KEYS}, hour, state, n, first_seen, last_seen, stale");
    let mut sql = Sql::new(format!(
        "WITH c AS (SELECT {columns} FROM dead_letter_rollup"
    ));
    sql.append(where_sql::<D>(keys));
    sql.push(format!(
        " UNION ALL SELECT {columns} FROM dead_letter_rollup_delta"
    ));
    sql.append(where_sql::<D>(keys));
    // The times of a bucket a row left are read again from its rows, until a fold has;
    // a bucket with a recorded claim has its live leases counted (claimed, not pending).
    sql.push(format!(
        "), stale AS (SELECT DISTINCT {KEYS}, hour FROM c WHERE stale), \
         leased AS (SELECT {KEYS}, hour FROM c WHERE state = 'leased' \
           GROUP BY {KEYS}, hour HAVING sum(n) > 0), \
         times AS ({}), live AS ({}), \
         u AS (SELECT c.reason, c.eff_producer, c.eff_schema_version, c.source_queue, \
           c.eff_error_class, c.hour, c.state, c.n, \
           CASE WHEN s.hour IS NULL THEN c.first_seen END AS first_seen, \
           CASE WHEN s.hour IS NULL THEN c.last_seen END AS last_seen \
           FROM c LEFT JOIN stale s ON s.reason = c.reason AND s.hour = c.hour \
            AND (s.eff_producer, s.eff_schema_version, s.source_queue, s.eff_error_class) \
                IS NOT DISTINCT FROM \
                (c.eff_producer, c.eff_schema_version, c.source_queue, c.eff_error_class) \
           UNION ALL SELECT * FROM times UNION ALL SELECT * FROM live) SELECT ",
        per_bucket(
            "stale",
            "min(d.dead_lettered_at) AS f, max(d.dead_lettered_at) AS l",
            "true",
            "'times' AS state, CAST(0 AS BIGINT) AS n, m.f AS first_seen, m.l AS last_seen",
        ),
        per_bucket(
            "leased",
            "count(*) AS n",
            &claimed,
            "'claimed' AS state, m.n, CAST(NULL AS timestamptz) AS first_seen, \
             CAST(NULL AS timestamptz) AS last_seen",
        ),
    ));
    let sum = |cond: &str| format!("CAST(COALESCE(sum(n) FILTER (WHERE {cond}), 0) AS BIGINT)");
    let mut columns: Vec<String> = dims
        .iter()
        .enumerate()
        .map(|(i, d)| format!("{} AS k{i}", dimension(*d)))
        .collect();
    columns.extend([
        format!("{} AS n", sum("state <> 'claimed'")),
        format!(
            "{} - {} AS pending",
            sum("state IN ('open', 'leased')"),
            sum("state = 'claimed'")
        ),
        format!("{} AS claimed", sum("state = 'claimed'")),
        format!("{} AS uncertain", sum("state = 'uncertain'")),
        format!("{} AS replayed", sum("state = 'replayed'")),
        format!("{} AS discarded", sum("state = 'discarded'")),
        "min(first_seen) AS first_seen, max(last_seen) AS last_seen".into(),
    ]);
    let positions: Vec<String> = (1..=dims.len()).map(|i| i.to_string()).collect();
    sql.push(format!(
        "{} FROM u GROUP BY {1} HAVING sum(n) FILTER (WHERE state <> 'claimed') > 0 \
         ORDER BY {2} DESC, {1}",
        columns.join(", "),
        positions.join(", "),
        dims.len() + 1
    ));
    sql
}
