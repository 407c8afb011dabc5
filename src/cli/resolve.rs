//! `dlq resolve`: the operator's decision on `uncertain` dead letters, after checking the
//! consumers: `--delivered` marks them replayed, `--not-delivered` makes them `pending`
//! again. Only rows that no run can still settle are resolved (the lease has ended, or
//! the claim was dlq v1's), so no replay can still be settling one; a refusal names until
//! when. A run that looks gone is no proof: one that lost its database connection lives
//! on, retrying its mark for `--settle-timeout`. The decision and its note go
//! into the history.

use super::filters::FilterArgs;
use super::output::say;
use super::output::thousands;
use super::prompt::{confirm, require_consent, Consent};
use super::report::{emit, StepReport};
use super::Result;
use super::{Ctx, Format};
use clap::Args;
use dlq::error::DlqError;
use dlq::model::{validate_id, HistoryAction, NewHistory, Outcome, State};
use dlq::plan::Plan;
use dlq::store::{Resolution, Store};
use std::collections::HashSet;
use std::path::PathBuf;

/// `dlq resolve --help`.
const EXAMPLES: &str = "Examples:
  # The consumer's inbox has the event: mark it replayed
  dlq resolve 2e3f3208-3f20-5e9c-9d48-a8ff92218f06 --delivered --note \"evt-inv-9001 is in the inventory inbox (INC-4711)\"
  # None of a group reached the consumer: pending again, for a later replay
  dlq resolve --state uncertain --reason retries_exhausted --not-delivered --note \"none arrived before the failover (INC-4711)\" --yes
  # The uncertain items of one plan run
  dlq resolve --plan inventory-plan.json --not-delivered --note \"checked the consumer's log\" --yes";

#[derive(Debug, Args)]
#[command(after_long_help = EXAMPLES)]
pub struct ResolveArgs {
    /// The dead-letter ID (or --plan FILE, or filters with --state uncertain)
    #[arg(conflicts_with = "plan")]
    pub id: Option<String>,
    /// Resolve the uncertain items of this plan
    #[arg(long)]
    pub plan: Option<PathBuf>,
    /// The consumers received it: mark it replayed
    #[arg(
        long,
        required_unless_present = "not_delivered",
        conflicts_with = "not_delivered"
    )]
    pub delivered: bool,
    /// It never arrived: make it pending again (a later replay publishes it)
    #[arg(long)]
    pub not_delivered: bool,
    /// Why you decided so (what you checked); kept in the history
    #[arg(long)]
    pub note: String,
    /// Do not ask before resolving a selection (required when there is no terminal)
    #[arg(short = 'y', long)]
    pub yes: bool,
    /// With filters: at most this many dead letters
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(i64).range(1..=1_000_000))]
    pub limit: i64,
    #[command(flatten)]
    pub filters: FilterArgs,
}

pub async fn run(ctx: &Ctx, args: ResolveArgs) -> Result<u8> {
    if args.note.trim().is_empty() {
        return Err(DlqError::usage(
            "--note is empty: say what you checked (it is kept in the history)",
        )
        .into());
    }
    let operator = ctx.operator()?;
    let store = ctx.store_for_writes().await?;
    let (ids, single) = select(store.as_ref(), &args).await?;
    if !single {
        if let Some(code) = consent(ctx, store.as_ref(), &args, &ids).await? {
            return Ok(code);
        }
    }
    let (resolution, detail) = if args.delivered {
        let d = format!("resolved as delivered (marked replayed): {}", args.note);
        (Resolution::Delivered, d)
    } else {
        let d = format!("resolved as not delivered (pending again): {}", args.note);
        (Resolution::NotDelivered, d)
    };
    let how = How {
        resolution,
        detail: &detail,
        operator: &operator,
    };
    let mut worst: Option<Outcome> = None;
    for chunk in ids.chunks(1000) {
        let settled = resolve_chunk(store.as_ref(), chunk, &how).await?;
        for id in chunk {
            let report = report_of(store.as_ref(), id, &settled, &how).await?;
            match (single, ctx.format) {
                (false, Format::Json) => ctx.out.json_line(&report),
                _ => {
                    emit(ctx, &report);
                }
            }
            if worst.is_none_or(|w| report.outcome.severity() > w.severity()) {
                worst = Some(report.outcome);
            }
        }
    }
    store.close().await;
    Ok(worst.map(|o| o.exit_code()).unwrap_or(dlq::exit::OK))
}

