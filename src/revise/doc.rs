//! A JSON text as a tree of the spans it was written in.
//!
//! An edit must leave every byte it does not touch as it was: key order, whitespace,
//! string escapes, numbers as written (`12345678901234567890`, `1.10`, `1e400`). So no
//! edit goes through a parsed value that is printed again: serde_json (with `raw_value`)
//! gives each member's raw text, whose place in the whole text is known, and an edit is
//! a splice of those places ([`super::patch`]).

use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;
use std::fmt;

/// One value of a JSON text: where it is (`start..start + text.len()`) and what it holds.
#[derive(Debug)]
pub struct Node<'a> {
    pub start: usize,
    pub text: &'a str,
    pub kind: Kind<'a>,
}

#[derive(Debug)]
pub enum Kind<'a> {
    Object(Vec<(String, Node<'a>)>),
    Array(Vec<Node<'a>>),
    Scalar,
}

impl Node<'_> {
    pub fn end(&self) -> usize {
        self.start + self.text.len()
    }

    /// The member `key` of an object (the first, as the stores' filters read it).
    pub fn member(&self, key: &str) -> Option<(usize, &Node<'_>)> {
        match &self.kind {
            Kind::Object(m) => m
                .iter()
                .enumerate()
                .find(|(_, (k, _))| k == key)
                .map(|(i, (_, n))| (i, n)),
            _ => None,
        }
    }
}

/// Parses `text` (one JSON value, whitespace around it allowed) into its spans. A key
/// written twice in one object is refused: which of the two an edit means is unknown.
pub fn parse(text: &str) -> Result<Node<'_>, String> {
    let raw: &RawValue = serde_json::from_str(text).map_err(|e| e.to_string())?;
    node(text, raw)
}

fn node<'a>(base: &'a str, raw: &'a RawValue) -> Result<Node<'a>, String> {
    let text = raw.get();
    let start = text.as_ptr() as usize - base.as_ptr() as usize;
    let kind = match text.as_bytes().first() {
        Some(b'{') => {
            let members = serde_json::Deserializer::from_str(text)
                .deserialize_map(MembersVisitor)
                .map_err(|e| e.to_string())?;
            let mut out: Vec<(String, Node<'a>)> = Vec::with_capacity(members.len());
            for (k, v) in members {
                if out.iter().any(|(seen, _)| *seen == k) {
                    return Err(format!("the key {k:?} is written twice in one object"));
                }
                out.push((k, node(base, v)?));
            }
            Kind::Object(out)
        }
        Some(b'[') => {
            let items: Vec<&'a RawValue> = serde_json::from_str(text).map_err(|e| e.to_string())?;
            Kind::Array(
                items
                    .into_iter()
                    .map(|v| node(base, v))
                    .collect::<Result<_, _>>()?,
            )
        }
        _ => Kind::Scalar,
    };
    Ok(Node { start, text, kind })
}

/// An object's members in the order written, each value as raw text.
struct MembersVisitor;

impl<'de> Visitor<'de> for MembersVisitor {
    type Value = Vec<(String, &'de RawValue)>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Self::Value, M::Error> {
        let mut out = Vec::new();
        while let Some(k) = map.next_key::<String>()? {
            out.push((k, map.next_value::<&'de RawValue>()?));
        }
        Ok(out)
    }
}

/// Whether two scalars are the same value: strings by their value (an escape or its
/// character alike), numbers by their exact decimal value (`1.10` is `1.1`, never
/// `1.1000000000000001`), `true`, `false`, `null` as themselves.
pub fn same_scalar(a: &str, b: &str) -> bool {
    if a == b {
        return true;
    }
    use serde_json::Value;
    match (
        serde_json::from_str::<Value>(a),
        serde_json::from_str::<Value>(b),
    ) {
        (Ok(Value::String(x)), Ok(Value::String(y))) => x == y,
        (Ok(Value::Number(x)), Ok(Value::Number(y))) => {
            match (decimal(&x.to_string()), decimal(&y.to_string())) {
                (Some(x), Some(y)) => x == y,
                _ => false,
            }
        }
        (Ok(x), Ok(y)) => x == y && !x.is_number(),
        _ => false,
    }
}

/// A JSON number as (negative, significant digits, exponent of the last digit): one
/// form for every way of writing one value. None for an exponent too large to hold.
fn decimal(text: &str) -> Option<(bool, String, i128)> {
    let (neg, rest) = match text.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, text),
    };
    let (mantissa, exp) = match rest.find(['e', 'E']) {
        Some(i) => (&rest[..i], rest[i + 1..].parse::<i128>().ok()?),
        None => (rest, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{int}{frac}");
    let digits = digits.trim_start_matches('0');
    let trimmed = digits.trim_end_matches('0');
    if trimmed.is_empty() {
        return Some((false, String::new(), 0));
    }
    let exp = exp - frac.len() as i128 + (digits.len() - trimmed.len()) as i128;
    Some((neg, trimmed.to_string(), exp))
}

/// The tree pretty-printed (two spaces), keys in their order and every scalar as
/// written: what the editor shows.
pub fn pretty(n: &Node<'_>) -> String {
    let mut out = String::new();
    write_pretty(n, 0, &mut out);
    out.push('\n');
    out
}

fn write_pretty(n: &Node<'_>, depth: usize, out: &mut String) {
    let pad = |d: usize| "  ".repeat(d);
    match &n.kind {
        Kind::Scalar => out.push_str(n.text),
        Kind::Object(m) if m.is_empty() => out.push_str("{}"),
        Kind::Array(a) if a.is_empty() => out.push_str("[]"),
        Kind::Object(m) => {
            out.push_str("{\n");
            for (i, (k, v)) in m.iter().enumerate() {
                out.push_str(&pad(depth + 1));
                out.push_str(&serde_json::to_string(k).unwrap_or_default());
                out.push_str(": ");
                write_pretty(v, depth + 1, out);
                out.push_str(if i + 1 < m.len() { ",\n" } else { "\n" });
            }
            out.push_str(&pad(depth));
            out.push('}');
        }
        Kind::Array(a) => {
            out.push_str("[\n");
            for (i, v) in a.iter().enumerate() {
                out.push_str(&pad(depth + 1));
                write_pretty(v, depth + 1, out);
                out.push_str(if i + 1 < a.len() { ",\n" } else { "\n" });
            }
            out.push_str(&pad(depth));
            out.push(']');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_compare_by_exact_value() {
        assert!(same_scalar("1.10", "1.1"));
        assert!(same_scalar("1e400", "10E399"));
        assert!(!same_scalar("12345678901234567890", "12345678901234567891"));
        assert!(same_scalar("\"\\u00e9\"", "\"é\""));
        assert!(!same_scalar("1", "\"1\""));
    }

    #[test]
    fn spans_point_into_the_text() {
        let t = r#" {"a": [1, {"b": 1.10}], "c": "x"} "#;
        let n = parse(t).unwrap();
        let (_, a) = n.member("a").unwrap();
        assert_eq!(&t[a.start..a.end()], r#"[1, {"b": 1.10}]"#);
        assert!(parse(r#"{"a":1,"a":2}"#).is_err());
    }
}
