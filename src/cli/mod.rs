//! Command-line layer: global options, one module per subcommand, and [`output`], the
//! only module that writes to stdout.

mod aggregate;
mod broker;
mod capture;
mod check;
mod claim;
mod completions;
mod diff;
mod discard;
mod edit;
mod export;
mod filters;
mod import;
mod list;
mod man;
mod metrics;
mod migrate;
mod note;
mod output;
mod plan;
mod profile;
mod prompt;
mod prune;
mod release;
mod replay;
mod report;
mod resolve;
mod restore;
mod serve;
mod show;

use anyhow::Context as _;
use clap::builder::TypedValueParser as _;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use dlq::error::DlqError;

/// A command's result: a library error ([`DlqError`], which decides the exit code) with
/// what the command was doing as context.
pub type Result<T, E = anyhow::Error> = std::result::Result<T, E>;
use dlq::secret::{scrub, SecretUrl};
use dlq::store::{self, Store, StoreOptions};
use dlq::topology::BrokerTopology;
use std::io::IsTerminal;
use std::time::Duration;

pub use output::Out;

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

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Json,
    Markdown,
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
        env = "DLQ_DATABASE_URL",
        hide_env_values = true,
        default_value = "sqlite://dlq.db"
    )]
    pub database_url: String,
    /// Read the database URL from this file (keeps the password out of the process list)
    #[arg(long, global = true, env = "DLQ_DATABASE_URL_FILE")]
    pub database_url_file: Option<std::path::PathBuf>,
    /// RabbitMQ URL: amqp://USER:PASSWORD@HOST:PORT/VHOST; repeat it (or separate with
    /// commas) for the nodes of one cluster, tried in order
    #[arg(
        long,
        global = true,
        env = "DLQ_AMQP_URL",
        hide_env_values = true,
        value_delimiter = ',',
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f"
    )]
    pub amqp_url: Vec<String>,
    /// Read the AMQP URL(s) from this file (one per line, or separated by commas)
    #[arg(long, global = true, env = "DLQ_AMQP_URL_FILE")]
    pub amqp_url_file: Option<std::path::PathBuf>,
    /// PEM file of CAs to trust for amqps:// (default: the system's roots)
    #[arg(long, global = true, env = "DLQ_AMQP_CA_FILE")]
    pub amqp_ca_file: Option<std::path::PathBuf>,
    /// PEM client certificate for amqps:// (with --amqp-client-key)
    #[arg(
        long,
        global = true,
        env = "DLQ_AMQP_CLIENT_CERT",
        requires = "amqp_client_key"
    )]
    pub amqp_client_cert: Option<std::path::PathBuf>,
    /// PEM (PKCS#8) key of the client certificate
    #[arg(
        long,
        global = true,
        env = "DLQ_AMQP_CLIENT_KEY",
        requires = "amqp_client_cert"
    )]
    pub amqp_client_key: Option<std::path::PathBuf>,
    /// What the broker is: `single` (one node: a nack from a full queue is publish_failed)
    /// or `cluster` (also one behind a single address) [default: not known, so a nack is
    /// uncertain; several --amqp-url are a cluster]
    #[arg(
        long,
        global = true,
        env = "DLQ_BROKER_TOPOLOGY",
        value_parser = clap::builder::PossibleValuesParser::new(BrokerTopology::NAMES)
            .map(|s| BrokerTopology::parse(&s).unwrap_or_default())
    )]
    pub broker_topology: Option<BrokerTopology>,
    /// Refuse plaintext connections: amqps:// only, PostgreSQL with sslmode=require, verify-ca or verify-full
    #[arg(long, global = true, env = "DLQ_REQUIRE_TLS", action = clap::ArgAction::SetTrue, value_parser = clap::builder::BoolishValueParser::new())]
    pub require_tls: bool,
    /// Who is acting, recorded in history and claim tokens [default: your login name]
    #[arg(long, global = true, env = "DLQ_OPERATOR")]
    pub operator: Option<String>,
    /// Output format [default: table on a terminal, otherwise json]
    #[arg(short = 'o', long, global = true, env = "DLQ_OUTPUT", value_enum)]
    pub output: Option<Format>,
    /// How long to wait to connect to the database or the broker
    #[arg(long, global = true, env = "DLQ_CONNECT_TIMEOUT", default_value = "5s", value_parser = dlq::timeparse::duration_arg)]
    pub connect_timeout: Duration,
    /// Longest a single SQL statement may run (PostgreSQL statement_timeout)
    #[arg(long, global = true, env = "DLQ_STATEMENT_TIMEOUT", default_value = "30s", value_parser = dlq::timeparse::duration_arg)]
    pub statement_timeout: Duration,
    /// How long a replay retries writing its outcome (a mark or release) while the database does not answer; then the rows are left uncertain
    #[arg(long, global = true, env = "DLQ_SETTLE_TIMEOUT", default_value = "30s", value_parser = dlq::timeparse::duration_arg)]
    pub settle_timeout: Duration,
    /// How long to wait for a lock (PostgreSQL lock_timeout, SQLite busy timeout)
    #[arg(long, global = true, env = "DLQ_LOCK_TIMEOUT", default_value = "5s", value_parser = dlq::timeparse::duration_arg)]
    pub lock_timeout: Duration,
    /// Use the named profile of the config file (flags and env still win)
    #[arg(long, global = true, env = "DLQ_PROFILE")]
    pub profile: Option<String>,
    /// The config file [default: $XDG_CONFIG_HOME/dlq/config.toml]
    #[arg(long, global = true, env = "DLQ_CONFIG")]
    pub config: Option<std::path::PathBuf>,
    /// More logging on stderr (-v: connections and steps, -vv: SQL and broker frames)
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
    Discard(discard::DiscardArgs),
    /// Make discarded dead letters pending again, with a note
    Restore(restore::RestoreArgs),
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
}

