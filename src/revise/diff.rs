//! `dlq diff A B` and `edit --dry-run`: what differs between two bodies and two header
//! sets. JSON-aware when both are JSON (paths added, removed, changed), else line by
//! line when both are text, else byte ranges (hex).

use super::doc;
use super::patch::{self, path_text, Op};
use serde::Serialize;
use serde_json::value::RawValue;
use similar::{capture_diff_slices, Algorithm, DiffOp};

/// How two bodies were compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Json,
    Text,
    Bytes,
}

/// One difference: where, what, and the two sides (JSON text for JSON, the lines for
/// text, hex for bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub path: String,
    pub op: Op,
    pub a: Option<String>,
    pub b: Option<String>,
    /// The sides are JSON texts (written into JSON output as they are).
    pub json: bool,
}

impl Serialize for Change {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let side = |v: &Option<String>| -> Option<Box<RawValue>> {
            v.as_ref().map(|t| {
                let json = if self.json {
                    t.clone()
                } else {
                    serde_json::to_string(t).unwrap_or_default()
                };
                RawValue::from_string(json)
                    .unwrap_or_else(|_| RawValue::from_string("null".into()).expect("null"))
            })
        };
        let mut m = s.serialize_map(Some(4))?;
        m.serialize_entry("path", &self.path)?;
        m.serialize_entry("op", self.op.as_str())?;
        m.serialize_entry("a", &side(&self.a))?;
        m.serialize_entry("b", &side(&self.b))?;
        m.end()
    }
}

/// `dlq diff -o json` (and a dry run's `diff`): body and headers.
#[derive(Debug, Serialize)]
pub struct Report {
    pub kind: &'static str,
    pub body: Vec<Change>,
    pub headers: Vec<Change>,
}

/// The differences between two dead letters' bodies and headers.
pub fn report(a_body: &[u8], b_body: &[u8], a_headers: &str, b_headers: &str) -> Report {
    let (kind, body) = body(a_body, b_body);
    Report {
        kind: match kind {
            Kind::Json => "json",
            Kind::Text => "text",
            Kind::Bytes => "bytes",
        },
        body,
        headers: headers(a_headers, b_headers),
    }
}

/// The unified view of headers, then body, of two dead letters named `a` and `b`.
pub fn views(
    a_body: &[u8],
    b_body: &[u8],
    a_headers: &str,
    b_headers: &str,
    a: &str,
    b: &str,
) -> Vec<Line> {
    let pretty = |h: &str| view(h.as_bytes());
    let mut out = unified(
        &pretty(a_headers),
        &pretty(b_headers),
        &format!("a/{a} headers"),
        &format!("b/{b} headers"),
    );
    out.extend(unified(
        &view(a_body),
        &view(b_body),
        &format!("a/{a} body"),
        &format!("b/{b} body"),
    ));
    out
}

impl Op {
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Added => "added",
            Op::Removed => "removed",
            Op::Changed => "changed",
        }
    }
}

/// The differences between two bodies.
pub fn body(a: &[u8], b: &[u8]) -> (Kind, Vec<Change>) {
    if let (Ok(at), Ok(bt)) = (std::str::from_utf8(a), std::str::from_utf8(b)) {
        if let Some(changes) = json(at, bt) {
            return (Kind::Json, changes);
        }
        return (Kind::Text, text(at, bt));
    }
    (Kind::Bytes, bytes(a, b))
}

/// The differences between two JSON texts (None unless both parse).
pub fn json(a: &str, b: &str) -> Option<Vec<Change>> {
    let (an, bn) = (doc::parse(a).ok()?, doc::parse(b).ok()?);
    let (deltas, _) = patch::patch(a, &an, &bn);
    Some(
        deltas
            .into_iter()
            .map(|d| Change {
                path: path_text(&d.path),
                op: d.op,
                a: d.a,
                b: d.b,
                json: true,
            })
            .collect(),
    )
}

fn op_of(d: &DiffOp) -> Option<Op> {
    match d {
        DiffOp::Equal { .. } => None,
        DiffOp::Delete { .. } => Some(Op::Removed),
        DiffOp::Insert { .. } => Some(Op::Added),
        DiffOp::Replace { .. } => Some(Op::Changed),
    }
}

