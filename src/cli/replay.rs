//! `dlq replay ID` and `dlq replay --plan FILE`: both go through [`dlq::replay::replay`].

mod context;
mod progress;
mod single;

use super::output::say;
use super::prompt::{confirm, require_consent, watch_signals_counted, Consent};
use super::Ctx;
use super::Result;
use clap::Args;
use dlq::error::DlqError;
use dlq::plan::{run_plan, Canary, DepthGate, Pacing, Plan, RunOptions, DEFAULT_CANARY_WAIT};
use dlq::publisher::PublisherOptions;
use dlq::publisher::{Broker, Pacer};
use dlq::rate::Rate;
use dlq::replay::{Notice, Notices, ReplayOptions, Step, LEASE_MARGIN};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

/// `dlq replay --help`: how it is used at 3 a.m.
const EXAMPLES: &str = "Examples:
  # See where one dead letter would go, with its final headers and body
  dlq replay 2e3f3208-3f20-5e9c-9d48-a8ff92218f06 --dry-run
  # Replay it from a script, only if the body is still the one reviewed
  dlq replay 2e3f3208-3f20-5e9c-9d48-a8ff92218f06 --expect-sha256 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08 --yes
  # A reviewed plan, gently: 5 items first, watched for 2m, then 5/s rising to 200/s
  # over 10m, never while the target queue holds more than 1000 ready messages
  dlq replay --plan inventory-plan.json --canary 5 --ramp 5/s..200/s:10m --max-target-depth 1000
  # The same plan at a fixed rate, one JSON line per item for a script
  dlq replay --plan inventory-plan.json --rate 50/s --max-failures 3 --yes -o json";

#[derive(Debug, Args)]
#[command(after_long_help = EXAMPLES)]
pub struct ReplayArgs {
    /// The dead-letter ID (or --plan FILE)
    #[arg(required_unless_present = "plan", conflicts_with = "plan")]
    pub id: Option<String>,
    /// Replay exactly the items of a plan
    ///
    /// A plan written by `dlq plan` (- for stdin).
    #[arg(long, value_name = "FILE")]
    pub plan: Option<PathBuf>,
    /// Use a lease taken with `dlq claim`
    ///
    /// Instead of claiming now.
    #[arg(long, conflicts_with = "plan")]
    pub token: Option<String>,
    /// How long the claim lasts
    ///
    /// It must exceed --connect-timeout + --confirm-timeout.
    #[arg(long, value_name = "DUR", default_value = "5m", value_parser = dlq::timeparse::lease_arg)]
    pub lease: Duration,
    /// Longest wait for the broker's confirm
    #[arg(long, value_name = "DUR", default_value = "10s", value_parser = dlq::timeparse::duration_arg)]
    pub confirm_timeout: Duration,
    /// Publish to this exchange instead
    ///
    /// Instead of the row's (default: the default exchange).
    #[arg(long, value_name = "NAME")]
    pub exchange: Option<String>,
    /// Publish with this routing key instead
    ///
    /// Instead of the row's (default: its source queue).
    #[arg(long, value_name = "KEY")]
    pub routing_key: Option<String>,
    /// Show target, headers and body; change nothing
    #[arg(long, conflicts_with = "plan")]
    pub dry_run: bool,
    /// Do not ask (required without a terminal)
    #[arg(short = 'y', long)]
    pub yes: bool,
    /// Only if the body's SHA-256 is still this
    ///
    /// The SHA-256 `dlq show` printed when you reviewed it.
    #[arg(long, value_name = "SHA256", conflicts_with = "plan")]
    pub expect_sha256: Option<String>,
    /// Plan: publishes per second (20/s, 300/m)
    ///
    /// With --plan: at most this many publishes per second.
    #[arg(long, value_parser = parse_rate, requires = "plan")]
    pub rate: Option<f64>,
    /// Plan: a rising rate, e.g. 5/s..200/s:10m
    ///
    /// With --plan: a rate that rises linearly from FROM to TO over DUR (default 5m); with
    /// --canary it starts once the canary has passed.
    #[arg(long, value_parser = parse_ramp, requires = "plan", conflicts_with = "rate", value_name = "FROM..TO[:DUR]")]
    pub ramp: Option<Rate>,
    /// Plan: replay N first, then watch them
    ///
    /// With --plan: after N items, wait (--canary-wait) watching for any of them to come
    /// back as a new dead letter; one that does stops the run.
    #[arg(long, value_name = "N", requires = "plan", value_parser = clap::value_parser!(u64).range(1..))]
    pub canary: Option<u64>,
    /// How long to watch the canary [default: 2m]
    ///
    /// With --canary: then the run goes on.
    #[arg(long, value_name = "DUR", requires = "canary", value_parser = dlq::timeparse::duration_arg)]
    pub canary_wait: Option<Duration>,
    /// Plan: wait while the target queue holds > N
    ///
    /// With --plan: checked before each batch; the target must be one queue, not a named
    /// exchange.
    #[arg(long, value_name = "N", requires = "plan")]
    pub max_target_depth: Option<u64>,
    /// Plan: stop after N failed or uncertain
    ///
    /// With --plan: no new items are taken after N publish_failed or uncertain items;
    /// batches already out still settle, so the summary may count a few more.
    #[arg(long, value_name = "N", requires = "plan", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_failures: Option<u64>,
    /// Plan: items per batch
    ///
    /// With --plan: items claimed, published and marked together.
    #[arg(long, value_name = "N", default_value_t = 1000, requires = "plan", value_parser = clap::value_parser!(u64).range(1..=5000))]
    pub batch_size: u64,
    /// Plan: batches worked on at once
    ///
    /// With --plan and no --rate: each on its own connection (one is being published
    /// while the others are claimed or marked); with --ramp they share its rate.
    #[arg(long, value_name = "N", default_value_t = 2, requires = "plan", value_parser = clap::value_parser!(u64).range(1..=8))]
    pub workers: u64,
}

