//! Errors that stop a command. Outcomes of the protocol (`not_replayed`, `uncertain`, ...)
//! are not errors: they are `model::Outcome`s, reported on stdout.

use crate::exit;
use crate::spell::{Cmd, InWords, Spell, Words};

pub type Result<T, E = DlqError> = std::result::Result<T, E>;

// Errors keep their cause as a `#[source]` (a driver or I/O error); what an operator
// reads is the chain on one line ([`one_line`]), scrubbed of secrets where it is printed.

#[derive(Debug, thiserror::Error)]
pub enum DlqError {
    /// Bad arguments or input the user can fix by retyping (exit 2).
    #[error("{0}")]
    Usage(Words),
    /// The database has no (or an older) dlq schema.
    #[error("{}", schema_missing(.0, &InWords))]
    SchemaMissing(String),
    /// The config file or a profile in it is unusable (exit 1: bad configuration).
    #[error("{0}")]
    Config(String),
    /// Unknown dead-letter ID.
    #[error("not_found: no dead letter with id {0:?}")]
    NotFound(String),
    /// SQLite is locked by another writer for longer than the busy timeout.
    #[error("the database is locked by another writer (busy for longer than {0:?}); nothing was changed, try again")]
    Busy(std::time::Duration),
    /// The database could not answer now (connection lost, lock or statement timeout,
    /// serialization failure): the same statement may succeed if tried again.
    #[error("database: {what}{}", cause(.source.as_ref()))]
    Unavailable {
        what: String,
        #[source]
        source: Option<sqlx::Error>,
    },
    /// The database refused or failed a statement for a reason trying again won't fix.
    #[error("database{}", cause(Some(.0)))]
    Database(#[source] sqlx::Error),
    /// Reading or writing a file or a stream failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// Anything else that prevents running: connection, configuration, I/O.
    #[error("{0}")]
    Other(Words),
    /// Ctrl-C or SIGTERM before anything was changed (at a prompt): exit 130.
    #[error("{0}")]
    Interrupted(String),
}

impl DlqError {
    pub fn usage(msg: impl Into<Words>) -> Self {
        DlqError::Usage(msg.into())
    }
    pub fn other(msg: impl Into<Words>) -> Self {
        DlqError::Other(msg.into())
    }

    /// The error's text, the CLI things it names spelled by `s` (its `Display` spells
    /// them in words).
    pub fn render(&self, s: &dyn Spell) -> String {
        match self {
            DlqError::Usage(w) | DlqError::Other(w) => w.spell(s),
            DlqError::SchemaMissing(cause) => schema_missing(cause, s),
            _ => self.to_string(),
        }
    }

    /// The documented exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            DlqError::Usage(_) => exit::USAGE,
            DlqError::NotFound(_) => exit::NOT_FOUND,
            DlqError::SchemaMissing(_)
            | DlqError::Config(_)
            | DlqError::Busy(_)
            | DlqError::Unavailable { .. }
            | DlqError::Database(_)
            | DlqError::Io { .. }
            | DlqError::Other(_) => exit::ERROR,
            DlqError::Interrupted(_) => exit::INTERRUPTED,
        }
    }
}

fn schema_missing(cause: &str, s: &dyn Spell) -> String {
    format!(
        "the database has no dlq schema or an older one: run {} first ({cause})",
        s.command(Cmd::Migrate)
    )
}

/// The driver's text of a cause, scrubbed of secrets, as `: text` (an error's text can
/// land in a JSON report, not only on stderr where everything is scrubbed again).
fn cause(source: Option<&sqlx::Error>) -> String {
    let Some(e) = source else {
        return String::new();
    };
    let text = match e.as_database_error() {
        Some(d) => d.message().to_string(),
        None => e.to_string(),
    };
    format!(": {}", crate::secret::scrub(&text))
}

/// Adds what was being done to an I/O error, keeping it as the source.
pub trait IoContext<T> {
    fn io_context(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T> IoContext<T> for std::result::Result<T, std::io::Error> {
    fn io_context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| DlqError::Io {
            what: what(),
            source,
        })
    }
}

/// The error and its causes on one line, `outer: inner: ...`, what a [`DlqError`] names
/// spelled by `s`. A `DlqError` already says its cause, so the chain stops there.
pub fn one_line(e: &(dyn std::error::Error + 'static), s: &dyn Spell) -> String {
    let mut parts = Vec::new();
    let mut next = Some(e);
    while let Some(err) = next {
        if let Some(d) = err.downcast_ref::<DlqError>() {
            parts.push(d.render(s));
            break;
        }
        parts.push(err.to_string());
        next = err.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_are_kept_as_sources_and_said_once() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let e = Err::<(), _>(io)
            .io_context(|| "cannot read plan.json".into())
            .unwrap_err();
        assert!(std::error::Error::source(&e).is_some());
        assert_eq!(
            one_line(&e, &InWords),
            "cannot read plan.json: no such file"
        );
        let e = DlqError::Unavailable {
            what: "connection lost".into(),
            source: Some(sqlx::Error::PoolClosed),
        };
        assert!(std::error::Error::source(&e).is_some());
        let text = one_line(&e, &InWords);
        assert!(text.starts_with("database: connection lost: "), "{text}");
        // The cause is said once, though it is both in the text and the source.
        assert_eq!(text.matches("closed").count(), 1, "{text}");
    }

    #[test]
    fn a_cause_never_prints_a_registered_password() {
        crate::secret::register("Hunter2Canary");
        let e = DlqError::Database(sqlx::Error::Protocol(
            "server said: bad password Hunter2Canary".into(),
        ));
        assert!(!e.to_string().contains("Hunter2Canary"), "{e}");
    }
}
