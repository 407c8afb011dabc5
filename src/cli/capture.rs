//! `dlq capture --queue Q`: the messages of a RabbitMQ dead-letter queue become dead
//! letters; all the work is [`dlq::capture::capture`].

use super::output::say;
use super::Result;
use super::{Ctx, Format};
use clap::Args;
use dlq::capture::{
    capture, CaptureOptions, CaptureSummary, Event, ParkCopy, Stopped, POSSIBLE_DUPLICATE_HEADER,
};
use dlq::error::DlqError;
use dlq::model::validate_filter_value;
use dlq::publisher::ConnectOptions;
use std::io::IsTerminal;
use std::time::Duration;

/// `dlq capture --help`.
const EXAMPLES: &str = "Examples:
  # Move what a RabbitMQ dead-letter queue holds into the store, then stop
  dlq capture --queue payments.settle.dlq
  # Keep capturing (reconnecting) until Ctrl-C; park what cannot be stored
  dlq capture --queue payments.settle.dlq --follow --park-queue payments.settle.parked";

#[derive(Debug, Args)]
#[command(after_long_help = EXAMPLES)]
pub struct CaptureArgs {
    /// The RabbitMQ queue holding the dead letters (classic or quorum)
    #[arg(long, value_parser = queue_name)]
    pub queue: String,
    /// Store this reason for every message instead of the one mapped from x-death
    #[arg(long)]
    pub reason: Option<String>,
    /// Stop after this many messages
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub max: Option<u64>,
    /// Keep consuming until SIGINT/SIGTERM, reconnecting when the broker or the database
    /// goes away (default: stop when the queue is empty)
    #[arg(long)]
    pub follow: bool,
    /// Messages stored in one transaction and acked together (the prefetch is at most four
    /// times this: one batch is received while the two before are stored, on PostgreSQL)
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..=10000))]
    pub batch: u64,
    /// Move a message that cannot be stored to this queue (publisher-confirmed, with an
    /// x-dlq-capture-error header) instead of stopping
    #[arg(long)]
    pub park_queue: Option<String>,
    /// Largest body stored; a larger one cannot be stored (bytes, or with KiB / MiB)
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    pub max_body_bytes: usize,
    /// About the most bytes of bodies held at once: the prefetch is lowered to as many
    /// messages of the largest body seen as fit, and a batch is closed at its share
    /// (bytes, or with KiB / MiB)
    #[arg(long, default_value = "256MiB", value_parser = parse_size)]
    pub max_held_bytes: usize,
}

/// A queue name AMQP can carry: at most 255 bytes.
fn queue_name(s: &str) -> std::result::Result<String, String> {
    match s.len() {
        0..=255 => Ok(s.to_string()),
        _ => Err("a queue name is at most 255 bytes".into()),
    }
}

fn parse_size(s: &str) -> std::result::Result<usize, String> {
    let t = s.trim();
    let (num, mult) = if let Some(n) = t.strip_suffix("MiB") {
        (n, 1024 * 1024)
    } else if let Some(n) = t.strip_suffix("KiB") {
        (n, 1024)
    } else {
        (t.strip_suffix('B').unwrap_or(t), 1)
    };
    num.trim()
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .filter(|n| *n > 0)
        .ok_or_else(|| {
            format!("invalid size {s:?}: expected bytes, such as 1048576, 512KiB or 64MiB")
        })
}

/// The signals a run hears: the first (SIGINT or SIGTERM) turns `finish` true, and the
/// batches in hand are stored and acked; a second fires `now`, and the run stops at once.
struct Signals {
    finish: tokio::sync::watch::Receiver<bool>,
    now: tokio::sync::oneshot::Receiver<()>,
}

fn watch_signals() -> Signals {
    let (finish_tx, finish) = tokio::sync::watch::channel(false);
    let (now_tx, now) = tokio::sync::oneshot::channel();
    let mut now_tx = Some(now_tx);
    tokio::spawn(async move {
        #[cfg(unix)]
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        for seen in 0..2 {
            #[cfg(unix)]
            match term.as_mut() {
                Some(term) => tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                },
                None => _ = tokio::signal::ctrl_c().await,
            }
            #[cfg(not(unix))]
            let _ = tokio::signal::ctrl_c().await;
            if seen == 0 {
                say("dlq: interrupted: storing and acking the batches in hand, then stopping (interrupt again to stop at once)");
                let _ = finish_tx.send(true);
            } else if let Some(tx) = now_tx.take() {
                let _ = tx.send(());
            }
        }
    });
    Signals { finish, now }
}

/// One line for stderr: secrets removed, control and bidi characters shown escaped.
fn line(s: &str) -> String {
    dlq::sanitize::line(&dlq::secret::scrub(s)).into_owned()
}

fn counts(s: &CaptureSummary) -> String {
    format!(
        "captured {}, already there {}, parked {}",
        s.captured, s.already_there, s.parked
    )
}

