//! `dlq diff A B`: what differs between two dead letters (an original and its revision,
//! or any two): body (JSON-aware, else text, else bytes) and headers.

use super::report::{emit, StepReport};
use super::Result;
use super::{Ctx, Format};
use clap::Args;
use dlq::model::{validate_id, Outcome};
use dlq::revise::diff;
use serde::Serialize;

#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The first dead-letter ID (e.g. the original)
    pub a: String,
    /// The second (e.g. its revision)
    pub b: String,
}

#[derive(Serialize)]
struct DiffJson<'a> {
    a: &'a str,
    b: &'a str,
    #[serde(flatten)]
    report: diff::Report,
}

pub async fn run(ctx: &Ctx, args: DiffArgs) -> Result<u8> {
    validate_id(&args.a)?;
    validate_id(&args.b)?;
    let store = ctx.store().await?;
    let (a, b) = (store.get(&args.a).await?, store.get(&args.b).await?);
    store.close().await;
    let (a, b) = match (a, b) {
        (Some(a), Some(b)) => (a, b),
        (a, _) => {
            let id = if a.is_none() { &args.a } else { &args.b };
            let r = StepReport::new(
                id,
                Outcome::NotFound,
                format!("no dead letter with id {id:?}"),
            );
            return Ok(emit(ctx, &r));
        }
    };
    match ctx.format {
        Format::Json => ctx.out.json(&DiffJson {
            a: &args.a,
            b: &args.b,
            report: diff::report(&a.body, &b.body, &a.headers_json, &b.headers_json),
        }),
        Format::Table | Format::Wide | Format::Markdown | Format::Tsv => {
            let lines = diff::views(
                &a.body,
                &b.body,
                &a.headers_json,
                &b.headers_json,
                &args.a,
                &args.b,
            );
            if lines.is_empty() {
                ctx.out.text("no differences in body and headers\n");
            }
            ctx.out.diff(&lines);
        }
    }
    Ok(dlq::exit::OK)
}
