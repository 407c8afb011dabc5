//! `dlq migrate`: applies the embedded migrations; a second run is a no-op.

use super::Result;
use super::{Ctx, Format};
use clap::Args;

#[derive(Debug, Args)]
pub struct MigrateArgs {}

pub async fn run(ctx: &Ctx, _args: MigrateArgs) -> Result<u8> {
    let url = ctx.database_url()?;
    let mut opts = ctx.store_options();
    opts.create = true;
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
