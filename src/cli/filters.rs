//! The filters shared by `list`, `aggregate`, `plan`, `export` and the commands that
//! change a selection (`resolve`, `discard`, `restore`, `prune`).

use super::output::{say, thousands};
use clap::Args;
use dlq::error::{DlqError, Result};
use dlq::model::{
    validate_filter_value, validate_id, ContentMatch, Dimension, Filter, MatchOn, State,
};
use dlq::plan::Plan;
use dlq::store::Store;
use dlq::timeparse::{parse_time, time_arg};

#[derive(Debug, Args, Clone)]
pub struct FilterArgs {
    /// Only this reason
    ///
    /// poison_message, permanent_failure, retries_exhausted, ...
    #[arg(long, value_name = "REASON")]
    pub reason: Option<String>,
    /// Only this producer
    ///
    /// "(unknown)" selects rows with none.
    #[arg(long, value_name = "NAME")]
    pub producer: Option<String>,
    /// Only this schema version
    ///
    /// "(unknown)" selects rows with none.
    #[arg(long, value_name = "VERSION")]
    pub schema_version: Option<String>,
    /// Only those consumed from this queue
    #[arg(long, value_name = "QUEUE")]
    pub source_queue: Option<String>,
    /// Only this business event (all its attempts)
    #[arg(long, value_name = "ID")]
    pub event_id: Option<String>,
    /// Dead-lettered at or after (RFC 3339, 2h, 7d)
    ///
    /// An RFC 3339 time, or a duration back from now (30m, 2h, 7d).
    #[arg(long, value_name = "TIME", value_parser = time_arg)]
    pub since: Option<String>,
    /// Dead-lettered before (RFC 3339, 2h, 7d)
    ///
    /// An RFC 3339 time, or a duration back from now.
    #[arg(long, value_name = "TIME", value_parser = time_arg)]
    pub until: Option<String>,
    /// Only rows in these states (a comma list)
    ///
    /// Or all.
    #[arg(long, value_name = "STATES", default_value = "all", value_delimiter = ',', value_parser = STATES)]
    pub state: Vec<String>,
    /// Only bodies containing this text
    ///
    /// Byte for byte, no wildcards.
    #[arg(long, value_name = "TEXT")]
    pub grep: Option<String>,
    /// Only errors containing this text
    ///
    /// No wildcards.
    #[arg(long, value_name = "TEXT")]
    pub error_contains: Option<String>,
    /// Only with this header value (repeatable)
    ///
    /// Compared as text; all given must match.
    #[arg(long = "header", value_name = "KEY=VALUE")]
    pub headers: Vec<String>,
    /// Only JSON bodies with this value at a path
    ///
    /// A dotted path, compared as text: customer.id=c-17 (repeatable).
    #[arg(long = "field", value_name = "PATH=VALUE")]
    pub fields: Vec<String>,
    /// Only revisions made by `dlq edit`
    #[arg(long)]
    pub revisions: bool,
}

/// What `--state` takes; clap lists them in `--help` and shell completion offers them.
const STATES: [&str; 6] = [
    "all",
    "pending",
    "claimed",
    "uncertain",
    "replayed",
    "discarded",
];

impl FilterArgs {
    /// `--state` as one comma list, for [`State::parse_list`].
    pub fn states(&self) -> String {
        self.state.join(",")
    }
}

impl FilterArgs {
    /// Whether no filter is given (`--state` aside).
    pub fn is_empty(&self) -> bool {
        [
            &self.reason,
            &self.producer,
            &self.schema_version,
            &self.source_queue,
            &self.event_id,
            &self.since,
            &self.until,
            &self.grep,
            &self.error_contains,
        ]
        .iter()
        .all(|v| v.is_none())
            && self.headers.is_empty()
            && self.fields.is_empty()
            && !self.revisions
    }

    /// Whether a relative time (`2h`) needs the database clock to resolve.
    pub fn needs_now(&self) -> bool {
        [&self.since, &self.until]
            .into_iter()
            .flatten()
            .any(|t| chrono::DateTime::parse_from_rfc3339(t.trim()).is_err())
    }

    /// Resolves the filter, asking the database for its clock only when needed.
    pub async fn resolve(&self, store: &dyn dlq::store::Store) -> Result<Filter> {
        let now = if self.needs_now() {
            store.now().await?
        } else {
            chrono::Utc::now()
        };
        self.to_filter(now)
    }

