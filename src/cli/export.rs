//! `dlq export [filters]`: JSON lines that `dlq import` reads back byte for byte, into
//! either store. Rows stream from the database to stdout one at a time, so memory stays
//! flat however many there are.

use super::filters::FilterArgs;
use super::output::thousands;
use super::Ctx;
use clap::Args;
use dlq::error::{DlqError, Result};
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
    let mut sink = |row: dlq::store::NewDeadLetter| -> Result<()> {
        let mut line = dlq::import::export_line(&row);
        line.push('\n');
        out.write_all(line.as_bytes()).map_err(|e| {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                closed = true;
            }
            DlqError::other(format!("cannot write the export: {e}"))
        })
    };
    let result = store.export(&filter, &mut sink).await;
    store.close().await;
    let flushed = out.flush();
    match result {
        // The reader went away (`dlq export | head`): not an error, as for `list`.
        Err(_) if closed => return Ok(dlq::exit::OK),
        Err(e) => return Err(e),
        Ok(n) => {
            flushed.map_err(|e| DlqError::other(format!("cannot write the export: {e}")))?;
            eprintln!("exported {} dead letters", thousands(n as i64));
        }
    }
    Ok(dlq::exit::OK)
}
