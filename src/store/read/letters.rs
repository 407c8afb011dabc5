//! The reads of whole rows, bodies included (`show`, a replay's `held` rows), and of
//! one row's history and revisions.

use super::rows::read_bodies;
use super::{
    all, by_ids, required, state_of, text, whole_row, whole_row_columns, Backend, Bind, Dialect,
    NotUtf8,
};
use crate::error::Result;
use crate::model::{token_ref, DeadLetter, HistoryEntry, State};
use futures_util::TryStreamExt;
use sqlx::QueryBuilder;

pub(super) async fn load<B: Backend>(b: &B, ids: &[String]) -> Result<Vec<DeadLetter>> {
    whole_rows(b, &mut by_ids(&whole_row_columns::<B::Db>(), ids)).await
}

pub(super) async fn held<B: Backend>(
    b: &B,
    ids: &[String],
    token: &str,
) -> Result<Vec<DeadLetter>> {
    let mut qb = by_ids(&whole_row_columns::<B::Db>(), ids);
    qb.push(" AND replay_claim_owner = ");
    B::Db::bind(&mut qb, Bind::Text(token.to_string()));
    qb.push(format!(
        " AND replay_attempt_at IS NULL AND {}",
        state_of::<B::Db>(State::Claimed)
    ));
    whole_rows(b, &mut qb).await
}

pub(super) async fn history<B: Backend>(b: &B, id: &str) -> Result<Vec<HistoryEntry>> {
    let mut qb = QueryBuilder::new(format!(
        "SELECT {} AS at, operator, action, outcome, detail, target, plan_id, token, \
         token_ref FROM dead_letter_history WHERE dead_letter_id = ",
        B::Db::HISTORY_AT
    ));
    B::Db::bind(&mut qb, Bind::Text(id.to_string()));
    qb.push(" ORDER BY seq");
    all(b, &mut qb, |r| {
        let t = |col: &str| text::<B::Db>(r, col);
        Ok(HistoryEntry {
            // Only dlq writes the history; a time no one can read shows as 1970.
            at: B::Db::time(r, "at")?.unwrap_or_default(),
            operator: required(t("operator")?, "operator")?,
            action: required(t("action")?, "action")?,
            outcome: required(t("outcome")?, "outcome")?,
            detail: t("detail")?,
            token_ref: match t("token")? {
                Some(token) => Some(token_ref(&token)),
                None => t("token_ref")?,
            },
            target: t("target")?,
            plan_id: t("plan_id")?,
        })
    })
    .await
}

pub(super) async fn revised_as<B: Backend>(b: &B, id: &str) -> Result<Vec<String>> {
    let mut qb = QueryBuilder::new("SELECT id FROM dead_letters WHERE revision_of = ");
    B::Db::bind(&mut qb, Bind::Text(id.to_string()));
    qb.push(" ORDER BY id");
    all(b, &mut qb, |r| B::Db::text(r, "id", NotUtf8::Escape))
        .await
        .map(|ids| ids.into_iter().flatten().collect())
}

/// Whole rows: the rows, then any large body in slices, all of each body from one
/// snapshot (never pieced together from two versions of a row).
async fn whole_rows<B: Backend>(
    b: &B,
    qb: &mut QueryBuilder<'static, B::Db>,
) -> Result<Vec<DeadLetter>> {
    let rows = all(b, qb, whole_row::<B::Db>).await?;
    if rows.iter().all(|(_, to_read)| to_read.is_none()) {
        return Ok(rows.into_iter().map(|(letter, _)| letter).collect());
    }
    let err = |e| b.db_err(e);
    let mut tx = b.pool().begin().await.map_err(err)?;
    if let Some(snapshot) = B::Db::SNAPSHOT {
        B::Db::fetch(&mut tx, QueryBuilder::new(snapshot).build())
            .try_collect::<Vec<_>>()
            .await
            .map_err(err)?;
    }
    let rows = read_bodies::<B::Db>(&mut tx, rows, err).await?;
    tx.rollback().await.map_err(err)?;
    Ok(rows)
}
