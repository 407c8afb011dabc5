//! `dlq list`: newest first, bodies never read.

use super::filters::FilterArgs;
use super::output::{opt, thousands, time, truncate};
use super::Result;
use super::{Ctx, Format};
use clap::Args;

#[derive(Debug, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub filters: FilterArgs,
    /// At most this many rows
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(i64).range(1..=1_000_000))]
    pub limit: i64,
    /// Refresh every INTERVAL (default 2s) until Ctrl-C
    #[arg(long, value_name = "INTERVAL", num_args = 0..=1, default_missing_value = "2s", value_parser = dlq::timeparse::duration_arg)]
    pub watch: Option<std::time::Duration>,
}

pub async fn run(ctx: &Ctx, args: ListArgs) -> Result<u8> {
    let store = match args.watch {
        Some(_) => ctx.store_for_run(1).await?,
        None => ctx.store().await?,
    };
    let Some(every) = args.watch else {
        render(ctx, store.as_ref(), &args).await?;
        store.close().await;
        return Ok(dlq::exit::OK);
    };
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stdout());
    // One Ctrl-C future for the whole run: a signal that arrives during a refresh is
    // not lost (a new future per loop would only see the next one).
    let mut ctrl_c = std::pin::pin!(tokio::signal::ctrl_c());
    loop {
        if terminal {
            ctx.out.clear_screen();
            eprintln!(
                "every {}; Ctrl-C to stop",
                humantime::format_duration(every)
            );
        }
        tokio::select! {
            done = render(ctx, store.as_ref(), &args) => done?,
            _ = &mut ctrl_c => break,
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = &mut ctrl_c => break,
            _ = super::output::stdout_closed() => {
                ctx.out.mark_closed();
                break;
            }
        }
    }
    store.close().await;
    Ok(dlq::exit::OK)
}

async fn render(ctx: &Ctx, store: &dyn dlq::store::Store, args: &ListArgs) -> Result<()> {
    let filter = args.filters.resolve(store).await?;
    let (rows, total) = store.list(&filter, args.limit).await?;
    match ctx.format {
        Format::Json if args.watch.is_some() => ctx.out.json_line(&rows),
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
    ctx.out.check()?;
    if (rows.len() as i64) < total {
        eprintln!(
            "{} of {} shown (raise --limit or narrow the filters)",
            thousands(rows.len() as i64),
            thousands(total)
        );
    } else if rows.is_empty() && ctx.format != Format::Json {
        eprintln!("no dead letters match");
    }
    Ok(())
}
