//! The ID a person typed or pasted, made the ID of a row before the command runs: spaces
//! around it trimmed, and a unique prefix of [`MIN_PREFIX`] characters or more replaced
//! by the full ID, so that every step after (claim, report, history) uses the full one.

use super::{Ctx, Result};
use dlq::error::DlqError;
use dlq::model::validate_id;
use dlq::store::Store;

/// The shortest prefix taken for an ID (a shorter one is looked up exactly).
pub const MIN_PREFIX: usize = 8;
/// Candidates named when a prefix is ambiguous.
const SHOWN: usize = 5;

impl Ctx {
    /// Trims each ID and resolves a unique prefix to its row's ID. An exact ID always
    /// wins (also one with spaces, if a row has it); an ambiguous prefix is a usage
    /// error naming candidates; anything else is left for the command to report
    /// (`not_found`, or its own error when the store cannot be read).
    pub async fn resolve_ids(&self, ids: Vec<&mut String>) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let opened = self.store().await;
        let store = opened.as_ref().ok();
        for id in ids {
            if let Some(full) = resolve(store.map(|s| s.as_ref()), id).await? {
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
async fn resolve(store: Option<&dyn Store>, raw: &str) -> Result<Option<String>> {
    let trimmed = raw.trim();
    if validate_id(trimmed).is_err() {
        return Ok(None);
    }
    let Some(store) = store else {
        return Ok((trimmed != raw).then(|| trimmed.to_string()));
    };
    let exists = |id: &str| {
        let ids = vec![id.to_string()];
        async move { store.summaries(&ids).await.is_ok_and(|r| !r.is_empty()) }
    };
    if exists(raw).await {
        return Ok(None);
    }
    let as_is = Ok((trimmed != raw).then(|| trimmed.to_string()));
    if trimmed != raw && exists(trimmed).await {
        return as_is;
    }
    if trimmed.chars().count() < MIN_PREFIX {
        return as_is;
    }
    let Ok(found) = store
        .ids_starting_with(trimmed, None, SHOWN as i64 + 1)
        .await
    else {
        return as_is;
    };
    match found.as_slice() {
        [] => as_is,
        [one] => Ok(Some(one.clone())),
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