pub async fn run(ctx: &Ctx, args: CaptureArgs) -> Result<u8> {
    validate(&args)?;
    let opts = options(ctx, &args)?;
    let store: std::sync::Arc<dyn dlq::store::Store> = ctx
        .store_for_run(dlq::capture::STORING as u32)
        .await?
        .into();
    store.check_schema().await?;
    let signals = watch_signals();
    let progress = (ctx.format != Format::Json && std::io::stderr().is_terminal())
        .then(|| spinner(&args.queue));
    let say = |text: String| match &progress {
        Some(pb) => pb.println(text),
        None => super::output::say(&text),
    };
    let started = std::time::Instant::now();
    let mut acked: Option<CaptureSummary> = None;
    // A park published since the last acked batch: the message may be in both queues.
    let mut parking = false;
    let on_event = |e: Event<'_>| match e {
        Event::Batch(s) => {
            if let Some(pb) = &progress {
                pb.set_message(counts(s));
            }
            acked = Some(s.clone());
            parking = false;
        }
        Event::Parking => parking = true,
        Event::Parked { why, copy } => say(parked_line(opts.park_queue.as_deref(), why, copy)),
        Event::Reconnecting { why, wait } => say(format!(
            "dlq: {}; trying again in {}",
            line(why),
            humantime::format_duration(wait)
        )),
        Event::Connected { host } => tracing::info!(%host, "consuming"),
    };
    let result = tokio::select! {
        r = capture(store.clone(), &opts, signals.finish, on_event) => Some(r),
        Ok(()) = signals.now => None,
    };
    if let Some(pb) = &progress {
        pb.finish_and_clear();
    }
    let Some(result) = result else {
        // A store transaction may hang on a silent link: the pool is not closed (that
        // waits for it), and nothing it held was acked.
        let mut summary = acked.unwrap_or_else(|| CaptureSummary::new(&args.queue));
        summary.stopped = Some(Stopped::Interrupted);
        summary.seconds = started.elapsed().as_secs_f64();
        let park = match (parking, &opts.park_queue) {
            (true, Some(p)) => format!(
                "; a message being parked may already be in {} as well: look there before running again, or the rerun parks it a second time",
                line(p)
            ),
            _ => String::new(),
        };
        super::output::say(&format!(
            "dlq: interrupted again: stopped at once; the messages not yet acked are still in {} (a rerun finds any whose rows were stored){park}",
            line(&args.queue)
        ));
        print_summary(ctx, &args, &summary);
        return Ok(dlq::exit::INTERRUPTED);
    };
    store.close().await;
    let summary = result?;
    print_summary(ctx, &args, &summary);
    Ok(match summary.stopped {
        // Without --follow, a run stopped before the queue was empty did not finish.
        Some(Stopped::Interrupted) if !args.follow => dlq::exit::INTERRUPTED,
        _ => dlq::exit::OK,
    })
}

/// The line of a message moved to the parking queue `park`.
fn parked_line(park: Option<&str>, why: &str, copy: ParkCopy) -> String {
    let again = match copy {
        ParkCopy::First => String::new(),
        ParkCopy::MaybeSecond => format!(
            " again: this run had moved it there before its ack was lost, so it may be there twice (this copy has the header {POSSIBLE_DUPLICATE_HEADER})"
        ),
    };
    format!(
        "dlq: moved a message to {}{again}: {}",
        line(park.unwrap_or_default()),
        line(why)
    )
}

fn print_summary(ctx: &Ctx, args: &CaptureArgs, summary: &CaptureSummary) {
    match ctx.format {
        Format::Json => ctx.out.json(summary),
        _ => {
            let end = match summary.stopped {
                Some(Stopped::Empty) => "the queue is empty",
                Some(Stopped::Max) => "stopped at --max",
                Some(Stopped::Interrupted) => "interrupted",
                None => "stopped",
            };
            let text = format!("{} from {}; {end}\n", counts(summary), line(&args.queue));
            ctx.out.text(&text);
        }
    }
}

fn validate(args: &CaptureArgs) -> Result<()> {
    validate_filter_value("queue", &args.queue)?;
    if let Some(r) = &args.reason {
        validate_filter_value("reason", r)?;
    }
    if let Some(p) = &args.park_queue {
        validate_filter_value("park-queue", p)?;
        if *p == args.queue {
            return Err(DlqError::usage(
                "--park-queue must differ from --queue: a parked message would be taken again",
            )
            .into());
        }
    }
    Ok(())
}

fn options(ctx: &Ctx, args: &CaptureArgs) -> Result<CaptureOptions> {
    let amqp = ctx.amqp_urls()?;
    let who = ctx.operator().unwrap_or_else(|_| "dlq".into());
    let connect = ConnectOptions {
        connect_timeout: ctx.global.connect_timeout,
        connection_name: format!("dlq capture {} by {who}", args.queue),
        tls: ctx.tls_files(),
    };
    let mut opts = CaptureOptions::new(amqp, args.queue.clone(), connect);
    opts.reason = args.reason.clone();
    opts.max = args.max;
    opts.follow = args.follow;
    // clap keeps it within 1..=10000.
    opts.batch =
        std::num::NonZeroUsize::new(args.batch as usize).unwrap_or(std::num::NonZeroUsize::MIN);
    opts.park_queue = args.park_queue.clone();
    opts.topology = ctx.broker_topology(&opts.urls)?;
    opts.max_body_bytes = args.max_body_bytes;
    opts.max_held_bytes = args.max_held_bytes;
    opts.spell = std::sync::Arc::new(super::spell::Commands);
    Ok(opts)
}

/// The spinner on a terminal's stderr while capture runs.
fn spinner(queue: &str) -> indicatif::ProgressBar {
    let pb = indicatif::ProgressBar::new_spinner();
    pb.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {elapsed} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
    );
    pb.enable_steady_tick(Duration::from_millis(200));
    pb.set_message(format!("consuming {}", line(queue)));
    pb
}

#[cfg(test)]
mod tests {
    /// Once broke (review): the progress line's own escaping let bidi controls through
    /// (a database's refusal can echo a body) onto a terminal.
    #[test]
    fn a_line_escapes_bidi_and_control_characters_and_hides_passwords() {
        let shown = super::line("refused: a\u{202E}b\u{2066}c\n amqp://u:hunter2@h/v");
        assert!(!shown.contains(['\u{202E}', '\u{2066}', '\n']), "{shown}");
        assert!(!shown.contains("hunter2"), "{shown}");
    }
}
