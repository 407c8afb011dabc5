//! Keeping credentials out of every byte `dlq` prints.
//!
//! Two layers: URLs are held in [`SecretUrl`], whose `Display` and `Debug` mask the
//! password; and every password seen is registered here so that [`scrub`] can remove it
//! from any text (driver errors, parse errors that echo the whole URL) at the one place
//! errors and logs are written.

use std::fmt;
use std::sync::{Mutex, OnceLock};

fn registry() -> &'static Mutex<Vec<String>> {
    static SECRETS: OnceLock<Mutex<Vec<String>>> = OnceLock::new();
    SECRETS.get_or_init(|| Mutex::new(Vec::new()))
}

/// Remember a secret so that [`scrub`] removes it, in raw and percent-decoded form.
pub fn register(secret: &str) {
    if secret.is_empty() {
        return;
    }
    let mut list = registry().lock().unwrap_or_else(|e| e.into_inner());
    let decoded = url::form_urlencoded::parse(format!("x={secret}").as_bytes())
        .next()
        .map(|(_, v)| v.into_owned());
    let pct = percent_decode(secret);
    for s in [Some(secret.to_string()), decoded, Some(pct)]
        .into_iter()
        .flatten()
    {
        if !s.is_empty() && !list.contains(&s) {
            list.push(s);
        }
    }
    // Longest first so that a secret containing another is masked whole.
    list.sort_by_key(|s| std::cmp::Reverse(s.len()));
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
            if let Ok(b) = u8::from_str_radix(hex, 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Remove every registered secret, and any `user:password@` userinfo, from `text`.
pub fn scrub(text: &str) -> String {
    let mut out = text.to_string();
    for s in registry().lock().unwrap_or_else(|e| e.into_inner()).iter() {
        if out.contains(s.as_str()) {
            out = out.replace(s.as_str(), "***");
        }
    }
    mask_userinfo(&out)
}

/// Masks the password part of anything that looks like `scheme://user:password@`.
fn mask_userinfo(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(pos) = rest.find("://") {
        let (head, tail) = rest.split_at(pos + 3);
        out.push_str(head);
        let end = tail
            .find(|c: char| c == '/' || c.is_whitespace() || c == '"' || c == '\'')
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        match (authority.rfind('@'), authority.find(':')) {
            (Some(at), Some(colon)) if colon < at => {
                out.push_str(&authority[..colon]);
                out.push_str(":***");
                out.push_str(&authority[at..]);
            }
            _ => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// A connection URL whose password never reaches `Display` or `Debug`.
#[derive(Clone)]
pub struct SecretUrl {
    raw: String,
}

impl SecretUrl {
    pub fn new(raw: impl Into<String>) -> Self {
        let raw = raw.into();
        if let Ok(u) = url::Url::parse(&raw) {
            if let Some(p) = u.password() {
                register(p);
            }
        } else if let Some(p) = crude_password(&raw) {
            register(&p);
        }
        SecretUrl { raw }
    }

    /// The URL with its password, for handing to a driver. Never print it.
    pub fn expose(&self) -> &str {
        &self.raw
    }

    pub fn has_password(&self) -> bool {
        match url::Url::parse(&self.raw) {
            Ok(u) => u.password().is_some(),
            Err(_) => crude_password(&self.raw).is_some(),
        }
    }

    pub fn scheme(&self) -> &str {
        self.raw.split("://").next().unwrap_or("")
    }
}

/// The password of a URL the `url` crate cannot parse (e.g. a bad port), if any.
fn crude_password(raw: &str) -> Option<String> {
    let after = raw.split_once("://")?.1;
    let authority = &after[..after.find('/').unwrap_or(after.len())];
    let at = authority.rfind('@')?;
    let userinfo = &authority[..at];
    userinfo.split_once(':').map(|(_, p)| p.to_string())
}

impl fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&mask_userinfo(&self.raw))
    }
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretUrl({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_and_debug_mask_the_password() {
        let u = SecretUrl::new("postgres://bob:s3cr%40t@db.example:5432/x");
        assert_eq!(u.to_string(), "postgres://bob:***@db.example:5432/x");
        assert!(!format!("{u:?}").contains("s3cr"));
    }

    #[test]
    fn scrub_removes_registered_secrets_in_any_form() {
        let _ = SecretUrl::new("amqp://u:pa%2Fss@h:notaport/%2f");
        let s = scrub("invalid uri amqp://u:pa%2Fss@h:notaport/ and pa/ss");
        assert!(!s.contains("pa%2Fss") && !s.contains("pa/ss"), "{s}");
    }
}
