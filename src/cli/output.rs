//! The only place that writes to stdout. Tables for people, JSON for scripts, Markdown
//! for incident tickets. A closed pipe (`dlq list | head`) is not an error.

use super::Format;
use comfy_table::{presets, ContentArrangement, Table};
use serde::Serialize;
use std::io::Write;

pub struct Out {
    format: Format,
}

impl Out {
    pub fn new(format: Format) -> Self {
        Out { format }
    }

    fn write(&self, text: &str) {
        let mut stdout = std::io::stdout().lock();
        let _ = stdout.write_all(text.as_bytes());
        let _ = stdout.flush();
    }

    /// A whole JSON document, pretty-printed.
    pub fn json(&self, value: &impl Serialize) {
        match serde_json::to_string_pretty(value) {
            Ok(s) => self.write(&format!("{s}\n")),
            Err(e) => eprintln!("dlq: error: cannot encode output: {e}"),
        }
    }

    /// One JSON value on one line (streams of items).
    pub fn json_line(&self, value: &impl Serialize) {
        match serde_json::to_string(value) {
            Ok(s) => self.write(&format!("{s}\n")),
            Err(e) => eprintln!("dlq: error: cannot encode output: {e}"),
        }
    }

    /// A table with a header row, as a terminal table or as Markdown.
    pub fn table(&self, header: Vec<String>, rows: Vec<Vec<String>>) {
        let mut t = Table::new();
        if self.format == Format::Markdown {
            t.load_preset(presets::ASCII_MARKDOWN);
        } else {
            t.load_preset(presets::UTF8_FULL_CONDENSED)
                .set_content_arrangement(ContentArrangement::Dynamic);
        }
        t.set_header(header);
        for r in rows {
            t.add_row(r);
        }
        self.write(&format!("{t}\n"));
    }

    /// Plain text, as is.
    pub fn text(&self, text: &str) {
        self.write(text);
    }

    /// A buffered stdout for a stream too long to hold (`export`); the caller handles
    /// write errors (a full disk must not pass for a finished export).
    pub fn stream(&self) -> std::io::BufWriter<std::io::Stdout> {
        std::io::BufWriter::with_capacity(256 * 1024, std::io::stdout())
    }
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

pub fn opt(v: &Option<String>) -> String {
    v.clone().unwrap_or_else(|| dlq::model::UNKNOWN.to_string())
}

/// Bodies larger than this are cut in the table view (JSON always carries all of it).
const MAX_SHOWN_BODY: usize = 64 * 1024;

/// Pretty JSON when the body is JSON, text when UTF-8, else a hex dump; cut when large.
pub fn render_body(body: &[u8]) -> String {
    let shown = &body[..body.len().min(MAX_SHOWN_BODY)];
    let cut = body.len() > MAX_SHOWN_BODY;
    let note = if cut {
        format!(
            "\n… {} more bytes not shown (use -o json for the whole body)\n",
            body.len() - MAX_SHOWN_BODY
        )
    } else {
        String::new()
    };
    if let Ok(text) = std::str::from_utf8(body) {
        if !cut {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(text) {
                return format!("{}\n", serde_json::to_string_pretty(&v).unwrap_or_default());
            }
        }
        let shown_text = String::from_utf8_lossy(shown);
        return format!("{shown_text}\n{note}");
    }
    let mut out = String::from("(not UTF-8; hex dump)\n");
    for (i, chunk) in shown.chunks(16).enumerate() {
        let hex: Vec<String> = chunk.iter().map(|b| format!("{b:02x}")).collect();
        let ascii: String = chunk
            .iter()
            .map(|b| {
                if b.is_ascii_graphic() || *b == b' ' {
                    *b as char
                } else {
                    '.'
                }
            })
            .collect();
        out.push_str(&format!(
            "{:08x}  {:<48} |{}|\n",
            i * 16,
            hex.join(" "),
            ascii
        ));
    }
    out.push_str(&note);
    out
}
