//! `dlq import FILE|-`: all lines or none.

use super::Result;
use super::{Ctx, Format};
use clap::Args;
use dlq::error::DlqError;
use dlq::store::OnExisting;
use std::io::BufReader;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// JSON lines file (as `export` writes it, or `show -o json` output), or - for stdin
    pub file: PathBuf,
    /// Keep rows whose ID already exists instead of failing
    #[arg(long)]
    pub skip_existing: bool,
}

pub async fn run(ctx: &Ctx, args: ImportArgs) -> Result<u8> {
    let rows = if args.file.as_os_str() == "-" {
        dlq::import::read_lines(std::io::stdin().lock())?
    } else {
        if args.file.is_dir() {
            return Err(DlqError::usage(format!(
                "cannot import {}: it is a directory (give a file, or - for stdin)",
                args.file.display()
            ))
            .into());
        }
        let f = std::fs::File::open(&args.file)
            .map_err(|e| DlqError::usage(format!("cannot open {}: {e}", args.file.display())))?;
        dlq::import::read_lines(BufReader::new(f))?
    };
    let store = ctx.store_for_writes().await?;
    let existing = match args.skip_existing {
        true => OnExisting::Skip,
        false => OnExisting::Refuse,
    };
    let report = store.import(rows, existing).await?;
    store.close().await;
    match ctx.format {
        Format::Json => ctx.out.json(&report),
        _ => ctx.out.text(&format!(
            "imported {} dead letters ({} already there, kept)\n",
            report.imported, report.skipped_existing
        )),
    }
    Ok(dlq::exit::OK)
}
