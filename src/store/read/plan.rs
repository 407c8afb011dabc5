//! The reads a plan needs: the candidates with their body hashes, and the dead
//! letters that came back after a replay (paged by time and ID, and swept by event ID
//! and header for those stored after a newer row was read).

use super::{all, required, select, text, time, Backend, Bind, Dialect, TimeCol};
use crate::error::Result;
use crate::model::{sha256_hex, Filter};
use crate::publisher::DEAD_LETTER_ID_HEADER;
use crate::store::{HeaderSweep, NewArrival, PlanCandidate};
use chrono::{DateTime, Utc};
use sqlx::QueryBuilder;

pub(super) async fn plan_candidates<B: Backend>(
    b: &B,
    filter: &Filter,
    limit: i64,
) -> Result<Vec<PlanCandidate>> {
    let mut qb = select("id, reason, eff_producer, eff_schema_version, body", filter);
    qb.push(format!(
        " ORDER BY {}, id LIMIT ",
        B::Db::at(TimeCol::DeadLetteredAt)
    ));
    B::Db::bind(&mut qb, Bind::Int(limit));
    all(b, &mut qb, |r| {
        let t = |col: &str| text::<B::Db>(r, col);
        Ok(PlanCandidate {
            id: required(t("id")?, "id")?,
            reason: required(t("reason")?, "reason")?,
            producer: t("eff_producer")?,
            schema_version: t("eff_schema_version")?,
            sha256: sha256_hex(required(B::Db::bytes(r, "body")?, "body")?),
        })
    })
    .await
}

/// The dead letters written after `after`, in (time, id) order: each with its event ID
/// and the row its `x-dead-letter-id` header names (headers that are not a JSON object,
/// as a worker may write, name none).
pub(super) async fn dead_lettered_since<B: Backend>(
    b: &B,
    after: &(DateTime<Utc>, String),
    limit: i64,
) -> Result<Vec<NewArrival>> {
    let at = B::Db::at(TimeCol::DeadLetteredAt);
    let mut qb = arrivals::<B::Db>(&format!("({at}, id) > ("));
    B::Db::bind(&mut qb, Bind::Time(after.0));
    qb.push(", ");
    B::Db::bind(&mut qb, Bind::Text(after.1.clone()));
    qb.push(format!(") ORDER BY {at}, id LIMIT "));
    B::Db::bind(&mut qb, Bind::Int(limit));
    all(b, &mut qb, arrival::<B::Db>).await
}

/// The dead letters stamped at or after `since` that carry one of `events` or hold an
/// `x-dead-letter-id` header: every come-back of a run's messages, however late each was
/// stored. One probe of the event index per few hundred events; the headers, only when
/// a row the run sent has no event ID, by one read of the window (in a flood, every row
/// since the run's start).
pub(super) async fn came_back_among<B: Backend>(
    b: &B,
    since: DateTime<Utc>,
    events: &[String],
    headers: HeaderSweep,
) -> Result<Vec<NewArrival>> {
    let at = B::Db::at(TimeCol::DeadLetteredAt);
    let mut out = Vec::new();
    if headers == HeaderSweep::Window {
        let mut qb = arrivals::<B::Db>(&format!("{at} >= "));
        B::Db::bind(&mut qb, Bind::Time(since));
        qb.push(format!(" AND {}", holds_header()));
        out = all(b, &mut qb, arrival::<B::Db>).await?;
    }
    for chunk in events.chunks(500) {
        let mut qb = arrivals::<B::Db>(&format!("{at} >= "));
        B::Db::bind(&mut qb, Bind::Time(since));
        qb.push(" AND eff_event_id IN (");
        for (n, e) in chunk.iter().enumerate() {
            qb.push(if n == 0 { "" } else { ", " });
            B::Db::bind(&mut qb, Bind::Text(e.clone()));
        }
        qb.push(")");
        out.extend(all(b, &mut qb, arrival::<B::Db>).await?);
    }
    Ok(out)
}

/// Headers that may hold the `x-dead-letter-id` header.
fn holds_header() -> String {
    format!("headers_json LIKE '%\"{DEAD_LETTER_ID_HEADER}\"%'")
}

/// The columns of a [`NewArrival`] from dead_letters, up to `WHERE ` and `cond`. Only
/// headers that hold the name are read: in a flood, most new rows are no replay coming
/// back, and their headers may be large.
fn arrivals<D: Dialect>(cond: &str) -> QueryBuilder<'static, D> {
    let at = D::at(TimeCol::DeadLetteredAt);
    QueryBuilder::new(format!(
        "SELECT id, eff_event_id, CASE WHEN {} THEN headers_json END AS headers_json, \
         {at} AS dead_lettered_at FROM dead_letters WHERE {cond}",
        holds_header()
    ))
}

fn arrival<D: Dialect>(r: &D::Row) -> super::Decoded<NewArrival> {
    let t = |col: &str| text::<D>(r, col);
    Ok(NewArrival {
        id: required(t("id")?, "id")?,
        event_id: t("eff_event_id")?,
        replayed_from: t("headers_json")?.as_deref().and_then(replayed_from),
        at: time::<D>(r, "dead_lettered_at")?,
    })
}

/// The `x-dead-letter-id` header of stored headers, if they are a JSON object holding it
/// as a string.
fn replayed_from(headers_json: &str) -> Option<String> {
    let headers: serde_json::Value = serde_json::from_str(headers_json).ok()?;
    Some(headers.get(DEAD_LETTER_ID_HEADER)?.as_str()?.to_string())
}
