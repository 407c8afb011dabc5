//! Decoding a row of the shared reads into the model's types, whatever a worker stored.

use super::{Decoded, Dialect, NotUtf8};
use crate::error::{DlqError, Result};
use crate::model::{
    token_operator, DeadLetter, Dimension, Group, GroupKey, IdStorage, State, Summary,
};
use chrono::{DateTime, Utc};
use std::borrow::Cow;
use std::collections::BTreeMap;

pub(crate) fn required<T>(v: Option<T>, col: &str) -> Decoded<T> {
    v.ok_or_else(|| sqlx::Error::ColumnDecode {
        index: col.to_string(),
        source: "unexpected NULL".into(),
    })
}

/// A text column as a worker wrote it: SQLite does not check that TEXT is UTF-8, and one
/// invalid byte must not make a whole listing fail (PostgreSQL refuses them on insert).
pub(crate) fn text<D: Dialect>(row: &D::Row, col: &str) -> Decoded<Option<String>> {
    D::text(row, col, NotUtf8::Escape)
}

pub(super) fn time<D: Dialect>(row: &D::Row, col: &str) -> Decoded<DateTime<Utc>> {
    required(D::time(row, col)?, col)
}

/// The columns of the export's row that [`Columns`] reads, named once: a decoder that
/// steps the statement itself finds each one's position once per statement, not once
/// per value (`store/sqlite_export.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Col {
    Id,
    Body,
    Reason,
    Attempts,
    HeadersJson,
    ReplayClaimOwner,
    LastReplayError,
    EventId,
    Error,
    Producer,
    SchemaVersion,
    SourceQueue,
    Exchange,
    RoutingKey,
    DiscardNote,
    RevisionOf,
    DeadLetteredAt,
    ReplayedAt,
    ReplayClaimExpiresAt,
    ReplayAttemptAt,
    DiscardedAt,
    Unreadable,
    History,
}

impl Col {
    pub(crate) const ALL: [Col; 23] = [
        Col::Id,
        Col::Body,
        Col::Reason,
        Col::Attempts,
        Col::HeadersJson,
        Col::ReplayClaimOwner,
        Col::LastReplayError,
        Col::EventId,
        Col::Error,
        Col::Producer,
        Col::SchemaVersion,
        Col::SourceQueue,
        Col::Exchange,
        Col::RoutingKey,
        Col::DiscardNote,
        Col::RevisionOf,
        Col::DeadLetteredAt,
        Col::ReplayedAt,
        Col::ReplayClaimExpiresAt,
        Col::ReplayAttemptAt,
        Col::DiscardedAt,
        Col::Unreadable,
        Col::History,
    ];

    /// Its name in the SELECT list (`AS` name).
    pub(crate) fn name(self) -> &'static str {
        match self {
            Col::Id => "id",
            Col::Body => "body",
            Col::Reason => "reason",
            Col::Attempts => "attempts",
            Col::HeadersJson => "headers_json",
            Col::ReplayClaimOwner => "replay_claim_owner",
            Col::LastReplayError => "last_replay_error",
            Col::EventId => "event_id",
            Col::Error => "error",
            Col::Producer => "producer",
            Col::SchemaVersion => "schema_version",
            Col::SourceQueue => "source_queue",
            Col::Exchange => "exchange",
            Col::RoutingKey => "routing_key",
            Col::DiscardNote => "discard_note",
            Col::RevisionOf => "revision_of",
            Col::DeadLetteredAt => "dead_lettered_at",
            Col::ReplayedAt => "replayed_at",
            Col::ReplayClaimExpiresAt => "replay_claim_expires_at",
            Col::ReplayAttemptAt => "replay_attempt_at",
            Col::DiscardedAt => "discarded_at",
            Col::Unreadable => "unreadable",
            Col::History => "history",
        }
    }
}

/// A row's columns, as the dialect reads them, whichever driver fetched the row: sqlx
/// ([`Of`], by name), or the SQLite export's own stepping (`store/sqlite_export.rs`,
/// by position).
pub(crate) trait Columns {
    fn text(&self, col: Col, bytes: NotUtf8) -> Decoded<Option<String>>;
    fn int(&self, col: Col) -> Decoded<i64>;
    fn time(&self, col: Col) -> Decoded<Option<DateTime<Utc>>>;
    fn bytes(&self, col: Col) -> Decoded<Option<Cow<'_, [u8]>>>;
}

