//! The only place that writes to stdout. Tables for people, JSON for scripts, Markdown
//! for incident tickets.
//!
//! Human output passes through [`dlq::sanitize`]: every table cell and Markdown cell as
//! one line, plain text as a block; JSON is written as serde encodes it (exact bytes).
//!
//! Every write is checked. A failed write is remembered: nothing more is written, the
//! command sees it through [`Out::check`], and `main` turns it into one error line and
//! exit 1. A closed pipe (`dlq list | head`) is not an error: the command ends at once and
//! quietly; a plan run is stopped like Ctrl-C (see [`Out::stop_on_close`]).

use super::{ColorWhen, Format, Headers};
mod body;
mod pager;
mod table;

pub use body::render_body;
use comfy_table::presets;
use dlq::error::{DlqError, Result};
use dlq::sanitize;
use serde::Serialize;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use table::Look;
pub use table::{Column, Fit};

/// Why stdout could not be written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteFailure {
    /// The reader went away (EPIPE): end quietly.
    Closed,
    /// Anything else (a full disk, an I/O error): an error.
    Failed(String),
}

pub struct Out {
    format: Format,
    headers: Headers,
    colour: Colour,
    failure: Mutex<Option<WriteFailure>>,
    on_close: Mutex<Option<Arc<AtomicBool>>>,
}

/// How a JSON document is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonStyle {
    /// Indented, as [`Out::json`] writes it.
    Pretty,
    /// On one line, as [`Out::json_line`] writes it.
    Line,
}

impl Out {
    pub fn new(format: Format, headers: Headers, colour: Colour) -> Self {
        Out {
            format,
            headers,
            colour,
            failure: Mutex::new(None),
            on_close: Mutex::new(None),
        }
    }

    /// The first write that failed, if any.
    pub fn failure(&self) -> Option<WriteFailure> {
        self.failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Whether the reader of stdout went away.
    pub fn closed(&self) -> bool {
        self.failure() == Some(WriteFailure::Closed)
    }

    /// `Err` once a write has failed, so a command stops before it says anything else.
    pub fn check(&self) -> Result<()> {
        match self.failure() {
            None => Ok(()),
            Some(WriteFailure::Closed) => Err(DlqError::other("stdout was closed")),
            Some(WriteFailure::Failed(e)) => Err(DlqError::other(format!(
                "cannot write the output to stdout: {e}"
            ))),
        }
    }

    /// Sets `flag` when the reader of stdout goes away (the interrupt flag of a run).
    pub fn stop_on_close(&self, flag: Arc<AtomicBool>) {
        if self.closed() {
            flag.store(true, Ordering::SeqCst);
        }
        *self.on_close.lock().unwrap_or_else(|e| e.into_inner()) = Some(flag);
    }

    /// Records that the reader went away (seen by [`stdout_closed`] while idle).
    pub fn mark_closed(&self) {
        self.fail(WriteFailure::Closed);
    }

    fn fail(&self, why: WriteFailure) {
        let mut f = self.failure.lock().unwrap_or_else(|e| e.into_inner());
        if f.is_none() {
            if why == WriteFailure::Closed {
                if let Some(flag) = &*self.on_close.lock().unwrap_or_else(|e| e.into_inner()) {
                    flag.store(true, Ordering::SeqCst);
                }
            }
            *f = Some(why);
        }
    }

    fn write(&self, text: &str) {
        self.bytes(text.as_bytes());
    }

    /// A whole JSON document, pretty-printed, serialized straight into stdout: a dead
    /// letter's body is never held a second time as JSON text (see `show`).
    pub fn json(&self, value: &impl Serialize) {
        if self.failure().is_some() {
            return;
        }
        let mut stdout = std::io::BufWriter::with_capacity(64 * 1024, std::io::stdout().lock());
        let written = serde_json::to_writer_pretty(&mut stdout, value)
            .map_err(|e| match e.is_io() {
                true => std::io::Error::from(e),
                false => std::io::Error::other(format!("cannot encode output: {e}")),
            })
            .and_then(|()| stdout.write_all(b"\n"))
            .and_then(|()| stdout.flush());
        if let Err(e) = written {
            self.fail(match e.kind() {
                std::io::ErrorKind::BrokenPipe => WriteFailure::Closed,
                _ => WriteFailure::Failed(e.to_string()),
            });
        }
    }

    /// One JSON value on one line (streams of items).
    pub fn json_line(&self, value: &impl Serialize) {
        match serde_json::to_string(value) {
            Ok(s) => self.write(&format!("{s}\n")),
            Err(e) => self.fail(WriteFailure::Failed(format!("cannot encode output: {e}"))),
        }
    }

    /// A JSON array written as its items arrive, in the bytes [`Out::json`]
    /// ([`JsonStyle::Pretty`]) or [`Out::json_line`] would write for the whole array,
    /// without holding it.
    pub fn json_array(&self, style: JsonStyle) -> JsonArray<'_> {
        JsonArray {
            out: self,
            pretty: style == JsonStyle::Pretty,
            buf: String::from("["),
            empty: true,
        }
    }

