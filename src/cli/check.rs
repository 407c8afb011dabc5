//! `dlq check`: thresholds for cron, a Kubernetes probe or a Nagios-style runner. Exit 0
//! when all hold, 7 when one is breached, 1 when the store cannot be read; one line like
//! a monitoring plugin's, whatever stdout is (JSON only when asked with `-o json`).

use super::filters::FilterArgs;
use super::output::thousands;
use super::{Ctx, Format, Result};
use clap::Args;
use dlq::model::State;
use dlq::store::alerting::{bounded, breaches, Breach, Check, Limits};
use serde_json::json;
use std::time::Duration;

#[derive(Debug, Args)]
#[command(group(
    clap::ArgGroup::new("limits")
        .required(true)
        .multiple(true)
        .args(["max_pending", "max_age", "max_uncertain"])
))]
pub struct CheckArgs {
    /// Breached when more dead letters than this are pending
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(i64).range(0..))]
    pub max_pending: Option<i64>,
    /// Breached when the oldest pending dead letter is older than this (30m, 1h, 2d)
    #[arg(long, value_name = "DURATION", value_parser = dlq::timeparse::duration_arg)]
    pub max_age: Option<Duration>,
    /// Breached when more dead letters than this are uncertain
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(i64).range(0..))]
    pub max_uncertain: Option<i64>,
    #[command(flatten)]
    pub filters: FilterArgs,
}

/// `3h12m`, `2d4h`, `5m3s`, `42s`: the two largest units.
pub fn short_duration(secs: i64) -> String {
    let units = [("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)];
    let Some(first) = units.iter().position(|(_, n)| secs >= *n) else {
        return "0s".into();
    };
    let (u1, n1) = units[first];
    let mut text = format!("{}{u1}", secs / n1);
    if let Some((u2, n2)) = units.get(first + 1) {
        let rest = (secs % n1) / n2;
        if rest > 0 {
            text.push_str(&format!("{rest}{u2}"));
        }
    }
    text
}

fn breach_text(b: &Breach) -> String {
    match b.check {
        Check::Pending => format!("{} pending > {}", thousands(b.value), thousands(b.max)),
        Check::OldestPendingAge => format!(
            "oldest pending {} > {}",
            short_duration(b.value),
            short_duration(b.max)
        ),
        Check::Uncertain => format!("{} uncertain > {}", thousands(b.value), thousands(b.max)),
    }
}

pub async fn run(ctx: &Ctx, args: CheckArgs) -> Result<u8> {
    let limits = Limits {
        max_pending: args.max_pending,
        max_age: args.max_age,
        max_uncertain: args.max_uncertain,
    };
    let store = ctx.store().await?;
    let filter = args.filters.resolve(store.as_ref()).await?;
    let gauges = bounded(ctx.global.statement_timeout, store.gauges(&filter)).await?;
    store.close().await;
    let found = breaches(&gauges, &limits);
    let (pending, uncertain) = (gauges.total(State::Pending), gauges.total(State::Uncertain));
    let age = gauges.oldest_pending_age().map(|d| d.as_secs());
    if ctx.global.output == Some(Format::Json) {
        let list: Vec<_> = found
            .iter()
            .map(|b| json!({"check": b.check.as_str(), "value": b.value, "max": b.max}))
            .collect();
        ctx.out.json(&json!({
            "ok": found.is_empty(),
            "breaches": list,
            "pending": pending,
            "uncertain": uncertain,
            "oldest_pending_age_seconds": age,
        }));
    } else if found.is_empty() {
        let mut line = format!(
            "dlq check: OK: {} pending, {} uncertain",
            thousands(pending),
            thousands(uncertain)
        );
        if let Some(a) = age {
            line.push_str(&format!(", oldest pending {}", short_duration(a as i64)));
        }
        ctx.out.text(&format!("{line}\n"));
    } else {
        let what: Vec<String> = found.iter().map(breach_text).collect();
        ctx.out
            .text(&format!("dlq check: CRITICAL: {}\n", what.join("; ")));
    }
    Ok(if found.is_empty() {
        dlq::exit::OK
    } else {
        dlq::exit::BREACHED
    })
}

#[cfg(test)]
mod tests {
    use super::short_duration;

    #[test]
    fn durations_read_like_the_contract() {
        assert_eq!(short_duration(3 * 3600 + 12 * 60 + 5), "3h12m");
        assert_eq!(short_duration(3600), "1h");
        assert_eq!(short_duration(42), "42s");
        assert_eq!(short_duration(0), "0s");
        assert_eq!(short_duration(2 * 86_400 + 4 * 3600), "2d4h");
    }
}
