//! `dlq completions SHELL`: shell completion scripts.

use super::{Cli, Ctx};
use clap::{Args, CommandFactory};
use dlq::error::Result;

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// bash, zsh, fish, elvish or powershell
    pub shell: clap_complete::Shell,
}

pub fn run(ctx: &Ctx, args: CompletionsArgs) -> Result<u8> {
    let mut buf = Vec::new();
    clap_complete::generate(args.shell, &mut Cli::command(), "dlq", &mut buf);
    ctx.out.text(&String::from_utf8_lossy(&buf));
    Ok(dlq::exit::OK)
}
