//! `dlq show ID`: everything about one dead letter. The table view puts what identifies
//! it (ID, state, SHA-256, sizes) and its history first and the body last, so a large
//! body never scrolls them away; a view longer than the screen goes through the pager.
//! `--body-only` writes the stored bytes alone, for `> FILE`.

use super::output::{opt, render_body, time, time_or, Base64, UNREADABLE};
use super::report::{emit, StepReport};
use super::Result;
use super::{Ctx, Format};
use clap::Args;
use dlq::model::{validate_id, DeadLetter, HistoryEntry, Outcome, Settling, Summary};
use dlq::sanitize::{line, markdown_cell};
use serde::Serialize;

#[derive(Debug, Args)]
pub struct ShowArgs {
    /// The dead-letter ID
    pub id: String,
    /// Leave the body out of the table and Markdown views (`-o json` always carries it)
    #[arg(long, conflicts_with = "body_only")]
    pub no_body: bool,
    /// Write the body's exact bytes to stdout and nothing else, whatever `-o` says (for `> FILE`)
    #[arg(long, visible_alias = "raw")]
    pub body_only: bool,
}

/// Which parts of the record the table and Markdown views print.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Body {
    Shown,
    Left,
}

#[derive(Serialize)]
struct ShowJson<'a> {
    #[serde(flatten)]
    summary: &'a Summary,
    headers: serde_json::Map<String, serde_json::Value>,
    body_base64: Base64<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    body_text: Option<&'a str>,
    sha256: String,
    body_bytes: usize,
    /// While the run that attempted an uncertain row may still settle it: its lease end.
    settling_until: Option<chrono::DateTime<chrono::Utc>>,
    /// Of an uncertain row: who may still settle it (`running`, `v1_claim`, `ended`).
    settling: Option<&'static str>,
    /// Of a revised original: the revision that carries its event now.
    revised_as: Option<&'a str>,
    history: &'a [HistoryEntry],
}

fn settling_name(s: Settling) -> &'static str {
    match s {
        Settling::Running { .. } => "running",
        Settling::V1Claim => "v1_claim",
        Settling::Ended => "ended",
    }
}

pub async fn run(ctx: &Ctx, args: ShowArgs) -> Result<u8> {
    validate_id(&args.id)?;
    let store = ctx.store().await?;
    let Some(row) = store.get(&args.id).await? else {
        store.close().await;
        // The same `not_found` report as claim, release and replay print.
        let id = &args.id;
        let r = StepReport::new(
            id,
            Outcome::NotFound,
            format!("no dead letter with id {id:?}"),
        );
        return Ok(emit(ctx, &r));
    };
    let history = store.history(&args.id).await?;
    let revised_as = store.revised_as(&args.id).await?;
    let revised_as = revised_as.first().map(String::as_str);
    let settling = row.summary.settling(row.db_now);
    store.close().await;
    if args.body_only {
        ctx.out.bytes(&row.body);
        return Ok(dlq::exit::OK);
    }
    let body = match args.no_body {
        true => Body::Left,
        false => Body::Shown,
    };
    match ctx.format {
        Format::Json => ctx.out.json(&ShowJson {
            summary: &row.summary,
            headers: row.headers(),
            body_base64: Base64(&row.body),
            body_text: std::str::from_utf8(&row.body).ok(),
            sha256: row.sha256(),
            body_bytes: row.body.len(),
            settling_until: settling.and_then(Settling::until),
            settling: settling.map(settling_name),
            revised_as,
            history: &history,
        }),
        Format::Table | Format::Wide | Format::Tsv => ctx
            .out
            .paged(&render(&row, settling, revised_as, &history, body)),
        Format::Markdown => ctx
            .out
            .text(&render_markdown(&row, settling, revised_as, &history, body)),
    }
    Ok(dlq::exit::OK)
}