    /// A table written as its rows arrive, in tables of [`TABLE_CHUNK`] rows: column
    /// widths need every row of a table, so a huge listing is several tables, each with
    /// its header, an empty line apart.
    pub fn table_chunks(&self, header: Vec<Column>) -> TableChunks<'_> {
        TableChunks {
            out: self,
            header,
            rows: Vec::new(),
            printed: false,
        }
    }

    /// A table with a header row, as a terminal table, as Markdown or as TSV. Every cell
    /// is shown on one line with its control characters (tabs too) escaped. On a terminal
    /// (or with `COLUMNS` set) the table fits its width as each column's [`Fit`] allows
    /// (see [`table`]); what is left out, or a vertical layout, is said on stderr.
    /// `-o wide` never fits: every column at its whole width.
    pub fn table(&self, columns: Vec<Column>, rows: Vec<Vec<String>>) {
        self.table_part(columns, rows, Part::Whole);
    }

    fn table_part(&self, columns: Vec<Column>, rows: Vec<Vec<String>>, part: Part) {
        let markdown = self.format == Format::Markdown;
        let cell = |s: &String| match markdown {
            true => sanitize::markdown_cell(s),
            false => sanitize::line(s).into_owned(),
        };
        let columns: Vec<Column> = columns
            .into_iter()
            .map(|c| Column {
                name: cell(&c.name),
                ..c
            })
            .collect();
        let rows: Vec<Vec<String>> = rows.iter().map(|r| r.iter().map(cell).collect()).collect();
        if self.format == Format::Tsv {
            return self.write(&tsv(&columns, &rows, self.headers_of(part)));
        }
        if part == Part::Later {
            self.write("\n");
        }
        let fitted = match markdown {
            true => {
                let look = Look {
                    headers: Headers::Shown,
                    colour: Colour::Off,
                };
                table::render(presets::ASCII_MARKDOWN, &columns, &rows, None, look)
            }
            false => {
                let look = Look {
                    headers: self.headers,
                    colour: self.colour,
                };
                // `-o wide` shows every column at its whole width, whatever the terminal's.
                let width = match self.format {
                    Format::Wide => None,
                    _ => terminal_width(),
                };
                table::render(table::TERMINAL, &columns, &rows, width, look)
            }
        };
        if !fitted.left_out.is_empty() {
            say(&format!(
                "narrow terminal: {} not shown (widen it, or use -o wide)",
                fitted.left_out.join(", ")
            ));
        }
        if fitted.vertical {
            say("narrow terminal: one field a line (widen it, or use -o wide)");
        }
        self.write(&format!("{}\n", fitted.text));
    }

    /// A TSV's header line goes before its first rows only.
    fn headers_of(&self, part: Part) -> Headers {
        match part {
            Part::Later => Headers::Left,
            Part::Whole => self.headers,
        }
    }

    /// A report's line, `ID: OUTCOME (DETAIL)`, each part escaped as a table cell is,
    /// the outcome coloured on a terminal (see [`Colour`]).
    pub fn report_line(&self, id: &str, outcome: &str, detail: &str) {
        let outcome_text = sanitize::line(outcome);
        let outcome_text = match (self.colour, table::ansi_of(outcome)) {
            (Colour::On, Some(code)) => format!("\x1b[{code}m{outcome_text}\x1b[0m"),
            _ => outcome_text.into_owned(),
        };
        let (id, detail) = (sanitize::line(id), sanitize::line(detail));
        self.write(&format!("{id}: {outcome_text} ({detail})\n"));
    }

    /// One ID on its line (`-q`), escaped as a table cell is.
    pub fn id_line(&self, id: &str) {
        self.write(&format!("{}\n", sanitize::line(id)));
    }

    /// Whether stdout carries TSV (`-o tsv`): numbers unformatted, text uncut.
    pub fn is_tsv(&self) -> bool {
        self.format == Format::Tsv
    }

    /// Whether text cells are shown whole (`-o tsv`, `-o wide`), never cut with `…`.
    pub fn whole_text(&self) -> bool {
        matches!(self.format, Format::Tsv | Format::Wide)
    }

    /// Whether a progress bar goes on stderr: for people (not with `-o json`), on a
    /// terminal. Only the bar depends on it; stdout's format does not.
    pub fn progress_bar(&self) -> bool {
        self.format != Format::Json && std::io::IsTerminal::is_terminal(&std::io::stderr())
    }

    /// Whether stdout carries JSON (one line per item of a stream).
    pub fn is_json(&self) -> bool {
        self.format == Format::Json
    }

    /// Plain text for people: newlines and tabs kept, other control characters escaped.
    pub fn text(&self, text: &str) {
        self.write(&sanitize::block(text));
    }

    /// Plain text as [`Out::text`] writes it, through the pager when stdout is a terminal
    /// and the text is longer than the screen (see [`pager`]).
    pub fn paged(&self, text: &str) {
        let text = sanitize::block(text);
        let Some(pager) = pager::wanted(text.lines().count()) else {
            return self.write(&text);
        };
        if let Err(e) = pager::run(&pager, &text) {
            say(&format!(
                "dlq: cannot start the pager {pager:?} ({e}); writing to stdout"
            ));
            self.write(&text);
        }
    }

    /// Bytes exactly as given (`show --body-only`: a body to a file).
    pub fn bytes(&self, bytes: &[u8]) {
        if self.failure().is_some() {
            return;
        }
        let mut stdout = std::io::stdout().lock();
        if let Err(e) = stdout.write_all(bytes).and_then(|()| stdout.flush()) {
            self.fail(match e.kind() {
                std::io::ErrorKind::BrokenPipe => WriteFailure::Closed,
                _ => WriteFailure::Failed(e.to_string()),
            });
        }
    }

    /// A unified diff view (`dlq diff`, `edit --dry-run`): each line's text escaped as
    /// any untrusted text, coloured as `git diff` colours it on a terminal (not with
    /// `NO_COLOR`, nor in Markdown).
    pub fn diff(&self, lines: &[dlq::revise::diff::Line]) {
        use dlq::revise::diff::Line;
        let colour = self.colour == Colour::On;
        let mut out = String::new();
        for l in lines {
            let (code, mark, text) = match l {
                Line::Header(t) if t.starts_with("@@") => ("36", "", t),
                Line::Header(t) => ("1", "", t),
                Line::Context(t) => ("", " ", t),
                Line::Removed(t) => ("31", "-", t),
                Line::Added(t) => ("32", "+", t),
            };
            let text = sanitize::line(&format!("{mark}{text}")).into_owned();
            match colour && !code.is_empty() {
                true => out.push_str(&format!("\x1b[{code}m{text}\x1b[0m\n")),
                false => out.push_str(&format!("{text}\n")),
            }
        }
        self.write(&out);
    }

    /// Text `dlq` generated itself (completion scripts, the man page), written as is.
    pub fn generated(&self, text: &str) {
        self.write(text);
    }

    /// Clears the terminal (`list --watch`).
    pub fn clear_screen(&self) {
        self.write("\x1b[2J\x1b[H");
    }

    /// A buffered stdout for a stream too long to hold (`export`); the caller handles
    /// write errors (a full disk must not pass for a finished export).
    pub fn stream(&self) -> std::io::BufWriter<std::io::Stdout> {
        std::io::BufWriter::with_capacity(256 * 1024, std::io::stdout())
    }
}

