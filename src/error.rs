//! Errors that stop a command. Outcomes of the protocol (`not_replayed`, `uncertain`, ...)
//! are not errors: they are [`crate::model::Outcome`]s, reported on stdout.

use crate::exit;

pub type Result<T, E = DlqError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum DlqError {
    /// Bad arguments or input the user can fix by retyping (exit 2).
    #[error("{0}")]
    Usage(String),
    /// The database has no (or an older) dlq schema.
    #[error("the database has no dlq schema or an older one: run `dlq migrate` first ({0})")]
    SchemaMissing(String),
    /// Unknown dead-letter ID.
    #[error("not_found: no dead letter with id {0:?}")]
    NotFound(String),
    /// SQLite is locked by another writer for longer than the busy timeout.
    #[error("the database is locked by another writer (busy for longer than {0:?}); nothing was changed, try again")]
    Busy(std::time::Duration),
    /// The database could not answer now (connection lost, lock or statement timeout,
    /// serialization failure): the same statement may succeed if tried again.
    #[error("{0}")]
    Unavailable(String),
    /// Anything else that prevents running: connection, configuration, I/O.
    #[error("{0}")]
    Other(String),
}

impl DlqError {
    pub fn usage(msg: impl Into<String>) -> Self {
        DlqError::Usage(msg.into())
    }
    pub fn other(msg: impl Into<String>) -> Self {
        DlqError::Other(msg.into())
    }

    /// The documented exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            DlqError::Usage(_) => exit::USAGE,
            DlqError::NotFound(_) => exit::NOT_FOUND,
            DlqError::SchemaMissing(_)
            | DlqError::Busy(_)
            | DlqError::Unavailable(_)
            | DlqError::Other(_) => exit::ERROR,
        }
    }
}

impl From<std::io::Error> for DlqError {
    fn from(e: std::io::Error) -> Self {
        DlqError::Other(e.to_string())
    }
}
