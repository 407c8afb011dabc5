//! The revision write of `dlq edit`, once over the [`Dialect`] for both stores.
//!
//! One write transaction sets the original aside (`discarded`, "revised as NEW: note")
//! with one conditional UPDATE guarded as a claim is (the row must be `pending` on the
//! database's clock), inserts the revision, and appends the history of both. A replay, a
//! claim or another edit of the same row racing it finds the row no longer pending (or
//! waits on its lock and then does), so exactly one of them wins: an original and its
//! revision can never both be published. (That an import or a restore brings no second
//! live copy is the `copies` module's.)

use super::read::{push_binds, state_of, Backend, Bind, Decoded, Dialect};
use super::NewDeadLetter;
use crate::error::Result;
use crate::model::{NewHistory, State};
use async_trait::async_trait;
use futures_util::TryStreamExt;
use sqlx::QueryBuilder;

/// A revision to write (the `revise` module makes it).
#[derive(Debug, Clone)]
pub struct NewRevision {
    pub original_id: String,
    /// What the original's `discard_note` becomes: `revised as NEW_ID: TEXT`.
    pub discard_note: String,
    /// The revision: its new `id`, `revision_of` = the original's ID, attempts 0.
    pub row: NewDeadLetter,
    /// The history of both rows.
    pub history: Vec<NewHistory>,
}

/// What became of a [`NewRevision`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RevisionWrite {
    Written,
    /// The original is no longer `pending` (or gone): nothing was written.
    NotPending,
}

/// The revision write of a store.
#[async_trait]
pub trait Revise: Send + Sync {
    async fn revise(&self, rev: &NewRevision) -> Result<RevisionWrite>;
}

#[async_trait]
impl<B: Backend> Revise for B {
    async fn revise(&self, rev: &NewRevision) -> Result<RevisionWrite> {
        let err = |e| self.db_err(e);
        let mut tx = self
            .pool()
            .begin_with(<B::Db as Dialect>::BEGIN_WRITE)
            .await
            .map_err(err)?;
        let mut qb = QueryBuilder::new(format!(
            "UPDATE dead_letters SET discarded_at = {}, discard_note = ",
            <B::Db as Dialect>::NOW
        ));
        B::Db::bind(&mut qb, Bind::Text(rev.discard_note.clone()));
        qb.push(" WHERE ");
        B::Db::push_exact_ids(&mut qb, std::slice::from_ref(&rev.original_id));
        qb.push(format!(
            " AND {} RETURNING id",
            state_of::<B::Db>(State::Pending)
        ));
        let set_aside = B::Db::fetch(&mut tx, qb.build())
            .try_collect::<Vec<_>>()
            .await
            .map_err(err)?;
        if set_aside.len() != 1 {
            tx.rollback().await.map_err(err)?;
            return Ok(RevisionWrite::NotPending);
        }
        insert_row::<B::Db>(&mut tx, &rev.row).await.map_err(err)?;
        insert_history::<B::Db>(&mut tx, &rev.history)
            .await
            .map_err(err)?;
        tx.commit().await.map_err(err)?;
        Ok(RevisionWrite::Written)
    }
}

/// Inserts the revision row (the stores derive the effective identity columns).
async fn insert_row<D: Dialect>(conn: &mut D::Connection, r: &NewDeadLetter) -> Decoded<()> {
    let mut qb = QueryBuilder::new(
        "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, event_id, error, \
         producer, schema_version, source_queue, exchange, routing_key, revision_of, \
         dead_lettered_at) VALUES (",
    );
    let values = [
        Bind::Text(r.id.clone()),
        Bind::Bytes(r.body.clone()),
        Bind::Text(r.reason.clone()),
        Bind::Int(r.attempts),
        Bind::Text(r.headers_json.clone()),
        Bind::OptText(r.event_id.clone()),
        Bind::OptText(r.error.clone()),
        Bind::OptText(r.producer.clone()),
        Bind::OptText(r.schema_version.clone()),
        Bind::OptText(r.source_queue.clone()),
        Bind::OptText(r.exchange.clone()),
        Bind::OptText(r.routing_key.clone()),
        Bind::OptText(r.revision_of.clone()),
    ];
    for (i, v) in values.into_iter().enumerate() {
        qb.push(match i {
            0 => "",
            // attempts: an INTEGER column on both stores.
            3 => ", CAST(",
            _ => ", ",
        });
        let int = matches!(v, Bind::Int(_));
        D::bind(&mut qb, v);
        if int {
            qb.push(" AS INTEGER)");
        }
    }
    qb.push(", COALESCE(");
    D::bind(&mut qb, Bind::OptTime(r.dead_lettered_at));
    qb.push(format!(", {}))", D::NOW));
    D::fetch(conn, qb.build()).try_collect::<Vec<_>>().await?;
    Ok(())
}

/// Appends history entries (their time is the database's).
async fn insert_history<D: Dialect>(
    conn: &mut D::Connection,
    entries: &[NewHistory],
) -> Decoded<()> {
    if entries.is_empty() {
        return Ok(());
    }
    let mut qb = QueryBuilder::new(
        "INSERT INTO dead_letter_history \
         (dead_letter_id, operator, action, outcome, detail, token, target, plan_id) VALUES ",
    );
    for (n, e) in entries.iter().enumerate() {
        qb.push(if n == 0 { "(" } else { ", (" });
        let values = [
            Bind::Text(e.dead_letter_id.clone()),
            Bind::Text(e.operator.clone()),
            Bind::Text(e.action.to_string()),
            Bind::Text(e.outcome.as_str().to_string()),
            Bind::Text(e.detail.clone()),
            Bind::OptText(e.token.clone()),
            Bind::OptText(e.target.clone()),
            Bind::OptText(e.plan_id.clone()),
        ];
        push_binds(&mut qb, values);
        qb.push(")");
    }
    D::fetch(conn, qb.build()).try_collect::<Vec<_>>().await?;
    Ok(())
}