fn parse_rate(s: &str) -> std::result::Result<f64, String> {
    let (num, per) = s.split_once('/').unwrap_or((s, "s"));
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("invalid rate {s:?}: expected N/s or N/m, such as 20/s"))?;
    let secs = match per.trim() {
        "s" | "sec" | "second" => 1.0,
        "m" | "min" | "minute" => 60.0,
        _ => {
            return Err(format!(
                "invalid rate {s:?}: expected N/s or N/m, such as 20/s"
            ))
        }
    };
    let rate = n / secs;
    if !(rate.is_finite() && rate > 0.0) {
        return Err(format!("invalid rate {s:?}: it must be greater than zero"));
    }
    if !(MIN_RATE..=MAX_RATE).contains(&rate) {
        return Err(format!(
            "invalid rate {s:?}: between 1/m and 1000000/s (one publish a minute to a million a second)"
        ));
    }
    Ok(rate)
}

/// `--ramp FROM..TO[:DURATION]`: two rates as `--rate` takes them, the first no higher
/// than the second (a ramp rises), and a positive duration (default 5m).
fn parse_ramp(s: &str) -> std::result::Result<Rate, String> {
    let form = "expected FROM..TO[:DURATION], such as 5/s..200/s:5m";
    let (from, rest) = s
        .split_once("..")
        .ok_or_else(|| format!("invalid ramp {s:?}: {form}"))?;
    let (to, over) = match rest.split_once(':') {
        Some((to, d)) => (
            to,
            dlq::timeparse::parse_duration(d).map_err(|e| format!("invalid ramp {s:?}: {e}"))?,
        ),
        None => (rest, DEFAULT_RAMP),
    };
    let from = parse_rate(from).map_err(|e| format!("invalid ramp {s:?}: {e}"))?;
    let to = parse_rate(to).map_err(|e| format!("invalid ramp {s:?}: {e}"))?;
    if from > to {
        return Err(format!(
            "invalid ramp {s:?}: a ramp rises, so FROM must not be above TO"
        ));
    }
    Ok(Rate::Ramp { from, to, over })
}

/// The contract's default ramp time.
const DEFAULT_RAMP: Duration = Duration::from_secs(300);

/// `--rate` bounds: slower than one a minute would outlast any lease; faster than a
/// million a second is not a rate but a typo.
const MIN_RATE: f64 = 1.0 / 60.0;
const MAX_RATE: f64 = 1_000_000.0;

