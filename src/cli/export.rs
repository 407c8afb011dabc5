//! `dlq export [filters]`: JSON lines that `dlq import` reads back byte for byte, into
//! either store. Rows stream from the database to stdout one at a time, so memory stays
//! flat however many there are.

use super::filters::FilterArgs;
use super::output::say;
use super::output::thousands;
use super::Ctx;
use super::Result;
use anyhow::Context as _;
use clap::Args;
use dlq::error::DlqError;
use std::io::Write;

#[derive(Debug, Args)]
pub struct ExportArgs {
    #[command(flatten)]
    pub filters: FilterArgs,
}

pub async fn run(ctx: &Ctx, args: ExportArgs) -> Result<u8> {
    let store = ctx.store().await?;
    let filter = args.filters.resolve(store.as_ref()).await?;
    let mut out = ctx.out.stream();
    let mut closed = false;
    let mut sink = |row: dlq::store::NewDeadLetter| -> dlq::error::Result<()> {
        dlq::import::write_export_line(&mut out, &row).map_err(|e| {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                closed = true;
            }
            DlqError::other(format!("cannot write the export: {e}"))
        })
    };
    let result = store.export(&filter, &mut sink).await;
    store.close().await;
    let flushed = out.flush();
    // The reader went away (`dlq export | head`): not an error, as for `list`.
    let closed_pipe = |e: &std::io::Error| e.kind() == std::io::ErrorKind::BrokenPipe;
    match (result, flushed) {
        (Err(_), _) if closed => Ok(dlq::exit::OK),
        (Err(e), _) => Err(e.into()),
        (Ok(_), Err(e)) if closed_pipe(&e) => Ok(dlq::exit::OK),
        (Ok(_), Err(e)) => Err(e).context("cannot write the export"),
        (Ok(n), Ok(())) => {
            say(&format!("exported {} dead letters", thousands(n as i64)));
            Ok(dlq::exit::OK)
        }
    }
}
