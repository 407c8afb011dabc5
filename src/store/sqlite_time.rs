//! SQLite times, whatever storage class a worker wrote them in.
//!
//! dlq writes INTEGER microseconds since the epoch (UTC); the Python workers writing the
//! same file store what their library chooses: SQLAlchemy's `DateTime` and the `sqlite3`
//! adapter TEXT (`2026-12-01 13:41:34.334875`, with or without `T`, an offset or `Z`),
//! `time.time()` a REAL, others INTEGER seconds or milliseconds. SQLite keeps each
//! value as written, so every read, filter, ordering, plan selection and lease comparison
//! goes through one expression, [`us!`], that turns any of them into INTEGER
//! microseconds (NULL when it cannot be read). The rule, by storage class:
//!
//! - INTEGER by magnitude: below 1e11 seconds, below 1e14 milliseconds, below 1e17
//!   microseconds, else nanoseconds (each unit's range starts in 1973 and ends in 5138);
//! - REAL below 1e7 a Julian day number (SQLite's own `julianday()`), else as INTEGER
//!   (epoch seconds from `time.time()`, with their fraction);
//! - TEXT starting `YYYY-MM-DD`: SQLite's date syntax (`T` or space, optional seconds,
//!   `Z` or `±HH:MM`), with up to nine fractional digits kept to the microsecond (SQLite's
//!   own date functions keep milliseconds, so the fraction is read here). A `±HHMM` at
//!   the very end after a time (`+0000` as Python's `strftime('%z')` writes it) is read
//!   as `±HH:MM` ([`colon_offset!`]): the same instant, the same ranges, a space before
//!   it allowed as SQLite allows one there. Any other offset (`+00000`, `+000`, one
//!   after a date alone or followed by a space) is left to SQLite, which refuses it;
//! - anything else (other text, a BLOB) cannot be read: [`UNREADABLE`] says what is
//!   stored, and the value counts as absent in comparisons, while `IS NULL` tests use
//!   the column itself: an unreadable `replayed_at` still means replayed, and a lease
//!   end that is set but cannot be read holds the row (another tool's live lease, e.g.
//!   Go's `2099-01-01 00:00:00 +0000 UTC`: see [`super::lease_live`]).
//!
//! The indexes on `dead_lettered_at` are on this expression (remade by each migration
//! that changed it, last 20261204000100), so ordering and `--since` stay index-backed:
//! a change of the expression needs a migration that makes them again on its new text.

use chrono::{DateTime, Utc};

/// The fractional digits (up to nine) of a SQLite text time, as text: the digits after
/// the `.` at position 20 (`'1'` keeps leading zeros through the cast).
macro_rules! frac {
    ($c:literal) => {
        concat!("substr(CAST('1' || substr(", $c, ", 21, 9) AS INTEGER), 2)")
    };
}

/// Text `$c` with a `±HHMM` offset at its end, after a time, rewritten `±HH:MM` (a `:`
/// before the last two digits): SQLite's date functions then read it, or refuse it, as
/// they do `±HH:MM`. Any other text stays as it is.
macro_rules! colon_offset {
    ($c:literal) => {
        concat!(
            "(CASE WHEN ",
            $c,
            " GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9][T ][0-9][0-9]:[0-9]*[+-][0-9][0-9][0-9][0-9]' ",
            "THEN substr(",
            $c,
            ", 1, length(",
            $c,
            ") - 2) || ':' || substr(",
            $c,
            ", -2) ELSE ",
            $c,
            " END)"
        )
    };
}

