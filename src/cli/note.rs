//! `dlq note ID TEXT`: a free-text entry in a dead letter's history (an investigation
//! link, a ticket), with the operator and the database time. `show` prints it.

use super::report::{emit, StepReport};
use super::Ctx;
use super::Result;
use clap::Args;
use dlq::error::DlqError;
use dlq::model::{validate_id, HistoryAction, Outcome};

#[derive(Debug, Args)]
pub struct NoteArgs {
    /// The dead-letter ID
    pub id: String,
    /// The note
    pub text: String,
}

pub async fn run(ctx: &Ctx, args: NoteArgs) -> Result<u8> {
    validate_id(&args.id)?;
    if args.text.trim().is_empty() {
        return Err(DlqError::usage("the note is empty").into());
    }
    let operator = ctx.operator()?;
    let store = ctx.store_for_writes().await?;
    let first = store
        .summaries(std::slice::from_ref(&args.id))
        .await?
        .into_iter()
        .next();
    // The history of an id stored as bytes would be shared with its TEXT twin's.
    if let Some(why) = first.as_ref().and_then(|r| r.id_storage.refusal(&r.id)) {
        store.close().await;
        return Err(DlqError::other(format!("dead letter {:?}: {why}", args.id)).into());
    }
    let report = if first.is_none() {
        StepReport::new(
            &args.id,
            Outcome::NotFound,
            format!("no dead letter with id {:?}", args.id),
        )
    } else {
        let r = StepReport::new(&args.id, Outcome::Noted, args.text.clone());
        store
            .append_history(&[r.history(&operator, HistoryAction::Note, None)])
            .await?;
        r
    };
    store.close().await;
    Ok(emit(ctx, &report))
}
