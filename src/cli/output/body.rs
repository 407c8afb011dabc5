//! A body as a person reads it: pretty JSON when it is JSON, text when UTF-8, else a hex
//! dump; cut to [`MAX_SHOWN_BODY`] bytes. A cut JSON body stays pretty: it is cut at a
//! line of its pretty form, so the screen shows the structure and not one huge line.

use std::io::Write;

/// Bytes of a body shown in the table view (JSON and `--body-only` carry all of it).
pub const MAX_SHOWN_BODY: usize = 64 * 1024;

/// Bodies up to this size are parsed to be pretty-printed; a larger one is shown as text
/// (parsing it would cost many times its size in memory).
const MAX_PARSED_BODY: usize = 16 * 1024 * 1024;

/// What [`render_body`] made of a body.
pub struct ShownBody {
    pub text: String,
    /// The body is JSON (shown pretty-printed).
    pub json: bool,
}

/// A writer that keeps the first `cap` bytes and counts the rest.
struct Capped {
    buf: Vec<u8>,
    cap: usize,
    more: usize,
}

impl Write for Capped {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        let room = self.cap - self.buf.len();
        let take = room.min(b.len());
        self.buf.extend_from_slice(&b[..take]);
        self.more += b.len() - take;
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn note(more: usize, of: &str) -> String {
    format!("… {more} more bytes not shown ({of}; --body-only writes the body as stored, -o json carries it too)\n")
}

/// The pretty form of a JSON body, cut at its last whole line within the limit.
fn pretty(value: &serde_json::Value) -> String {
    let mut w = Capped {
        buf: Vec::new(),
        cap: MAX_SHOWN_BODY,
        more: 0,
    };
    let _ = serde_json::to_writer_pretty(&mut w, value);
    if w.more == 0 {
        return format!("{}\n", String::from_utf8_lossy(&w.buf));
    }
    // serde_json escapes newlines inside strings: each one here ends a line, and cutting
    // there never splits a UTF-8 character.
    let end = w.buf.iter().rposition(|&b| b == b'\n').unwrap_or(0);
    let more = w.more + (w.buf.len() - end);
    let shown = String::from_utf8_lossy(&w.buf[..end]);
    format!("{shown}\n{}", note(more, "of the pretty-printed body"))
}

/// Pretty JSON when the body is JSON, text when UTF-8, else a hex dump; cut when large.
pub fn render_body(body: &[u8]) -> ShownBody {
    if body.len() <= MAX_PARSED_BODY {
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) {
            return ShownBody {
                text: pretty(&v),
                json: true,
            };
        }
    }
    let shown = &body[..body.len().min(MAX_SHOWN_BODY)];
    let more = body.len() - shown.len();
    let note = match more {
        0 => String::new(),
        n => format!("\n{}", note(n, "of the body")),
    };
    let text = match std::str::from_utf8(body) {
        Ok(_) => format!("{}\n{note}", String::from_utf8_lossy(shown)),
        Err(_) => hex_dump(shown) + &note,
    };
    ShownBody { text, json: false }
}

fn hex_dump(shown: &[u8]) -> String {
    let mut out = String::from("(not UTF-8; hex dump)\n");
    for (i, chunk) in shown.chunks(16).enumerate() {
        let hex: Vec<String> = chunk.iter().map(|b| format!("{b:02x}")).collect();
        let ascii: String = chunk
            .iter()
            .map(|b| match b.is_ascii_graphic() || *b == b' ' {
                true => *b as char,
                false => '.',
            })
            .collect();
        out.push_str(&format!(
            "{:08x}  {:<48} |{}|\n",
            i * 16,
            hex.join(" "),
            ascii
        ));
    }
    out
}
