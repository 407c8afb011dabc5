//! What a replay prompt shows before anything changes: where the messages go (database,
//! broker, exchange and routing key, overrides marked), how many, how fast, what mix, and
//! how old the plan is. URLs are shown as [`dlq::secret::SecretUrl`] shows them (no
//! password).

use super::ReplayArgs;
use dlq::plan::{Plan, DEFAULT_CANARY_WAIT};
use dlq::rate::Rate;
use dlq::replay::{resolve_target, ReplayOptions};
use dlq::secret::SecretUrl;
use std::collections::BTreeMap;

/// Rows read to show the targets of a plan without overrides: enough to name them.
pub const TARGET_SAMPLE: usize = 200;

/// A plan older than this is said to be old.
const OLD_PLAN: chrono::Duration = chrono::Duration::hours(1);

/// Where a run publishes: the broker's first node and, of many, how many.
pub fn broker(amqp: &[SecretUrl]) -> String {
    match amqp {
        [] => "(none)".to_string(),
        [one] => one.to_string(),
        [first, rest @ ..] => format!("{first} (and {} more node(s))", rest.len()),
    }
}

/// The target line: overrides marked, else the targets of (a sample of) the rows.
pub fn targets(rows: &[dlq::model::Summary], opts: &ReplayOptions, of: usize) -> String {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for r in rows {
        let t = resolve_target(r, opts)
            .map(|t| t.to_string())
            .unwrap_or_else(|| "(no target: give --routing-key)".to_string());
        *seen.entry(t).or_default() += 1;
    }
    let mut shown: Vec<String> = seen.iter().map(|(t, n)| format!("{t} ({n})")).collect();
    if shown.len() > 3 {
        let more = shown.len() - 3;
        shown.truncate(3);
        shown.push(format!("{more} more"));
    }
    let marks: Vec<&str> = [
        opts.exchange.as_ref().map(|_| "--exchange"),
        opts.routing_key.as_ref().map(|_| "--routing-key"),
    ]
    .into_iter()
    .flatten()
    .collect();
    let sample = match rows.len() < of {
        true => format!(" (of the first {})", rows.len()),
        false => String::new(),
    };
    let over = match marks.is_empty() {
        true => String::new(),
        false => format!(" [set by {}]", marks.join(" and ")),
    };
    format!("{}{sample}{over}", shown.join(", "))
}

/// How fast: the rate or ramp, and the canary.
fn pace(args: &ReplayArgs) -> String {
    let rate = match super::rate_of(args) {
        Some(Rate::Fixed(r)) => format!("rate {}", per_second(r)),
        Some(Rate::Ramp { from, to, over }) => format!(
            "ramp {}..{} over {}",
            per_second(from),
            per_second(to),
            humantime::format_duration(over)
        ),
        None => "no --rate (as fast as the broker confirms)".to_string(),
    };
    match args.canary {
        Some(n) => format!(
            "{rate}; canary {n}, then watching {}",
            humantime::format_duration(args.canary_wait.unwrap_or(DEFAULT_CANARY_WAIT))
        ),
        None => rate,
    }
}

/// `2/s`, `0.5/s`.
fn per_second(r: f64) -> String {
    let s = format!("{r:.2}");
    format!("{}/s", s.trim_end_matches('0').trim_end_matches('.'))
}

/// The mix of a plan: the top three values of each field, with counts.
fn mix(plan: &Plan) -> Vec<String> {
    plan.mix
        .iter()
        .map(|(field, values)| {
            let top = crate::cli::breakdown::top(values);
            format!("  {:<11}{top}", format!("{field}: "))
        })
        .collect()
}

/// What a plan's header says of where it runs and what it sends.
pub struct Shown {
    pub database: String,
    pub broker: String,
    pub targets: String,
    /// The bytes of the plan's bodies together.
    pub bytes: i64,
    /// The database's clock, for the plan's age.
    pub now: chrono::DateTime<chrono::Utc>,
}

/// The lines shown before `replay --plan` asks (or starts, with `--yes` on a terminal).
pub fn plan_header(plan: &Plan, args: &ReplayArgs, shown: &Shown) -> String {
    let age = shown.now.signed_duration_since(plan.created_at);
    let age_text = humantime::format_duration(std::time::Duration::from_secs(
        age.num_seconds().max(0) as u64,
    ));
    let old = match age > OLD_PLAN {
        true => " (old: the dead letters may have changed since; `dlq plan` makes a new one)",
        false => "",
    };
    let mut lines = vec![
        format!(
            "About to replay plan {} ({} items, made by {} at {}, {age_text} ago{old})",
            plan.plan_id,
            plan.items.len(),
            plan.created_by,
            crate::cli::output::time(plan.created_at),
        ),
        format!("  database:  {}", shown.database),
        format!("  broker:    {}", shown.broker),
        format!("  target:    {}", shown.targets),
        format!(
            "  bodies:    {} bytes in all",
            crate::cli::output::thousands(shown.bytes)
        ),
        format!("  pace:      {}", pace(args)),
    ];
    lines.extend(mix(plan));
    lines.push(format!(
        "  filters:   {}",
        serde_json::to_string(&plan.filters).unwrap_or_default()
    ));
    lines
        .iter()
        .map(|l| dlq::sanitize::line(l).into_owned())
        .collect::<Vec<_>>()
        .join("\n")
}
