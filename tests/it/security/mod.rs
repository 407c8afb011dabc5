//! Untrusted input and secrets: hostile rows never reach a terminal raw, passwords never
//! reach any output, TLS, files that hold passwords, fuzzing of the parsers.

mod fuzz;
mod hostile;
mod secret_files;
mod secrets;
mod tls;
mod urls;

use std::process::Command;

/// What a hostile publisher puts into any text it controls.
const ATTACKS: [&str; 8] = [
    "\u{1b}]0;pwned\u{7}",              // retitle the terminal window (OSC 0)
    "\u{1b}]52;c;cm0gLXJmIH4K\u{7}",    // write the clipboard (OSC 52)
    "\u{1b}[2J\u{1b}[41m",              // clear the screen, red background (CSI)
    "\u{9b}2J",                         // the same with the one-byte C1 CSI
    "\u{202e}gnp.exe\u{2066}x\u{2069}", // bidi override and isolate
    "shown\roverwritten",               // return to the start of the line
    "\u{7f}\u{8}\u{0}",                 // DEL, backspace, NUL
    "a|b`c\\|d",                        // Markdown table breakers
];

/// Characters a terminal acts on instead of printing, defined here independently of
/// `dlq::sanitize`: C0 (but newline and tab), DEL, C1, bidi controls, line separators.
fn is_raw_control(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t')
        || matches!(
            c,
            '\u{61c}'
                | '\u{200e}'
                | '\u{200f}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
                | '\u{2028}'
                | '\u{2029}'
        )
}

#[track_caller]
fn assert_clean(bytes: &[u8], what: &str) {
    let text = std::str::from_utf8(bytes).unwrap_or_else(|e| {
        panic!(
            "{what}: not UTF-8 ({e}): {:?}",
            String::from_utf8_lossy(bytes)
        )
    });
    if let Some(c) = text.chars().find(|c| is_raw_control(*c)) {
        panic!("{what}: raw {c:?} in {}", text.escape_debug());
    }
}

/// A run with its raw bytes (a `Run` would hide invalid UTF-8).
struct Raw {
    code: i32,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

impl Raw {
    fn of(mut c: Command) -> Raw {
        let o = c.output().unwrap();
        Raw {
            code: o.status.code().unwrap_or(-1),
            stdout: o.stdout,
            stderr: o.stderr,
        }
    }
    fn out(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
    fn err(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
    #[track_caller]
    fn assert_clean(&self, what: &str) {
        assert_clean(&self.stdout, &format!("{what} stdout"));
        assert_clean(&self.stderr, &format!("{what} stderr"));
    }
}

/// The number of `|` not escaped by a backslash.
fn unescaped_pipes(line: &str) -> usize {
    let mut n = 0;
    let mut escaped = false;
    for c in line.chars() {
        match (escaped, c) {
            (false, '\\') => escaped = true,
            (false, '|') => n += 1,
            _ => escaped = false,
        }
    }
    n
}