pub async fn run(ctx: &Ctx, args: ReplayArgs) -> Result<u8> {
    plan_only(&args)?;
    // Before each publish the attempt step checks that the lease outlives the confirm
    // wait, one pacing period (at least a second) of sending, and a margin.
    let period = rate_of(&args)
        .map(|r| Duration::from_secs_f64(1.0 / r.slowest()))
        .unwrap_or_default()
        .max(Duration::from_secs(1));
    let mut needed = ctx.global.connect_timeout + args.confirm_timeout + period + LEASE_MARGIN;
    if args.plan.is_some() && workers_of(&args) > 1 {
        // Workers take turns: one may wait for another's sending and confirm wait.
        needed += args.confirm_timeout + period;
    }
    if args.lease <= needed {
        return Err(DlqError::usage(format!(
            "--lease {} must be longer than --connect-timeout {} plus --confirm-timeout {} plus {} of sending and a {} margin, or the lease could lapse mid-publish",
            humantime::format_duration(args.lease),
            humantime::format_duration(ctx.global.connect_timeout),
            humantime::format_duration(args.confirm_timeout),
            humantime::format_duration(period),
            humantime::format_duration(LEASE_MARGIN),
        )).into());
    }
    if let Some(h) = &args.expect_sha256 {
        if h.len() != 64 || !h.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(DlqError::usage(
                "--expect-sha256 takes the 64 hex digits that `dlq show` prints as sha256",
            )
            .into());
        }
    }
    let operator = ctx.operator()?;
    let amqp = ctx.amqp_urls()?;
    let opts = ReplayOptions {
        operator: operator.clone(),
        lease: args.lease,
        token: args.token.clone(),
        exchange: args.exchange.clone(),
        routing_key: args.routing_key.clone(),
        plan_id: None,
        settle_timeout: ctx.global.settle_timeout,
        interrupts: Default::default(),
        notices: notices(ctx.global.settle_timeout),
        spell: std::sync::Arc::new(super::spell::Commands),
    };
    let publisher_opts = PublisherOptions {
        connect_timeout: ctx.global.connect_timeout,
        confirm_timeout: args.confirm_timeout,
        connection_name: format!("dlq replay by {operator}"),
        tls: ctx.tls_files(),
        topology: ctx.broker_topology(&amqp)?,
    };
    match (&args.id, &args.plan) {
        (Some(id), _) => single::single(ctx, &args, id, opts, amqp, publisher_opts).await,
        (None, Some(path)) => group(ctx, &args, path, opts, amqp, publisher_opts).await,
        (None, None) => Err(DlqError::usage("give a dead-letter ID or --plan FILE").into()),
    }
}

/// Refuses a plan-run option without `--plan`: clap's `requires` let `replay ID --rate
/// 5/s` through, and a single replay would have ignored it.
fn plan_only(args: &ReplayArgs) -> std::result::Result<(), DlqError> {
    let given = [
        ("--rate", args.rate.is_some()),
        ("--ramp", args.ramp.is_some()),
        ("--canary", args.canary.is_some()),
        ("--canary-wait", args.canary_wait.is_some()),
        ("--max-target-depth", args.max_target_depth.is_some()),
        ("--max-failures", args.max_failures.is_some()),
    ];
    match given.iter().find(|(_, set)| *set) {
        Some((name, _)) if args.plan.is_none() => Err(DlqError::usage(format!(
            "{name} is for a plan run: give --plan FILE (a single `replay ID` publishes one message)"
        ))),
        _ => Ok(()),
    }
}

/// `--rate` or `--ramp` (they conflict).
fn rate_of(args: &ReplayArgs) -> Option<Rate> {
    args.ramp.or(args.rate.map(Rate::Fixed))
}

/// A fixed rate is kept by one connection; otherwise SQL and publishing overlap (a ramp
/// is shared by the connections).
fn workers_of(args: &ReplayArgs) -> usize {
    match args.rate {
        Some(_) => 1,
        None => args.workers as usize,
    }
}

/// The lines a plan run starts with: where it goes, how much, how fast, what mix.
async fn header(
    ctx: &Ctx,
    store: &dyn dlq::store::Store,
    plan: &Plan,
    args: &ReplayArgs,
    amqp: &[dlq::secret::SecretUrl],
    opts: &ReplayOptions,
) -> Result<String> {
    let ids: Vec<String> = plan
        .ids()
        .into_iter()
        .take(context::TARGET_SAMPLE)
        .collect();
    let sample = store.summaries(&ids).await?;
    let shown = context::Shown {
        database: ctx.database_url()?.to_string(),
        broker: context::broker(amqp),
        targets: context::targets(&sample, opts, plan.items.len()),
        bytes: store.body_bytes(&plan.ids()).await?,
        now: store.now().await?,
    };
    Ok(context::plan_header(plan, args, &shown))
}

