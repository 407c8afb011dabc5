//! Showing untrusted text to a person without letting it drive their terminal.
//!
//! Bodies, headers, error texts, producers and queue names come from whoever could publish
//! to the broker (CWE-150). Every line of human output (tables, Markdown, plain text,
//! progress lines, errors, logs) goes through [`line`] or [`block`]; JSON output does not,
//! and keeps every byte.
//!
//! The rule is a character class: a character that a terminal or a text viewer acts on
//! instead of printing is written as a visible escape (`\u{1b}`, `\r`, `\0`, ...):
//!
//! - C0 controls U+0000–U+001F (newline and tab are kept by [`block`], for body views),
//!   DEL U+007F and C1 controls U+0080–U+009F (U+009B is a one-character CSI);
//! - Unicode bidirectional controls (U+061C, U+200E, U+200F, U+202A–U+202E,
//!   U+2066–U+2069), which reorder what is shown (CVE-2021-42574);
//! - the line and paragraph separators U+2028 and U+2029.
//!
//! Escaping ESC itself defuses every escape sequence (CSI, OSC including OSC 52 clipboard
//! writes, DCS, ...), so no sequence parser is needed, and a `\r` can no longer return to
//! the start of a line to overwrite it.
//!
//! Why these few lines rather than a crate: the crates at hand either strip escape
//! sequences (`strip-ansi-escapes`, `console::strip_ansi_codes`), which hides that
//! something was there and lets C1 controls and bidi overrides through, or parse them the
//! way a terminal emulator does (`vte`), which is more than a character-class rule needs.
//! A backslash is not escaped: a body holding the text `\u{1b}` looks the same as one
//! holding ESC. `-o json` is the way to see exact bytes.

use std::borrow::Cow;

/// What of a text's layout is kept when it is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// One line: newline and tab are escaped too.
    Line,
    /// A block (a body view): newline and tab are kept.
    Block,
}

/// Whether `c` is shown escaped in the `layout`.
pub fn needs_escape(c: char, layout: Layout) -> bool {
    match c {
        '\n' | '\t' => layout == Layout::Line,
        '\0'..='\u{1f}' | '\u{7f}'..='\u{9f}' => true,
        '\u{061c}'
        | '\u{200e}'
        | '\u{200f}'
        | '\u{202a}'..='\u{202e}'
        | '\u{2066}'..='\u{2069}' => true,
        '\u{2028}' | '\u{2029}' => true,
        _ => false,
    }
}

fn escape(s: &str, layout: Layout) -> Cow<'_, str> {
    if !s.chars().any(|c| needs_escape(c, layout)) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if !needs_escape(c, layout) {
            out.push(c);
            continue;
        }
        match c {
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\0' => out.push_str("\\0"),
            c => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
        }
    }
    Cow::Owned(out)
}

/// One line: every control character escaped, newline and tab included. For table cells,
/// field values, progress and error lines.
pub fn line(s: &str) -> Cow<'_, str> {
    escape(s, Layout::Line)
}

/// A block of text (a body, pretty-printed headers, a command's plain output): newline and
/// tab kept, everything else of the class escaped; `\r` is escaped too.
pub fn block(s: &str) -> Cow<'_, str> {
    escape(s, Layout::Block)
}

/// A Markdown table cell: [`line`], then `\`, `|` and backticks escaped so that a value
/// can neither end its cell nor open a code span across cells.
pub fn markdown_cell(s: &str) -> String {
    let l = line(s);
    let mut out = String::with_capacity(l.len());
    for c in l.chars() {
        if matches!(c, '\\' | '|' | '`') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Whether `s` holds nothing [`line`] would escape.
pub fn is_clean_line(s: &str) -> bool {
    !s.chars().any(|c| needs_escape(c, Layout::Line))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_sequences_are_shown_not_run() {
        let hostile = "{\"x\":\"\u{1b}]0;pwned\u{7}\u{1b}[2J\"}";
        assert_eq!(line(hostile), "{\"x\":\"\\u{1b}]0;pwned\\u{7}\\u{1b}[2J\"}");
        assert_eq!(line("a\rb"), "a\\rb");
        assert_eq!(block("a\rb\nc\td"), "a\\rb\nc\td");
        assert_eq!(line("a\nb\tc\0"), "a\\nb\\tc\\0");
        assert_eq!(line("\u{9b}31m \u{7f}"), "\\u{9b}31m \\u{7f}");
        assert_eq!(line("abc\u{202e}fed"), "abc\\u{202e}fed");
        assert_eq!(line("\u{2066}x\u{2069}"), "\\u{2066}x\\u{2069}");
    }

    #[test]
    fn ordinary_text_is_borrowed_unchanged() {
        for s in ["", "plain", "Grüße, 日本語, emoji 👨‍👩‍👧", "back\\slash \"q\""]
        {
            assert!(matches!(line(s), Cow::Borrowed(_)), "{s}");
            assert_eq!(line(s), s);
        }
    }

    #[test]
    fn markdown_cells_cannot_break_the_table() {
        assert_eq!(markdown_cell("a|b"), "a\\|b");
        assert_eq!(markdown_cell("a\\|b"), "a\\\\\\|b");
        assert_eq!(markdown_cell("`x`"), "\\`x\\`");
        assert_eq!(markdown_cell("a\nb"), "a\\\\nb");
    }

    #[test]
    fn escaping_is_idempotent() {
        let s = "\u{1b}[41m\r\n\u{202e}";
        let once = line(s).into_owned();
        assert_eq!(line(&once), once);
        assert!(is_clean_line(&once));
    }
}
