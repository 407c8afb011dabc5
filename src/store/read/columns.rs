//! The SELECT lists the reads share and the decoding of a whole or claimed row: what a
//! [`crate::model::Summary`] reads, and how a large body is left out to be read in slices.

use super::decode::{summary, time};
use super::{required, text, Decoded, Dialect, TimeCol};
use crate::model::DeadLetter;
use crate::store::{state_case, Claimed};

/// A body longer than this is not sent with its row but read after it in slices of
/// [`BODY_SLICE`] bytes into one buffer, where the dialect has a [`Dialect::BODY_LEN`].
/// PostgreSQL's driver holds a value twice while it reads it and decoding copies it once
/// more: read whole, a 50 MiB body cost 3.2x its size (docs/performance.md).
pub const BODY_INLINE_MAX: i64 = 1 << 20;
pub const BODY_SLICE: i64 = 8 << 20;

/// The time columns, each as [`Dialect::at`] reads it under its own name, and what
/// cannot be read of them (`unreadable`).
pub(super) fn time_columns<D: Dialect>() -> String {
    let mut cols: Vec<String> = TimeCol::ALL
        .iter()
        .map(|c| format!("{} AS {}", D::shown_at(*c), c.name()))
        .collect();
    cols.push(format!("{} AS unreadable", D::UNREADABLE));
    cols.join(", ")
}

/// The SELECT list of a [`Summary`]. The claim owner is read whole; [`summary`] keeps
/// only its operator part.
pub(crate) fn summary_columns<D: Dialect>() -> String {
    format!(
        "id, reason, CAST(attempts AS BIGINT) AS attempts, replay_claim_owner, \
         last_replay_error, eff_event_id, error, eff_producer, eff_schema_version, \
         source_queue, exchange, routing_key, discard_note, revision_of, {}, {} AS id_storage, \
         {} AS state",
        time_columns::<D>(),
        D::ID_STORAGE,
        state_case(D::NOW, D::at(TimeCol::LeaseEnd))
    )
}

/// The body's length in bytes, as SQL (SQLite's `length` counts a TEXT value's
/// characters: only ever compared with [`BODY_INLINE_MAX`] there).
pub(super) fn body_len<D: Dialect>() -> &'static str {
    D::BODY_LEN.unwrap_or("length(body)")
}

/// A row's columns: the summary, headers, the body when `len` (SQL) is at most
/// [`BODY_INLINE_MAX`] or when there is no `len`, and `body_len`.
fn row_columns<D: Dialect>(len: Option<&str>) -> String {
    let body = match len {
        Some(len) => format!(
            "CASE WHEN {len} <= {BODY_INLINE_MAX} THEN body END AS body, \
             CAST({len} AS BIGINT) AS body_len"
        ),
        None => "body, 0 AS body_len".to_string(),
    };
    format!(
        "{}, headers_json, {body}, {} AS db_now",
        summary_columns::<D>(),
        D::NOW
    )
}

/// The columns of a whole row, as [`whole_row`] reads them.
pub(crate) fn whole_row_columns<D: Dialect>() -> String {
    row_columns::<D>(D::BODY_LEN)
}

/// The columns of a claimed row, as [`claimed_row`] reads them (a RETURNING list): a
/// large body is left out on every store (SQLite materializes RETURNING rows).
pub(crate) fn claimed_columns<D: Dialect>() -> String {
    row_columns::<D>(Some(body_len::<D>()))
}

pub(crate) fn claimed_row<D: Dialect>(row: &D::Row) -> Decoded<Claimed> {
    // A body that is no bytes (SQLite does not enforce a column's type) is left to
    // `held`, whose error releases that row alone.
    let content = match D::bytes(row, "body").ok().flatten() {
        Some(body) => Some((
            required(text::<D>(row, "headers_json")?, "headers_json")?,
            body.to_vec(),
        )),
        None => None,
    };
    Ok(Claimed {
        summary: summary::<D>(row)?,
        db_now: time::<D>(row, "db_now")?,
        content,
    })
}

pub(crate) fn whole_row<D: Dialect>(row: &D::Row) -> Decoded<Partial> {
    let (body, to_read) = match D::bytes(row, "body")? {
        Some(body) => (body.to_vec(), None),
        None => (Vec::new(), Some(D::int(row, "body_len")?)),
    };
    let letter = DeadLetter {
        summary: summary::<D>(row)?,
        headers_json: required(text::<D>(row, "headers_json")?, "headers_json")?,
        body,
        db_now: time::<D>(row, "db_now")?,
    };
    Ok((letter, to_read))
}

/// A row read by [`whole_row_columns`]: whole, or with its body still to read (its
/// length in bytes; see [`read_bodies`]).
pub(crate) type Partial = (DeadLetter, Option<i64>);
