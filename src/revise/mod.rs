//! Revisions (`dlq edit`): a dead letter whose content must be fixed before it can be
//! replayed gets a new row with the fixed content, written in the same transaction that
//! sets the original aside ([`crate::store::Revise`]), so one business event can never be
//! published through both copies.
//!
//! A stored body is never changed. The edit itself keeps every byte it does not touch
//! ([`doc`], [`patch`]); [`diff`] compares two dead letters for `dlq diff` and
//! `edit --dry-run`.

pub mod diff;
pub mod doc;
mod jq;
pub mod patch;

pub use jq::{JqError, Program};
pub use patch::PathError;

use crate::error::Result;
use crate::model::{sha256_hex, DeadLetter, HistoryAction, NewHistory, Outcome, State};
use crate::store::{
    derived_identity, EventInContent, NewDeadLetter, NewRevision, RevisionWrite, Store,
};

/// How the body changes.
pub enum BodyChange {
    /// Headers only.
    Keep,
    /// A jq program over a JSON body.
    Jq(Program),
    /// `--set PATH=JSON` / `--delete PATH`, in order.
    Paths(Vec<PathEdit>),
    /// The whole new body (`--body-file`), bytes as they are.
    Replace(Vec<u8>),
    /// What an operator saved in the editor: for a JSON body, JSON whose changes are
    /// spliced onto the stored text; else the new text.
    Edited(String),
}

#[derive(Debug, Clone)]
pub enum PathEdit {
    /// The value at the path becomes this JSON text (checked to be JSON).
    Set {
        path: Vec<String>,
        json: String,
    },
    Delete {
        path: Vec<String>,
    },
}

#[derive(Debug, Clone)]
pub enum HeaderEdit {
    /// The header becomes this string.
    Set {
        key: String,
        value: String,
    },
    Drop {
        key: String,
    },
}

pub struct Change {
    pub body: BodyChange,
    pub headers: Vec<HeaderEdit>,
}

/// Why a dead letter was not edited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Only a `pending` row can be edited.
    NotPending(State),
    /// Its body no longer hashes to what the plan says (the hash found).
    Drifted {
        expected: String,
        found: String,
    },
    /// A jq or path edit of a body that is not JSON (the parser's words).
    BodyNotJson(String),
    /// The stored headers are not a JSON object.
    HeadersNotJson,
    Jq(JqError),
    /// The path goes through a value that is not an object.
    NotAnObject(String),
    /// An edited text body is not UTF-8.
    BodyNotText,
}

/// The edited content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Content {
    pub body: Vec<u8>,
    pub headers_json: String,
}

/// Applies the change to a body and its headers: the new content, or why not.
pub fn apply(
    body: &[u8],
    headers_json: &str,
    change: &Change,
) -> std::result::Result<Content, Refusal> {
    let body = match &change.body {
        BodyChange::Keep => body.to_vec(),
        BodyChange::Replace(b) => b.clone(),
        BodyChange::Jq(p) => {
            let text = json_text(body)?;
            let out = p.run(text).map_err(Refusal::Jq)?;
            splice(text, &out)?.into_bytes()
        }
        BodyChange::Paths(edits) => {
            let original = json_text(body)?;
            let mut text = original.to_string();
            for e in edits {
                text = path_edit(&text, e).map_err(|e| match e {
                    PathError::NotJson(m) => Refusal::BodyNotJson(m),
                    PathError::NotAnObject(p) => Refusal::NotAnObject(p),
                })?;
            }
            // Only what the values changed: a value set to what it was keeps its text.
            splice(original, &text)?.into_bytes()
        }
        BodyChange::Edited(buffer) => edited(body, buffer)?,
    };
    let mut headers = headers_json.to_string();
    for h in &change.headers {
        let (path, value) = match h {
            HeaderEdit::Set { key, value } => (key, Some(value)),
            HeaderEdit::Drop { key } => (key, None),
        };
        let edit = match value {
            Some(v) => PathEdit::Set {
                path: vec![path.clone()],
                json: serde_json::to_string(v).unwrap_or_default(),
            },
            None => PathEdit::Delete {
                path: vec![path.clone()],
            },
        };
        headers = path_edit(&headers, &edit).map_err(|_| Refusal::HeadersNotJson)?;
    }
    Ok(Content {
        body,
        headers_json: headers,
    })
}