fn text(a: &str, b: &str) -> Vec<Change> {
    let al: Vec<&str> = a.split_inclusive('\n').collect();
    let bl: Vec<&str> = b.split_inclusive('\n').collect();
    let side =
        |lines: &[&str], r: std::ops::Range<usize>| (!r.is_empty()).then(|| lines[r].concat());
    capture_diff_slices(Algorithm::Myers, &al, &bl)
        .iter()
        .filter_map(|d| {
            let op = op_of(d)?;
            let line = d.old_range().start + 1;
            Some(Change {
                path: format!("line {line}"),
                op,
                a: side(&al, d.old_range()),
                b: side(&bl, d.new_range()),
                json: false,
            })
        })
        .collect()
}

fn bytes(a: &[u8], b: &[u8]) -> Vec<Change> {
    let side = |s: &[u8], r: std::ops::Range<usize>| (!r.is_empty()).then(|| hex::encode(&s[r]));
    capture_diff_slices(Algorithm::Myers, a, b)
        .iter()
        .filter_map(|d| {
            let op = op_of(d)?;
            Some(Change {
                path: format!("byte {}", d.old_range().start),
                op,
                a: side(a, d.old_range()),
                b: side(b, d.new_range()),
                json: false,
            })
        })
        .collect()
}

/// The differences between two header sets (JSON objects; else compared as text).
pub fn headers(a: &str, b: &str) -> Vec<Change> {
    json(a, b).unwrap_or_else(|| text(a, b))
}

/// A body as the lines a unified view compares: pretty JSON (its own order and numbers),
/// the text, or a hex dump of 16 bytes a line.
pub fn view(body: &[u8]) -> String {
    if let Ok(t) = std::str::from_utf8(body) {
        return match doc::parse(t) {
            Ok(n) => doc::pretty(&n),
            Err(_) => t.to_string(),
        };
    }
    body.chunks(16)
        .enumerate()
        .map(|(i, c)| {
            let hex: Vec<String> = c.iter().map(|b| format!("{b:02x}")).collect();
            format!("{:08x}  {}\n", i * 16, hex.join(" "))
        })
        .collect()
}

/// A line of a unified view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Line {
    /// `--- a` / `+++ b` / `@@ ... @@`.
    Header(String),
    Context(String),
    Removed(String),
    Added(String),
}

/// A unified view (three lines of context) of two texts, as `git diff` shows it.
pub fn unified(a: &str, b: &str, a_name: &str, b_name: &str) -> Vec<Line> {
    let d = similar::TextDiff::from_lines(a, b);
    let mut out = Vec::new();
    for group in d.grouped_ops(3) {
        if out.is_empty() {
            out.push(Line::Header(format!("--- {a_name}")));
            out.push(Line::Header(format!("+++ {b_name}")));
        }
        let (first, last) = (&group[0], &group[group.len() - 1]);
        let (o, n) = (first.old_range().start, first.new_range().start);
        let (ol, nl) = (last.old_range().end - o, last.new_range().end - n);
        out.push(Line::Header(format!(
            "@@ -{},{ol} +{},{nl} @@",
            o + 1,
            n + 1
        )));
        for op in &group {
            for c in d.iter_changes(op) {
                let v = c.value().trim_end_matches('\n').to_string();
                out.push(match c.tag() {
                    similar::ChangeTag::Equal => Line::Context(v),
                    similar::ChangeTag::Delete => Line::Removed(v),
                    similar::ChangeTag::Insert => Line::Added(v),
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_text_and_bytes() {
        let (k, c) = body(
            br#"{"a":1,"b":{"c":"x"}}"#,
            br#"{"a":1,"b":{"c":"y"},"d":[1]}"#,
        );
        assert_eq!(k, Kind::Json);
        assert_eq!(c.len(), 2);
        assert_eq!((c[0].path.as_str(), c[0].op), ("b.c", Op::Changed));
        assert_eq!((c[1].path.as_str(), c[1].op), ("d", Op::Added));
        let (k, c) = body(b"one\ntwo\n", b"one\nthree\n");
        assert_eq!(
            (k, c[0].path.as_str(), c[0].op),
            (Kind::Text, "line 2", Op::Changed)
        );
        let (k, c) = body(&[0xff, 1, 2], &[0xff, 1, 3]);
        assert_eq!((k, c[0].a.as_deref()), (Kind::Bytes, Some("02")));
    }
}