/// The format asked for with `-o`, or the contract's default: a table on a terminal,
/// JSON otherwise. Every command prints in this format, whatever else it shows (a
/// progress bar on stderr never changes what stdout carries).
pub fn pick_format(asked: Option<Format>) -> Format {
    asked.unwrap_or(match std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        true => Format::Table,
        false => Format::Json,
    })
}

/// Whether stdout is coloured (states and outcomes in tables, diffs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Colour {
    On,
    Off,
}

/// `--color`: `auto` colours a table on a terminal unless `NO_COLOR` is set; never
/// JSON, Markdown or TSV.
pub fn pick_colour(when: ColorWhen, format: Format) -> Colour {
    let on = matches!(format, Format::Table | Format::Wide)
        && match when {
            ColorWhen::Always => true,
            ColorWhen::Never => false,
            ColorWhen::Auto => {
                std::io::IsTerminal::is_terminal(&std::io::stdout())
                    && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
            }
        };
    match on {
        true => {
            // comfy-table styles through crossterm, which reads NO_COLOR itself: an
            // explicit `--color always` wins.
            crossterm::style::Colored::set_ansi_color_disabled(false);
            Colour::On
        }
        false => Colour::Off,
    }
}

/// `COLUMNS`, when set to a width: it wins over the terminal's (and sets one for output
/// that is not a terminal).
fn columns_env() -> Option<u16> {
    std::env::var("COLUMNS")
        .ok()?
        .trim()
        .parse()
        .ok()
        .filter(|w| *w >= 20)
}

