//! `dlq replay ID`: one reviewed dead letter. The dry run and the prompt read the row to
//! show it; the replay itself claims and reads it again (what was shown may have changed,
//! `--expect-sha256` is how a script pins it).

use super::super::output::{render_body, say_lines, truncate, Base64};
use super::super::prompt::{confirm, require_consent, watch_signals_counted, Consent};
use super::super::report::{emit, emit_item, StepReport};
use super::super::{Ctx, Format, Result};
use super::{context, ReplayArgs};
use dlq::error::DlqError;
use dlq::model::{validate_id, DeadLetter, Outcome};
use dlq::publisher::{replay_headers, Broker, PublisherOptions, Target};
use dlq::replay::{replay, resolve_target, Item, ReplayOptions};
use dlq::store::Store;

/// What `replay ID --dry-run -o json` prints.
#[derive(serde::Serialize)]
struct DryRunJson<'a> {
    body_base64: Base64<'a>,
    body_text: Option<&'a str>,
    delivery_mode: u8,
    detail: String,
    exchange: &'a str,
    headers: &'a serde_json::Map<String, serde_json::Value>,
    id: &'a str,
    mandatory: bool,
    message_id: Option<&'a str>,
    outcome: &'static str,
    routing_key: &'a str,
    sha256: String,
    state: dlq::model::State,
}

pub(super) async fn single(
    ctx: &Ctx,
    args: &ReplayArgs,
    id: &str,
    opts: ReplayOptions,
    amqp: Vec<dlq::secret::SecretUrl>,
    publisher_opts: PublisherOptions,
) -> Result<u8> {
    validate_id(id)?;
    let broker_shown = context::broker(&amqp);
    let mut broker = Broker::new(amqp, publisher_opts, None);
    if args.yes && !args.dry_run {
        // Nothing to ask: connect to the broker while the database work runs.
        broker.connect_early();
    }
    // No separate schema check: these reads name the derived columns only `dlq migrate`
    // adds. The body is read only to be shown: the claim reads the row again.
    let store = ctx.store().await?;
    // The first: of two rows shown as one ID, the TEXT one (the one a write takes).
    let Some(summary) = store.summaries(&[id.to_string()]).await?.into_iter().next() else {
        broker.close().await;
        return Ok(not_found(ctx, id));
    };
    let Some(target) = resolve_target(&summary, &opts) else {
        return Err(DlqError::usage(format!(
            "dead letter {id} has no exchange, routing key or source queue: give --routing-key (and --exchange)"
        )).into());
    };
    if args.dry_run {
        return dry_run(ctx, store.as_ref(), id, &target, &opts).await;
    }
    if require_consent(ctx, Consent::of(args.yes), "replay")? {
        let shown = Shown {
            target: &target,
            broker: &broker_shown,
        };
        if let Some(code) = ask(ctx, store.as_ref(), id, &shown).await? {
            return Ok(code);
        }
    }
    let (interrupted, interrupts) = watch_signals_counted();
    let opts = ReplayOptions { interrupts, ..opts };
    broker.connect_early();
    let item = Item {
        id: id.to_string(),
        expected_sha256: args.expect_sha256.clone(),
    };
    let reports = replay(store.as_ref(), &mut broker, &[item], &opts, &interrupted).await;
    tokio::join!(broker.close(), store.close());
    let report = reports?
        .pop()
        .ok_or_else(|| DlqError::other("the replay produced no report"))?;
    Ok(emit_item(ctx, &report))
}

fn not_found(ctx: &Ctx, id: &str) -> u8 {
    let detail = format!("no dead letter with id {id:?}");
    emit(ctx, &StepReport::new(id, Outcome::NotFound, detail))
}

/// `--dry-run`: where it would go, with the headers and body it would carry.
async fn dry_run(
    ctx: &Ctx,
    store: &dyn Store,
    id: &str,
    target: &Target,
    opts: &ReplayOptions,
) -> Result<u8> {
    let Some(row) = store.get(id).await? else {
        return Ok(not_found(ctx, id));
    };
    let headers = replay_headers(&row.headers(), id, &row.summary.reason, &opts.operator);
    // Written as it is encoded, keys in the order they always had (sorted).
    let doc = DryRunJson {
        body_base64: Base64(&row.body),
        body_text: std::str::from_utf8(&row.body).ok(),
        delivery_mode: 2,
        detail: format!("would publish to {target}; nothing was claimed or published"),
        exchange: &target.exchange,
        headers: &headers,
        id,
        mandatory: true,
        message_id: row.summary.event_id.as_deref(),
        outcome: "dry_run",
        routing_key: &target.routing_key,
        sha256: row.sha256(),
        state: row.summary.state,
    };
    match ctx.format {
        Format::Json => ctx.out.json(&doc),
        _ => ctx.out.text(&format!(
            "dry run: would publish {id} to {target} (mandatory, persistent); nothing was claimed or published\nmessage_id: {}\nheaders:\n{}\nbody ({} bytes, sha256 {}, published byte for byte; shown pretty-printed when JSON):\n{}",
            row.summary.event_id.as_deref().unwrap_or("(none)"),
            serde_json::to_string_pretty(&headers).unwrap_or_default(),
            row.body.len(),
            row.sha256(),
            render_body(&row.body).text
        )),
    }
    Ok(dlq::exit::OK)
}

/// Where the prompt says the message goes.
struct Shown<'a> {
    target: &'a Target,
    broker: &'a str,
}

/// The prompt: what it is, where it goes, through which broker and database. `Some(exit
/// code)` when the command ends here (declined, or the row is gone).
async fn ask(ctx: &Ctx, store: &dyn Store, id: &str, shown: &Shown<'_>) -> Result<Option<u8>> {
    let Some(row) = store.get(id).await? else {
        return Ok(Some(not_found(ctx, id)));
    };
    say_lines(&prompt_text(ctx, &row, shown)?);
    if confirm(ctx, "Replay it?").await? {
        return Ok(None);
    }
    let declined = StepReport::new(
        id,
        Outcome::NotReplayed,
        "declined at the prompt; nothing was claimed or published",
    );
    Ok(Some(emit(ctx, &declined)))
}

fn prompt_text(ctx: &Ctx, row: &DeadLetter, shown: &Shown<'_>) -> Result<String> {
    let preview = truncate(&String::from_utf8_lossy(&row.body), 200);
    let line = |s: &str| dlq::sanitize::line(s).into_owned();
    Ok(format!(
        "About to replay:\n  id:        {}\n  event id:  {}\n  reason:    {}\n  producer:  {}\n  target:    {}\n  broker:    {}\n  database:  {}\n  sha256:    {}\n  body:      {} bytes: {}",
        line(&row.summary.id),
        line(row.summary.event_id.as_deref().unwrap_or("(unknown)")),
        line(&row.summary.reason),
        line(row.summary.producer.as_deref().unwrap_or("(unknown)")),
        line(&shown.target.to_string()),
        line(shown.broker),
        line(&ctx.database_url()?.to_string()),
        row.sha256(),
        row.body.len(),
        line(&preview)
    ))
}