async fn group(
    ctx: &Ctx,
    args: &ReplayArgs,
    path: &std::path::Path,
    mut opts: ReplayOptions,
    amqp: Vec<dlq::secret::SecretUrl>,
    publisher_opts: PublisherOptions,
) -> Result<u8> {
    let plan = Plan::read(path)?;
    opts.plan_id = Some(plan.plan_id.clone());
    let workers = workers_of(args);
    let store = ctx.store_for_run(workers as u32 + 1).await?;
    store.check_schema().await?;
    plan.check_database(store.as_ref()).await?;
    let depth = match args.max_target_depth {
        Some(max) => Some(DepthGate {
            queue: dlq::plan::depth_target(store.as_ref(), &plan.ids(), &opts).await?,
            max,
        }),
        None => None,
    };
    // Asked, or with --yes on a terminal: where it goes is said once before it starts.
    let asking = require_consent(ctx, Consent::of(args.yes), "replay")?;
    if asking || std::io::stderr().is_terminal() {
        let header = header(ctx, store.as_ref(), &plan, args, &amqp, &opts).await?;
        super::output::say_lines(&header);
    }
    if asking && !confirm(ctx, "Replay this plan?").await? {
        say("declined; nothing was claimed or published");
        return Ok(dlq::exit::NOT_DONE);
    }
    let (interrupted, interrupts) = watch_signals_counted();
    opts.interrupts = interrupts;
    ctx.out.stop_on_close(interrupted.clone());
    let batch = match args.rate {
        Some(r) => (args.batch_size as usize).min(r.ceil() as usize).max(1),
        None => args.batch_size as usize,
    };
    let pacing = Pacing {
        pacer: rate_of(args).map(Pacer::new),
        canary: args.canary.map(|n| Canary {
            items: n as usize,
            wait: args.canary_wait.unwrap_or(DEFAULT_CANARY_WAIT),
        }),
        depth,
    };
    let run_opts = RunOptions {
        replay: opts,
        batch_size: batch,
        max_failures: args.max_failures.map(|m| m as usize),
        workers,
        pacing,
    };
    let make_broker = || {
        let pacer = run_opts.pacing.pacer.clone();
        Broker::new(amqp.clone(), publisher_opts.clone(), pacer)
    };
    run_group(ctx, store, &plan, &run_opts, make_broker, &interrupted).await
}

/// Runs the plan, showing its progress, then its summary; returns the exit code.
async fn run_group(
    ctx: &Ctx,
    store: Box<dyn dlq::store::Store>,
    plan: &Plan,
    run_opts: &RunOptions,
    make_broker: impl Fn() -> Broker,
    interrupted: &std::sync::atomic::AtomicBool,
) -> Result<u8> {
    let pacer = run_opts.pacing.pacer.clone();
    let mut progress = progress::Progress::new(ctx, plan.items.len() as u64, pacer);
    let result = run_plan(
        store.as_ref(),
        make_broker,
        plan,
        run_opts,
        interrupted,
        |e| progress.on_event(e),
    )
    .await;
    store.close().await;
    let summary = result?;
    progress.finish();
    let counts: Vec<String> = summary
        .counts
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    match ctx.out.is_json() {
        false => ctx.out.text(&format!(
            "plan {}: {} of {} done ({}){}\n",
            summary.plan_id,
            summary.done,
            summary.total,
            counts.join(", "),
            summary
                .stop_detail
                .as_ref()
                .map(|d| format!("; {d}"))
                .unwrap_or_default()
        )),
        true => ctx
            .out
            .json_line(&serde_json::json!({ "summary": summary })),
    }
    if let Some(d) = summary.stop_detail.as_ref().filter(|_| !ctx.out.closed()) {
        say(&format!(
            "dlq: {} ({} of {} items done)",
            dlq::sanitize::line(d),
            summary.done,
            summary.total
        ));
    }
    Ok(summary.exit_code())
}

/// What a replay must say at once goes to stderr, one line per problem: a retry is said
/// again only once as long as the settle timeout has passed since it was last said.
fn notices(settle: Duration) -> Notices {
    let said: std::sync::Mutex<std::collections::HashMap<Step, std::time::Instant>> =
        Default::default();
    Notices::new(move |n| {
        let text = match n {
            Notice::Retrying {
                step,
                rows,
                until,
                cause,
            } => {
                let mut said = said.lock().unwrap_or_else(|e| e.into_inner());
                let now = std::time::Instant::now();
                if said.get(step).is_some_and(|t| now.duration_since(*t) < settle) {
                    return;
                }
                said.insert(*step, now);
                let until = super::output::time(*until);
                let what = match step {
                    Step::Claim => "claiming",
                    Step::Mark => "writing the mark of confirmed replays for",
                    Step::Release => "releasing (nothing was published)",
                    Step::Uncertain => "recording why the outcome is unknown for",
                };
                let leave = match step {
                    Step::Claim | Step::Release => "Ctrl-C stops",
                    Step::Mark | Step::Uncertain => "Ctrl-C leaves them uncertain",
                };
                format!(
                    "dlq: the database does not answer ({cause}); retrying {what} {rows} dead letter(s) until {until} (--settle-timeout {}); {leave}",
                    humantime::format_duration(settle)
                )
            }
            Notice::NotRecorded { rows, cause } => format!(
                "dlq: could not record why {rows} dead letter(s) are uncertain ({cause}); they show uncertain all the same (`dlq list --state uncertain`)"
            ),
        };
        say(&text);
    })
}
