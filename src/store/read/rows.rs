//! Whole rows beyond one SELECT: large bodies read in slices, and the export's rows
//! (raw columns, history) with the import of that history.

use super::columns::body_len;
use super::decode::{unreadable, Col, Columns};
use super::{push_binds, required, Bind, Decoded, Dialect, NotUtf8, Partial, BODY_SLICE};
use crate::error::{DlqError, Result};
use crate::model::{token_operator, DeadLetter, HistoryEntry};
use crate::spell::{words, Cmd};
use crate::store::NewDeadLetter;
use futures_util::TryStreamExt;
use sqlx::QueryBuilder;

/// Completes rows read by [`super::whole_row`]: each body left out is read in slices
/// into one buffer of its final size, on `conn` (in one snapshot, see
/// [`super::letters::whole_rows`]). A row deleted meanwhile is an error, never a shorter
/// body.
pub(super) async fn read_bodies<D: Dialect>(
    conn: &mut D::Connection,
    rows: Vec<Partial>,
    err: impl Fn(sqlx::Error) -> DlqError,
) -> Result<Vec<DeadLetter>> {
    let mut out = Vec::with_capacity(rows.len());
    for (mut letter, to_read) in rows {
        if let Some(len) = to_read {
            letter.body = read_body::<D>(conn, &letter.summary.id, len, &err).await?;
        }
        out.push(letter);
    }
    Ok(out)
}

/// At most four slices, so a body stored compressed (where each `substr` decompresses
/// everything before its slice) costs at most 2.5 whole reads; at least [`BODY_SLICE`].
fn slice_len(len: i64) -> i64 {
    BODY_SLICE.max((len + 3) / 4)
}

async fn read_body<D: Dialect>(
    conn: &mut D::Connection,
    id: &str,
    len: i64,
    err: &impl Fn(sqlx::Error) -> DlqError,
) -> Result<Vec<u8>> {
    let gone = || {
        DlqError::other(format!(
            "the body of {id} changed or the row was deleted while it was read"
        ))
    };
    let slice = slice_len(len);
    let mut body: Vec<u8> = Vec::new();
    // The snapshot's length, read with the first slice.
    let mut total: Option<i64> = None;
    while total.is_none_or(|t| (body.len() as i64) < t) {
        let before = body.len();
        let mut qb = QueryBuilder::new("SELECT substr(body, CAST(");
        D::bind(&mut qb, Bind::Int(before as i64 + 1));
        qb.push(" AS INTEGER), CAST(");
        D::bind(&mut qb, Bind::Int(slice));
        qb.push(format!(
            " AS INTEGER)) AS part, CAST({} AS BIGINT) AS len FROM dead_letters WHERE id = ",
            body_len::<D>()
        ));
        D::bind(&mut qb, Bind::Text(id.to_string()));
        let mut parts = D::fetch(conn, qb.build());
        let row = parts.try_next().await.map_err(err)?.ok_or_else(gone)?;
        let part = D::bytes(&row, "part").and_then(|p| required(p, "part"));
        let part = part.map_err(err)?;
        if total.is_none() {
            let t = D::int(&row, "len").map_err(err)?;
            body.try_reserve_exact(t as usize).map_err(|_| {
                DlqError::other(format!(
                    "the body of {id} ({t} bytes) does not fit in memory"
                ))
            })?;
            total = Some(t);
        }
        body.extend_from_slice(part);
        if body.len() == before && total.is_some_and(|t| t > 0) {
            return Err(gone());
        }
    }
    Ok(body)
}

/// An exported row: the raw columns (not the effective identity), exactly as stored.
pub(crate) fn exported(row: &impl Columns) -> Result<NewDeadLetter> {
    let (r, owner, history) = exported_columns(row).map_err(crate::store::db_error)?;
    // Its own claim and times wait until the import gives it back (or undoes it).
    if crate::store::import_held(owner.as_deref(), r.replay_claim_expires_at) {
        return Err(DlqError::other(
            words(format!(
                "dead letter {:?} is held by a dlq import that has not finished, so its own state is not yet in the store (the lines before it were exported; run ",
                r.id
            ))
            .cmd(Cmd::Export)
            .text(" again once the import has ended)"),
        ));
    }
    Ok(NewDeadLetter {
        history: Some(crate::store::parse_history_json(history.as_deref())?),
        ..r
    })
}

