//! The ID a person typed or pasted, made the ID of a row before the command runs: spaces
//! around it trimmed (unless a row has the ID with them) and, for a command that only
//! reads (`show`, `diff`), a unique prefix of [`MIN_PREFIX`] characters or more replaced
//! by the full ID, said on stderr. A command that changes something takes only the full
//! ID: a script's full ID whose row is gone (pruned, say) must be `not_found`, never the
//! row of a longer ID that starts with it (the same event dead-lettered again).

use super::output::say;
use super::{Ctx, Result};
use dlq::error::DlqError;
use dlq::model::validate_id;
use dlq::store::Store;

/// The shortest prefix taken for an ID (a shorter one is looked up exactly).
pub const MIN_PREFIX: usize = 8;
/// Candidates named when a prefix is ambiguous.
const SHOWN: usize = 5;

/// What a command does with the dead letter an ID names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdUse {
    /// Shows it: a unique prefix may stand for it.
    Read,
    /// Changes it (or its history): only its full ID names it.
    Change,
}

impl Ctx {
    /// Trims each ID and, where it is only read, resolves a unique prefix to its row's
    /// ID. An exact ID always wins (also one with spaces, if a row has it); an ambiguous
    /// prefix is a usage error naming candidates; a store that cannot be read is an
    /// error here, not a `not_found` later. Anything else is left for the command.
    pub async fn resolve_ids(&self, ids: Vec<(&mut String, IdUse)>) -> Result<()> {
        let needs_store =
            |(id, using): &(&mut String, IdUse)| *using == IdUse::Read || id.trim() != id.as_str();
        if !ids.iter().any(needs_store) {
            return Ok(());
        }
        let opened = self.store().await?;
        for (id, using) in ids {
            if let Some(full) = resolve(opened.as_ref(), id, using).await? {
                *id = full;
            }
        }
        if let Ok(mut slot) = self.opened.lock() {
            *slot = Some(opened);
        }
        Ok(())
    }
}

/// The ID `raw` stands for, when it is not `raw` itself.
async fn resolve(store: &dyn Store, raw: &str, using: IdUse) -> Result<Option<String>> {
    let trimmed = raw.trim();
    if validate_id(trimmed).is_err() {
        return Ok(None);
    }
    let exists = |id: &str| {
        let ids = vec![id.to_string()];
        async move { Ok::<_, DlqError>(!store.summaries(&ids).await?.is_empty()) }
    };
    if trimmed != raw && exists(raw).await? {
        return Ok(None);
    }
    let as_is = Ok((trimmed != raw).then(|| trimmed.to_string()));
    if using == IdUse::Change || trimmed.chars().count() < MIN_PREFIX || exists(trimmed).await? {
        return as_is;
    }
    let found = store
        .ids_starting_with(trimmed, None, SHOWN as i64 + 1)
        .await?;
    match found.as_slice() {
        [] => as_is,
        [one] => {
            say(&format!(
                "dlq: {:?} is the start of one ID only: showing {}",
                dlq::sanitize::line(trimmed),
                dlq::sanitize::line(one)
            ));
            Ok(Some(one.clone()))
        }
        many => Err(ambiguous(trimmed, many).into()),
    }
}

fn ambiguous(prefix: &str, found: &[String]) -> DlqError {
    let mut shown: Vec<String> = found
        .iter()
        .take(SHOWN)
        .map(|id| dlq::sanitize::line(id).into_owned())
        .collect();
    if found.len() > SHOWN {
        shown.push("…".into());
    }
    DlqError::usage(format!(
        "the ID prefix {:?} matches more than one dead letter ({}): give more of the ID",
        dlq::sanitize::line(prefix),
        shown.join(", ")
    ))
}
