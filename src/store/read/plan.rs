//! The reads a plan needs: the candidates with their body hashes, and the dead
//! letters that came back after a replay (paged by time and ID).

use super::{all, required, select, text, time, Backend, Bind, Dialect, TimeCol};
use crate::error::Result;
use crate::model::{sha256_hex, Filter};
use crate::publisher::DEAD_LETTER_ID_HEADER;
use crate::store::{NewArrival, PlanCandidate};
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
/// as a worker may write, name none). Only headers that hold the name are read: in a
/// flood, most new rows are no replay coming back, and their headers may be large.
pub(super) async fn dead_lettered_since<B: Backend>(
    b: &B,
    after: &(DateTime<Utc>, String),
    limit: i64,
) -> Result<Vec<NewArrival>> {
    let at = B::Db::at(TimeCol::DeadLetteredAt);
    let mut qb = QueryBuilder::new(format!(
        "SELECT id, eff_event_id, CASE WHEN headers_json LIKE '%\"{DEAD_LETTER_ID_HEADER}\"%' \
         THEN headers_json END AS headers_json, {at} AS dead_lettered_at FROM dead_letters \
         WHERE ({at}, id) > ("
    ));
    B::Db::bind(&mut qb, Bind::Time(after.0));
    qb.push(", ");
    B::Db::bind(&mut qb, Bind::Text(after.1.clone()));
    qb.push(format!(") ORDER BY {at}, id LIMIT "));
    B::Db::bind(&mut qb, Bind::Int(limit));
    all(b, &mut qb, |r| {
        let t = |col: &str| text::<B::Db>(r, col);
        Ok(NewArrival {
            id: required(t("id")?, "id")?,
            event_id: t("eff_event_id")?,
            replayed_from: t("headers_json")?.as_deref().and_then(replayed_from),
            at: time::<B::Db>(r, "dead_lettered_at")?,
        })
    })
    .await
}

/// The `x-dead-letter-id` header of stored headers, if they are a JSON object holding it
/// as a string.
fn replayed_from(headers_json: &str) -> Option<String> {
    let headers: serde_json::Value = serde_json::from_str(headers_json).ok()?;
    Some(headers.get(DEAD_LETTER_ID_HEADER)?.as_str()?.to_string())
}
