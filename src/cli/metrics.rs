//! `dlq metrics`: the store's state in the Prometheus text format (0.0.4), printed once
//! (a textfile collector, cron) or served at `/metrics` with `--listen` (see
//! [`super::serve`]).
//!
//! The exposition is written by the `prometheus` crate's `TextEncoder`, so label values
//! are escaped exactly as the format says however hostile the stored text.

use super::filters::FilterArgs;
use super::Ctx;
use super::Result;
use clap::Args;
use dlq::error::DlqError;
use dlq::model::{State, UNKNOWN};
use dlq::store::alerting::{age, bounded, Gauges, PairCounts};
use prometheus::{Encoder, GaugeVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

/// The producer label of the pairs beyond `--max-series`.
pub const OTHER: &str = "(other)";

#[derive(Debug, Args)]
pub struct MetricsArgs {
    /// Serve the metrics at http://ADDR/metrics until Ctrl-C or SIGTERM (127.0.0.1:9471)
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<std::net::SocketAddr>,
    /// At most this many reason/producer pairs (largest first); the others of each reason
    /// are summed under producer="(other)"
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_series: u32,
    #[command(flatten)]
    pub filters: FilterArgs,
}

pub async fn run(ctx: &Ctx, args: MetricsArgs) -> Result<u8> {
    if let Some(addr) = args.listen {
        return super::serve::run(ctx, addr, args.filters, args.max_series as usize).await;
    }
    let store = ctx.store().await?;
    let filter = args.filters.resolve(store.as_ref()).await?;
    let gauges = bounded(ctx.global.statement_timeout, store.gauges(&filter)).await?;
    store.close().await;
    ctx.out
        .generated(&render(&gauges, args.max_series as usize)?);
    Ok(dlq::exit::OK)
}

/// The pairs to show: the first `max` as they are, the rest summed per reason under
/// producer [`OTHER`].
fn fold(pairs: &[PairCounts], max: usize) -> Vec<PairCounts> {
    let mut shown: Vec<PairCounts> = pairs.iter().take(max).cloned().collect();
    let mut others: Vec<PairCounts> = Vec::new();
    for p in pairs.iter().skip(max) {
        let i = match others.iter().position(|o| o.reason == p.reason) {
            Some(i) => i,
            None => {
                others.push(PairCounts {
                    reason: p.reason.clone(),
                    producer: Some(OTHER.to_string()),
                    by_state: [0; 5],
                    oldest_pending: None,
                });
                others.len() - 1
            }
        };
        let o = &mut others[i];
        for (sum, n) in o.by_state.iter_mut().zip(p.by_state) {
            *sum += n;
        }
        o.oldest_pending = match (o.oldest_pending, p.oldest_pending) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    shown.extend(others);
    shown
}

fn metric_error(e: prometheus::Error) -> DlqError {
    DlqError::other(format!("cannot render the metrics: {e}"))
}

/// The exposition of `gauges`, `dlq_up 1` included.
pub fn render(gauges: &Gauges, max_series: usize) -> dlq::error::Result<String> {
    let reg = Registry::new();
    let dead = IntGaugeVec::new(
        Opts::new(
            "dlq_dead_letters",
            "Dead letters per state, reason and producer (every state, zeros included).",
        ),
        &["state", "reason", "producer"],
    )
    .map_err(metric_error)?;
    let oldest = GaugeVec::new(
        Opts::new(
            "dlq_oldest_pending_age_seconds",
            "Age of the oldest pending dead letter per reason and producer (absent: none pending).",
        ),
        &["reason", "producer"],
    )
    .map_err(metric_error)?;
    let uncertain = IntGauge::new(
        "dlq_uncertain_dead_letters",
        "Dead letters that may have been published: check the consumers, then dlq resolve.",
    )
    .map_err(metric_error)?;
    let outcomes = IntCounterVec::new(
        Opts::new(
            "dlq_replay_outcomes_total",
            "Replay outcomes recorded in the history (prune lowers it: a counter reset).",
        ),
        &["outcome"],
    )
    .map_err(metric_error)?;
    for p in fold(&gauges.pairs, max_series) {
        let producer = p.producer.as_deref().unwrap_or(UNKNOWN);
        for st in State::ALL {
            dead.with_label_values(&[st.as_str(), &p.reason, producer])
                .set(p.count(st));
        }
        if let Some(t) = p.oldest_pending {
            oldest
                .with_label_values(&[&p.reason, producer])
                .set(age(gauges.now, t).as_secs_f64());
        }
    }
    uncertain.set(gauges.total(State::Uncertain));
    for (o, n) in &gauges.outcomes {
        outcomes
            .with_label_values(&[o.as_str()])
            .inc_by(u64::try_from(*n).unwrap_or_default());
    }
    for c in [
        Box::new(dead) as Box<dyn prometheus::core::Collector>,
        Box::new(oldest),
        Box::new(uncertain),
        Box::new(outcomes),
    ] {
        reg.register(c).map_err(metric_error)?;
    }
    encode(&reg, 1)
}

/// `dlq_up 0` and nothing else: the store did not answer.
pub fn render_down() -> dlq::error::Result<String> {
    encode(&Registry::new(), 0)
}

fn encode(reg: &Registry, up: i64) -> dlq::error::Result<String> {
    let g = IntGauge::new("dlq_up", "1 when the store answered this scrape, else 0.")
        .map_err(metric_error)?;
    g.set(up);
    reg.register(Box::new(g)).map_err(metric_error)?;
    let mut buf = Vec::new();
    prometheus::TextEncoder::new()
        .encode(&reg.gather(), &mut buf)
        .map_err(metric_error)?;
    String::from_utf8(buf).map_err(|e| DlqError::other(format!("cannot render the metrics: {e}")))
}
