//! `dlq edit`: fix a dead letter's content as a revision (a new row, the original set
//! aside in the same transaction), by a jq program, paths, a whole new body, or the
//! editor; one ID or each item of a reviewed plan.

use super::prompt::{confirm, require_consent, Consent};
use super::report::StepReport;
use super::Result;
use super::{Ctx, Format};
use clap::Args;
use dlq::error::DlqError;
use dlq::model::{validate_id, Outcome, State};
use dlq::revise::{
    self, BodyChange, Change, EditOptions, EditOutcome, HeaderEdit, JqError, PathEdit, Program,
    Refusal,
};
use dlq::store::{EventInContent, Store};
use serde::Serialize;
use std::path::PathBuf;

mod editor;
mod plan;

/// `dlq edit --help`.
const EXAMPLES: &str = "Examples:
  # Fix a decimal comma: look at the change first, then write it
  dlq edit 2e3f3208-3f20-5e9c-9d48-a8ff92218f06 --jq '.amount |= sub(\",\";\".\")' --note \"INC-42: decimal comma\" --dry-run
  # Set one field and one header
  dlq edit 2e3f3208-3f20-5e9c-9d48-a8ff92218f06 --set tenant='\"acme\"' --header schema-version=6 --note \"INC-42: missing tenant\"
  # Every item of a reviewed plan, and a plan of the revisions to replay
  dlq edit --plan billing.plan --jq '.amount |= sub(\",\";\".\")' --note \"INC-42\" --plan-out revisions.plan --yes";

#[derive(Debug, Args)]
#[command(after_long_help = EXAMPLES)]
pub struct EditArgs {
    /// The dead-letter ID (or --plan FILE)
    #[arg(conflicts_with = "plan", required_unless_present = "plan")]
    pub id: Option<String>,
    /// Edit each item of this plan (made on this database)
    #[arg(long)]
    pub plan: Option<PathBuf>,
    /// With --plan: write a plan of the revisions here, ready for `replay --plan`
    #[arg(long, requires = "plan", value_name = "NEWPLAN")]
    pub plan_out: Option<PathBuf>,
    /// Why (a ticket, what was wrong); kept in both histories
    #[arg(long)]
    pub note: String,
    /// A jq program over the JSON body; it must yield exactly one value
    #[arg(long, value_name = "EXPR", conflicts_with_all = ["set", "delete", "body_file"])]
    pub jq: Option<String>,
    /// Set the value at a dotted path of the JSON body (repeatable): amount="1.50"
    #[arg(long = "set", value_name = "PATH=JSON")]
    pub set: Vec<String>,
    /// Delete the member at a dotted path of the JSON body (repeatable)
    #[arg(long = "delete", value_name = "PATH")]
    pub delete: Vec<String>,
    /// The whole new body, bytes as they are
    #[arg(long, value_name = "FILE", conflicts_with_all = ["set", "delete", "plan"])]
    pub body_file: Option<PathBuf>,
    /// Set a header to this string (repeatable)
    #[arg(long = "header", value_name = "KEY=VALUE")]
    pub headers: Vec<String>,
    /// Remove a header (repeatable)
    #[arg(long = "drop-header", value_name = "KEY")]
    pub drop_headers: Vec<String>,
    /// Open the body in $VISUAL / $EDITOR even without a terminal (the default on one
    /// when no other change is given)
    #[arg(long, conflicts_with_all = ["jq", "set", "delete", "body_file", "plan"])]
    pub editor: bool,
    /// Show the change (a diff of body and headers) and write nothing
    #[arg(long)]
    pub dry_run: bool,
    /// Give the revision a fresh event ID (recorded in the history)
    #[arg(long)]
    pub new_event_id: bool,
    /// Do not ask (a plan edit without a terminal needs it)
    #[arg(short = 'y', long)]
    pub yes: bool,
}

/// One item of `edit -o json`, the contract's shape.
#[derive(Serialize)]
pub struct EditReport {
    pub id: String,
    pub outcome: Outcome,
    pub revision_id: Option<String>,
    pub sha256: Option<String>,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diff: Option<revise::diff::Report>,
    /// A dry run's unified view, for people.
    #[serde(skip)]
    pub view: Vec<revise::diff::Line>,
}

pub async fn run(ctx: &Ctx, args: EditArgs) -> Result<u8> {
    if args.note.trim().is_empty() {
        return Err(
            DlqError::usage("--note is empty: say why (it is kept in both histories)").into(),
        );
    }
    let operator = ctx.operator()?;
    let store = ctx.store_for_writes().await?;
    let code = match &args.plan {
        Some(path) => plan::run(ctx, store.as_ref(), &args, path, &operator).await,
        None => one(ctx, store.as_ref(), &args, &operator).await,
    };
    store.close().await;
    code
}

