//! The content filters' conditions (`--header KEY=VALUE`, `--field PATH=VALUE`), parsed
//! once and checked for what SQLite's JSON paths cannot hold.

use crate::error::{DlqError, Result};
use crate::spell::{Flag, Words};
use serde::{Deserialize, Serialize};

/// A `--header KEY=VALUE` or `--field PATH=VALUE` condition. The value at the key (or
/// dotted path of object keys) matches when, as text, it equals `value`: a JSON string as
/// its value, a number, `true`, `false` or `null` as its JSON text as written; an array
/// or object when `value` is the same JSON (whitespace aside). Bound as parameters, never
/// a pattern: `%`, `_`, `*` and quotes are plain characters.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ContentMatch {
    pub key: String,
    pub value: String,
}

/// What a [`ContentMatch`] looks in: a header (one key) or the body (a dotted path).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchOn {
    Header,
    Field,
}

impl ContentMatch {
    /// Parses `KEY=VALUE` (split at the first `=`); a field's key is a path of object
    /// keys (`customer.id`).
    pub fn parse(on: MatchOn, s: &str) -> Result<ContentMatch> {
        let (flag, what, empty) = match on {
            MatchOn::Header => (Flag::Header, "KEY=VALUE", "KEY"),
            MatchOn::Field => (Flag::Field, "PATH=VALUE", "key"),
        };
        let refuse = |why: String| DlqError::usage(Words::default().flag(flag).text(why));
        let Some((key, value)) = s.split_once('=') else {
            return Err(refuse(format!(" {s:?}: expected {what}")));
        };
        let m = ContentMatch {
            key: key.to_string(),
            value: value.to_string(),
        };
        let segments: Vec<&str> = match on {
            MatchOn::Field => m.path(),
            MatchOn::Header => vec![key],
        };
        for seg in segments {
            if seg.is_empty() {
                return Err(refuse(format!(" {s:?}: an empty {empty} in {what}")));
            }
            // SQLite's JSON paths quote keys with `"` and cannot escape one.
            if seg.contains('"') || seg.chars().any(char::is_control) {
                return Err(refuse(format!(
                    " {s:?}: a key cannot hold a double quote or a control character"
                )));
            }
        }
        if m.value.contains('\0') {
            return Err(refuse(": the value holds a NUL".into()));
        }
        Ok(m)
    }

    /// The object keys from the top of the document (a header name is one key).
    pub fn path(&self) -> Vec<&str> {
        self.key.split('.').collect()
    }

    /// The value as JSON when it is an array or object, for a comparison as JSON.
    pub fn value_json(&self) -> Option<&str> {
        match serde_json::from_str::<serde_json::Value>(&self.value) {
            Ok(serde_json::Value::Array(_) | serde_json::Value::Object(_)) => {
                Some(self.value.as_str())
            }
            _ => None,
        }
    }

    /// Texts that a matching document holds, byte for byte, unless it spells them with a
    /// JSON escape (then it holds a backslash): the last key in quotes, and a scalar
    /// value as typed. A cheap test that rules out most rows before any JSON is parsed,
    /// and never a matching one.
    pub fn needles(&self, on: MatchOn) -> Vec<String> {
        let key = match on {
            MatchOn::Field => self.path().last().copied().unwrap_or_default(),
            MatchOn::Header => self.key.as_str(),
        };
        let mut out = vec![format!("\"{key}\"")];
        if self.value_json().is_none() && !self.value.is_empty() {
            out.push(self.value.clone());
        }
        out
    }
}