/// A row sqlx fetched, read through its dialect.
pub(crate) struct Of<'r, D: Dialect>(pub &'r D::Row);

impl<D: Dialect> Columns for Of<'_, D> {
    fn text(&self, col: Col, bytes: NotUtf8) -> Decoded<Option<String>> {
        D::text(self.0, col.name(), bytes)
    }
    fn int(&self, col: Col) -> Decoded<i64> {
        D::int(self.0, col.name())
    }
    fn time(&self, col: Col) -> Decoded<Option<DateTime<Utc>>> {
        D::time(self.0, col.name())
    }
    fn bytes(&self, col: Col) -> Decoded<Option<Cow<'_, [u8]>>> {
        Ok(D::bytes(self.0, col.name())?.map(Cow::Borrowed))
    }
}

/// The `unreadable` column of [`time_columns`]: column name to what is stored.
pub(super) fn unreadable(row: &impl Columns) -> Decoded<BTreeMap<String, String>> {
    let Some(json) = row.text(Col::Unreadable, NotUtf8::Escape)? else {
        return Ok(BTreeMap::new());
    };
    serde_json::from_str(&json).map_err(|e| sqlx::Error::Decode(e.into()))
}

pub(super) fn summary<D: Dialect>(row: &D::Row) -> Decoded<Summary> {
    let t = |col: &str| text::<D>(row, col);
    let state = required(t("state")?, "state")?;
    let owner = t("replay_claim_owner")?;
    Ok(Summary {
        id: required(t("id")?, "id")?,
        reason: required(t("reason")?, "reason")?,
        attempts: D::int(row, "attempts")?,
        replayed_at: D::time(row, "replayed_at")?,
        replay_claim_owner: owner.as_deref().map(|o| token_operator(o).to_string()),
        replay_claim_expires_at: D::time(row, "replay_claim_expires_at")?,
        last_replay_error: t("last_replay_error")?,
        event_id: t("eff_event_id")?,
        error: t("error")?,
        producer: t("eff_producer")?,
        schema_version: t("eff_schema_version")?,
        source_queue: t("source_queue")?,
        exchange: t("exchange")?,
        routing_key: t("routing_key")?,
        dead_lettered_at: D::time(row, "dead_lettered_at")?,
        replay_attempt_at: D::time(row, "replay_attempt_at")?,
        discarded_at: D::time(row, "discarded_at")?,
        discard_note: t("discard_note")?,
        revision_of: t("revision_of")?,
        unreadable: unreadable(&Of::<D>(row))?,
        state: State::parse(&state)
            .ok_or_else(|| sqlx::Error::Decode(format!("unknown state {state:?}").into()))?,
        v1_claim: owner.as_deref().is_some_and(crate::store::is_v1_token),
        id_storage: IdStorage::from_code(D::int(row, "id_storage")?),
    })
}

/// One group of an aggregate (the scan's or the kept counts'): the keys `k0..`, `n`, the
/// state counts and the times.
pub(super) fn group<D: Dialect>(row: &D::Row, dims: &[Dimension]) -> Decoded<Group> {
    let int = |col: &str| D::int(row, col);
    let keys = dims
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let k = format!("k{i}");
            Ok((
                *d,
                if d.is_time() {
                    // A time no row of the group could be read in: "(unknown)".
                    D::time(row, &k)?.map_or(GroupKey::Text(None), GroupKey::Time)
                } else {
                    GroupKey::Text(text::<D>(row, &k)?)
                },
            ))
        })
        .collect::<Decoded<Vec<_>>>()?;
    Ok(Group {
        keys,
        count: int("n")?,
        pending: int("pending")?,
        claimed: int("claimed")?,
        uncertain: int("uncertain")?,
        replayed: int("replayed")?,
        discarded: int("discarded")?,
        first_seen: D::time(row, "first_seen")?,
        last_seen: D::time(row, "last_seen")?,
    })
}

/// The one row of `rows` (read by one ID), or an error naming the rows shown as `id`.
pub(super) fn only_one(mut rows: Vec<DeadLetter>, id: &str) -> Result<Option<DeadLetter>> {
    if rows.len() > 1 {
        let why = rows
            .iter()
            .find_map(|r| r.summary.id_storage.refusal(id))
            .unwrap_or_else(|| format!("{} rows are shown as id {id:?}", rows.len()));
        return Err(DlqError::other(format!("dead letter {id:?}: {why}")));
    }
    Ok(rows.pop())
}