/// Column `$c`, whatever its storage class, as INTEGER microseconds or NULL (see the
/// module docs). Deterministic (no `now`: text must start with a date), so it can be
/// indexed.
macro_rules! us {
    ($c:literal) => {
        concat!(
            "(CASE typeof(",
            $c,
            ") ",
            "WHEN 'integer' THEN CASE WHEN abs(",
            $c,
            ") < 100000000000 THEN ",
            $c,
            " * 1000000 ",
            "WHEN abs(",
            $c,
            ") < 100000000000000 THEN ",
            $c,
            " * 1000 ",
            "WHEN abs(",
            $c,
            ") < 100000000000000000 THEN ",
            $c,
            " ELSE ",
            $c,
            " / 1000 END ",
            "WHEN 'real' THEN CAST(ROUND(CASE WHEN abs(",
            $c,
            ") < 10000000.0 ",
            "THEN (",
            $c,
            " - 2440587.5) * 86400000000.0 ",
            "WHEN abs(",
            $c,
            ") < 100000000000.0 THEN ",
            $c,
            " * 1000000.0 ",
            "WHEN abs(",
            $c,
            ") < 100000000000000.0 THEN ",
            $c,
            " * 1000.0 ",
            "WHEN abs(",
            $c,
            ") < 100000000000000000.0 THEN ",
            $c,
            " ",
            "ELSE ",
            $c,
            " / 1000.0 END) AS INTEGER) ",
            "WHEN 'text' THEN CASE WHEN ",
            $c,
            " GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]*' ",
            "THEN CASE WHEN substr(",
            $c,
            ", 20, 1) = '.' ",
            "THEN unixepoch(substr(",
            $c,
            ", 1, 19) || substr(",
            $crate::store::sqlite_time::colon_offset!($c),
            ", 21 + length(",
            $crate::store::sqlite_time::frac!($c),
            "))) * 1000000 ",
            "+ CAST(substr(",
            $crate::store::sqlite_time::frac!($c),
            " || '000000', 1, 6) AS INTEGER) ",
            "ELSE unixepoch(",
            $crate::store::sqlite_time::colon_offset!($c),
            ") * 1000000 END END ",
            "END)"
        )
    };
}
pub(crate) use {colon_offset, frac, us};

/// [`us!`] for a SELECT list: a NULL is NULL at once, without the expression's type
/// tests (most time columns of most rows are NULL). Not for indexes or comparisons:
/// those must spell [`us!`] as the indexes do.
macro_rules! shown_us {
    ($c:literal) => {
        concat!(
            "(CASE WHEN ",
            $c,
            " IS NULL THEN NULL ELSE ",
            $crate::store::sqlite_time::us!($c),
            " END)"
        )
    };
}

/// The database clock in microseconds since the epoch (SQLite's clock has milliseconds).
pub const NOW_US: &str =
    "(CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER) * 1000)";

pub const DEAD_LETTERED_AT: &str = us!("dead_lettered_at");
pub const REPLAYED_AT: &str = us!("replayed_at");
pub const LEASE_END: &str = us!("replay_claim_expires_at");
pub const ATTEMPT_AT: &str = us!("replay_attempt_at");
pub const DISCARDED_AT: &str = us!("discarded_at");
pub const HISTORY_AT: &str = us!("at");

/// The time columns as a SELECT list shows them ([`shown_us!`]).
pub const SHOWN_DEAD_LETTERED_AT: &str = shown_us!("dead_lettered_at");
pub const SHOWN_REPLAYED_AT: &str = shown_us!("replayed_at");
pub const SHOWN_LEASE_END: &str = shown_us!("replay_claim_expires_at");
pub const SHOWN_ATTEMPT_AT: &str = shown_us!("replay_attempt_at");
pub const SHOWN_DISCARDED_AT: &str = shown_us!("discarded_at");

