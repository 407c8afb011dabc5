//! What the command line says, as clap parses it: the global options every command takes
//! and the list of subcommands. Each subcommand's own arguments live in its module.

use super::ids::IdUse;
use super::*;
use clap::builder::TypedValueParser as _;
use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};
use dlq::topology::BrokerTopology;
use std::time::Duration;

#[derive(Debug, Parser)]
#[command(
    name = "dlq",
    version,
    about = "Dead-letter triage and safe replay",
    long_about = "Dead-letter triage and safe replay.\n\nIsolate what is failing (list, aggregate, show), then replay one reviewed dead letter or a reviewed plan through claim -> publish with confirm -> mark.",
    after_help = "Exit codes: 0 done, 1 error, 2 usage, 3 not_replayed/not_claimed/not_released/not_resolved/not_discarded/not_restored/not_edited, 4 not_found, 5 publish_failed, 6 uncertain, 7 breached (check), 130 interrupted."
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalOpts,
    #[command(subcommand)]
    pub command: Command,
}

/// The end of every command's `-h` (the short form): what `--help` adds.
const SHORT_HELP_END: &str =
    "Global options (database, broker, TLS, timeouts, profile) and examples: --help";

/// The command line as `dlq` parses it: the derived definition, each command's `-h`
/// ending on where the rest is (as `kubectl options` is named at the end of its help).
pub fn command() -> clap::Command {
    Cli::command().mut_subcommands(|c| {
        let long = c.get_after_long_help().is_some();
        let c = c.after_help(SHORT_HELP_END);
        match long {
            true => c,
            false => c.after_long_help(""),
        }
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    // (No doc comments here: clap would turn every `--help` into its long layout.)
    Table,
    Json,
    Markdown,
    // Tab-separated lines for awk and cut (list, aggregate); other commands print as table.
    Tsv,
    // A table with every column, none cut (kubectl's `-o wide`); otherwise as table.
    Wide,
}

/// When to colour states and outcomes (`--color`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ColorWhen {
    Auto,
    Always,
    Never,
}

/// Whether a table or TSV starts with its header line (`--no-headers`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Headers {
    Shown,
    Left,
}