impl Command {
    /// A profile's default lease, for the commands that take one.
    pub fn set_default_lease(&mut self, lease: Duration) {
        match self {
            Command::Claim(a) => a.lease = lease,
            Command::Replay(a) => a.lease = lease,
            _ => {}
        }
    }
}

/// Everything a subcommand needs, resolved once.
pub struct Ctx {
    pub global: GlobalOpts,
    pub format: Format,
    pub out: Out,
    /// What the profile (if any) gave.
    pub profile: profile::Applied,
}

impl Ctx {
    /// A bad value from the config file is a configuration error (exit 1); typed on the
    /// line or in the environment, a usage error (exit 2).
    fn bad_value(origin: &Option<String>, e: DlqError) -> DlqError {
        match (origin, e) {
            (Some(o), DlqError::Usage(m)) => DlqError::Config(format!("{o}: {m}")),
            (_, e) => e,
        }
    }
}

fn read_url_file(path: &std::path::Path, what: &str) -> dlq::error::Result<String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        DlqError::usage(format!(
            "cannot read the {what} file {}: {e}",
            path.display()
        ))
    })?;
    let url = text.trim().to_string();
    if SecretUrl::new(url.clone()).has_password() {
        warn_if_readable_by_others(path);
    }
    Ok(url)
}

/// Warns (once per file) when `path`, which holds a password, can be read by its group or
/// by everyone, and says how to fix it.
pub fn warn_if_readable_by_others(path: &std::path::Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        static WARNED: std::sync::Mutex<Vec<std::path::PathBuf>> =
            std::sync::Mutex::new(Vec::new());
        let Ok(meta) = std::fs::metadata(path) else {
            return;
        };
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o044 == 0 {
            return;
        }
        let mut warned = WARNED.lock().unwrap_or_else(|e| e.into_inner());
        if warned.iter().any(|p| p == path) {
            return;
        }
        warned.push(path.to_path_buf());
        say(&format!(
            "dlq: warning: {} holds a password and can be read by other users (mode {mode:o}); fix it with: chmod 600 {}",
            path.display(),
            shell_word(&path.display().to_string())
        ));
    }
}

/// `s` as one shell word, quoted when it needs to be.
fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+:,@%".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

impl Ctx {
    pub fn database_url(&self) -> dlq::error::Result<SecretUrl> {
        self.database_url_as_given()
            .map_err(|e| Self::bad_value(&self.profile.database_url, e))
    }

