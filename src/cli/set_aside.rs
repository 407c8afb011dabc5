//! `dlq discard` and `dlq restore`, one flow in two directions. A discard sets `pending`
//! dead letters aside, with a note, so that no claim, plan or replay ever takes them (the
//! row is kept byte for byte); a restore makes a discarded one `pending` again, with a
//! note in its history saying why, unless another copy of its event is live (a revised
//! original; see `dlq::store::copies`). Two argument structs, for their own help texts.

use super::filters::{select, FilterArgs};
use super::output::say;
use super::prompt::Consent;
use super::report::{confirm_and_apply, Applied, Change};
use super::Ctx;
use super::Result;
use clap::Args;
use dlq::error::DlqError;
use dlq::model::{HistoryAction, NewHistory, Outcome, State};
use dlq::store::copies::LiveCopy;
use dlq::store::Store;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

#[derive(Debug, Args)]
pub struct DiscardArgs {
    /// The dead-letter ID (or --plan FILE, or filters)
    #[arg(conflicts_with = "plan")]
    pub id: Option<String>,
    /// Discard the items of this plan (made on this database)
    #[arg(long)]
    pub plan: Option<PathBuf>,
    /// Why it must never be replayed (a ticket, what you checked); kept in the history
    #[arg(long)]
    pub note: String,
    /// Do not ask (required when there is no terminal)
    #[arg(short = 'y', long)]
    pub yes: bool,
    /// With filters: at most this many dead letters
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(i64).range(1..=1_000_000))]
    pub limit: i64,
    #[command(flatten)]
    pub filters: FilterArgs,
}

#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// The dead-letter ID (or --plan FILE, or filters with --state discarded)
    #[arg(conflicts_with = "plan")]
    pub id: Option<String>,
    /// Restore the discarded items of this plan (made on this database)
    #[arg(long)]
    pub plan: Option<PathBuf>,
    /// Why it may be replayed after all; kept in the history
    #[arg(long)]
    pub note: String,
    /// Do not ask (required when there is no terminal)
    #[arg(short = 'y', long)]
    pub yes: bool,
    /// With filters: at most this many dead letters
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(i64).range(1..=1_000_000))]
    pub limit: i64,
    #[command(flatten)]
    pub filters: FilterArgs,
}

/// Which way the rows move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Discard,
    Restore,
}

/// What either command was asked, the same for both.
struct Request<'a> {
    id: Option<&'a str>,
    plan: Option<&'a Path>,
    note: &'a str,
    consent: Consent,
    limit: i64,
    filters: &'a FilterArgs,
}

pub async fn discard(ctx: &Ctx, a: DiscardArgs) -> Result<u8> {
    let req = Request {
        id: a.id.as_deref(),
        plan: a.plan.as_deref(),
        note: &a.note,
        consent: Consent::of(a.yes),
        limit: a.limit,
        filters: &a.filters,
    };
    run(ctx, Direction::Discard, req).await
}

pub async fn restore(ctx: &Ctx, a: RestoreArgs) -> Result<u8> {
    let req = Request {
        id: a.id.as_deref(),
        plan: a.plan.as_deref(),
        note: &a.note,
        consent: Consent::of(a.yes),
        limit: a.limit,
        filters: &a.filters,
    };
    run(ctx, Direction::Restore, req).await
}

impl Direction {
    /// The change, without the rows whose detail differs.
    fn change(self, note: &str, plan_id: Option<String>) -> Change {
        let (action, from, meaning, done, not_done, detail, refused) = match self {
            Direction::Discard => (
                HistoryAction::Discard,
                State::Pending,
                "never replayed until restored",
                Outcome::Discarded,
                Outcome::NotDiscarded,
                format!("set aside, never replayed until restored: {note}"),
                "not discarded: only a pending dead letter can be; ",
            ),
            Direction::Restore => (
                HistoryAction::Restore,
                State::Discarded,
                "pending again: a plan or replay may publish it",
                Outcome::Restored,
                Outcome::NotRestored,
                format!("pending again: {note}"),
                "not restored: only a discarded dead letter can be; ",
            ),
        };
        Change {
            action,
            from,
            meaning,
            done,
            not_done,
            detail,
            detail_of: Default::default(),
            refused,
            plan_id,
        }
    }

