//! `dlq prune --older-than D --state replayed,discarded`: deletes settled dead letters,
//! with their history, in short batches, so that a worker inserting meanwhile waits for
//! one batch at most. Never a `pending`, `claimed` or `uncertain` one, nor a revision
//! while its original is here (a chain goes from its first row down: its replayed
//! revision tells that the original's event went out).

use super::filters::FilterArgs;
use super::output::say;
use super::output::{thousands, time};
use super::prompt::{confirm, require_consent, watch_signals, Consent};
use super::Result;
use super::{Ctx, Format};
use clap::Args;
use dlq::error::DlqError;
use dlq::model::State;
use serde::Serialize;
use std::sync::atomic::Ordering;
use std::time::Duration;

#[derive(Debug, Args)]
pub struct PruneArgs {
    /// Only rows settled (replayed or discarded) more than this long ago: 30d, 12h
    #[arg(long, value_parser = dlq::timeparse::duration_arg)]
    pub older_than: Duration,
    /// Count what would be deleted; delete nothing
    #[arg(long)]
    pub dry_run: bool,
    /// Do not ask (required when there is no terminal)
    #[arg(short = 'y', long)]
    pub yes: bool,
    /// Rows looked at per transaction
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(i64).range(1..=100_000))]
    pub batch_size: i64,
    #[command(flatten)]
    pub filters: FilterArgs,
}

#[derive(Serialize)]
struct PruneReport {
    dry_run: bool,
    states: Vec<State>,
    settled_before: String,
    matched: i64,
    deleted: u64,
    interrupted: bool,
}

pub async fn run(ctx: &Ctx, args: PruneArgs) -> Result<u8> {
    let states = State::parse_list(&args.filters.states())?;
    if states.is_empty()
        || states
            .iter()
            .any(|s| !matches!(s, State::Replayed | State::Discarded))
    {
        return Err(DlqError::usage(
            "prune deletes settled dead letters only: give --state replayed, discarded or replayed,discarded (never pending, claimed or uncertain)",
        ).into());
    }
    let store = ctx.store_for_writes().await?;
    let now = store.now().await?;
    let mut filter = args.filters.to_filter(now)?;
    let before = chrono::Duration::from_std(args.older_than)
        .ok()
        .and_then(|d| now.checked_sub_signed(d))
        .ok_or_else(|| DlqError::usage("--older-than is too far back"))?;
    filter.settled_before = Some(before);
    let matched = store.count(&filter).await?;
    let mut report = PruneReport {
        dry_run: args.dry_run,
        states: filter.states.clone(),
        settled_before: time(before),
        matched,
        deleted: 0,
        interrupted: false,
    };
    let states_text = report
        .states
        .iter()
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    if args.dry_run || matched == 0 {
        store.close().await;
        print(ctx, &report, &states_text);
        return Ok(dlq::exit::OK);
    }
    if require_consent(ctx, Consent::of(args.yes), "prune")? {
        say(&format!(
            "About to delete {} dead letters ({states_text}) settled before {}, and their history",
            thousands(matched),
            time(before)
        ));
        say(&format!("  database:        {}", ctx.database_url()?));
        if !confirm(ctx, "Delete them?").await? {
            say("declined; nothing was deleted");
            return Ok(dlq::exit::NOT_DONE);
        }
    }
    let interrupted = watch_signals();
    let mut after: Option<String> = None;
    loop {
        if interrupted.load(Ordering::SeqCst) {
            report.interrupted = true;
            break;
        }
        let (last, deleted) = store
            .prune_batch(&filter, after.as_deref(), args.batch_size)
            .await?;
        report.deleted += deleted;
        match last {
            Some(l) => after = Some(l),
            None => break,
        }
    }
    store.close().await;
    print(ctx, &report, &states_text);
    Ok(if report.interrupted {
        dlq::exit::INTERRUPTED
    } else {
        dlq::exit::OK
    })
}

fn print(ctx: &Ctx, r: &PruneReport, states: &str) {
    match ctx.format {
        Format::Json => ctx.out.json(r),
        _ if r.dry_run => ctx.out.text(&format!(
            "would delete {} dead letters ({states}) settled before {}, with their history; nothing was deleted (--dry-run)\n",
            thousands(r.matched),
            r.settled_before
        )),
        _ => ctx.out.text(&format!(
            "deleted {} dead letters ({states}) settled before {}, with their history{}\n",
            thousands(r.deleted as i64),
            r.settled_before,
            if r.interrupted {
                "; interrupted, the rest are kept"
            } else {
                ""
            }
        )),
    }
}
