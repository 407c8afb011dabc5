//! `dlq man`: the man page, generated from the same definitions as `--help`.

use super::Result;
use super::{Cli, Ctx};
use clap::{Args, CommandFactory};
use dlq::error::DlqError;

#[derive(Debug, Args)]
pub struct ManArgs {}

pub fn run(ctx: &Ctx, _args: ManArgs) -> Result<u8> {
    let mut buf = Vec::new();
    clap_mangen::Man::new(Cli::command())
        .render(&mut buf)
        .map_err(|e| DlqError::other(format!("cannot render the man page: {e}")))?;
    ctx.out.generated(&String::from_utf8_lossy(&buf));
    Ok(dlq::exit::OK)
}
