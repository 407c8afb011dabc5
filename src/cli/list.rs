//! `dlq list`: newest first, bodies never read.

use super::filters::FilterArgs;
use super::output::say;
use super::output::{opt, thousands, time_or, truncate, Column, Fit, JsonStyle, UNREADABLE};
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
    /// Count every matching row (by default counting stops at 10,000: "50 of 10,000+")
    #[arg(long)]
    pub count: bool,
    /// Refresh every INTERVAL (default 2s) until Ctrl-C
    #[arg(long, value_name = "INTERVAL", num_args = 0..=1, default_missing_value = "2s", value_parser = dlq::timeparse::duration_arg)]
    pub watch: Option<std::time::Duration>,
    /// Print the IDs only, one per line, whatever `-o` says (for `| xargs -n1 dlq show`)
    #[arg(short, long, conflicts_with = "watch")]
    pub quiet: bool,
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
            say(&format!(
                "refreshed at {} UTC, every {}; Ctrl-C to stop",
                chrono::Utc::now().format("%H:%M:%S"),
                humantime::format_duration(every)
            ));
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

/// The table's columns: an ID, the time, the reason, the producer and the state are
/// never left out, nor a column filtered for; the error is cut to fit.
fn columns(filters: &FilterArgs) -> Vec<Column> {
    let schema = match filters.schema_version {
        Some(_) => Fit::Keep,
        None => Fit::Drop(1),
    };
    vec![
        Column::new("ID", Fit::Keep),
        Column::new("DEAD-LETTERED", Fit::Keep),
        Column::new("REASON", Fit::Keep),
        Column::new("PRODUCER", Fit::Keep),
        Column::new("SCHEMA", schema),
        Column::new("ATTEMPTS", Fit::Drop(0)),
        Column::new("STATE", Fit::Keep).painted(),
        Column::new("ERROR", Fit::Cut),
    ]
}

/// The error as a table shows it (cut at 200 characters), or TSV and `-o wide` (whole,
/// on one line).
fn error_cell(ctx: &Ctx, error: &str) -> String {
    match ctx.out.whole_text() {
        true => error.to_string(),
        false => truncate(error, 200),
    }
}

/// Counting stops here unless `--count` asks: on a flood, an exact count costs far more
/// than the page (docs/performance.md).
const COUNT_CAP: i64 = 10_000;

/// Streams the rows from the database to stdout (memory stays flat whatever `--limit`),
/// then says how many more match.
async fn render(ctx: &Ctx, store: &dyn dlq::store::Store, args: &ListArgs) -> Result<()> {
    let filter = args.filters.resolve(store).await?;
    let shown = match ctx.format {
        _ if args.quiet => {
            store
                .list_each(&filter, args.limit, &mut |r| {
                    ctx.out.id_line(&r.id);
                    ctx.out.check()
                })
                .await
        }
        Format::Json => {
            let mut rows = ctx.out.json_array(match args.watch {
                None => JsonStyle::Pretty,
                Some(_) => JsonStyle::Line,
            });
            let shown = store
                .list_each(&filter, args.limit, &mut |r| {
                    rows.push(&r);
                    ctx.out.check()
                })
                .await;
            // An array cut short by a failure stays unclosed (invalid JSON): a script must
            // never take part of the rows for all of them.
            if shown.is_ok() {
                rows.finish();
            }
            shown
        }
        Format::Table | Format::Wide | Format::Markdown | Format::Tsv => {
            let header = columns(&args.filters);
            let mut table = ctx.out.table_chunks(header);
            let shown = store
                .list_each(&filter, args.limit, &mut |r| {
                    table.push(vec![
                        r.id,
                        time_or(r.dead_lettered_at, UNREADABLE),
                        r.reason,
                        opt(&r.producer),
                        opt(&r.schema_version),
                        r.attempts.to_string(),
                        r.state.as_str().to_string(),
                        error_cell(ctx, r.error.as_deref().unwrap_or("")),
                    ]);
                    ctx.out.check()
                })
                .await;
            table.finish();
            shown
        }
    }? as i64;
    ctx.out.check()?;
    if shown == args.limit {
        // A limit above the cap is counted up to the limit: "20,000 of 20,000+".
        let cap = COUNT_CAP.max(args.limit);
        let total = match args.count {
            true => store.count(&filter).await?,
            false => store.count_at_most(&filter, cap).await?,
        };
        if total > shown {
            let of = match total > cap && !args.count {
                true => format!("{}+", thousands(cap)),
                false => thousands(total),
            };
            say(&format!(
                "{} of {of} shown (raise --limit or narrow the filters)",
                thousands(shown)
            ));
        }
    } else if shown == 0 {
        if ctx.format != Format::Json || args.quiet {
            say("no dead letters match");
        }
        args.filters.hint_unmatched(store).await;
    }
    Ok(())
}
