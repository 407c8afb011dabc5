//! When the database does not answer: how long a protocol write (a mark, a release, the
//! note of doubt, a claim on a busy SQLite file) is retried, what the operator is told
//! at once, and how an interrupt during that wait ends it.
//!
//! Why bounded: a mark retried until the lease ends waited five minutes in silence
//! while the operator could not tell what dlq was doing. `--settle-timeout` bounds the
//! wait; the first failure says, once, what is retried and until when (the library
//! sends a [`Notice`]; the CLI words it); a signal that arrives during the wait ends it
//! at once, leaving the rows `uncertain` (never a mark that may or may not have been
//! written reported as one or the other).

use crate::error::DlqError;
use crate::spell::{InWords, Spell};
use crate::store::is_transient;
use chrono::{DateTime, Utc};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// `--settle-timeout`'s default.
pub const DEFAULT_SETTLE_TIMEOUT: Duration = Duration::from_secs(30);

/// The protocol write being retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    Claim,
    /// Marking confirmed publishes replayed.
    Mark,
    /// Releasing rows that were certainly not published.
    Release,
    /// Recording why the outcome is unknown.
    Uncertain,
}

/// Something the operator must hear at once, not only in the report at the end.
#[derive(Debug, Clone)]
pub enum Notice {
    /// A write failed for a transient reason and is retried until `until`.
    Retrying {
        step: Step,
        rows: usize,
        until: DateTime<Utc>,
        cause: String,
    },
    /// Rows whose doubt could not be written (they show `uncertain` all the same: their
    /// attempt is recorded; what is missing is the reason).
    NotRecorded { rows: usize, cause: String },
}

/// Where notices go (the CLI prints them on stderr); by default nowhere.
#[derive(Clone, Default)]
pub struct Notices(Option<Arc<NoticeFn>>);

type NoticeFn = dyn Fn(&Notice) + Send + Sync;

impl Notices {
    pub fn new(f: impl Fn(&Notice) + Send + Sync + 'static) -> Self {
        Notices(Some(Arc::new(f)))
    }

    pub fn send(&self, n: &Notice) {
        if let Some(f) = &self.0 {
            f(n)
        }
    }
}

impl std::fmt::Debug for Notices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Notices")
    }
}

/// How a retried write ended.
pub enum Settled<T> {
    Done(T),
    /// It failed for good, or for as long as it was allowed to be retried.
    Failed(DlqError),
    /// A signal came during the write or the wait: whether the write happened is unknown.
    Abandoned,
}

/// What bounds a retried write.
pub struct Bounds<'a> {
    pub until: Instant,
    /// Signals seen so far (SIGINT, SIGTERM); one that arrives during the wait ends it.
    pub interrupts: &'a AtomicUsize,
    pub notices: &'a Notices,
    pub step: Step,
    pub rows: usize,
    /// Which errors are worth another try (a claim retries only a busy file).
    pub retry: fn(&DlqError) -> bool,
}

/// Runs `op` until it succeeds, fails for good, `until` passes, or a signal arrives.
/// The protocol writes are token-guarded and idempotent, so a retry after a lost reply
/// is safe. At least one try; the first failure sends [`Notice::Retrying`]; a signal
/// that arrives after it (the retries, the pauses) ends the wait.
pub async fn retrying<T, F, Fut>(b: Bounds<'_>, mut op: F) -> Settled<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = crate::error::Result<T>>,
{
    let seen = b.interrupts.load(Ordering::SeqCst);
    let interrupted = || b.interrupts.load(Ordering::SeqCst) != seen;
    let mut pause = Duration::from_millis(50);
    let mut told = false;
    loop {
        // The first try is the settlement itself, which a Ctrl-C waits for; only the
        // retries are the wait that a signal ends.
        let tried = match told {
            false => op().await,
            true => match until_signal(&interrupted, op()).await {
                None => return Settled::Abandoned,
                Some(r) => r,
            },
        };
        match tried {
            Ok(v) => return Settled::Done(v),
            Err(e) if (b.retry)(&e) && Instant::now() + pause < b.until => {
                if !told {
                    told = true;
                    let left = b.until.saturating_duration_since(Instant::now());
                    b.notices.send(&Notice::Retrying {
                        step: b.step,
                        rows: b.rows,
                        until: Utc::now() + chrono::Duration::from_std(left).unwrap_or_default(),
                        // A transient error names nothing of the CLI.
                        cause: cause_text(&e, &InWords),
                    });
                }
                tracing::debug!("retrying in {pause:?}: {e}");
                if until_signal(&interrupted, tokio::time::sleep(pause))
                    .await
                    .is_none()
                {
                    return Settled::Abandoned;
                }
                pause = (pause * 2).min(Duration::from_secs(2));
            }
            Err(e) => return Settled::Failed(e),
        }
    }
}

/// Transient errors: the default retry rule.
pub fn transient(e: &DlqError) -> bool {
    is_transient(e)
}

/// A busy SQLite file: the one error a claim retries (it surely changed nothing).
pub fn busy(e: &DlqError) -> bool {
    matches!(e, DlqError::Busy(_))
}

/// An error's text for a notice or a report, without the advice meant for a command
/// that stops ("nothing was changed, try again" is false once something was sent).
/// What the error names of the CLI is spelled by `s`.
pub fn cause_text(e: &DlqError, s: &dyn Spell) -> String {
    match e {
        DlqError::Busy(_) => "the database is locked by another writer".into(),
        other => other.render(s),
    }
}

async fn until_signal<T>(
    interrupted: &impl Fn() -> bool,
    fut: impl std::future::Future<Output = T>,
) -> Option<T> {
    tokio::pin!(fut);
    loop {
        tokio::select! {
            v = &mut fut => return Some(v),
            _ = tokio::time::sleep(Duration::from_millis(25)) => {
                if interrupted() {
                    return None;
                }
            }
        }
    }
}