/// The stored value of each time column that cannot be read, as a JSON object text
/// (`{"replayed_at": "'yesterday'"}`, values as SQLite's `quote()` spells them), or NULL
/// when all can. INTEGER and REAL values can always be read. A NULL is tested first:
/// cheaper than its type, and most time columns of most rows are NULL.
pub const UNREADABLE: &str = concat!(
    "CASE WHEN (dead_lettered_at IS NOT NULL AND typeof(dead_lettered_at) IN ('text', 'blob') AND ",
    us!("dead_lettered_at"),
    " IS NULL) ",
    "OR (replayed_at IS NOT NULL AND typeof(replayed_at) IN ('text', 'blob') AND ",
    us!("replayed_at"),
    " IS NULL) ",
    "OR (replay_claim_expires_at IS NOT NULL AND typeof(replay_claim_expires_at) IN ('text', 'blob') AND ",
    us!("replay_claim_expires_at"),
    " IS NULL) ",
    "OR (replay_attempt_at IS NOT NULL AND typeof(replay_attempt_at) IN ('text', 'blob') AND ",
    us!("replay_attempt_at"),
    " IS NULL) ",
    "OR (discarded_at IS NOT NULL AND typeof(discarded_at) IN ('text', 'blob') AND ",
    us!("discarded_at"),
    " IS NULL) ",
    "THEN json_patch('{}', json_object(",
    "'dead_lettered_at', CASE WHEN dead_lettered_at IS NOT NULL AND ",
    us!("dead_lettered_at"),
    " IS NULL THEN quote(dead_lettered_at) END, ",
    "'replayed_at', CASE WHEN replayed_at IS NOT NULL AND ",
    us!("replayed_at"),
    " IS NULL THEN quote(replayed_at) END, ",
    "'replay_claim_expires_at', CASE WHEN replay_claim_expires_at IS NOT NULL AND ",
    us!("replay_claim_expires_at"),
    " IS NULL THEN quote(replay_claim_expires_at) END, ",
    "'replay_attempt_at', CASE WHEN replay_attempt_at IS NOT NULL AND ",
    us!("replay_attempt_at"),
    " IS NULL THEN quote(replay_attempt_at) END, ",
    "'discarded_at', CASE WHEN discarded_at IS NOT NULL AND ",
    us!("discarded_at"),
    " IS NULL THEN quote(discarded_at) END",
    ")) END"
);