/// The header edits of `--header` / `--drop-header`.
fn header_edits(args: &EditArgs) -> Result<Vec<HeaderEdit>> {
    let mut out = Vec::new();
    for h in &args.headers {
        let Some((key, value)) = h.split_once('=') else {
            return Err(DlqError::usage(format!("--header {h:?}: expected KEY=VALUE")).into());
        };
        if key.is_empty() {
            return Err(DlqError::usage(format!("--header {h:?}: the KEY is empty")).into());
        }
        out.push(HeaderEdit::Set {
            key: key.into(),
            value: value.into(),
        });
    }
    out.extend(
        args.drop_headers
            .iter()
            .map(|k| HeaderEdit::Drop { key: k.clone() }),
    );
    Ok(out)
}

fn dotted(flag: &str, p: &str) -> Result<Vec<String>> {
    let path: Vec<String> = p.split('.').map(String::from).collect();
    if path.iter().any(String::is_empty) {
        return Err(DlqError::usage(format!("--{flag} {p:?}: an empty key in the path")).into());
    }
    Ok(path)
}

/// The body change the options give (`None`: none given, the editor's turn).
pub fn body_change(args: &EditArgs) -> Result<Option<BodyChange>> {
    if let Some(code) = &args.jq {
        let p = Program::compile(code).map_err(|e| match e {
            JqError::Program(m) => DlqError::usage(format!("--jq: {m}")),
            other => DlqError::usage(format!("--jq: {other:?}")),
        })?;
        return Ok(Some(BodyChange::Jq(p)));
    }
    if let Some(f) = &args.body_file {
        let bytes = std::fs::read(f).map_err(|e| {
            DlqError::usage(format!("cannot read --body-file {}: {e}", f.display()))
        })?;
        return Ok(Some(BodyChange::Replace(bytes)));
    }
    let mut edits = Vec::new();
    for s in &args.set {
        let Some((p, json)) = s.split_once('=') else {
            return Err(DlqError::usage(format!("--set {s:?}: expected PATH=JSON")).into());
        };
        if revise::doc::parse(json).is_err() {
            return Err(DlqError::usage(format!(
                "--set {s:?}: {json:?} is not JSON (a string needs its quotes: {p}='\"{json}\"')"
            ))
            .into());
        }
        edits.push(PathEdit::Set {
            path: dotted("set", p)?,
            json: json.trim().to_string(),
        });
    }
    for p in &args.delete {
        edits.push(PathEdit::Delete {
            path: dotted("delete", p)?,
        });
    }
    Ok((!edits.is_empty()).then_some(BodyChange::Paths(edits)))
}

pub fn options(args: &EditArgs, operator: &str) -> EditOptions {
    EditOptions {
        operator: operator.to_string(),
        note: args.note.clone(),
        expect_sha256: None,
        new_event_id: args.new_event_id,
        dry_run: args.dry_run,
        plan_id: None,
    }
}

async fn one(ctx: &Ctx, store: &dyn Store, args: &EditArgs, operator: &str) -> Result<u8> {
    let id = args.id.clone().unwrap_or_default();
    validate_id(&id)?;
    let headers = header_edits(args)?;
    let opts = options(args, operator);
    let body = match body_change(args)? {
        Some(b) => b,
        None if args.editor || (headers.is_empty() && !args.new_event_id && ctx.interactive()) => {
            let Some(row) = store.get(&id).await? else {
                return Ok(print(ctx, &[report(store, &id, &EditOutcome::NotFound).await?]));
            };
            if row.summary.state != State::Pending {
                let out = EditOutcome::NotEdited(Refusal::NotPending(row.summary.state));
                return Ok(print(ctx, &[report(store, &id, &out).await?]));
            }
            match editor::edit(&row.body)? {
                Some(buffer) => BodyChange::Edited(buffer),
                None => {
                    let r = StepReport::new(&id, Outcome::Unchanged, "edit cancelled: the buffer was saved unchanged or empty; nothing written");
                    return Ok(print(ctx, &[from_step(r)]));
                }
            }
        }
        None if headers.is_empty() && !args.new_event_id => {
            return Err(DlqError::usage(
                "say the change: --jq, --set, --delete, --body-file, --header or --drop-header (or run on a terminal for the editor, or pass --editor)",
            )
            .into())
        }
        None => BodyChange::Keep,
    };
    let change = Change { body, headers };
    let outcome = revise::edit(store, &id, &change, &opts).await?;
    Ok(print(ctx, &[report(store, &id, &outcome).await?]))
}

fn from_step(r: StepReport) -> EditReport {
    EditReport {
        id: r.id,
        outcome: r.outcome,
        revision_id: None,
        sha256: None,
        detail: r.detail,
        diff: None,
        view: Vec::new(),
    }
}