    /// Validates the values and resolves relative times against `now` (the DB clock).
    pub fn to_filter(&self, now: chrono::DateTime<chrono::Utc>) -> Result<Filter> {
        for (name, v) in [
            ("reason", &self.reason),
            ("producer", &self.producer),
            ("schema-version", &self.schema_version),
            ("source-queue", &self.source_queue),
            ("event-id", &self.event_id),
        ] {
            if let Some(v) = v {
                validate_filter_value(name, v)?;
            }
        }
        let since = self
            .since
            .as_deref()
            .map(|s| parse_time(s, now))
            .transpose()?;
        let until = self
            .until
            .as_deref()
            .map(|s| parse_time(s, now))
            .transpose()?;
        if let (Some(s), Some(u)) = (since, until) {
            if s >= u {
                return Err(DlqError::usage("--since must be before --until"));
            }
        }
        for (name, v) in [
            ("grep", &self.grep),
            ("error-contains", &self.error_contains),
        ] {
            if v.as_deref() == Some("") {
                return Err(DlqError::usage(format!(
                    "--{name} is empty: it would match everything"
                )));
            }
        }
        let headers = self
            .headers
            .iter()
            .map(|h| ContentMatch::parse(MatchOn::Header, h))
            .collect::<Result<Vec<_>>>()?;
        let fields = self
            .fields
            .iter()
            .map(|f| ContentMatch::parse(MatchOn::Field, f))
            .collect::<Result<Vec<_>>>()?;
        Ok(Filter {
            grep: self.grep.clone(),
            error_contains: self.error_contains.clone(),
            headers,
            fields,
            settled_before: None,
            reason: self.reason.clone(),
            producer: self.producer.clone(),
            schema_version: self.schema_version.clone(),
            source_queue: self.source_queue.clone(),
            event_id: self.event_id.clone(),
            since,
            until,
            states: State::parse_list(&self.states())?,
            revisions: self.revisions,
        })
    }
}

/// How many stored values a filter that matches nothing names.
const HINTED: i64 = 5;

impl FilterArgs {
    /// After a command found nothing: for each of `--reason`, `--producer`,
    /// `--schema-version` and `--source-queue` whose value no row has at all, says on
    /// stderr which values exist (the most common, with counts), so a typo is not a
    /// silent "nothing". stdout and the exit code stay as they are; a failed read says
    /// nothing.
    pub async fn hint_unmatched(&self, store: &dyn Store) {
        for (flag, dim, value) in [
            ("reason", Dimension::Reason, &self.reason),
            ("producer", Dimension::Producer, &self.producer),
            (
                "schema-version",
                Dimension::SchemaVersion,
                &self.schema_version,
            ),
            ("source-queue", Dimension::SourceQueue, &self.source_queue),
        ] {
            let Some(value) = value else { continue };
            let alone = only(dim, value);
            if !matches!(store.count_at_most(&alone, 0).await, Ok(0)) {
                continue;
            }
            let Ok(common) = store.common_values(dim, HINTED).await else {
                continue;
            };
            let values: Vec<String> = common
                .iter()
                .map(|(v, n)| format!("{} ({})", dlq::sanitize::line(v), thousands(*n)))
                .collect();
            let stored = match values.is_empty() {
                true => "none is stored".to_string(),
                false => format!("the most common: {}", values.join(", ")),
            };
            say(&format!(
                "dlq: no dead letter has --{flag} {:?}; {stored}",
                dlq::sanitize::line(value)
            ));
        }
    }
}

/// The filter that selects the rows whose `dim` is `value`, in any state.
fn only(dim: Dimension, value: &str) -> Filter {
    let mut f = Filter::default();
    let slot = match dim {
        Dimension::Reason => &mut f.reason,
        Dimension::Producer => &mut f.producer,
        Dimension::SchemaVersion => &mut f.schema_version,
        _ => &mut f.source_queue,
    };
    *slot = Some(value.to_string());
    f
}

/// What a command that changes rows acts on.
pub struct Selection {
    pub ids: Vec<String>,
    /// One ID typed by the operator (not a plan or filters).
    pub single: bool,
    pub plan_id: Option<String>,
}

/// The rows a command that changes them acts on: one ID, the items of a plan made on
/// this database, or the rows the filters select in `state` (the only state the command
/// can act on), refusing more than `limit`. `verb` names the change (`discarded`).
pub async fn select(
    store: &dyn Store,
    id: Option<&str>,
    plan: Option<&std::path::Path>,
    filters: &FilterArgs,
    state: State,
    limit: i64,
    verb: &str,
) -> Result<Selection> {
    if (id.is_some() || plan.is_some()) && !filters.is_empty() {
        return Err(DlqError::usage(
            "give a dead-letter ID, --plan FILE or filters, not both",
        ));
    }
    if let Some(id) = id {
        validate_id(id)?;
        return Ok(Selection {
            ids: vec![id.to_string()],
            single: true,
            plan_id: None,
        });
    }
    if let Some(path) = plan {
        let plan = Plan::load(path, store).await?;
        return Ok(Selection {
            ids: plan.ids(),
            single: false,
            plan_id: Some(plan.plan_id),
        });
    }
    if filters.is_empty() {
        return Err(DlqError::usage(format!(
            "give a dead-letter ID, --plan FILE or at least one filter (--reason, --producer, --grep, ...): every {} dead letter is not a selection",
            state.as_str()
        )));
    }
    let mut filter = filters.resolve(store).await?;
    match filter.states.as_slice() {
        [] => filter.states = vec![state],
        [s] if *s == state => {}
        _ => {
            return Err(DlqError::usage(format!(
                "only {0} dead letters can be {verb}: use --state {0} (the default here)",
                state.as_str()
            )))
        }
    }
    let (rows, total) = store.list(&filter, limit).await?;
    if (rows.len() as i64) < total {
        return Err(DlqError::usage(format!(
            "the filters select {} {} dead letters, more than --limit {}: narrow them or raise --limit",
            thousands(total),
            state.as_str(),
            limit
        )));
    }
    Ok(Selection {
        ids: rows.into_iter().map(|r| r.id).collect(),
        single: false,
        plan_id: None,
    })
}