/// The width a table must fit: `COLUMNS`, else the terminal's; none when stdout is not
/// a terminal and `COLUMNS` is unset.
fn terminal_width() -> Option<usize> {
    columns_env()
        .or_else(|| comfy_table::Table::new().width())
        .map(usize::from)
}

/// See [`Out::json_array`].
pub struct JsonArray<'o> {
    out: &'o Out,
    pretty: bool,
    buf: String,
    empty: bool,
}

impl JsonArray<'_> {
    pub fn push(&mut self, value: &impl Serialize) {
        let encoded = if self.pretty {
            serde_json::to_string_pretty(value)
        } else {
            serde_json::to_string(value)
        };
        let item = match encoded {
            Ok(s) => s,
            Err(e) => {
                let why = format!("cannot encode output: {e}");
                return self.out.fail(WriteFailure::Failed(why));
            }
        };
        if !self.empty {
            self.buf.push(',');
        }
        self.empty = false;
        if self.pretty {
            // An item one level in: serde_json escapes newlines inside strings, so every
            // newline here is the pretty printer's.
            self.buf.push_str("\n  ");
            self.buf.push_str(&item.replace('\n', "\n  "));
        } else {
            self.buf.push_str(&item);
        }
        if self.buf.len() >= 64 * 1024 {
            self.out.write(&std::mem::take(&mut self.buf));
        }
    }

    pub fn finish(mut self) {
        if self.pretty && !self.empty {
            self.buf.push('\n');
        }
        self.buf.push_str("]\n");
        self.out.write(&self.buf);
    }
}

/// Which part of a listing a table is: the first (or only) one, or one after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Whole,
    Later,
}

/// Tab-separated lines: the header line (unless left out), then a line per row. Cells
/// are already one line with tabs escaped, so a tab only ever separates.
fn tsv(columns: &[Column], rows: &[Vec<String>], headers: Headers) -> String {
    let mut out = String::new();
    if headers == Headers::Shown {
        let names: Vec<&str> = columns.iter().map(|c| c.name.as_str()).collect();
        out.push_str(&names.join("\t"));
        out.push('\n');
    }
    for r in rows {
        out.push_str(&r.join("\t"));
        out.push('\n');
    }
    out
}