/// Options every command takes; `--help` lists them under their own heading, after the
/// command's own options (as cargo and gh do).
#[derive(Debug, Args)]
#[command(next_help_heading = "Global Options")]
pub struct GlobalOpts {
    /// Database URL: postgres://USER@HOST/DB or sqlite://FILE
    #[arg(
        long,
        global = true,
        hide_short_help = true,
        env = "DLQ_DATABASE_URL",
        hide_env_values = true,
        default_value = "sqlite://dlq.db"
    )]
    pub database_url: String,
    /// Read the database URL from this file (keeps the password out of the process list)
    #[arg(
        long,
        global = true,
        hide_short_help = true,
        env = "DLQ_DATABASE_URL_FILE"
    )]
    pub database_url_file: Option<std::path::PathBuf>,
    /// RabbitMQ URL: amqp://USER:PASSWORD@HOST:PORT/VHOST; repeat it (or separate with
    /// commas) for the nodes of one cluster, tried in order
    #[arg(
        long,
        global = true,
        hide_short_help = true,
        env = "DLQ_AMQP_URL",
        hide_env_values = true,
        value_delimiter = ',',
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f"
    )]
    pub amqp_url: Vec<String>,
    /// Read the AMQP URL(s) from this file (one per line, or separated by commas)
    #[arg(long, global = true, hide_short_help = true, env = "DLQ_AMQP_URL_FILE")]
    pub amqp_url_file: Option<std::path::PathBuf>,
    /// PEM file of CAs to trust for amqps:// (default: the system's roots)
    #[arg(long, global = true, hide_short_help = true, env = "DLQ_AMQP_CA_FILE")]
    pub amqp_ca_file: Option<std::path::PathBuf>,
    /// PEM client certificate for amqps:// (with --amqp-client-key)
    #[arg(
        long,
        global = true,
        hide_short_help = true,
        env = "DLQ_AMQP_CLIENT_CERT",
        requires = "amqp_client_key"
    )]
    pub amqp_client_cert: Option<std::path::PathBuf>,
    /// PEM (PKCS#8) key of the client certificate
    #[arg(
        long,
        global = true,
        hide_short_help = true,
        env = "DLQ_AMQP_CLIENT_KEY",
        requires = "amqp_client_cert"
    )]
    pub amqp_client_key: Option<std::path::PathBuf>,
    /// What the broker is: `single` (one node: a nack from a full queue is publish_failed)
    /// or `cluster` (also one behind a single address) [default: not known, so a nack is
    /// uncertain; several --amqp-url are a cluster]
    #[arg(
        long,
        global = true, hide_short_help = true,
        env = "DLQ_BROKER_TOPOLOGY",
        value_parser = clap::builder::PossibleValuesParser::new(BrokerTopology::NAMES)
            .map(|s| BrokerTopology::parse(&s).unwrap_or_default())
    )]
    pub broker_topology: Option<BrokerTopology>,
    /// Refuse plaintext connections: amqps:// only, PostgreSQL with sslmode=require, verify-ca or verify-full
    #[arg(long, global = true, hide_short_help = true, env = "DLQ_REQUIRE_TLS", action = clap::ArgAction::SetTrue, value_parser = clap::builder::BoolishValueParser::new())]
    pub require_tls: bool,
    /// Who is acting, recorded in history and claim tokens [default: your login name]
    #[arg(long, global = true, hide_short_help = true, env = "DLQ_OPERATOR")]
    pub operator: Option<String>,
    /// Output format
    ///
    /// [default: table on a terminal, otherwise json]
    #[arg(short = 'o', long, global = true, env = "DLQ_OUTPUT", value_enum)]
    pub output: Option<Format>,
    /// Leave out the header line of a table or TSV (for awk, cut, xargs)
    #[arg(long, global = true, hide_short_help = true, env = "DLQ_NO_HEADERS", action = clap::ArgAction::SetTrue, value_parser = clap::builder::BoolishValueParser::new())]
    pub no_headers: bool,
    /// Colour states and outcomes: auto (on a terminal, unless NO_COLOR is set), always, never
    #[arg(
        long,
        global = true,
        hide_short_help = true,
        env = "DLQ_COLOR",
        value_enum,
        default_value = "auto",
        hide_possible_values = true
    )]
    pub color: ColorWhen,
    /// How long to wait to connect to the database or the broker
    #[arg(long, global = true, hide_short_help = true, env = "DLQ_CONNECT_TIMEOUT", default_value = "5s", value_parser = dlq::timeparse::duration_arg)]
    pub connect_timeout: Duration,
    /// Longest a single SQL statement may run (PostgreSQL statement_timeout)
    #[arg(long, global = true, hide_short_help = true, env = "DLQ_STATEMENT_TIMEOUT", default_value = "30s", value_parser = dlq::timeparse::duration_arg)]
    pub statement_timeout: Duration,
    /// How long a replay retries writing its outcome (a mark or release) while the database does not answer; then the rows are left uncertain
    #[arg(long, global = true, hide_short_help = true, env = "DLQ_SETTLE_TIMEOUT", default_value = "30s", value_parser = dlq::timeparse::duration_arg)]
    pub settle_timeout: Duration,
    /// How long to wait for a lock (PostgreSQL lock_timeout, SQLite busy timeout)
    #[arg(long, global = true, hide_short_help = true, env = "DLQ_LOCK_TIMEOUT", default_value = "5s", value_parser = dlq::timeparse::duration_arg)]
    pub lock_timeout: Duration,
    /// Use the named profile of the config file (flags and env still win)
    #[arg(long, global = true, hide_short_help = true, env = "DLQ_PROFILE")]
    pub profile: Option<String>,
    /// The config file [default: $XDG_CONFIG_HOME/dlq/config.toml]
    #[arg(long, global = true, hide_short_help = true, env = "DLQ_CONFIG")]
    pub config: Option<std::path::PathBuf>,
    /// More logging on stderr (-v, -vv)
    ///
    /// -v: connections and steps, -vv: SQL and broker frames.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// List dead letters, newest first
    List(list::ListArgs),
    /// Count dead letters by reason, schema version, producer, source queue, hour or day
    Aggregate(aggregate::AggregateArgs),
    /// Show one dead letter: every column, body, headers, lease and history
    Show(show::ShowArgs),
    /// Take a replay lease on one dead letter and print its token
    Claim(claim::ClaimArgs),
    /// Give back a lease taken with `claim`
    Release(release::ReleaseArgs),
    /// Replay one reviewed dead letter, or a reviewed plan
    Replay(replay::ReplayArgs),
    /// Settle uncertain dead letters: the operator says whether the consumers got them
    Resolve(resolve::ResolveArgs),
    /// Freeze a reviewed, homogeneous selection into a plan (JSON on stdout)
    Plan(plan::PlanArgs),
    /// Import dead letters from JSON lines (the shape `export` and `show -o json` print)
    Import(import::ImportArgs),
    /// Move the messages of a RabbitMQ dead-letter queue into the store
    Capture(capture::CaptureArgs),
    /// Export dead letters as JSON lines that `import` reads back byte for byte
    Export(export::ExportArgs),
    /// Set dead letters aside with a note: never claimed, planned or replayed
    Discard(set_aside::DiscardArgs),
    /// Make discarded dead letters pending again, with a note
    Restore(set_aside::RestoreArgs),
    /// Add a note to a dead letter's history
    Note(note::NoteArgs),
    /// Fix a dead letter's content as a revision (the original is set aside)
    Edit(edit::EditArgs),
    /// Compare two dead letters: body (JSON-aware) and headers
    Diff(diff::DiffArgs),
    /// Delete dead letters replayed or discarded long ago, with their history
    Prune(prune::PruneArgs),
    /// Print the store's state in the Prometheus text format, or serve it (--listen)
    Metrics(metrics::MetricsArgs),
    /// Exit 7 when a threshold (pending, oldest pending age, uncertain) is breached
    Check(check::CheckArgs),
    /// Create or upgrade the schema (safe to run again)
    Migrate(migrate::MigrateArgs),
    /// Print shell completions
    Completions(completions::CompletionsArgs),
    /// Print the man page (roff)
    Man(man::ManArgs),
    /// Print dead-letter IDs for shell completion
    #[command(name = "__ids", hide = true)]
    Ids(completions::IdsArgs),
    /// Print the stored values of a filter for shell completion
    #[command(name = "__values", hide = true)]
    Values(completions::ValuesArgs),
}