    fn database_url_as_given(&self) -> dlq::error::Result<SecretUrl> {
        let raw = match &self.global.database_url_file {
            Some(p) => read_url_file(p, "database URL")?,
            None => self.global.database_url.clone(),
        };
        let url = SecretUrl::new(raw);
        if let Some(why) = url.problem() {
            return Err(DlqError::usage(format!(
                "invalid database URL {url}: {why}"
            )));
        }
        store::check_url(&url)?;
        if self.global.require_tls {
            require_tls_database(&url)?;
        }
        Ok(url)
    }

    pub fn store_options(&self) -> StoreOptions {
        StoreOptions {
            connect_timeout: self.global.connect_timeout,
            statement_timeout: self.global.statement_timeout,
            lock_timeout: self.global.lock_timeout,
            busy_timeout: self.global.lock_timeout,
            create: false,
            max_connections: 1,
            long_running: false,
        }
    }

    /// Opens the store for reading. Reads name the derived columns and the history
    /// table, so a database without the schema fails with "run `dlq migrate`" anyway.
    pub async fn store(&self) -> Result<Box<dyn Store>> {
        let url = self.database_url()?;
        store::open(&url, &self.store_options())
            .await
            .with_context(|| format!("opening {url}"))
    }

    /// Opens the store for a run that lasts and uses `connections` at once.
    pub async fn store_for_run(&self, connections: u32) -> Result<Box<dyn Store>> {
        let url = self.database_url()?;
        let opts = StoreOptions {
            max_connections: connections,
            long_running: true,
            ..self.store_options()
        };
        store::open(&url, &opts)
            .await
            .with_context(|| format!("opening {url}"))
    }

    /// Opens the store for writing, after checking that `dlq migrate` has run (a claim
    /// touches only the workers' columns and would otherwise succeed on an old table).
    pub async fn store_for_writes(&self) -> Result<Box<dyn Store>> {
        let store = self.store().await?;
        store.check_schema().await?;
        Ok(store)
    }

    pub fn operator(&self) -> dlq::error::Result<String> {
        let op = self
            .global
            .operator
            .clone()
            .or_else(|| std::env::var("USER").ok())
            .or_else(|| std::env::var("LOGNAME").ok())
            .unwrap_or_default();
        if op.trim().is_empty() {
            return Err(DlqError::usage(
                "no operator: pass --operator NAME or set DLQ_OPERATOR (it is recorded in the history)",
            ));
        }
        if op.chars().any(char::is_control) || op.len() > 128 {
            return Err(DlqError::usage(
                "the operator name must be at most 128 characters with no control characters",
            ));
        }
        Ok(op.trim().to_string())
    }

    pub fn interactive(&self) -> bool {
        std::io::stdin().is_terminal() && std::io::stderr().is_terminal()
    }
}

/// `--require-tls` for the database: SQLite is a local file; PostgreSQL must verify or
/// at least require TLS (in the URL's `sslmode` or `PGSSLMODE`).
fn require_tls_database(url: &SecretUrl) -> dlq::error::Result<()> {
    if url.scheme().starts_with("sqlite") {
        return Ok(());
    }
    let from_url = url::Url::parse(url.expose()).ok().and_then(|u| {
        u.query_pairs()
            .find(|(k, _)| k == "sslmode")
            .map(|(_, v)| v.into_owned())
    });
    let mode = from_url.or_else(|| std::env::var("PGSSLMODE").ok());
    match mode.as_deref() {
        Some("require" | "verify-ca" | "verify-full") => Ok(()),
        other => Err(DlqError::usage(format!(
            "--require-tls: the database URL {url} allows plaintext (sslmode={}); add ?sslmode=verify-full (or require)",
            other.unwrap_or("prefer, the default")
        ))),
    }
}

/// A password typed into a flag shows in `ps` for every user of the machine.
fn warn_if_password_in_flag(flag: &str, env: &str, values: &[String]) {
    let typed = std::env::args().any(|a| a == flag || a.starts_with(&format!("{flag}=")));
    if typed
        && values
            .iter()
            .any(|v| SecretUrl::new(v.clone()).has_password())
    {
        say(&format!(
            "dlq: warning: a password given in {flag} is visible to other users of this machine; prefer {env} or {flag}-file"
        ));
    }
}