/// Rows per table of [`Out::table_chunks`].
pub const TABLE_CHUNK: usize = 1000;

/// See [`Out::table_chunks`].
pub struct TableChunks<'o> {
    out: &'o Out,
    header: Vec<Column>,
    rows: Vec<Vec<String>>,
    printed: bool,
}

impl TableChunks<'_> {
    pub fn push(&mut self, row: Vec<String>) {
        self.rows.push(row);
        if self.rows.len() == TABLE_CHUNK {
            self.print();
        }
    }

    fn print(&mut self) {
        let part = match self.printed {
            true => Part::Later,
            false => Part::Whole,
        };
        self.printed = true;
        self.out
            .table_part(self.header.clone(), std::mem::take(&mut self.rows), part);
    }

    /// Prints the last rows (or, when there were none, the header alone).
    pub fn finish(mut self) {
        if !self.rows.is_empty() || !self.printed {
            self.print();
        }
    }
}

/// Resolves when the reader of stdout has gone away (a pipe whose other end closed);
/// never when stdout is a terminal, a file, or cannot be watched. Lets an idle loop such
/// as `list --watch` end at once instead of at its next write.
pub async fn stdout_closed() {
    #[cfg(unix)]
    {
        use tokio::io::{unix::AsyncFd, Interest};
        // SAFETY: fd 1 is open for the whole life of the process and always refers to the
        // same file description: dlq never closes, replaces or duplicates onto it.
        let registered =
            unsafe { AsyncFd::register_with_interest(std::io::stdout(), Interest::ERROR) };
        // A pipe's write end reports an error condition once no reader is left (a
        // terminal or a file cannot be registered, or never does).
        if let Ok(fd) = registered {
            if fd.ready(Interest::ERROR).await.is_ok() {
                return;
            }
        }
    }
    std::future::pending::<()>().await
}

/// Shortens `s` to `max` characters with an ellipsis, on one line.
pub fn truncate(s: &str, max: usize) -> String {
    let one_line = s.replace(['\n', '\r', '\t'], " ");
    if one_line.chars().count() <= max {
        one_line
    } else {
        let mut t: String = one_line.chars().take(max.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

/// `1234567` → `1,234,567`.
pub fn thousands(n: i64) -> String {
    let s = n.abs().to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        format!("-{out}")
    } else {
        out
    }
}

pub fn time(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// How a time a worker stored in a form dlq cannot read is shown (`show` says what is
/// stored).
pub const UNREADABLE: &str = "(unreadable)";

/// A time that may be absent or unreadable: `none` then.
pub fn time_or(t: Option<chrono::DateTime<chrono::Utc>>, none: &str) -> String {
    t.map(time).unwrap_or_else(|| none.to_string())
}

pub fn opt(v: &Option<String>) -> String {
    v.clone().unwrap_or_else(|| dlq::model::UNKNOWN.to_string())
}

/// Bytes serialized as a base64 JSON string, encoded while they are written: a body is
/// never held a second time as base64 text.
pub struct Base64<'a>(pub &'a [u8]);

impl Serialize for Base64<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(&base64::display::Base64Display::new(
            self.0,
            &base64::engine::general_purpose::STANDARD,
        ))
    }
}

/// One line on stderr, scrubbed of secrets and with control characters escaped. A failed
/// write to stderr is ignored: there is nowhere left to report it.
pub fn say(line: &str) {
    use std::io::Write;
    let text = dlq::sanitize::line(&dlq::secret::scrub(line).replace('\n', " ")).into_owned();
    let _ = writeln!(std::io::stderr().lock(), "{text}");
}

/// Shows the cursor again and ends the line on stderr, when it is a terminal: a prompt
/// cut short by Ctrl-C leaves the cursor hidden mid-line.
pub fn restore_cursor() {
    use std::io::{IsTerminal, Write};
    if std::io::stderr().is_terminal() {
        let _ = writeln!(std::io::stderr().lock(), "\x1b[?25h");
    }
}

/// Several lines on stderr (a prompt's context), each as [`say`] writes one.
pub fn say_lines(text: &str) {
    text.lines().for_each(say);
}
