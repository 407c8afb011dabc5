//! The reads that list and count rows by a filter, or by IDs, without their bodies:
//! `list`, `count`, `aggregate`, the shell's ID completion.

use super::decode::{group, summary};
use super::{
    all, by_ids, count_of, each, push_where, select, state_of, summary_columns, text, Backend,
    Bind, Bucket, Dialect, NotUtf8, TimeCol,
};
use crate::error::Result;
use crate::model::{Dimension, Filter, Group, State, Summary};
use sqlx::QueryBuilder;

/// `substr` rather than `LIKE`: an ID may hold `%` or `_`, and SQLite's `LIKE` ignores
/// ASCII case. Where IDs sort by code point, the prefix is also bounded as a range of
/// the primary key: else PostgreSQL walks the whole table newest first to find a prefix
/// that matches nothing (20 s at 10,000,000 rows; issue 24).
pub(super) async fn ids_starting_with<B: Backend>(
    b: &B,
    prefix: &str,
    state: Option<State>,
    limit: i64,
) -> Result<Vec<String>> {
    let range = match B::Db::CODE_POINT_IDS {
        Some(asked) => {
            let mut qb = QueryBuilder::new(asked);
            match count_of(b, &mut qb).await? {
                1 => after_prefix(prefix),
                _ => None,
            }
        }
        None => None,
    };
    let mut qb = QueryBuilder::new("SELECT id FROM dead_letters WHERE substr(id, 1, length(");
    B::Db::bind(&mut qb, Bind::Text(prefix.to_string()));
    qb.push(")) = ");
    B::Db::bind(&mut qb, Bind::Text(prefix.to_string()));
    if let Some(end) = range {
        qb.push(" AND id >= ");
        B::Db::bind(&mut qb, Bind::Text(prefix.to_string()));
        qb.push(" AND id < ");
        B::Db::bind(&mut qb, Bind::Text(end));
    }
    if let Some(st) = state {
        qb.push(format!(" AND {}", state_of::<B::Db>(st)));
    }
    qb.push(format!(
        " ORDER BY {} DESC, id LIMIT ",
        B::Db::at(TimeCol::DeadLetteredAt)
    ));
    B::Db::bind(&mut qb, Bind::Int(limit));
    all(b, &mut qb, |r| B::Db::text(r, "id", NotUtf8::Refuse))
        .await
        .map(|ids| ids.into_iter().flatten().collect())
}

