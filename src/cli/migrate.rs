//! `dlq migrate`: applies the embedded migrations; a second run is a no-op.

use super::Result;
use super::{Ctx, Format};
use clap::Args;
use dlq::error::DlqError;

#[derive(Debug, Args)]
pub struct MigrateArgs {}

pub async fn run(ctx: &Ctx, _args: MigrateArgs) -> Result<u8> {
    let url = ctx.database_url()?;
    let mut opts = ctx.store_options();
    opts.create = true;
    // A new SQLite file being switched to WAL by another `dlq migrate` at this moment is
    // busy for an instant: try again within the lock timeout.
    let deadline = tokio::time::Instant::now() + opts.busy_timeout;
    let store = loop {
        match dlq::store::open(&url, &opts).await {
            Err(DlqError::Busy(_)) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await
            }
            opened => break opened?,
        }
    };
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