/// Words for what became of an edit.
pub async fn report(store: &dyn Store, id: &str, o: &EditOutcome) -> Result<EditReport> {
    let mut r = EditReport {
        id: id.to_string(),
        outcome: o.outcome(),
        revision_id: None,
        sha256: None,
        detail: String::new(),
        diff: None,
        view: Vec::new(),
    };
    r.detail = match o {
        EditOutcome::Edited {
            revision_id,
            sha256,
            new_event_id,
            event_in_content,
        } => {
            r.revision_id = Some(revision_id.clone());
            r.sha256 = Some(sha256.clone());
            let mut fresh = new_event_id
                .as_ref()
                .map(|e| format!(" with the new event id {e}"))
                .unwrap_or_default();
            if let Some(new) = new_event_id {
                fresh += &still_named(event_in_content, new, revision_id);
            }
            format!("revision {revision_id} made{fresh}; {id} is set aside (revised as {revision_id}); review it with `dlq diff {id} {revision_id}`, replay it with `dlq replay {revision_id}`")
        }
        EditOutcome::Unchanged => "the change changes nothing; no revision made".into(),
        EditOutcome::WouldEdit { before, after } => {
            r.sha256 = Some(dlq::model::sha256_hex(&after.body));
            let (b, a) = (before, after);
            r.diff = Some(revise::diff::report(
                &b.body,
                &a.body,
                &b.headers_json,
                &a.headers_json,
            ));
            r.view = revise::diff::views(
                &b.body,
                &a.body,
                &b.headers_json,
                &a.headers_json,
                id,
                "revision",
            );
            "would make a revision with this change (dry run: nothing written)".into()
        }
        EditOutcome::NotFound => format!("no dead letter with id {id:?}"),
        EditOutcome::NotEdited(Refusal::NotPending(_)) => {
            let prefix = "not edited: only a pending dead letter can be edited; this one is ";
            return Ok(from_step(
                StepReport::unavailable(store, id, Outcome::NotEdited, prefix).await?,
            ));
        }
        EditOutcome::NotEdited(why) => format!("not edited: {}", refusal(why)),
    };
    Ok(r)
}

/// What a new event ID leaves as it was: the old ID where the content names it (only the
/// message ID carries the new one), and the edit that changes it there too.
fn still_named(old: &EventInContent, new: &str, revision: &str) -> String {
    let mut places = Vec::new();
    let mut fix = Vec::new();
    if let Some(h) = &old.header {
        places.push(format!("its x-event-id header {h:?}"));
        fix.push(format!("--header x-event-id={new}"));
    }
    if let Some(b) = &old.body {
        places.push(format!("its body's event_id {b:?}"));
        fix.push(format!("--set event_id='\"{new}\"'"));
    }
    if places.is_empty() {
        return String::new();
    }
    let (verb, them) = match places.len() {
        1 => ("names", "it"),
        _ => ("name", "them"),
    };
    format!(
        " (its message ID); {} still {verb} the old event, which a consumer that reads it there sees: to change {them} too, `dlq edit {revision} {} --note ...`",
        places.join(" and "),
        fix.join(" ")
    )
}

fn refusal(r: &Refusal) -> String {
    match r {
        Refusal::NotPending(s) => format!("it is {}", s.as_str()),
        Refusal::Drifted { expected, found } => format!(
            "its body changed since the plan was reviewed (sha256 {found}, the plan says {expected}); make the plan again"
        ),
        Refusal::BodyNotJson(e) => format!("the body is not JSON ({e}): replace it with --body-file, or edit it as text in the editor"),
        Refusal::HeadersNotJson => "its stored headers are not a JSON object".into(),
        Refusal::Jq(JqError::Failed(e)) => format!("the jq program failed on it: {e}"),
        Refusal::Jq(JqError::Yields(0)) => "the jq program yielded no value (it must yield exactly one)".into(),
        Refusal::Jq(JqError::Yields(_)) => "the jq program yielded more than one value (it must yield exactly one)".into(),
        Refusal::Jq(JqError::Program(e)) => e.clone(),
        Refusal::NotAnObject(p) => format!("{p} is not a JSON object, so the path cannot go through it"),
        Refusal::BodyNotText => "the body is not UTF-8 text: only --body-file can replace it".into(),
    }
}

/// Prints the reports (and a dry run's diff) and returns the exit code of the worst.
pub fn print(ctx: &Ctx, reports: &[EditReport]) -> u8 {
    for r in reports {
        match ctx.format {
            Format::Json => ctx.out.json(r),
            Format::Table | Format::Wide | Format::Markdown | Format::Tsv => {
                ctx.out.diff(&r.view);
                ctx.out.text(&format!(
                    "{}\n",
                    dlq::sanitize::line(&format!("{}: {} ({})", r.id, r.outcome, r.detail))
                ));
            }
        }
    }
    worst(reports)
}

pub fn worst(reports: &[EditReport]) -> u8 {
    reports
        .iter()
        .map(|r| r.outcome)
        .max_by_key(|o| o.severity())
        .map_or(dlq::exit::OK, Outcome::exit_code)
}

/// Asks before a plan edit (or refuses without a terminal and --yes).
pub async fn consent(ctx: &Ctx, consent: Consent, n: usize) -> Result<bool> {
    if require_consent(ctx, consent, "edit a plan")? {
        return Ok(confirm(
            ctx,
            &format!("Make a revision of each of these {n} dead letters?"),
        )
        .await?);
    }
    Ok(true)
}
