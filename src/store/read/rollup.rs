//! `aggregate` from the per-group counts a store keeps as rows are written (PostgreSQL:
//! migration `20261203000300_rollup`), so that a whole table of millions answers from
//! thousands of rows (issue 24).
//!
//! The counts hold every column a group can be keyed by, the UTC hour and the state a row
//! has without the clock. A time window is answered from the counts for its whole hours
//! and from the rows for the part of an hour at either end, so `--since 2h` reads at most
//! an hour of rows. A filter on anything else (a state, a content filter) reads the rows
//! themselves, as does a store without counts. A claim's lease ends with time,
//! not with a write: rows whose claim is recorded are few, and are read one bucket at a
//! time to tell a live lease (claimed) from a lapsed one (pending).
//!
//! `dlq metrics` and `dlq check` read the same counts ([`kept_pair_counts`]), so that a
//! scrape in a flood costs what `aggregate` does, not a pass over every row. A bucket's
//! first time is of all its states (a claim or a mark moves a row out of `open` without
//! touching it), so the oldest pending row is read from the rows of one hour per
//! reason/producer pair: the first hour whose counts hold a pending row.

use super::decode::group;
use super::{all, where_sql, Backend, Bind, Dialect, Sql};
use crate::error::Result;
use crate::model::{Dimension, Filter, Group, State};
use async_trait::async_trait;
use chrono::{DateTime, DurationRound, TimeDelta, Utc};

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

/// The bucket columns after `reason` and `eff_producer`.
const BUCKET: [&str; 3] = ["eff_schema_version", "source_queue", "eff_error_class"];

/// A group of `u` with a row in it (a live lease is counted again as `claimed`).
const HAS_ROWS: &str = "sum(n) FILTER (WHERE state <> 'claimed') > 0";

/// The groups, or `None` when the counts cannot answer this filter.
pub(super) async fn aggregate<B: Backend>(
    b: &B,
    dims: &[Dimension],
    filter: &Filter,
) -> Result<Option<Vec<Group>>> {
    let Some(scope) = ready(b, filter).await? else {
        return Ok(None);
    };
    let mut qb = query::<B::Db>(dims, &scope).into_builder();
    all(b, &mut qb, |row| group::<B::Db>(row, dims))
        .await
        .map(Some)
}

/// The statement that counts the rows of `filter` per reason/producer pair, with the
/// columns of the alerts' scan (`store::alerting`): `reason`, `producer`, one per state
/// ([`State::as_str`]) and `oldest_pending`. `None`: the counts cannot answer this filter.
pub(crate) async fn kept_pair_counts<B: Backend>(b: &B, filter: &Filter) -> Result<Option<Sql>> {
    Ok(ready(b, filter)
        .await?
        .map(|scope| pair_query::<B::Db>(&scope)))
}

/// What of `filter` the counts answer, once folded; `None`: the rows are read instead.
async fn ready<B: Backend>(b: &B, filter: &Filter) -> Result<Option<Scope>> {
    let Some(rollup) = b.rollup() else {
        return Ok(None);
    };
    let Some(scope) = Scope::of(filter) else {
        return Ok(None);
    };
    match rollup.fold().await? {
        Fold::Ready => Ok(Some(scope)),
        Fold::Unavailable => Ok(None),
    }
}

/// What of a filter the counts answer: its keys, and the whole hours of its window (the
/// rest of the window, an hour's part at either end, is read from the rows).
struct Scope {
    keys: Filter,
    /// Whole hours from here (the first at or after `--since`).
    from: Option<DateTime<Utc>>,
    /// Whole hours before here (the start of the hour of `--until`).
    to: Option<DateTime<Utc>>,
    /// The windows read from the rows, `[since, from)` and `[to, until)`, each with the
    /// hour it lies in.
    rows: Vec<(Filter, DateTime<Utc>)>,
}