/// IDs of a command that changes the row they name.
fn change(ids: Vec<&mut String>) -> Vec<(&mut String, IdUse)> {
    ids.into_iter().map(|i| (i, IdUse::Change)).collect()
}

impl Command {
    /// The arguments that name one dead letter, and whether the command only reads it
    /// (a prefix may stand for it) or changes it (only the full ID does); see
    /// [`super::Ctx::resolve_ids`].
    pub fn single_ids(&mut self) -> Vec<(&mut String, IdUse)> {
        match self {
            Command::Show(a) => vec![(&mut a.id, IdUse::Read)],
            Command::Diff(a) => vec![(&mut a.a, IdUse::Read), (&mut a.b, IdUse::Read)],
            Command::Claim(a) => change(vec![&mut a.id]),
            Command::Release(a) => change(vec![&mut a.id]),
            Command::Note(a) => change(vec![&mut a.id]),
            Command::Replay(a) => change(a.id.iter_mut().collect()),
            Command::Resolve(a) => change(a.id.iter_mut().collect()),
            Command::Discard(a) => change(a.id.iter_mut().collect()),
            Command::Restore(a) => change(a.id.iter_mut().collect()),
            Command::Edit(a) => change(a.id.iter_mut().collect()),
            _ => Vec::new(),
        }
    }

    /// A profile's default lease, for the commands that take one.
    pub fn set_default_lease(&mut self, lease: Duration) {
        match self {
            Command::Claim(a) => a.lease = lease,
            Command::Replay(a) => a.lease = lease,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::command;

    /// Every `dlq ...` line of every command's EXAMPLES parses as it is written
    /// (a redirection aside): an example that drifts from the options fails here.
    #[test]
    fn every_example_parses() {
        let mut seen = 0;
        for sub in command().get_subcommands() {
            let Some(text) = sub.get_after_long_help() else {
                continue;
            };
            for line in text.to_string().lines() {
                let Some(rest) = line.trim().strip_prefix("dlq ") else {
                    continue;
                };
                let rest = rest.split(" > ").next().unwrap_or(rest);
                let words = shell_words::split(&format!("dlq {rest}")).unwrap();
                if let Err(e) = command().try_get_matches_from(&words) {
                    panic!("{line}: {e}");
                }
                seen += 1;
            }
        }
        assert!(seen >= 15, "only {seen} examples found");
    }
}
