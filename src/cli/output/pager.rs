//! Long text for a person through `$PAGER` (`less -FRX` by default), as git and psql do:
//! only when stdout is a terminal and the text is longer than the screen, so a pipe, a
//! file or a short record is written as it is.

use std::io::{IsTerminal, Write};
use std::process::{Command, Stdio};

/// The pager when `PAGER` is unset; an empty `PAGER` means none.
const DEFAULT_PAGER: &str = "less -FRX";

/// The screen's height: `LINES` when set, else the terminal's, else 24.
fn screen_rows() -> usize {
    let lines = std::env::var("LINES")
        .ok()
        .and_then(|l| l.trim().parse().ok());
    lines
        .or_else(|| {
            terminal_size::terminal_size_of(std::io::stdout())
                .map(|(_, h)| usize::from(h.0))
                .filter(|h| *h > 0)
        })
        .unwrap_or(24)
}

/// The pager command to run for `lines` lines of text, if any.
pub fn wanted(lines: usize) -> Option<String> {
    if !std::io::stdout().is_terminal() || lines <= screen_rows() {
        return None;
    }
    let pager = std::env::var("PAGER").unwrap_or_else(|_| DEFAULT_PAGER.to_string());
    (!pager.trim().is_empty()).then_some(pager)
}

/// Writes `text` through `pager` (a shell command line). `Err` when the pager cannot be
/// started (the caller writes the text itself); a pager quit early is not an error.
pub fn run(pager: &str, text: &str) -> std::io::Result<()> {
    // Ctrl-C in the pager is the pager's (as git does): dlq must not die under it and
    // hand the terminal back while the pager still reads it.
    #[cfg(unix)]
    let _ctrl_c = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt());
    let mut child = Command::new("sh")
        .args(["-c", pager])
        .stdin(Stdio::piped())
        .spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        // A person who quits the pager before the end closes this pipe: not an error.
        let _ = stdin.write_all(text.as_bytes());
    }
    child.wait()?;
    Ok(())
}
