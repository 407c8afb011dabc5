//! Why a row cannot be replayed (or claimed, or resolved) now: a [`RowUnavailable`],
//! rendered in the operator's words with the next steps a caller spells ([`Spell`]).

use super::reason::{NextStep, Spell};
use crate::model::{Settling, State, Summary};
use chrono::{DateTime, Utc};

pub(super) fn fmt_time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Why a row is not available to a claim (or is no longer the caller's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RowUnavailable {
    /// Its id is one dlq does not write ([`crate::model::IdStorage`]); what to run.
    IdRefused(String),
    /// A lease is held whose end dlq cannot read, so it may still be live.
    LeaseUnreadable {
        state: State,
        by: String,
        stored: String,
    },
    Replayed {
        at: Option<DateTime<Utc>>,
        by: String,
    },
    Discarded {
        at: Option<DateTime<Utc>>,
        note: String,
    },
    /// Attempted by a run that may still settle it, until `until`.
    Settling {
        by: String,
        at: String,
        until: DateTime<Utc>,
        left_s: i64,
    },
    /// Claimed by dlq v1 before the upgrade: a publish may be out, nobody holds it.
    V1Claim {
        by: String,
        until: Option<DateTime<Utc>>,
    },
    /// Attempted, its lease ended: only a decision settles it.
    Uncertain {
        by: String,
        at: String,
        error: String,
    },
    Claimed {
        by: String,
        until: DateTime<Utc>,
        left_s: i64,
    },
    Pending,
}

/// Why `row` cannot be claimed now (first an id dlq does not write).
pub fn why_unavailable(row: &Summary, now: DateTime<Utc>) -> RowUnavailable {
    let by = row
        .replay_claim_owner
        .clone()
        .unwrap_or_else(|| "unknown".into());
    let at = row.replay_attempt_at.map(fmt_time).unwrap_or_default();
    if let Some(why) = row.id_storage.refusal(&row.id) {
        return RowUnavailable::IdRefused(why);
    }
    if row.lease_unreadable() && matches!(row.state, State::Claimed | State::Uncertain) {
        let stored = row.unreadable["replay_claim_expires_at"].clone();
        return RowUnavailable::LeaseUnreadable {
            state: row.state,
            by,
            stored,
        };
    }
    match row.state {
        State::Replayed => RowUnavailable::Replayed {
            at: row.replayed_at,
            by,
        },
        State::Discarded => RowUnavailable::Discarded {
            at: row.discarded_at,
            note: row.discard_note.clone().unwrap_or_default(),
        },
        State::Uncertain => match row.settling(now) {
            Some(Settling::Running { until }) => RowUnavailable::Settling {
                by,
                at,
                until,
                left_s: (until - now).num_seconds().max(0),
            },
            Some(Settling::V1Claim) => RowUnavailable::V1Claim {
                by,
                until: row.replay_claim_expires_at,
            },
            _ => RowUnavailable::Uncertain {
                by,
                at,
                error: row
                    .last_replay_error
                    .clone()
                    .unwrap_or_else(|| "outcome unknown".into()),
            },
        },
        State::Claimed => {
            let until = row.replay_claim_expires_at.unwrap_or(now);
            let left_s = (until - now).num_seconds().max(0);
            RowUnavailable::Claimed { by, until, left_s }
        }
        State::Pending => RowUnavailable::Pending,
    }
}

impl RowUnavailable {
    /// What the operator can do about it.
    pub fn next(&self) -> Option<NextStep> {
        match self {
            RowUnavailable::LeaseUnreadable { .. } => Some(NextStep::ShowRow),
            RowUnavailable::Settling { .. }
            | RowUnavailable::V1Claim { .. }
            | RowUnavailable::Uncertain { .. } => Some(NextStep::Resolve),
            _ => None,
        }
    }

    /// In the operator's words, next steps spelled by `s`.
    pub fn render(&self, s: &dyn Spell) -> String {
        let time = |t: &Option<DateTime<Utc>>| t.map(fmt_time).unwrap_or_default();
        match self {
            RowUnavailable::IdRefused(why) => why.clone(),
            RowUnavailable::LeaseUnreadable { state, by, stored } => format!(
                "{}: {by} holds a lease whose end dlq cannot read (stored: {stored}), so it may still be live; once that tool is done, set replay_claim_expires_at to a time dlq reads (see {})",
                state.as_str(),
                s.next(&NextStep::ShowRow)
            ),
            RowUnavailable::Replayed { at, by } => {
                format!("already replayed at {} by {by}", time(at))
            }
            RowUnavailable::Discarded { at, note } => {
                format!("discarded at {}: {note}", time(at))
            }
            RowUnavailable::Settling {
                by,
                at,
                until,
                left_s,
            } => format!(
                "uncertain: a replay by {by} attempted it at {at} and may have published it; that run may still settle it until {} ({left_s}s left): then check the consumers and {}",
                fmt_time(*until),
                s.next(&NextStep::Resolve)
            ),
            RowUnavailable::V1Claim { by, until } => format!(
                "uncertain: claimed by a tool older than this schema (dlq v1, {by}, lease until {}): a replay may have been published before the upgrade, and nobody holds its claim now; check the consumers, then {}",
                until.map(fmt_time).unwrap_or_else(|| "unknown".into()),
                s.next(&NextStep::Resolve)
            ),
            RowUnavailable::Uncertain { by, at, error } => format!(
                "uncertain: a replay by {by} at {at} may have published it ({error}); check the consumers, then {}",
                s.next(&NextStep::Resolve)
            ),
            RowUnavailable::Claimed { by, until, left_s } => {
                format!("claimed by {by} until {} ({left_s}s left)", fmt_time(*until))
            }
            RowUnavailable::Pending => "nobody holds a claim on it".into(),
        }
    }
}