/// Flag over environment, for each URL and its `-file` twin: a flag typed on the command
/// line beats both variables (`--database-url-file F` wins over `DLQ_DATABASE_URL`, and
/// `--database-url U` over `DLQ_DATABASE_URL_FILE`); with both variables set, the file
/// wins. Typing both flags is the one conflict.
fn pick_url_sources(g: &mut GlobalOpts, m: &clap::ArgMatches) -> dlq::error::Result<()> {
    let typed = |id: &str| m.value_source(id) == Some(clap::parser::ValueSource::CommandLine);
    for (plain, flag) in [
        ("database_url", "--database-url"),
        ("amqp_url", "--amqp-url"),
    ] {
        match (typed(plain), typed(&format!("{plain}_file"))) {
            (true, true) => {
                return Err(DlqError::usage(format!(
                    "{flag} and {flag}-file are both given: pass one of them"
                )))
            }
            (true, false) if plain == "database_url" => g.database_url_file = None,
            (true, false) => g.amqp_url_file = None,
            _ => {}
        }
    }
    Ok(())
}

/// One line on stderr, scrubbed of secrets and with control characters escaped. A failed
/// write to stderr is ignored: there is nowhere left to report it.
pub fn say(line: &str) {
    use std::io::Write;
    let text = dlq::sanitize::line(&scrub(line).replace('\n', " ")).into_owned();
    let _ = writeln!(std::io::stderr().lock(), "{text}");
}

/// Prints the error as `dlq: error: ...` (its context and causes on one line) and
/// returns its exit code: the one the library error says, else 1.
fn report(e: &anyhow::Error) -> u8 {
    say(&format!("dlq: error: {}", dlq::error::one_line(e.as_ref())));
    e.downcast_ref::<DlqError>()
        .map_or(dlq::exit::ERROR, DlqError::exit_code)
}

/// The exit code once the command is done, given how its output went: a closed pipe ends
/// quietly; a write that failed otherwise is an error (exit 1) unless the command already
/// has a worse code to report.
fn finish(out: &Out, result: Result<u8>) -> u8 {
    if out.closed() {
        return result.unwrap_or(dlq::exit::OK);
    }
    let code = match result {
        Ok(code) => code,
        Err(e) => return report(&e),
    };
    match out.check() {
        Ok(()) => code,
        Err(e) => {
            report(&e.into());
            if code == dlq::exit::OK {
                dlq::exit::ERROR
            } else {
                code
            }
        }
    }
}

/// Log fields (messages, errors, SQL) pass through the sanitizer: a log line can quote
/// an error text or a value that came from the broker.
struct SanitizedFields;

impl<'w> tracing_subscriber::fmt::FormatFields<'w> for SanitizedFields {
    fn format_fields<R: tracing_subscriber::field::RecordFields>(
        &self,
        mut writer: tracing_subscriber::fmt::format::Writer<'w>,
        fields: R,
    ) -> std::fmt::Result {
        let mut buf = String::new();
        tracing_subscriber::fmt::format::DefaultFields::new().format_fields(
            tracing_subscriber::fmt::format::Writer::new(&mut buf),
            fields,
        )?;
        writer.write_str(&dlq::sanitize::block(&buf))
    }
}

fn init_logging(verbose: u8) {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{Layer, Registry};
    // DLQ_LOG takes a full tracing filter; the -v levels use a plain target list, which
    // costs nothing at start-up. Either filters globally: as a per-layer filter, EnvFilter
    // let some events through and silently dropped others.
    let filter: Box<dyn Layer<Registry> + Send + Sync> = match std::env::var("DLQ_LOG") {
        Ok(spec) => Box::new(tracing_subscriber::EnvFilter::new(spec)),
        Err(_) => Box::new(match verbose {
            0 => Targets::new()
                .with_default(LevelFilter::WARN)
                .with_target("lapin", LevelFilter::OFF)
                .with_target("amq_protocol", LevelFilter::OFF),
            1 => Targets::new()
                .with_default(LevelFilter::INFO)
                .with_target("dlq", LevelFilter::DEBUG)
                .with_target("lapin", LevelFilter::WARN),
            _ => Targets::new().with_default(LevelFilter::DEBUG),
        }),
    };
    let fmt = tracing_subscriber::fmt::layer()
        .fmt_fields(SanitizedFields)
        .with_writer(ScrubbedStderr::default)
        .with_target(verbose > 1)
        .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none());
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .try_init();
}

