//! The context a command runs in, resolved once from the parsed options: the output
//! format and writer, the database URL (from a flag, a file or the environment, checked
//! for `--require-tls`), how to open the store, and who the operator is.

use super::output::say;
use super::{profile, Format, GlobalOpts, Out, Result};
use anyhow::Context as _;
use dlq::error::DlqError;
use dlq::secret::SecretUrl;
use dlq::store::{self, Store, StoreOptions};
use std::io::IsTerminal;

/// Everything a subcommand needs, resolved once.
pub struct Ctx {
    pub global: GlobalOpts,
    pub format: Format,
    pub out: Out,
    /// What the profile (if any) gave.
    pub profile: profile::Applied,
    /// The store [`Ctx::resolve_ids`] opened, handed to the command's
    /// first [`Ctx::store`]: one connection, and one connect timeout, per command.
    pub opened: std::sync::Mutex<Option<Box<dyn Store>>>,
}

impl Ctx {
    /// A bad value from the config file is a configuration error (exit 1); typed on the
    /// line or in the environment, a usage error (exit 2).
    pub(super) fn bad_value(origin: &Option<String>, e: DlqError) -> DlqError {
        match (origin, e) {
            (Some(o), DlqError::Usage(m)) => {
                DlqError::Config(format!("{o}: {}", m.spell(&super::spell::Commands)))
            }
            (_, e) => e,
        }
    }
}

pub(super) fn read_url_file(path: &std::path::Path, what: &str) -> dlq::error::Result<String> {
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
            if_missing: dlq::store::IfMissing::Refuse,
            max_connections: 1,
            long_running: false,
        }
    }

    /// Opens the store for reading. Reads name the derived columns and the history
    /// table, so a database without the schema fails with "run `dlq migrate`" anyway.
    pub async fn store(&self) -> Result<Box<dyn Store>> {
        let opened = self.opened.lock().map(|mut o| o.take());
        if let Ok(Some(opened)) = opened {
            return Ok(opened);
        }
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
pub(super) fn warn_if_password_in_flag(flag: &str, env: &str, values: &[String]) {
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
pub(super) fn pick_url_sources(g: &mut GlobalOpts, m: &clap::ArgMatches) -> dlq::error::Result<()> {
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
