//! Asking before acting, and noticing Ctrl-C: shared by the commands that change rows.

use super::output::say;
use super::Ctx;
use dlq::error::{DlqError, Result};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// Sets the flag on SIGINT or SIGTERM; the protocol checks it before publishing.
pub fn watch_signals() -> Arc<AtomicBool> {
    watch_signals_counted().0
}

/// [`watch_signals`], also counting every signal: one that arrives while a replay
/// retries writing its outcome ends that wait at once (the rows stay uncertain).
pub fn watch_signals_counted() -> (Arc<AtomicBool>, Arc<AtomicUsize>) {
    WATCHED.store(true, Ordering::SeqCst);
    let flag = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicUsize::new(0));
    let (f, n) = (flag.clone(), count.clone());
    tokio::spawn(async move {
        #[cfg(unix)]
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(t) => t,
                Err(_) => return,
            };
        loop {
            #[cfg(unix)]
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            #[cfg(not(unix))]
            let _ = tokio::signal::ctrl_c().await;
            n.fetch_add(1, Ordering::SeqCst);
            if !f.swap(true, Ordering::SeqCst) {
                say("dlq: interrupted: stopping once the items in flight are settled");
            }
        }
    });
    (flag, count)
}

/// The prompt's handler stays for the process (tokio's do), so SIGINT no longer ends it
/// by default: a command that does not watch Ctrl-C itself (it neither publishes nor
/// acks) still ends at once with 130, as it would have without the prompt: an open
/// transaction rolls back, one whose commit was sent may have committed.
fn ctrl_c_stays_fatal() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        tokio::spawn(async {
            while tokio::signal::ctrl_c().await.is_ok() {
                if !WATCHED.load(Ordering::SeqCst) {
                    super::output::restore_cursor();
                    say("dlq: interrupted: what was written before is kept, a write under way may or may not be; `dlq show` or `dlq list` says which");
                    std::process::exit(i32::from(dlq::exit::INTERRUPTED));
                }
            }
        });
    });
}

/// What Ctrl-C at a prompt ends with (exit 130): nothing has been claimed or written yet.
fn interrupted_at_prompt() -> DlqError {
    super::output::restore_cursor();
    DlqError::Interrupted("interrupted at the prompt; nothing was changed".into())
}

/// Set once the command watches Ctrl-C itself ([`watch_signals_counted`]): from then on
/// Ctrl-C is its to settle.
static WATCHED: AtomicBool = AtomicBool::new(false);

/// Asks on the terminal; defaults to No. On a production profile the operator must type
/// the profile's name instead of answering y. Ctrl-C (a signal, or the key read in raw
/// mode) is [`DlqError::Interrupted`].
pub async fn confirm(ctx: &Ctx, prompt: &str) -> Result<bool> {
    let asked = ask(ctx, prompt);
    let answer = tokio::select! {
        a = asked => a,
        _ = tokio::signal::ctrl_c() => return Err(interrupted_at_prompt()),
    };
    ctrl_c_stays_fatal();
    match answer {
        Err(dialoguer::Error::IO(e)) if e.kind() == std::io::ErrorKind::Interrupted => {
            Err(interrupted_at_prompt())
        }
        a => a.map_err(|e| DlqError::other(format!("prompt failed: {e}"))),
    }
}

async fn ask(ctx: &Ctx, prompt: &str) -> std::result::Result<bool, dialoguer::Error> {
    let prompt = prompt.to_string();
    let production = ctx.profile.production.clone();
    let asked = tokio::task::spawn_blocking(move || match production {
        Some(name) => dialoguer::Input::<String>::new()
            .with_prompt(format!(
                "{prompt} This is the PRODUCTION profile: type its name ({name}) to go on"
            ))
            .allow_empty(true)
            .interact_text()
            .map(|typed| typed.trim() == name),
        None => dialoguer::Confirm::new()
            .with_prompt(prompt)
            .default(false)
            .interact(),
    });
    asked
        .await
        .map_err(|e| dialoguer::Error::IO(std::io::Error::other(e.to_string())))?
}

/// Whether the operator consented on the command line (`--yes`) or is to be asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Consent {
    Given,
    Ask,
}

impl Consent {
    /// From a command's `--yes`.
    pub fn of(yes: bool) -> Self {
        match yes {
            true => Consent::Given,
            false => Consent::Ask,
        }
    }
}

/// Whether to ask (`true`), or `Ok(false)` when consent was given; refused (usage) when
/// there is no terminal to ask on.
pub fn require_consent(ctx: &Ctx, consent: Consent, what: &str) -> Result<bool> {
    if consent == Consent::Given {
        return Ok(false);
    }
    if !ctx.interactive() {
        return Err(DlqError::usage(format!(
            "refusing to {what} without --yes: there is no terminal to ask on"
        )));
    }
    Ok(true)
}