/// The first text past every text that starts with `prefix`, in code point order: its
/// last character that can be, made the next one (`None`: no such text, or an empty
/// prefix).
fn after_prefix(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let next = match last {
            '\u{D7FF}' => Some('\u{E000}'),
            c => char::from_u32(c as u32 + 1),
        };
        if let Some(next) = next {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

pub(super) async fn list_each<B: Backend>(
    b: &B,
    filter: &Filter,
    limit: i64,
    sink: &mut (dyn FnMut(Summary) -> Result<()> + Send),
) -> Result<u64> {
    let mut qb = select(&summary_columns::<B::Db>(), filter);
    qb.push(format!(
        " ORDER BY {} DESC, id LIMIT ",
        B::Db::at(TimeCol::DeadLetteredAt)
    ));
    B::Db::bind(&mut qb, Bind::Int(limit));
    each(b, &mut qb, |row| {
        sink(summary::<B::Db>(row).map_err(|e| b.db_err(e))?)
    })
    .await
}

pub(super) async fn count_at_most<B: Backend>(b: &B, filter: &Filter, cap: i64) -> Result<i64> {
    // Stops after cap + 1 rows: a flood of rows costs no more than the cap.
    let mut qb = QueryBuilder::new("SELECT count(*) AS n FROM (SELECT 1 FROM dead_letters");
    push_where(&mut qb, filter);
    qb.push(" LIMIT ");
    B::Db::bind(&mut qb, Bind::Int(cap.saturating_add(1)));
    qb.push(") AS capped");
    count_of(b, &mut qb).await
}

/// The column (or bucket) a dimension groups by.
fn dimension<D: Dialect>(d: Dimension) -> String {
    match d {
        Dimension::Reason => "reason".into(),
        Dimension::Producer => "eff_producer".into(),
        Dimension::SchemaVersion => "eff_schema_version".into(),
        Dimension::SourceQueue => "source_queue".into(),
        Dimension::ErrorClass => "eff_error_class".into(),
        Dimension::Hour => D::bucket(Bucket::Hour),
        Dimension::Day => D::bucket(Bucket::Day),
    }
}

/// The `limit` most common values of a text dimension, with their counts, most common
/// first (rows with none left out): what completion offers and what a filter that matches
/// nothing names.
pub(super) async fn common_values<B: Backend>(
    b: &B,
    dim: Dimension,
    limit: i64,
) -> Result<Vec<(String, i64)>> {
    let expr = dimension::<B::Db>(dim);
    let mut qb = QueryBuilder::new(format!(
        "SELECT {expr} AS v, count(*) AS n FROM dead_letters WHERE {expr} IS NOT NULL \
         GROUP BY {expr} ORDER BY 2 DESC, 1 LIMIT "
    ));
    B::Db::bind(&mut qb, Bind::Int(limit));
    let rows = all(b, &mut qb, |r| {
        Ok((text::<B::Db>(r, "v")?, B::Db::int(r, "n")?))
    })
    .await?;
    Ok(rows
        .into_iter()
        .filter_map(|(v, n)| v.map(|v| (v, n)))
        .collect())
}

pub(super) async fn aggregate<B: Backend>(
    b: &B,
    dims: &[Dimension],
    filter: &Filter,
) -> Result<Vec<Group>> {
    let keys: Vec<String> = dims
        .iter()
        .enumerate()
        .map(|(i, d)| format!("{} AS k{i}", dimension::<B::Db>(*d)))
        .collect();
    let states: Vec<String> = State::ALL
        .iter()
        .map(|st| {
            let p = state_of::<B::Db>(*st);
            format!("count(CASE WHEN {p} THEN 1 END) AS {}", st.as_str())
        })
        .collect();
    let n = dims.len();
    let mut qb = select(
        &format!(
            "{}, count(*) AS n, {}, min({at}) AS first_seen, max({at}) AS last_seen",
            keys.join(", "),
            states.join(", "),
            at = B::Db::at(TimeCol::DeadLetteredAt)
        ),
        filter,
    );
    let positions: Vec<String> = (1..=n).map(|i| i.to_string()).collect();
    qb.push(format!(
        " GROUP BY {0} ORDER BY {1} DESC, {0}",
        positions.join(", "),
        n + 1
    ));
    all(b, &mut qb, |row| group::<B::Db>(row, dims)).await
}

pub(super) async fn summaries<B: Backend>(b: &B, ids: &[String]) -> Result<Vec<Summary>> {
    let mut qb = by_ids(&summary_columns::<B::Db>(), ids);
    // A TEXT id first: of two rows shown as one ID, the one a write takes.
    qb.push(" ORDER BY id_storage");
    all(b, &mut qb, summary::<B::Db>).await
}

#[cfg(test)]
mod tests {
    use super::after_prefix;

    #[test]
    fn the_text_after_a_prefix_skips_the_surrogates_and_carries_past_the_last_code_point() {
        assert_eq!(after_prefix("abc").as_deref(), Some("abd"));
        assert_eq!(after_prefix("a\u{D7FF}").as_deref(), Some("a\u{E000}"));
        assert_eq!(after_prefix("a\u{10FFFF}").as_deref(), Some("b"));
        assert_eq!(after_prefix("\u{10FFFF}\u{10FFFF}"), None);
        assert_eq!(after_prefix(""), None);
    }
}