/// The row's columns; with the claim owner as stored (the row keeps its operator part)
/// and the history's JSON text.
fn exported_columns(
    row: &impl Columns,
) -> Decoded<(NewDeadLetter, Option<String>, Option<String>)> {
    // Text that is not UTF-8 (SQLite, or a BLOB in a text column) escaped, as shown.
    let t = |col: Col| row.text(col, NotUtf8::Escape);
    let at = |col: Col| row.time(col);
    let owner = t(Col::ReplayClaimOwner)?;
    let r = NewDeadLetter {
        line: 0,
        id: required(t(Col::Id)?, "id")?,
        body: required(row.bytes(Col::Body)?, "body")?.into_owned(),
        reason: required(t(Col::Reason)?, "reason")?,
        attempts: row.int(Col::Attempts)?,
        headers_json: required(t(Col::HeadersJson)?, "headers_json")?,
        replayed_at: at(Col::ReplayedAt)?,
        replay_claim_owner: owner.as_deref().map(|o| token_operator(o).to_string()),
        replay_claim_expires_at: at(Col::ReplayClaimExpiresAt)?,
        last_replay_error: t(Col::LastReplayError)?,
        event_id: t(Col::EventId)?,
        error: t(Col::Error)?,
        producer: t(Col::Producer)?,
        schema_version: t(Col::SchemaVersion)?,
        source_queue: t(Col::SourceQueue)?,
        exchange: t(Col::Exchange)?,
        routing_key: t(Col::RoutingKey)?,
        dead_lettered_at: at(Col::DeadLetteredAt)?,
        replay_attempt_at: at(Col::ReplayAttemptAt)?,
        discarded_at: at(Col::DiscardedAt)?,
        discard_note: t(Col::DiscardNote)?,
        revision_of: t(Col::RevisionOf)?,
        history: None,
        unreadable: unreadable(row)?,
    };
    let history = row.text(Col::History, NotUtf8::Refuse)?;
    Ok((r, owner, history))
}

/// History entries per INSERT: 9 values each, within both drivers' limits.
const HISTORY_PER_STATEMENT: usize = 1000;

/// Each history entry import lines carried, with its row's ID, oldest first per row.
pub(crate) fn carried_history<'r>(
    rows: impl IntoIterator<Item = &'r NewDeadLetter>,
) -> Vec<(&'r str, &'r HistoryEntry)> {
    rows.into_iter()
        .flat_map(|r| {
            let h = r.history.as_deref().unwrap_or_default();
            h.iter().map(|e| (r.id.as_str(), e))
        })
        .collect()
}

/// Inserts history import lines carried, as exported (their times kept), in the order
/// given: one statement per [`HISTORY_PER_STATEMENT`] entries.
pub(crate) async fn import_history<D: Dialect>(
    conn: &mut D::Connection,
    entries: &[(&str, &HistoryEntry)],
) -> Decoded<()> {
    for chunk in entries.chunks(HISTORY_PER_STATEMENT) {
        let mut qb = QueryBuilder::new(
            "INSERT INTO dead_letter_history (dead_letter_id, at, operator, action, outcome, \
             detail, target, plan_id, token_ref) VALUES ",
        );
        for (i, (id, h)) in chunk.iter().enumerate() {
            qb.push(if i == 0 { "(" } else { ", (" });
            let values = [
                Bind::Text(id.to_string()),
                Bind::Time(h.at),
                Bind::Text(h.operator.clone()),
                Bind::Text(h.action.clone()),
                Bind::Text(h.outcome.clone()),
                Bind::OptText(h.detail.clone()),
                Bind::OptText(h.target.clone()),
                Bind::OptText(h.plan_id.clone()),
                Bind::OptText(h.token_ref.clone()),
            ];
            push_binds(&mut qb, values);
            qb.push(")");
        }
        D::fetch(conn, qb.build()).try_collect::<Vec<_>>().await?;
    }
    Ok(())
}