impl Scope {
    /// `None` when the counts cannot answer this filter: it selects by more than the
    /// bucket columns and a time window, or the window holds no whole hour.
    fn of(f: &Filter) -> Option<Scope> {
        let keys = Filter {
            reason: f.reason.clone(),
            producer: f.producer.clone(),
            schema_version: f.schema_version.clone(),
            source_queue: f.source_queue.clone(),
            ..Filter::default()
        };
        let windowed = Filter {
            since: f.since,
            until: f.until,
            ..keys.clone()
        };
        if windowed != *f {
            return None;
        }
        // An hour past chrono's range: the rows are read.
        let from = match f.since {
            Some(t) => Some(hour_at_or_after(t)?),
            None => None,
        };
        let to = match f.until {
            Some(t) => Some(hour_of(t)?),
            None => None,
        };
        if let (Some(from), Some(to)) = (from, to) {
            if to <= from {
                return None;
            }
        }
        let part = |since, until| Filter {
            since: Some(since),
            until: Some(until),
            ..keys.clone()
        };
        let mut rows = Vec::new();
        if let (Some(since), Some(from)) = (f.since, from) {
            if since < from {
                rows.push((part(since, from), hour_of(since)?));
            }
        }
        if let (Some(to), Some(until)) = (to, f.until) {
            if to < until {
                rows.push((part(to, until), to));
            }
        }
        Some(Scope {
            keys,
            from,
            to,
            rows,
        })
    }
}

/// The start of the UTC hour of `t` (the bucket `dlq_rollup_hour` gives it).
fn hour_of(t: DateTime<Utc>) -> Option<DateTime<Utc>> {
    t.duration_trunc(TimeDelta::hours(1)).ok()
}