/// Every column of the row, labelled, in the order `show` prints them.
fn fields(
    row: &DeadLetter,
    settling: Option<Settling>,
    revised_as: Option<&str>,
) -> Vec<(&'static str, String)> {
    let s = &row.summary;
    let mut out = identity(row);
    out.push(("lease:", lease(s, row.db_now)));
    for (col, stored) in &s.unreadable {
        let why = format!("{col} holds {stored}, which is no time dlq can read");
        out.push(("unreadable:", why));
    }
    out.extend(attempt(s, settling));
    out.extend(aside(s, revised_as));
    out.push((
        "last replay err:",
        s.last_replay_error.clone().unwrap_or_else(|| "-".into()),
    ));
    out
}

/// What the row is, where it came from and where a replay sends it.
fn identity(row: &DeadLetter) -> Vec<(&'static str, String)> {
    let s = &row.summary;
    let routing_key = s
        .routing_key
        .clone()
        .or_else(|| {
            s.source_queue
                .clone()
                .map(|q| format!("{q} (the source queue)"))
        })
        .unwrap_or_else(|| "(none: give --routing-key to replay)".into());
    vec![
        ("id:", s.id.clone()),
        ("state:", s.state.as_str().into()),
        ("sha256:", row.sha256()),
        ("body bytes:", row.body.len().to_string()),
        ("headers bytes:", row.headers_json.len().to_string()),
        ("reason:", s.reason.clone()),
        ("attempts:", s.attempts.to_string()),
        ("dead-lettered at:", time_or(s.dead_lettered_at, UNREADABLE)),
        ("event id:", opt(&s.event_id)),
        ("producer:", opt(&s.producer)),
        ("schema version:", opt(&s.schema_version)),
        ("source queue:", opt(&s.source_queue)),
        (
            "exchange:",
            s.exchange
                .clone()
                .unwrap_or_else(|| "(default exchange)".into()),
        ),
        ("routing key:", routing_key),
        ("error:", s.error.clone().unwrap_or_default()),
        (
            "replayed at:",
            s.replayed_at.map(time).unwrap_or_else(|| "-".into()),
        ),
    ]
}

/// Who holds the row's lease, until when, or that it lapsed.
fn lease(s: &dlq::model::Summary, db_now: chrono::DateTime<chrono::Utc>) -> String {
    match (&s.replay_claim_owner, s.replay_claim_expires_at) {
        (Some(owner), Some(until)) if s.v1_claim && s.replayed_at.is_none() => format!(
            "a claim by {owner} until {} taken by a tool older than this schema (dlq v1); nobody holds its token",
            time(until)
        ),
        (Some(owner), Some(until)) if s.replayed_at.is_none() && until > db_now => format!(
            "held by {owner} until {} ({}s left)",
            time(until),
            (until - db_now).num_seconds()
        ),
        (Some(owner), Some(until)) if s.replayed_at.is_none() => {
            format!("lapsed at {} (was {owner})", time(until))
        }
        _ => "-".into(),
    }
}

/// An open attempt: when, and who may still settle it.
fn attempt(s: &dlq::model::Summary, settling: Option<Settling>) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    match (s.replay_attempt_at, settling) {
        (Some(at), Some(Settling::V1Claim)) => out.push((
            "attempt at:",
            format!("unknown, before {} (the upgrade from dlq v1)", time(at)),
        )),
        (Some(at), _) => out.push(("attempt at:", time(at))),
        _ => {}
    }
    match settling {
        Some(Settling::Running { until }) => out.push((
            "settling until:",
            format!(
                "{} (the run that attempted it may still settle it; `dlq resolve` waits until then)",
                time(until)
            ),
        )),
        Some(Settling::V1Claim) => out.push((
            "settling:",
            "claimed by a tool older than this schema: nobody can settle it but `dlq resolve`"
                .into(),
        )),
        _ => {}
    }
    out
}