    /// The word for a row changed, in a refusal of the filters ("discarded").
    fn done_word(self) -> &'static str {
        match self {
            Direction::Discard => "discarded",
            Direction::Restore => "restored",
        }
    }
}

async fn run(ctx: &Ctx, dir: Direction, req: Request<'_>) -> Result<u8> {
    if req.note.trim().is_empty() {
        return Err(DlqError::usage("--note is empty: say why (it is kept in the history)").into());
    }
    let operator = ctx.operator()?;
    let store = ctx.store_for_writes().await?;
    let s = store.as_ref();
    let mut change = dir.change(req.note, None);
    let sel = select(
        s,
        req.id,
        req.plan,
        req.filters,
        change.from,
        req.limit,
        dir.done_word(),
    )
    .await?;
    change.plan_id = sel.plan_id.clone();
    if dir == Direction::Restore {
        change.detail_of = open_attempts(s, &sel.ids, req.note).await?;
        if !change.detail_of.is_empty() && !sel.single {
            say(&format!(
                "{} of these had a publish attempted before the discard, never settled: restored, they are uncertain, not pending (check the consumers, then `dlq resolve`)",
                change.detail_of.len()
            ));
        }
    }
    let note = req.note;
    let code = confirm_and_apply(
        ctx,
        s,
        &operator,
        &sel,
        req.consent,
        note,
        &change,
        |ids, history| async move {
            match dir {
                Direction::Discard => s.discard(&ids, note, &history).await.map(Applied::from),
                Direction::Restore => restore_rows(s, &ids, &history).await,
            }
        },
    )
    .await?;
    store.close().await;
    Ok(code)
}

/// Restores `ids`. A row left discarded because another copy of its event is live (or
/// restored with it) says which: both could be replayed (see `dlq::store::copies`).
async fn restore_rows(
    s: &dyn Store,
    ids: &[String],
    history: &[NewHistory],
) -> dlq::error::Result<Applied> {
    let changed = s.restore(ids, history).await?;
    let done: HashSet<&String> = changed.iter().collect();
    let left: Vec<String> = ids
        .iter()
        .filter(|id| !done.contains(id))
        .cloned()
        .collect();
    let mut refused = HashMap::new();
    // After the commit: a failed read must not hide what was restored (each row left
    // says why, or that it could not be read).
    let copies = match left.is_empty() {
        true => Vec::new(),
        false => s.live_copies(&left).await.unwrap_or_else(|e| {
            tracing::debug!("could not read the live copies of the rows left: {e}");
            Vec::new()
        }),
    };
    for copy in copies {
        refused
            .entry(copy.id.clone())
            .or_insert_with(|| live_copy_words(&copy));
    }
    Ok(Applied { changed, refused })
}

fn live_copy_words(copy: &LiveCopy) -> String {
    let other = &copy.other;
    format!(
        "not restored: it and {other:?} are copies of one event ({}), and {other:?} is live (or restored with it): both could be replayed, one event twice; set {other:?} aside (discard it) first, or restore only one of them",
        copy.why()
    )
}

/// What a restore says of the rows with an open publish attempt (a row imported so, or
/// discarded by an older `dlq`): restored, they are `uncertain`, not `pending`. A
/// discarded row's attempt does not change meanwhile: nothing claims a discarded row.
async fn open_attempts(
    store: &dyn Store,
    ids: &[String],
    note: &str,
) -> dlq::error::Result<HashMap<String, String>> {
    let mut out = HashMap::new();
    for chunk in ids.chunks(1000) {
        for row in store.summaries(chunk).await? {
            if row.replay_attempt_at.is_some() && row.replayed_at.is_none() {
                let detail = format!(
                    "uncertain, not pending: a publish attempted before the discard was never settled and may have been delivered; check the consumers, then `dlq resolve {} --delivered|--not-delivered`: {note}",
                    row.id
                );
                out.insert(row.id, detail);
            }
        }
    }
    Ok(out)
}