fn json_text(body: &[u8]) -> std::result::Result<&str, Refusal> {
    let text = std::str::from_utf8(body).map_err(|e| Refusal::BodyNotJson(e.to_string()))?;
    doc::parse(text).map_err(Refusal::BodyNotJson)?;
    Ok(text)
}

/// The changes from `text` to `new` (both JSON) written onto `text`.
fn splice(text: &str, new: &str) -> std::result::Result<String, Refusal> {
    let a = doc::parse(text).map_err(Refusal::BodyNotJson)?;
    let b = doc::parse(new).map_err(|e| Refusal::Jq(JqError::Failed(e)))?;
    Ok(patch::patch(text, &a, &b).1)
}

fn path_edit(text: &str, e: &PathEdit) -> std::result::Result<String, PathError> {
    match e {
        PathEdit::Set { path, json } => patch::set(text, path, json),
        PathEdit::Delete { path } => {
            Ok(patch::delete(text, path)?.unwrap_or_else(|| text.to_string()))
        }
    }
}

/// The body an operator saved in the editor. A JSON body's buffer must be JSON (the
/// caller reopens the editor with the error otherwise); a text body is the buffer, less
/// the final newline an editor adds to a text that had none.
fn edited(body: &[u8], buffer: &str) -> std::result::Result<Vec<u8>, Refusal> {
    if let Ok(text) = std::str::from_utf8(body) {
        if doc::parse(text).is_ok() {
            return splice(text, buffer).map(String::into_bytes);
        }
        let kept = match buffer.strip_suffix('\n') {
            Some(b) if !text.ends_with('\n') => b,
            _ => buffer,
        };
        return Ok(kept.as_bytes().to_vec());
    }
    Err(Refusal::BodyNotText)
}

/// What the editor shows of a body: pretty JSON in its own order and numbers, else the
/// text; None for bytes that are not UTF-8 (only `--body-file` replaces those).
pub fn editor_text(body: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    Some(match doc::parse(text) {
        Ok(n) => doc::pretty(&n),
        Err(_) => text.to_string(),
    })
}

/// Whether a buffer saved in the editor for `body` must be JSON, and is not: the error
/// to show on top when the editor opens again.
pub fn editor_error(body: &[u8], buffer: &str) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    doc::parse(text).ok()?;
    doc::parse(buffer).err()
}

/// What to do besides the change.
#[derive(Debug, Clone, Default)]
pub struct EditOptions {
    pub operator: String,
    pub note: String,
    /// Only when the body still hashes to this (a plan's item).
    pub expect_sha256: Option<String>,
    pub new_event_id: bool,
    pub dry_run: bool,
    pub plan_id: Option<String>,
}

/// What became of one edit.
#[derive(Debug, Clone)]
pub enum EditOutcome {
    Edited {
        revision_id: String,
        sha256: String,
        new_event_id: Option<String>,
        /// With a new event ID: the others the revision's headers (`x-event-id`) or body
        /// (`event_id`) still name, which a consumer reading it there sees.
        event_in_content: EventInContent,
    },
    Unchanged,
    /// `--dry-run`: the content it would write.
    WouldEdit {
        before: Content,
        after: Content,
    },
    NotEdited(Refusal),
    NotFound,
}

impl EditOutcome {
    pub fn outcome(&self) -> Outcome {
        match self {
            EditOutcome::Edited { .. } => Outcome::Edited,
            EditOutcome::Unchanged => Outcome::Unchanged,
            EditOutcome::WouldEdit { .. } => Outcome::WouldEdit,
            EditOutcome::NotEdited(_) => Outcome::NotEdited,
            EditOutcome::NotFound => Outcome::NotFound,
        }
    }
}

/// Edits one dead letter: reads it, applies the change, and writes the revision (or,
/// with `dry_run`, says what it would write).
pub async fn edit(
    store: &dyn Store,
    id: &str,
    change: &Change,
    opts: &EditOptions,
) -> Result<EditOutcome> {
    let Some(row) = store.get(id).await? else {
        return Ok(EditOutcome::NotFound);
    };
    edit_row(store, &row, change, opts).await
}

