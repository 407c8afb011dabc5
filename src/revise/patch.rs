//! Edits of a JSON text as splices of its spans ([`super::doc`]): what changed between
//! two trees, written onto the first one's text so that everything else stays as it was.

use super::doc::{parse, same_scalar, Kind, Node};

/// One step of a path: an object key or an array index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seg {
    Key(String),
    Index(usize),
}

/// A path as `customer.id` or `items[2].sku`.
pub fn path_text(path: &[Seg]) -> String {
    let mut out = String::new();
    for s in path {
        match s {
            Seg::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    if out.is_empty() {
        out.push('.');
    }
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Added,
    Removed,
    Changed,
}

/// One difference, with the values' texts as written.
#[derive(Debug, Clone)]
pub struct Delta {
    pub path: Vec<Seg>,
    pub op: Op,
    pub a: Option<String>,
    pub b: Option<String>,
}

/// A replacement of `range` of the first text.
#[derive(Debug, Clone)]
struct Splice {
    at: usize,
    end: usize,
    text: String,
}

/// The differences from `a` to `b`, and the text of `a` with them written in (every
/// byte outside them kept).
pub fn patch(a_text: &str, a: &Node<'_>, b: &Node<'_>) -> (Vec<Delta>, String) {
    let mut w = Walk::default();
    w.walk(a_text, a, b, &mut Vec::new());
    let mut text = a_text.to_string();
    w.splices
        .sort_by(|x, y| y.at.cmp(&x.at).then(y.end.cmp(&x.end)));
    for s in &w.splices {
        text.replace_range(s.at..s.end, &s.text);
    }
    (w.deltas, text)
}

#[derive(Default)]
struct Walk {
    deltas: Vec<Delta>,
    splices: Vec<Splice>,
}

fn member_text(k: &str, v: &str) -> String {
    format!("{}: {v}", serde_json::to_string(k).unwrap_or_default())
}

/// Where the member or item after `prev_end` starts: past whitespace, a comma, whitespace.
fn next_start(text: &str, prev_end: usize) -> usize {
    let b = text.as_bytes();
    let mut i = prev_end;
    while i < b.len() && (b[i].is_ascii_whitespace() || b[i] == b',') {
        i += 1;
    }
    i
}

impl Walk {
    fn walk(&mut self, text: &str, a: &Node<'_>, b: &Node<'_>, path: &mut Vec<Seg>) {
        match (&a.kind, &b.kind) {
            (Kind::Object(am), Kind::Object(bm)) => self.object(text, a, am, bm, path),
            (Kind::Array(ai), Kind::Array(bi)) => self.array(text, a, ai, bi, path),
            (Kind::Scalar, Kind::Scalar) if same_scalar(a.text, b.text) => {}
            _ => self.change(a, b, path),
        }
    }

    fn change(&mut self, a: &Node<'_>, b: &Node<'_>, path: &[Seg]) {
        self.deltas.push(Delta {
            path: path.to_vec(),
            op: Op::Changed,
            a: Some(a.text.to_string()),
            b: Some(b.text.to_string()),
        });
        self.splices.push(Splice {
            at: a.start,
            end: a.end(),
            text: b.text.to_string(),
        });
    }

    fn delta(&mut self, path: &[Seg], seg: Seg, op: Op, a: Option<&str>, b: Option<&str>) {
        let mut p = path.to_vec();
        p.push(seg);
        self.deltas.push(Delta {
            path: p,
            op,
            a: a.map(str::to_string),
            b: b.map(str::to_string),
        });
    }

    /// Removes the members or items of `ends` (value ends, in order) marked in `gone`,
    /// adds `added` after the last one: never two splices over one byte.
    fn rewrite(
        &mut self,
        text: &str,
        a: &Node<'_>,
        ends: &[usize],
        gone: &[bool],
        added: Vec<String>,
    ) {
        let Some(first_kept) = gone.iter().position(|g| !g) else {
            if gone.is_empty() && added.is_empty() {
                return;
            }
            // Nothing kept: the inside is the added members alone.
            self.splices.push(Splice {
                at: a.start + 1,
                end: a.end() - 1,
                text: added.join(", "),
            });
            return;
        };
        let start_of = |i: usize| match i {
            0 => next_start(text, a.start + 1),
            _ => next_start(text, ends[i - 1]),
        };
        for i in (0..gone.len()).filter(|i| gone[*i]) {
            let (at, end) = if i < first_kept {
                (start_of(i), start_of(i + 1))
            } else {
                (ends[i - 1], ends[i])
            };
            self.splices.push(Splice {
                at,
                end,
                text: String::new(),
            });
        }
        if !added.is_empty() {
            let last = *ends.last().unwrap_or(&(a.start + 1));
            self.splices.push(Splice {
                at: last,
                end: last,
                text: format!(", {}", added.join(", ")),
            });
        }
    }

    fn object(
        &mut self,
        text: &str,
        a: &Node<'_>,
        am: &[(String, Node<'_>)],
        bm: &[(String, Node<'_>)],
        path: &mut Vec<Seg>,
    ) {
        let mut gone = Vec::with_capacity(am.len());
        for (k, av) in am {
            match bm.iter().find(|(bk, _)| bk == k) {
                Some((_, bv)) => {
                    path.push(Seg::Key(k.clone()));
                    self.walk(text, av, bv, path);
                    path.pop();
                    gone.push(false);
                }
                None => {
                    self.delta(path, Seg::Key(k.clone()), Op::Removed, Some(av.text), None);
                    gone.push(true);
                }
            }
        }
        let mut added = Vec::new();
        for (k, bv) in bm.iter().filter(|(k, _)| !am.iter().any(|(ak, _)| ak == k)) {
            self.delta(path, Seg::Key(k.clone()), Op::Added, None, Some(bv.text));
            added.push(member_text(k, bv.text));
        }
        let ends: Vec<usize> = am.iter().map(|(_, v)| v.end()).collect();
        self.rewrite(text, a, &ends, &gone, added);
    }

    fn array(
        &mut self,
        text: &str,
        a: &Node<'_>,
        ai: &[Node<'_>],
        bi: &[Node<'_>],
        path: &mut Vec<Seg>,
    ) {
        for (i, (av, bv)) in ai.iter().zip(bi).enumerate() {
            path.push(Seg::Index(i));
            self.walk(text, av, bv, path);
            path.pop();
        }
        let gone: Vec<bool> = (0..ai.len()).map(|i| i >= bi.len()).collect();
        for (i, av) in ai.iter().enumerate().skip(bi.len()) {
            self.delta(path, Seg::Index(i), Op::Removed, Some(av.text), None);
        }
        let mut added = Vec::new();
        for (i, bv) in bi.iter().enumerate().skip(ai.len()) {
            self.delta(path, Seg::Index(i), Op::Added, None, Some(bv.text));
            added.push(bv.text.to_string());
        }
        let ends: Vec<usize> = ai.iter().map(Node::end).collect();
        self.rewrite(text, a, &ends, &gone, added);
    }
}

/// Why a path edit cannot be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathError {
    /// The text is not JSON (the parser's words).
    NotJson(String),
    /// The path goes through a value that is not an object (the path up to it).
    NotAnObject(String),
}

/// Sets the value at `path` (object keys from the top) to the JSON text `value`,
/// creating the objects on the way; the rest of `text` is kept.
pub fn set(text: &str, path: &[String], value: &str) -> Result<String, PathError> {
    let root = parse(text).map_err(PathError::NotJson)?;
    let mut node = &root;
    for (depth, key) in path.iter().enumerate() {
        if !matches!(node.kind, Kind::Object(_)) {
            return Err(PathError::NotAnObject(path[..depth].join(".")));
        }
        match node.member(key) {
            Some((_, next)) => node = next,
            None => {
                // The rest of the path as nested objects, added to this one.
                let mut inner = value.to_string();
                for k in path[depth + 1..].iter().rev() {
                    inner = format!("{{{}}}", member_text(k, &inner));
                }
                let Kind::Object(members) = &node.kind else {
                    unreachable!()
                };
                let member = member_text(key, &inner);
                let mut out = text.to_string();
                match members.last() {
                    Some((_, last)) => out.insert_str(last.end(), &format!(", {member}")),
                    None => out.replace_range(node.start + 1..node.end() - 1, &member),
                }
                return Ok(out);
            }
        }
    }
    let mut out = text.to_string();
    out.replace_range(node.start..node.end(), value);
    Ok(out)
}

/// Deletes the member at `path` (object keys from the top); the rest of `text` is kept.
/// `None`: there is nothing at `path`.
pub fn delete(text: &str, path: &[String]) -> Result<Option<String>, PathError> {
    let root = parse(text).map_err(PathError::NotJson)?;
    let Some((last, parents)) = path.split_last() else {
        return Ok(None);
    };
    let mut node = &root;
    for (depth, key) in parents.iter().enumerate() {
        match (&node.kind, node.member(key)) {
            (Kind::Object(_), Some((_, next))) => node = next,
            (Kind::Object(_), None) => return Ok(None),
            _ => return Err(PathError::NotAnObject(path[..depth].join("."))),
        }
    }
    let Kind::Object(members) = &node.kind else {
        return Err(PathError::NotAnObject(parents.join(".")));
    };
    let Some((i, _)) = node.member(last) else {
        return Ok(None);
    };
    let mut w = Walk::default();
    let ends: Vec<usize> = members.iter().map(|(_, v)| v.end()).collect();
    let gone: Vec<bool> = (0..members.len()).map(|j| j == i).collect();
    w.rewrite(text, node, &ends, &gone, Vec::new());
    let mut out = text.to_string();
    for s in &w.splices {
        out.replace_range(s.at..s.end, &s.text);
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edit(a: &str, b: &str) -> String {
        patch(a, &parse(a).unwrap(), &parse(b).unwrap()).1
    }

    #[test]
    fn untouched_text_is_kept() {
        let a = r#"{ "z": 12345678901234567890, "amount": "1,50", "p": 1.10, "big": 1e400, "u": "\u00e9" }"#;
        let b = r#"{"amount":"1.50","big":1e400,"p":1.1,"u":"é","z":12345678901234567890}"#;
        assert_eq!(
            edit(a, b),
            r#"{ "z": 12345678901234567890, "amount": "1.50", "p": 1.10, "big": 1e400, "u": "\u00e9" }"#
        );
    }

    #[test]
    fn members_removed_and_added() {
        assert_eq!(edit(r#"{"a":1, "b":2, "c":3}"#, r#"{"c":3}"#), r#"{"c":3}"#);
        assert_eq!(edit(r#"{"a":1, "b":2, "c":3}"#, r#"{"a":1}"#), r#"{"a":1}"#);
        assert_eq!(edit(r#"{"a":1}"#, r#"{"b":2}"#), r#"{"b": 2}"#);
        assert_eq!(
            edit(r#"{"a":1, "b":2}"#, r#"{"a":1,"c":[3]}"#),
            r#"{"a":1, "c": [3]}"#
        );
        assert_eq!(edit("[1, 2, 3]", "[1]"), "[1]");
        assert_eq!(edit("[]", "[1,2]"), "[1, 2]");
    }

    #[test]
    fn set_and_delete_by_path() {
        let t = r#"{"a": {"b": 1.10}, "n": 12345678901234567890}"#;
        let p = |s: &str| s.split('.').map(String::from).collect::<Vec<_>>();
        assert_eq!(
            set(t, &p("a.b"), "2").unwrap(),
            r#"{"a": {"b": 2}, "n": 12345678901234567890}"#
        );
        assert_eq!(
            set(t, &p("x.y"), "\"v\"").unwrap(),
            r#"{"a": {"b": 1.10}, "n": 12345678901234567890, "x": {"y": "v"}}"#
        );
        assert_eq!(
            set(t, &p("n.m"), "1"),
            Err(PathError::NotAnObject("n".into()))
        );
        assert_eq!(
            delete(t, &p("a")).unwrap().unwrap(),
            r#"{"n": 12345678901234567890}"#
        );
        assert_eq!(delete(t, &p("zz")).unwrap(), None);
    }
}