/// The IDs to resolve (the one given, a plan's, or the uncertain rows the filters
/// select, in ID order) and whether it is the one given.
async fn select(store: &dyn Store, args: &ResolveArgs) -> Result<(Vec<String>, bool)> {
    if let Some(id) = &args.id {
        validate_id(id)?;
        return Ok((vec![id.clone()], true));
    }
    if let Some(path) = &args.plan {
        return Ok((Plan::load(path, store).await?.ids(), false));
    }
    let mut filter = args.filters.resolve(store).await?;
    match filter.states.as_slice() {
        [] => filter.states = vec![State::Uncertain],
        [State::Uncertain] => {}
        _ => return Err(DlqError::usage(
            "only uncertain dead letters can be resolved: use --state uncertain (the default here)",
        )
        .into()),
    }
    let (rows, total) = store.list(&filter, args.limit).await?;
    if (rows.len() as i64) < total {
        return Err(DlqError::usage(format!(
            "the filters select {} uncertain dead letters, more than --limit {}: narrow them or raise --limit",
            thousands(total),
            args.limit
        ))
        .into());
    }
    // In ID order: a selection resolves (and reports) the same way every time.
    let mut ids: Vec<String> = rows.into_iter().map(|r| r.id).collect();
    ids.sort();
    Ok((ids, false))
}

/// Asks before a selection is resolved; `Some(exit code)` when the command ends here.
async fn consent(
    ctx: &Ctx,
    store: &dyn Store,
    args: &ResolveArgs,
    ids: &[String],
) -> Result<Option<u8>> {
    if ids.is_empty() {
        say("no uncertain dead letters match; nothing to resolve");
        return Ok(Some(dlq::exit::OK));
    }
    if require_consent(ctx, Consent::of(args.yes), "resolve a selection")? {
        let decision = match args.delivered {
            true => "delivered",
            false => "not delivered",
        };
        say(&format!(
            "About to resolve {} dead letters as {decision}: {}",
            thousands(ids.len() as i64),
            args.note
        ));
        say(&format!("  database:        {}", ctx.database_url()?));
        super::output::say_lines(&super::breakdown::lines(store, ids).await?);
        if !confirm(ctx, "Resolve them?").await? {
            say("declined; nothing was changed");
            return Ok(Some(dlq::exit::NOT_DONE));
        }
    }
    Ok(None)
}

/// What every row of one `dlq resolve` is settled as.
struct How<'a> {
    resolution: Resolution,
    detail: &'a str,
    operator: &'a str,
}

/// The rows of a chunk that were resolved, and those among them that a dlq v1 claim had
/// left uncertain (the report says so).
struct Settled {
    resolved: HashSet<String>,
    v1: HashSet<String>,
}

/// Resolves one chunk of IDs in one write.
async fn resolve_chunk(store: &dyn Store, chunk: &[String], how: &How<'_>) -> Result<Settled> {
    let entries: Vec<NewHistory> = chunk
        .iter()
        .map(|id| {
            StepReport::new(id, Outcome::Resolved, how.detail.to_string()).history(
                how.operator,
                HistoryAction::Resolve,
                None,
            )
        })
        .collect();
    let v1: HashSet<String> = store
        .summaries(chunk)
        .await?
        .into_iter()
        .filter(|s| s.v1_claim && s.state == State::Uncertain)
        .map(|s| s.id)
        .collect();
    let resolved: HashSet<String> = store
        .resolve(chunk, how.resolution, &entries)
        .await?
        .into_iter()
        .collect();
    Ok(Settled { resolved, v1 })
}

/// One row's report; a row not resolved says why (and its history records it).
async fn report_of(
    store: &dyn Store,
    id: &str,
    settled: &Settled,
    how: &How<'_>,
) -> Result<StepReport> {
    if settled.resolved.contains(id) {
        let why = match settled.v1.contains(id) {
            true => {
                " (it was claimed by a tool older than this schema, dlq v1; nobody held its claim)"
            }
            false => "",
        };
        return Ok(StepReport::new(
            id,
            Outcome::Resolved,
            format!("{}{why}", how.detail),
        ));
    }
    let r = StepReport::unavailable(store, id, Outcome::NotResolved, "not resolved: ").await?;
    r.record(store, how.operator, HistoryAction::Resolve, None)
        .await;
    Ok(r)
}