/// [`edit`] of a row already read.
pub async fn edit_row(
    store: &dyn Store,
    row: &DeadLetter,
    change: &Change,
    opts: &EditOptions,
) -> Result<EditOutcome> {
    if let Some(expected) = &opts.expect_sha256 {
        let found = row.sha256();
        if !found.eq_ignore_ascii_case(expected) {
            let r = Refusal::Drifted {
                expected: expected.clone(),
                found,
            };
            return Ok(EditOutcome::NotEdited(r));
        }
    }
    if row.summary.state != State::Pending {
        return Ok(EditOutcome::NotEdited(Refusal::NotPending(
            row.summary.state,
        )));
    }
    let after = match apply(&row.body, &row.headers_json, change) {
        Ok(c) => c,
        Err(r) => return Ok(EditOutcome::NotEdited(r)),
    };
    let before = Content {
        body: row.body.clone(),
        headers_json: row.headers_json.clone(),
    };
    if after == before && !opts.new_event_id {
        return Ok(EditOutcome::Unchanged);
    }
    if opts.dry_run {
        return Ok(EditOutcome::WouldEdit { before, after });
    }
    let rev = revision(row, after, opts);
    let new_event_id = opts
        .new_event_id
        .then(|| rev.row.event_id.clone())
        .flatten();
    let event_in_content = match &new_event_id {
        Some(fresh) => {
            EventInContent::of(&rev.row.headers_json, &rev.row.body).other_than(Some(fresh))
        }
        None => EventInContent::default(),
    };
    match store.revise(&rev).await? {
        RevisionWrite::Written => Ok(EditOutcome::Edited {
            revision_id: rev.row.id.clone(),
            sha256: sha256_hex(&rev.row.body),
            new_event_id,
            event_in_content,
        }),
        RevisionWrite::NotPending => Ok(
            match store
                .summaries(std::slice::from_ref(&row.summary.id))
                .await?
                .first()
            {
                None => EditOutcome::NotFound,
                Some(s) => EditOutcome::NotEdited(Refusal::NotPending(s.state)),
            },
        ),
    }
}

/// The revision of `row` with the content `after`: a new ID, the original's event ID (or
/// a fresh one), its queue, exchange, routing key and error, attempts 0; producer and
/// schema version kept unless the edit changed where they are derived from.
fn revision(row: &DeadLetter, after: Content, opts: &EditOptions) -> NewRevision {
    let s = &row.summary;
    let id = uuid::Uuid::now_v7().to_string();
    let event_id = match opts.new_event_id {
        true => Some(uuid::Uuid::new_v4().to_string()),
        false => s.event_id.clone(),
    };
    let old = derived_identity(&row.headers_json, &row.body);
    let new = derived_identity(&after.headers_json, &after.body);
    // A column the edit did not move keeps the original's effective value; one whose
    // header or body field the edit changed is derived from the edited content.
    let keep = |i: usize, v: &Option<String>| if old[i] == new[i] { v.clone() } else { None };
    let old_sha = row.sha256();
    let new_sha = sha256_hex(&after.body);
    let detail = |what: &str| {
        let fresh = match (&event_id, opts.new_event_id) {
            (Some(e), true) => format!("; new event id {e}"),
            _ => String::new(),
        };
        format!(
            "{what}: {} (sha256 {old_sha} -> {new_sha}{fresh})",
            opts.note
        )
    };
    let entry = |dead_letter_id: &str, detail: String| NewHistory {
        dead_letter_id: dead_letter_id.to_string(),
        operator: opts.operator.clone(),
        action: HistoryAction::Edit,
        outcome: Outcome::Edited,
        detail,
        token: None,
        target: None,
        plan_id: opts.plan_id.clone(),
    };
    let history = vec![
        // `restore` reads this prefix (store::NOT_REVISED): keep it as it is.
        entry(&s.id, detail(&format!("revised as {id}"))),
        entry(&id, detail(&format!("revision of {}", s.id))),
    ];
    NewRevision {
        original_id: s.id.clone(),
        discard_note: format!("revised as {id}: {}", opts.note),
        row: NewDeadLetter {
            id,
            body: after.body,
            reason: s.reason.clone(),
            attempts: 0,
            headers_json: after.headers_json,
            event_id,
            error: s.error.clone(),
            producer: keep(0, &s.producer),
            schema_version: keep(1, &s.schema_version),
            source_queue: s.source_queue.clone(),
            exchange: s.exchange.clone(),
            routing_key: s.routing_key.clone(),
            dead_lettered_at: s.dead_lettered_at,
            revision_of: Some(s.id.clone()),
            ..NewDeadLetter::default()
        },
        history,
    }
}