/// The first whole hour at or after `t`.
fn hour_at_or_after(t: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let start = hour_of(t)?;
    match start == t {
        true => Some(t),
        false => start.checked_add_signed(TimeDelta::hours(1)),
    }
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

/// For each row of the CTE `b` (a reason, a producer, an hour and the further bucket
/// columns `more`), `inner` over its rows of `dead_letters` (as `d`, their time only)
/// where `cond`, selected after `b`'s columns as `what` (of `m`): one range of the index
/// (reason, producer, time) per row of `b`, whatever the planner guesses of their number.
/// No producer is a range of its own: `IS NOT DISTINCT FROM` is no index condition, and
/// a range of the reason alone read every row of its hour per bucket (2.3 s for 1,670
/// buckets with a recorded claim at 1,000,000 rows).
fn per_bucket(b: &str, more: &[&str], inner: &str, cond: &str, what: &str) -> String {
    let of = |t: &str| more.iter().map(|k| format!("{t}.{k}")).collect::<Vec<_>>();
    let rest = match more.is_empty() {
        true => String::new(),
        false => format!(
            " AND ({}) IS NOT DISTINCT FROM ({})",
            of("d").join(", "),
            of("b").join(", ")
        ),
    };
    let range = |producer: &str| {
        format!(
            "SELECT d.dead_lettered_at FROM dead_letters d WHERE d.reason = b.reason \
               AND {producer} AND d.dead_lettered_at >= b.hour \
               AND d.dead_lettered_at <= b.hour + interval '1 hour' \
               AND dlq_rollup_hour(d.dead_lettered_at) = b.hour{rest} AND {cond}"
        )
    };
    format!(
        "SELECT b.reason, b.eff_producer, {}b.hour, {what} FROM {b} b CROSS JOIN LATERAL \
         (SELECT {inner} FROM ({} UNION ALL {}) AS d) AS m",
        of("b").iter().map(|c| format!("{c}, ")).collect::<String>(),
        range("d.eff_producer = b.eff_producer"),
        range("b.eff_producer IS NULL AND d.eff_producer IS NULL"),
    )
}

/// The counts' rows of the scope's keys and whole hours: folded, and what is not folded
/// yet (the deltas, and the rows no sweep has counted, shaped as deltas).
fn counts<D: Dialect>(scope: &Scope) -> Sql {
    let columns = format!("{KEYS}, hour, state, n, first_seen, last_seen, stale");
    let mut sql = Sql::new("");
    for (i, table) in ["dead_letter_rollup", "dead_letter_rollup_unfolded"]
        .iter()
        .enumerate()
    {
        sql.push(match i {
            0 => format!("SELECT {columns} FROM {table}"),
            _ => format!(" UNION ALL SELECT {columns} FROM {table}"),
        });
        sql.append(where_sql::<D>(&scope.keys));
        for (cmp, hour) in [(">=", scope.from), ("<", scope.to)] {
            if let Some(hour) = hour {
                sql.push(format!(" AND hour {cmp} "));
                sql.bind(Bind::Time(hour));
            }
        }
    }
    sql
}

/// The rows of the scope's part-hours, counted per state and grouped by the asked
/// dimensions only (a key not asked is NULL, each part's hour a constant: it lies inside
/// one hour), so that the planner hashes a few groups instead of sorting every row by
/// all the keys and its state (issue 24). Each state has its own first and last time;
/// its label says it was read on the clock (`row_pending`, `row_claimed`: counted, and
/// told apart).
fn part_hours<D: Dialect>(dims: &[Dimension], scope: &Scope) -> Sql {
    let states = [
        (State::Pending, "row_pending"),
        (State::Claimed, "row_claimed"),
        (State::Uncertain, "uncertain"),
        (State::Replayed, "replayed"),
        (State::Discarded, "discarded"),
    ];
    let counts = states
        .map(|(st, label)| {
            let p = super::state_of::<D>(st);
            format!(
                "count(*) FILTER (WHERE {p}) AS {label}, \
                 min(dead_lettered_at) FILTER (WHERE {p}) AS {label}_f, \
                 max(dead_lettered_at) FILTER (WHERE {p}) AS {label}_l"
            )
        })
        .join(", ");
    let unpivot = states
        .map(|(_, l)| format!("('{l}', g.{l}, g.{l}_f, g.{l}_l)"))
        .join(", ");
    let asked = |k: &str| dims.iter().any(|d| dimension(*d) == k);
    let keys: Vec<&str> = KEYS.split(", ").collect();
    let grouped = keys
        .iter()
        .filter(|k| asked(k))
        .copied()
        .collect::<Vec<_>>();
    let outer = keys
        .iter()
        .map(|k| match asked(k) {
            true => format!("g.{k}"),
            false => format!("CAST(NULL AS TEXT) AS {k}"),
        })
        .collect::<Vec<_>>()
        .join(", ");
    let mut sql = Sql::new("");
    for (part, hour) in &scope.rows {
        sql.push(format!(" UNION ALL SELECT {outer}, "));
        sql.bind(Bind::Time(*hour));
        sql.push(format!(
            " AS hour, s.state, s.n, s.first_seen, s.last_seen FROM (SELECT {}{counts} \
             FROM dead_letters",
            grouped.iter().map(|k| format!("{k}, ")).collect::<String>()
        ));
        sql.append(where_sql::<D>(part));
        match grouped.is_empty() {
            true => sql.push(" HAVING count(*) > 0"),
            false => sql.push(format!(" GROUP BY {}", grouped.join(", "))),
        };
        sql.push(format!(
            ") AS g CROSS JOIN LATERAL (VALUES {unpivot}) AS s (state, n, first_seen, last_seen) \
             WHERE s.n > 0"
        ));
    }
    sql
}

/// The CTE `u`: per bucket (or group of a part-hour) and state, its rows and their first
/// and last times, from the counts, the rows the counts cannot tell (the times of a
/// bucket a row left, live leases) and the part-hours' rows.
fn kept<D: Dialect>(dims: &[Dimension], scope: &Scope) -> Sql {
    let claimed = super::state_of::<D>(State::Claimed);
    let mut sql = Sql::new("WITH c AS (");
    sql.append(counts::<D>(scope));
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
           UNION ALL SELECT * FROM times UNION ALL SELECT * FROM live",
        per_bucket(
            "stale",
            &BUCKET,
            "min(d.dead_lettered_at) AS f, max(d.dead_lettered_at) AS l",
            "true",
            "'times' AS state, CAST(0 AS BIGINT) AS n, m.f AS first_seen, m.l AS last_seen",
        ),
        per_bucket(
            "leased",
            &BUCKET,
            "count(*) AS n",
            &claimed,
            "'claimed' AS state, m.n, CAST(NULL AS timestamptz) AS first_seen, \
             CAST(NULL AS timestamptz) AS last_seen",
        ),
    ));
    sql.append(part_hours::<D>(dims, scope));
    sql.push(")");
    sql
}

