//! Why a row cannot be replayed (or claimed, or resolved) now, in the operator's words.

use crate::model::{Settling, State, Summary};
use chrono::{DateTime, Utc};

pub(super) fn fmt_time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Why a row cannot be claimed (or is no longer the caller's), for the operator: first
/// an id dlq does not write (see [`crate::model::IdStorage`]).
pub fn why_unavailable(row: &Summary, now: DateTime<Utc>) -> String {
    let by = row.replay_claim_owner.as_deref().unwrap_or("unknown");
    let at = row.replay_attempt_at.map(fmt_time).unwrap_or_default();
    if let Some(why) = row.id_storage.refusal(&row.id) {
        return why;
    }
    if row.lease_unreadable() && matches!(row.state, State::Claimed | State::Uncertain) {
        let stored = &row.unreadable["replay_claim_expires_at"];
        return format!(
            "{}: {by} holds a lease whose end dlq cannot read (stored: {stored}), so it may still be live; once that tool is done, set replay_claim_expires_at to a time dlq reads (see `dlq show`)",
            row.state.as_str()
        );
    }
    let error = row
        .last_replay_error
        .as_deref()
        .unwrap_or("outcome unknown");
    match row.state {
        State::Replayed => format!(
            "already replayed at {} by {by}",
            row.replayed_at.map(fmt_time).unwrap_or_default()
        ),
        State::Discarded => format!(
            "discarded at {}: {}",
            row.discarded_at.map(fmt_time).unwrap_or_default(),
            row.discard_note.as_deref().unwrap_or("")
        ),
        State::Uncertain => match row.settling(now) {
            Some(Settling::Running { until }) => format!(
                "uncertain: a replay by {by} attempted it at {at} and may have published it; that run may still settle it until {} ({}s left): then check the consumers and `dlq resolve`",
                fmt_time(until),
                (until - now).num_seconds().max(0)
            ),
            Some(Settling::V1Claim) => format!(
                "uncertain: claimed by a tool older than this schema (dlq v1, {by}, lease until {}): a replay may have been published before the upgrade, and nobody holds its claim now; check the consumers, then `dlq resolve`",
                row.replay_claim_expires_at.map(fmt_time).unwrap_or_else(|| "unknown".into())
            ),
            _ => format!(
                "uncertain: a replay by {by} at {at} may have published it ({error}); check the consumers, then `dlq resolve`"
            ),
        },
        State::Claimed => {
            let until = row.replay_claim_expires_at.unwrap_or(now);
            let left = (until - now).num_seconds().max(0);
            format!("claimed by {by} until {} ({left}s left)", fmt_time(until))
        }
        State::Pending => "nobody holds a claim on it".into(),
    }
}