/// Set aside, or a revision of (or revised as) another row.
fn aside(s: &dlq::model::Summary, revised_as: Option<&str>) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if let Some(at) = s.discarded_at {
        let note = s.discard_note.as_deref().unwrap_or("");
        out.push(("discarded at:", format!("{} ({note})", time(at))));
    }
    if let Some(of) = &s.revision_of {
        let how = format!("{of} (`dlq diff {of} {}` shows the change)", s.id);
        out.push(("revision of:", how));
    }
    if let Some(rev) = revised_as {
        let what = format!("{rev} (replay that one; this one is set aside)");
        out.push(("revised as:", what));
    }
    out
}

fn render(
    row: &DeadLetter,
    settling: Option<Settling>,
    revised_as: Option<&str>,
    history: &[HistoryEntry],
    body: Body,
) -> String {
    let mut out = String::new();
    // Values are untrusted: each stays on its line, escaped (the body and headers below
    // keep their newlines; `Out::text` escapes the rest).
    for (k, v) in fields(row, settling, revised_as) {
        out.push_str(&format!("{k:<17} {}\n", line(&v)));
    }
    out.push_str("\nhistory:\n");
    if history.is_empty() {
        out.push_str("  (none)\n");
    }
    for h in history {
        out.push_str(&format!(
            "  {}  {:<10} {:<8} {:<15} {}{}\n",
            time(h.at),
            line(&h.operator),
            line(&h.action),
            line(&h.outcome),
            line(h.detail.as_deref().unwrap_or("")),
            h.plan_id
                .as_ref()
                .map(|p| format!(" (plan {})", line(p)))
                .unwrap_or_default()
        ));
    }
    out.push_str("\nheaders:\n");
    out.push_str(&serde_json::to_string_pretty(&row.headers()).unwrap_or_default());
    out.push('\n');
    if body == Body::Shown {
        out.push_str("\nbody:\n");
        out.push_str(&render_body(&row.body).text);
    }
    out
}

/// `show -o markdown`, for an incident ticket: the columns as a table, headers and body
/// in fenced blocks (a fence longer than any backtick run inside), the history as a table.
fn render_markdown(
    row: &DeadLetter,
    settling: Option<Settling>,
    revised_as: Option<&str>,
    history: &[HistoryEntry],
    body: Body,
) -> String {
    let cell = |v: &str| markdown_cell(v);
    let mut out = format!(
        "### Dead letter {}\n\n| field | value |\n|---|---|\n",
        cell(&row.summary.id)
    );
    for (k, v) in fields(row, settling, revised_as) {
        out.push_str(&format!("| {} | {} |\n", k.trim_end_matches(':'), cell(&v)));
    }
    out.push_str(&markdown_history(history));
    let headers = serde_json::to_string_pretty(&row.headers()).unwrap_or_default();
    out.push_str(&format!("\n#### Headers\n\n{}", fenced("json", &headers)));
    if body == Body::Shown {
        let shown = render_body(&row.body);
        let lang = if shown.json { "json" } else { "text" };
        let text = fenced(lang, shown.text.trim_end());
        out.push_str(&format!("\n#### Body\n\n{text}"));
    }
    out
}

/// The history of `show -o markdown`, as a table.
fn markdown_history(history: &[HistoryEntry]) -> String {
    let cell = |v: &str| markdown_cell(v);
    let mut out = String::new();
    out.push_str("\n#### History\n\n");
    if history.is_empty() {
        out.push_str("(none)\n");
        return out;
    }
    out.push_str("| at | operator | action | outcome | detail |\n|---|---|---|---|---|\n");
    for h in history {
        let detail = format!(
            "{}{}",
            h.detail.as_deref().unwrap_or(""),
            h.plan_id
                .as_ref()
                .map(|p| format!(" (plan {p})"))
                .unwrap_or_default()
        );
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            time(h.at),
            cell(&h.operator),
            cell(&h.action),
            cell(&h.outcome.to_string()),
            cell(&detail)
        ));
    }
    out
}

/// `text` in a fenced code block whose fence no backtick run inside can close.
fn fenced(lang: &str, text: &str) -> String {
    let longest = text.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest.max(2) + 1);
    format!("{fence}{lang}\n{text}\n{fence}\n")
}