/// SQL of the number of `u`'s rows where `cond`.
fn sum(cond: &str) -> String {
    format!("CAST(COALESCE(sum(n) FILTER (WHERE {cond}), 0) AS BIGINT)")
}

/// The rows of each state (a column named as [`State::as_str`]) of a group of `u`: a
/// recorded claim (`leased`) is pending unless its lease is live (`claimed`).
fn per_state() -> [String; 5] {
    [
        format!(
            "{} - {} AS pending",
            sum("state IN ('open', 'leased', 'row_pending')"),
            sum("state = 'claimed'")
        ),
        format!("{} AS claimed", sum("state IN ('claimed', 'row_claimed')")),
        format!("{} AS uncertain", sum("state = 'uncertain'")),
        format!("{} AS replayed", sum("state = 'replayed'")),
        format!("{} AS discarded", sum("state = 'discarded'")),
    ]
}

/// The groups of `dims`, largest first, as `list::aggregate` gives them.
fn query<D: Dialect>(dims: &[Dimension], scope: &Scope) -> Sql {
    let mut sql = kept::<D>(dims, scope);
    let mut columns: Vec<String> = dims
        .iter()
        .enumerate()
        .map(|(i, d)| format!("{} AS k{i}", dimension(*d)))
        .collect();
    columns.push(format!("{} AS n", sum("state <> 'claimed'")));
    columns.extend(per_state());
    columns.push("min(first_seen) AS first_seen, max(last_seen) AS last_seen".into());
    let positions: Vec<String> = (1..=dims.len()).map(|i| i.to_string()).collect();
    sql.push(format!(
        " SELECT {} FROM u GROUP BY {1} HAVING {HAS_ROWS} ORDER BY {2} DESC, {1}",
        columns.join(", "),
        positions.join(", "),
        dims.len() + 1
    ));
    sql
}

/// Per reason/producer pair, its rows per state and its oldest pending row's time: the
/// earliest of the pending rows' first times in the window's part-hours (each state's
/// times are its own there) and of the pending rows in the pair's first whole hour whose
/// counts hold one (`first_hour`), read from the rows: one range of the reason's rows in
/// one hour per pair, however old that hour.
fn pair_query<D: Dialect>(scope: &Scope) -> Sql {
    let mut sql = kept::<D>(&[Dimension::Reason, Dimension::Producer], scope);
    let pending = super::state_of::<D>(State::Pending);
    sql.push(format!(
        ", first_hour AS (SELECT reason, eff_producer, min(hour) AS hour FROM (\
           SELECT reason, eff_producer, hour FROM u \
           WHERE state IN ('open', 'leased', 'claimed') GROUP BY reason, eff_producer, hour \
           HAVING {} > {}) AS h GROUP BY reason, eff_producer), \
         oldest AS ({}) \
         SELECT reason, eff_producer AS producer, {}, min(first_seen) \
           FILTER (WHERE state IN ('row_pending', 'row_oldest')) AS oldest_pending \
         FROM (SELECT reason, eff_producer, state, n, first_seen FROM u \
           UNION ALL SELECT reason, eff_producer, 'row_oldest', CAST(0 AS BIGINT), first_seen \
           FROM oldest) AS a \
         GROUP BY reason, eff_producer HAVING {HAS_ROWS}",
        sum("state IN ('open', 'leased')"),
        sum("state = 'claimed'"),
        per_bucket(
            "first_hour",
            &[],
            "min(d.dead_lettered_at) AS f",
            &pending,
            "m.f AS first_seen",
        ),
        per_state().join(", "),
    ));
    sql
}