/// Log lines pass through [`scrub`] before reaching stderr.
#[derive(Default)]
struct ScrubbedStderr {
    buf: Vec<u8>,
}

impl std::io::Write for ScrubbedStderr {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for ScrubbedStderr {
    fn drop(&mut self) {
        let text = scrub(&String::from_utf8_lossy(&self.buf));
        let _ = std::io::Write::write_all(&mut std::io::stderr(), text.as_bytes());
    }
}

pub fn main() -> u8 {
    std::panic::set_hook(Box::new(|info| {
        say(&format!("dlq: internal error (a bug): {info}"));
    }));
    let parsed = Cli::command()
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m).map(|c| (c, m)));
    let (mut cli, matches) = match parsed {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return e.exit_code().clamp(0, 255) as u8;
        }
    };
    if let Err(e) = pick_url_sources(&mut cli.global, &matches) {
        return report(&e.into());
    }
    let applied = match profile::apply(&mut cli, &matches) {
        Ok(p) => p,
        Err(e) => return report(&e.into()),
    };
    // Register the passwords of the configured URLs before anything can print them.
    let _ = SecretUrl::new(cli.global.database_url.clone());
    for url in &cli.global.amqp_url {
        let _ = SecretUrl::new(url.trim().to_string());
    }
    warn_if_password_in_flag("--amqp-url", "DLQ_AMQP_URL", &cli.global.amqp_url);
    warn_if_password_in_flag(
        "--database-url",
        "DLQ_DATABASE_URL",
        std::slice::from_ref(&cli.global.database_url),
    );
    init_logging(cli.global.verbose);
    let format = cli
        .global
        .output
        .unwrap_or(if std::io::stdout().is_terminal() {
            Format::Table
        } else {
            Format::Json
        });
    let ctx = Ctx {
        global: cli.global,
        format,
        out: Out::new(format),
        profile: applied,
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return report(&anyhow::Error::new(e).context("cannot start the async runtime")),
    };
    let result = runtime.block_on(run(&ctx, cli.command));
    runtime.shutdown_timeout(Duration::from_secs(1));
    finish(&ctx.out, result)
}

async fn run(ctx: &Ctx, command: Command) -> Result<u8> {
    match command {
        Command::List(a) => list::run(ctx, a).await,
        Command::Aggregate(a) => aggregate::run(ctx, a).await,
        Command::Show(a) => show::run(ctx, a).await,
        Command::Claim(a) => claim::run(ctx, a).await,
        Command::Release(a) => release::run(ctx, a).await,
        Command::Replay(a) => replay::run(ctx, a).await,
        Command::Resolve(a) => resolve::run(ctx, a).await,
        Command::Plan(a) => plan::run(ctx, a).await,
        Command::Import(a) => import::run(ctx, a).await,
        Command::Capture(a) => capture::run(ctx, a).await,
        Command::Export(a) => export::run(ctx, a).await,
        Command::Discard(a) => discard::run(ctx, a).await,
        Command::Restore(a) => restore::run(ctx, a).await,
        Command::Note(a) => note::run(ctx, a).await,
        Command::Edit(a) => edit::run(ctx, a).await,
        Command::Diff(a) => diff::run(ctx, a).await,
        Command::Prune(a) => prune::run(ctx, a).await,
        Command::Metrics(a) => metrics::run(ctx, a).await,
        Command::Check(a) => check::run(ctx, a).await,
        Command::Migrate(a) => migrate::run(ctx, a).await,
        Command::Completions(a) => completions::run(ctx, a),
        Command::Man(a) => man::run(ctx, a),
        Command::Ids(a) => completions::ids(ctx, a).await,
    }
}