pub fn to_us(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

/// An INTEGER time by the magnitude rule of the module docs (a normalised value is
/// already microseconds and stays as it is).
pub fn from_int(v: i64) -> Option<DateTime<Utc>> {
    let us = match v.unsigned_abs() {
        a if a < 100_000_000_000 => v.checked_mul(1_000_000)?,
        a if a < 100_000_000_000_000 => v * 1000,
        a if a < 100_000_000_000_000_000 => v,
        _ => v / 1000,
    };
    DateTime::from_timestamp_micros(us)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Backend, Store};

    /// The migration's indexes are on the same expression as the reads use: a list and a
    /// filtered list are index scans, not a sort of the table.
    #[tokio::test]
    async fn the_reads_use_the_expression_indexes() {
        let (_dir, store) = crate::store::sqlite::tests::temp_store().await;
        store.migrate().await.unwrap();
        for (filter, index) in [
            ("", "dead_letters_at_idx"),
            ("WHERE reason = 'r'", "dead_letters_reason_idx"),
            ("WHERE eff_producer = 'p'", "dead_letters_producer_idx"),
        ] {
            let sql = format!(
                "EXPLAIN QUERY PLAN SELECT id FROM dead_letters {filter} \
                 ORDER BY {DEAD_LETTERED_AT} DESC, id LIMIT 50"
            );
            let rows = sqlx::query(&sql).fetch_all(store.pool()).await.unwrap();
            let text: Vec<String> = rows
                .iter()
                .map(|r| sqlx::Row::get::<String, _>(r, "detail"))
                .collect();
            assert!(
                text.iter().any(|d| d.contains(index))
                    && !text.iter().any(|d| d.contains("TEMP B-TREE FOR ORDER BY")),
                "{filter}: {text:?}"
            );
        }
        // Each index on the time is on the expression as the reads spell it.
        let made: Vec<(String, String)> = sqlx::query_as(
            "SELECT name, sql FROM sqlite_master WHERE type = 'index' \
             AND sql LIKE '%dead_lettered_at%' ORDER BY name",
        )
        .fetch_all(store.pool())
        .await
        .unwrap();
        assert_eq!(made.len(), 6, "{made:?}");
        for (name, sql) in made {
            assert!(sql.contains(DEAD_LETTERED_AT), "{name}: {sql}");
        }
    }

    /// What [`us!`] makes of one TEXT value, bound as TEXT like a worker's.
    async fn text_us(pool: &sqlx::SqlitePool, v: &str) -> Option<i64> {
        let sql = format!("SELECT {} FROM (SELECT ?1 AS c)", us!("c"));
        sqlx::query_scalar(&sql)
            .bind(v)
            .fetch_one(pool)
            .await
            .unwrap()
    }

    /// A `±HHMM` offset after a time (Python's `%z`) is the same instant as `±HH:MM`.
    #[tokio::test]
    async fn a_four_digit_offset_after_a_time_is_read_as_hh_mm() {
        let pool = sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap();
        for (hhmm, colon, want) in [
            (
                "2026-12-04 08:00:00+0000",
                "2026-12-04 08:00:00+00:00",
                "2026-12-04T08:00:00Z",
            ),
            (
                "2026-12-04T08:00:00.123456+0100",
                "2026-12-04T08:00:00.123456+01:00",
                "2026-12-04T07:00:00.123456Z",
            ),
            (
                "2026-12-04T08:00:00.5-0530",
                "2026-12-04T08:00:00.5-05:30",
                "2026-12-04T13:30:00.5Z",
            ),
            (
                "2026-12-04 08:00+1400",
                "2026-12-04 08:00+14:00",
                "2026-12-03T18:00:00Z",
            ),
            (
                "2026-12-04 08:00:00 -0500",
                "2026-12-04 08:00:00 -05:00",
                "2026-12-04T13:00:00Z",
            ),
        ] {
            let t = DateTime::parse_from_rfc3339(want).unwrap();
            let want = Some(to_us(t.with_timezone(&Utc)));
            assert_eq!(text_us(&pool, colon).await, want, "{colon}");
            assert_eq!(text_us(&pool, hhmm).await, want, "{hhmm}");
        }
    }

    /// Only four digits right at the end, after a time, in SQLite's ranges (hours to 14,
    /// minutes to 59, as for `±HH:MM`): anything else stays unreadable.
    #[tokio::test]
    async fn other_offsets_stay_unreadable() {
        let pool = sqlx::SqlitePool::connect("sqlite::memory:").await.unwrap();
        for v in [
            "2026-12-04 08:00:00+00000",
            "2026-12-04 08:00:00+000",
            "2026-12-04 08:00:00+00",
            "2026-12-04 08:00:00+0000 ",
            "2026-12-04 08:00:00+0000Z",
            "2026-12-04 08:00:00Z+0000",
            "2026-12-04 08:00:00+01:00+0100",
            "2026-12-04 08:00:00 -0500 EST",
            "2026-12-04 08:00:00+1500",
            "2026-12-04 08:00:00+0160",
            "2026-12-04 08:00:00+ab00",
            "2026-12-04-0500",
            "2026-12-04 -0500",
            "2026-12-04T-0500",
            "2026-12-04+0100",
            "2026-12-04 0800+0100",
            "x2026-12-04 08:00:00+0000",
        ] {
            assert_eq!(text_us(&pool, v).await, None, "{v:?}");
        }
    }

    #[test]
    fn integers_are_read_by_magnitude() {
        let t = DateTime::parse_from_rfc3339("2026-12-01T13:41:34.334875Z").unwrap();
        let t = t.with_timezone(&Utc);
        assert_eq!(
            from_int(t.timestamp()),
            DateTime::from_timestamp(t.timestamp(), 0)
        );
        assert_eq!(
            from_int(t.timestamp_millis()),
            DateTime::from_timestamp_millis(t.timestamp_millis())
        );
        assert_eq!(from_int(t.timestamp_micros()), Some(t));
        assert_eq!(from_int(t.timestamp_micros() * 1000), Some(t));
    }
}
