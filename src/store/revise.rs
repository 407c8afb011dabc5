//! The revision write of `dlq edit`, once over the [`Dialect`] for both stores.
//!
//! One write transaction sets the original aside (`discarded`, "revised as NEW: note")
//! with one conditional UPDATE guarded as a claim is (the row must be `pending` on the
//! database's clock), inserts the revision, and appends the history of both. A replay, a
//! claim or another edit of the same row racing it finds the row no longer pending (or
//! waits on its lock and then does), so exactly one of them wins: an original and its
//! revision can never both be published.
//!
//! An import's check for two live copies of one event ([`live_pair`]) is here too: the
//! edit keeps one copy live, the import must not bring a second. Copies are found by
//! the revision chain and, where a chain is broken, by the event ID an edit keeps.

use super::read::{push_binds, state_of, Backend, Bind, Decoded, Dialect, NotUtf8};
use super::NewDeadLetter;
use crate::error::{DlqError, Result};
use crate::model::{NewHistory, State};
use crate::spell::{words, Cmd};
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

/// The rows an import brought, as [`live_pair`] finds them and reads their liveness.
#[derive(Clone, Copy)]
pub(crate) enum Imported<'a> {
    /// These IDs, with their times as inserted (PostgreSQL: one transaction).
    Ids(&'a [String]),
    /// SQLite's staged import of this token: its rows hold the token as their claim and
    /// their own times wait in `dlq_import_rows`.
    Staged(&'a str),
}

/// Each row of a revision chain with each of its ancestors `anc`: every ID reached by
/// following `revision_of` (its row here or not) and, for a row some revision names,
/// itself. Two rows are copies of one event when they share an `anc` (a row no revision
/// names shares nothing through itself, so it needs no seed). Seeded from the revision
/// rows (a partial index) and the IDs they name, never every row; UNION, not UNION ALL,
/// so that a crafted `revision_of` cycle ends. A `revision_of` names a worker's BLOB id
/// too ([`Dialect::id_named`]).
fn chain<D: Dialect>() -> String {
    format!(
        "WITH RECURSIVE chain(id, anc) AS (\
         SELECT id, revision_of FROM dead_letters WHERE revision_of IS NOT NULL \
         UNION SELECT revision_of, revision_of FROM dead_letters WHERE revision_of IS NOT NULL \
         UNION SELECT chain.id, d.revision_of FROM chain JOIN dead_letters d ON {} \
         WHERE d.revision_of IS NOT NULL), ",
        D::id_named("d.id", "chain.anc")
    )
}

/// Two live copies of one event an import would leave ([`live_pair`]): `revision`
/// descends from the copy they share, or carries `other`'s event ID (`event`).
pub(crate) struct LivePair {
    pub revision: String,
    pub other: String,
    /// The shared event ID when only that links them (no chain of this store does).
    pub event: Option<String>,
}

/// After an import, in its transaction: two copies of one event, one of them imported
/// now, neither set aside (discarded) nor both replayed, so that the event could go out
/// through both (an export of the original taken before its edits beside the export of
/// the revisions; a revision made elsewhere of an original revised here). The import
/// refuses it ([`live_pair_refused`]). Copies are:
///
/// - rows sharing an ancestor in [`chain`]: a revision and an original it descends
///   from, or two revisions of one original however far down;
/// - where no chain here links them, an imported revision (live, not replayed) whose
///   `revision_of` names no row of this store (its middle never exported, `export
///   --state pending`, or pruned) and another live row of its event ID (an edit keeps
///   it). Rows of one event ID linked by no revision are the same event dead-lettered
///   twice: allowed, as a worker's inserts are; so is a store's whole export, whose
///   chains are whole, and a replayed or come-back row beside a revision.
///
/// Not caught: a revision made with `--new-event-id` whose chain is broken here (its
/// middle absent): nothing left links it to the original; a break above the direct
/// original; an original (or a plain row of its event) imported after such a revision:
/// only an imported revision whose direct original is missing is matched by its event
/// ID. (Matching by event ID and `dead_lettered_at`, which an edit keeps, would close
/// these and stop refusing a plain duplicate beside a pruned chain.)
///
/// Cheap: the chains' rows (the revision rows, a partial index, and the IDs they name),
/// and one probe of the event index per imported revision whose chain is broken, never
/// every row nor every pair of an event's rows.
pub(crate) async fn live_pair<D: Dialect>(
    conn: &mut D::Connection,
    imported: Imported<'_>,
) -> Decoded<Option<LivePair>> {
    if let Imported::Ids([]) = imported {
        return Ok(None);
    }
    let mut qb = QueryBuilder::new(chain::<D>());
    qb.push("imp(id) AS (");
    match imported {
        Imported::Ids(ids) => {
            qb.push("SELECT id FROM dead_letters WHERE ");
            D::push_ids(&mut qb, ids);
        }
        Imported::Staged(token) => {
            qb.push("SELECT id FROM dlq_import_rows WHERE token = ");
            D::bind(&mut qb, Bind::Text(token.to_string()));
        }
    }
    // `kin`: the live rows of the chains, as the import leaves them. MATERIALIZED:
    // SQLite 3.46 otherwise computed it again inside the pair join, for every row of an
    // import (an import of 40,000 rows ran for 20 minutes).
    qb.push(format!(
        "), kin(id, replayed_at, imported) AS MATERIALIZED (SELECT {}, ",
        D::id_text("d.id")
    ));
    let (replayed, discarded) = match imported {
        Imported::Ids(_) => ("d.replayed_at", "d.discarded_at"),
        Imported::Staged(_) => (
            "COALESCE(s.replayed_at, d.replayed_at)",
            "COALESCE(s.discarded_at, d.discarded_at)",
        ),
    };
    qb.push(format!(
        "{replayed}, d.id IN (SELECT id FROM imp) FROM (SELECT id FROM chain) p \
         JOIN dead_letters d ON {}",
        D::id_named("d.id", "p.id")
    ));
    push_staged(&mut qb, imported, "d");
    qb.push(format!(
        " WHERE {discarded} IS NULL), \
         live(id, anc, replayed_at, imported) AS (SELECT c.id, c.anc, k.replayed_at, \
         k.imported FROM chain c JOIN kin k ON k.id = c.id) \
         SELECT a.id AS rid, b.id AS oid, NULL AS event FROM live a \
         JOIN live b ON b.anc = a.anc AND b.id <> a.id \
         WHERE a.anc <> a.id AND (a.replayed_at IS NULL OR b.replayed_at IS NULL) \
         AND (a.imported OR b.imported) UNION ALL "
    ));
    push_broken_chain_pair::<D>(&mut qb, imported, (replayed, discarded));
    qb.push(" LIMIT 1");
    let rows = D::fetch(conn, qb.build()).try_collect::<Vec<_>>().await?;
    let Some(row) = rows.first() else {
        return Ok(None);
    };
    let text = |col| D::text(row, col, NotUtf8::Escape);
    Ok(Some(LivePair {
        revision: text("rid")?.unwrap_or_default(),
        other: text("oid")?.unwrap_or_default(),
        event: text("event")?,
    }))
}

/// Joins a staged import's own values of the rows `alias` (SQLite), if any.
fn push_staged<D: Dialect>(qb: &mut QueryBuilder<'static, D>, imported: Imported<'_>, alias: &str) {
    if let Imported::Staged(token) = imported {
        qb.push(" LEFT JOIN dlq_import_rows s ON s.token = ");
        D::bind(qb, Bind::Text(token.to_string()));
        qb.push(format!(" AND s.id = {alias}.id"));
    }
}

/// The pairs no chain here links: an imported revision, live and not replayed, whose
/// `revision_of` names no row of this store (its middle never exported, or pruned),
/// beside another live row of its event ID (an edit keeps it). One probe of the event
/// index per such revision, never a join of all the event's rows with each other; a
/// plain row of an event, or a revision whose chain is here, is left to the chain.
fn push_broken_chain_pair<D: Dialect>(
    qb: &mut QueryBuilder<'static, D>,
    imported: Imported<'_>,
    (replayed, discarded): (&str, &str),
) {
    let other_live = match imported {
        Imported::Ids(_) => "b.discarded_at IS NULL".to_string(),
        Imported::Staged(_) => "COALESCE((SELECT t.discarded_at FROM dlq_import_rows t \
             WHERE t.token = s.token AND t.id = b.id), b.discarded_at) IS NULL"
            .to_string(),
    };
    qb.push(format!(
        "SELECT rid, oid, event FROM (SELECT d.id AS rid, (SELECT b.id FROM dead_letters b \
         WHERE b.eff_event_id = d.eff_event_id AND b.id <> d.id AND {other_live} LIMIT 1) \
         AS oid, d.eff_event_id AS event FROM imp i JOIN dead_letters d ON d.id = i.id"
    ));
    push_staged(qb, imported, "d");
    qb.push(format!(
        " WHERE d.revision_of IS NOT NULL AND {discarded} IS NULL AND {replayed} IS NULL \
         AND NOT EXISTS (SELECT 1 FROM dead_letters p WHERE {})) e WHERE oid IS NOT NULL",
        D::id_named("p.id", "d.revision_of")
    ));
}

/// Why an import with a [`live_pair`] imported nothing.
pub(crate) fn live_pair_refused(pair: LivePair) -> DlqError {
    let LivePair {
        revision: rid,
        other: oid,
        event,
    } = pair;
    let Some(event) = event else {
        return DlqError::usage(
            words(format!(
                "dead letters {rid:?} and {oid:?} are copies of one event (a revision and an original it descends from, or revisions of one original), and neither is set aside: both could be replayed, one event twice (nothing was imported); import the original as "
            ))
            .cmd(Cmd::Export)
            .text(" writes it after the edit (discarded), or leave one of them out"),
        );
    };
    DlqError::usage(format!(
        "dead letters {rid:?} and {oid:?} are copies of one event (the same event ID {event:?}, and {rid:?} a revision, made by an edit), and neither is set aside: both could be replayed, one event twice (nothing was imported); leave one of them out, or set the one already here aside (discard it) first"
    ))
}
