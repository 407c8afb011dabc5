//! `dlq list`: newest first, bodies never read.

use super::filters::FilterArgs;
use super::output::{opt, thousands, time, truncate};
use super::{Ctx, Format};
use clap::Args;
use dlq::error::Result;

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub filters: FilterArgs,
    /// At most this many rows
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(i64).range(1..=1_000_000))]
    pub limit: i64,
}

pub async fn run(ctx: &Ctx, args: ListArgs) -> Result<u8> {
    let store = ctx.store().await?;
    let filter = args.filters.resolve(store.as_ref()).await?;
    let (rows, total) = store.list(&filter, args.limit).await?;
    match ctx.format {
        Format::Json => ctx.out.json(&rows),
        Format::Table | Format::Markdown => {
            let header = [
                "ID",
                "DEAD-LETTERED",
                "REASON",
                "PRODUCER",
                "SCHEMA",
                "ATTEMPTS",
                "STATE",
                "ERROR",
            ]
            .map(String::from)
            .to_vec();
            let body = rows
                .iter()
                .map(|r| {
                    vec![
                        r.id.clone(),
                        time(r.dead_lettered_at),
                        r.reason.clone(),
                        opt(&r.producer),
                        opt(&r.schema_version),
                        r.attempts.to_string(),
                        r.state.as_str().to_string(),
                        truncate(r.error.as_deref().unwrap_or(""), 48),
                    ]
                })
                .collect();
            ctx.out.table(header, body);
        }
    }
    if (rows.len() as i64) < total {
        eprintln!(
            "{} of {} shown (raise --limit or narrow the filters)",
            thousands(rows.len() as i64),
            thousands(total)
        );
    } else if rows.is_empty() && ctx.format != Format::Json {
        eprintln!("no dead letters match");
    }
    store.close().await;
    Ok(dlq::exit::OK)
}
