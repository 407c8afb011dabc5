//! `dlq aggregate --by ...`: where the dead letters come from, largest group first.

use super::filters::FilterArgs;
use super::output::say;
use super::output::{thousands, time, time_or, Column, Fit};
use super::Result;
use super::{Ctx, Format};
use clap::Args;
use dlq::model::{Dimension, Group, GroupKey, UNKNOWN};
use serde_json::{Map, Value};

#[derive(Debug, Args)]
pub struct AggregateArgs {
    /// Comma list of reason, schema_version, producer, source_queue, hour, day
    #[arg(long, value_parser = parse_by)]
    pub by: DimList,
    #[command(flatten)]
    pub filters: FilterArgs,
}

#[derive(Debug, Clone)]
pub struct DimList(pub Vec<Dimension>);

fn parse_by(s: &str) -> Result<DimList, String> {
    Dimension::parse_list(s)
        .map(DimList)
        .map_err(|e| e.render(&super::spell::Commands))
}

/// A bar of up to 30 cells, at least one for any non-zero count.
fn bar(count: i64, max: i64) -> String {
    let cells = ((count as f64 / max as f64) * 30.0).round().max(1.0) as usize;
    "█".repeat(cells)
}

fn key_text(k: &GroupKey) -> String {
    match k {
        GroupKey::Text(Some(s)) => s.clone(),
        GroupKey::Text(None) => UNKNOWN.to_string(),
        GroupKey::Time(t) => time(*t),
    }
}

/// The `--by` keys are never left out; the counts give way, COUNT last.
fn columns(by: &[Dimension]) -> Vec<Column> {
    let mut header: Vec<Column> = by
        .iter()
        .map(|d| Column::new(&d.name().to_uppercase(), Fit::Keep))
        .collect();
    let extras = [
        ("COUNT", 9),
        ("PENDING", 8),
        ("CLAIMED", 2),
        ("UNCERTAIN", 6),
        ("REPLAYED", 1),
        ("DISCARDED", 0),
        ("FIRST SEEN", 3),
        ("LAST SEEN", 5),
    ];
    header.extend(extras.map(|(name, rank)| Column::new(name, Fit::Drop(rank))));
    header
}

pub async fn run(ctx: &Ctx, args: AggregateArgs) -> Result<u8> {
    let store = ctx.store().await?;
    let filter = args.filters.resolve(store.as_ref()).await?;
    let groups = store.aggregate(&args.by.0, &filter).await?;
    match ctx.format {
        Format::Json => {
            let rows: Vec<Value> = groups.iter().map(json_of).collect();
            ctx.out.json(&rows);
        }
        Format::Table | Format::Wide | Format::Markdown | Format::Tsv => {
            table(ctx, &args, &groups)?;
        }
    }
    if groups.is_empty() {
        args.filters.hint_unmatched(store.as_ref()).await;
    }
    store.close().await;
    Ok(dlq::exit::OK)
}

/// One group as the contract's JSON object.
fn json_of(g: &Group) -> Value {
    let mut m = Map::new();
    for (d, k) in &g.keys {
        let v = match k {
            GroupKey::Text(s) => s.clone().map(Value::String).unwrap_or(Value::Null),
            GroupKey::Time(t) => Value::String(time(*t)),
        };
        m.insert(d.name().into(), v);
    }
    m.insert("count".into(), g.count.into());
    m.insert("pending".into(), g.pending.into());
    m.insert("claimed".into(), g.claimed.into());
    m.insert("uncertain".into(), g.uncertain.into());
    m.insert("replayed".into(), g.replayed.into());
    m.insert("discarded".into(), g.discarded.into());
    m.insert("first_seen".into(), g.first_seen.map(time).into());
    m.insert("last_seen".into(), g.last_seen.map(time).into());
    Value::Object(m)
}

/// The groups as a table (or TSV, Markdown), with a bar per bucket over time.
fn table(ctx: &Ctx, args: &AggregateArgs, groups: &[Group]) -> Result<()> {
    let mut header = columns(&args.by.0);
    // Over time, a bar per bucket shows a burst at a glance; the table then runs in time
    // order (JSON keeps the contract's largest-first order).
    let chart = args.by.0.len() == 1 && args.by.0[0].is_time() && !ctx.out.is_tsv();
    // TSV is for awk: plain numbers.
    let num = |n: i64| match ctx.out.is_tsv() {
        true => n.to_string(),
        false => thousands(n),
    };
    let max = groups.iter().map(|g| g.count).max().unwrap_or(1).max(1);
    let mut shown: Vec<&Group> = groups.iter().collect();
    if chart {
        header.push(Column::new("", Fit::Drop(7)));
        shown.sort_by_key(|g| match g.keys.first() {
            Some((_, GroupKey::Time(t))) => Some(*t),
            _ => g.first_seen,
        });
    }
    let rows = shown
        .into_iter()
        .map(|g| {
            let mut r: Vec<String> = g.keys.iter().map(|(_, k)| key_text(k)).collect();
            r.extend([
                num(g.count),
                num(g.pending),
                num(g.claimed),
                num(g.uncertain),
                num(g.replayed),
                num(g.discarded),
                time_or(g.first_seen, "-"),
                time_or(g.last_seen, "-"),
            ]);
            if chart {
                r.push(bar(g.count, max));
            }
            r
        })
        .collect();
    ctx.out.table(header, rows);
    ctx.out.check()?;
    if groups.is_empty() {
        say("no dead letters match");
    }
    Ok(())
}
