//! `dlq migrate`: applies the embedded migrations; a second run is a no-op. On a
//! terminal it asks before creating a SQLite file that does not exist (a typo in the URL
//! would otherwise become a new, empty database); scripts without a terminal, and
//! `--create`, create it as before.

use super::output::say;
use super::prompt::confirm;
use super::Result;
use super::{Ctx, Format};
use clap::Args;

#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// Create the SQLite file if it does not exist, without asking
    #[arg(long)]
    pub create: bool,
}

pub async fn run(ctx: &Ctx, args: MigrateArgs) -> Result<u8> {
    let url = ctx.database_url()?;
    if let Some(file) = dlq::store::sqlite_file_to_create(&url) {
        let question = format!("create new SQLite database {}?", file.display());
        if !args.create && ctx.interactive() && !confirm(ctx, &question).await? {
            say("dlq: declined: nothing was created");
            return Ok(dlq::exit::NOT_DONE);
        }
    }
    let mut opts = ctx.store_options();
    opts.if_missing = dlq::store::IfMissing::Create;
    let store = dlq::store::open(&url, &opts).await?;
    let applied = store.migrate().await?;
    store.close().await;
    match ctx.format {
        Format::Json => ctx.out.json(&serde_json::json!({
            "database": url.to_string(),
            "applied": applied,
        })),
        _ if applied.is_empty() => ctx.out.text(&format!("{url}: schema is up to date\n")),
        _ => ctx
            .out
            .text(&format!("{url}: applied {}\n", applied.join(", "))),
    }
    Ok(dlq::exit::OK)
}
