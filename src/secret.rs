//! Keeping credentials out of every byte `dlq` prints.
//!
//! Two layers: URLs are held in [`SecretUrl`], whose `Display` and `Debug` mask the
//! password (and never echo a URL that does not parse); and every password seen is
//! registered here so that [`scrub`] can remove it from any text (driver errors, parse
//! errors that echo the whole URL) at the one place errors and logs are written.

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
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
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
///
/// One redaction rule for every URL `dlq` shows:
/// - a URL that parses is shown with its password, any query parameter whose name holds
///   `pass` (`password=`, `sslpassword=`) and any fragment replaced by `***`;
/// - a URL that does not parse is never echoed: [`SecretUrl::problem`] says which part is
///   wrong, and `Display` shows at most its scheme and host.
#[derive(Clone)]
pub struct SecretUrl {
    raw: String,
    shown: String,
    problem: Option<String>,
}

impl SecretUrl {
    pub fn new(raw: impl Into<String>) -> Self {
        let raw = raw.into();
        let parts = Parts::split(&raw);
        for secret in parts.secrets() {
            register(secret);
        }
        let problem = parts.problem();
        // Without `//` only SQLite's `sqlite:FILE` is a URL; anything else, and anything
        // with a stray `@` after its host (a password the cut cannot see whole), is shown
        // as at most its scheme and host.
        let shown = match (&problem, parts.scheme) {
            (None, Some(s))
                if (parts.slashes || s.eq_ignore_ascii_case("sqlite"))
                    && parts.stray_at_password().is_none() =>
            {
                parts.redacted()
            }
            _ => parts.scheme_and_host(),
        };
        SecretUrl {
            raw,
            shown,
            problem,
        }
    }

    /// The URL with its password, for handing to a driver. Never print it.
    pub fn expose(&self) -> &str {
        &self.raw
    }

    /// What is wrong with the URL's shape (without repeating any of it), for the schemes
    /// `dlq` dials: `amqp`, `amqps`, `postgres`, `postgresql`, and a URL with no scheme.
    pub fn problem(&self) -> Option<&str> {
        self.problem.as_deref()
    }

    /// Whether the URL carries a password: in its user part or a `password=` parameter.
    pub fn has_password(&self) -> bool {
        !Parts::split(&self.raw).secrets().is_empty()
    }

    /// The scheme (`postgres`, `amqps`, `sqlite`, ...), or "" when there is none.
    pub fn scheme(&self) -> &str {
        Parts::split(&self.raw).scheme.unwrap_or("")
    }
}

/// Schemes whose URLs `dlq` checks before a driver sees them.
const DIALLED: [&str; 4] = ["amqp", "amqps", "postgres", "postgresql"];

/// A URL cut at its delimiters by position only, before any decoding: enough to show it
/// without its secrets, or to say what is wrong with it without repeating it.
struct Parts<'a> {
    raw: &'a str,
    scheme: Option<&'a str>,
    /// `//` follows `scheme:`.
    slashes: bool,
    /// What follows `scheme:` and `//`.
    after: &'a str,
    /// Offset of `after` in `raw`.
    at: usize,
    /// Length of the authority (up to the first `/`, `?` or `#`) in `after`.
    authority_len: usize,
}

impl<'a> Parts<'a> {
    fn split(raw: &'a str) -> Parts<'a> {
        let scheme = raw.find(':').map(|i| &raw[..i]).filter(|s| {
            s.starts_with(|c: char| c.is_ascii_alphabetic())
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        });
        let rest = match scheme {
            Some(s) => &raw[s.len() + 1..],
            None => raw,
        };
        let slashes = scheme.is_some() && rest.starts_with("//");
        let after = if slashes { &rest[2..] } else { rest };
        let at = raw.len() - after.len();
        let authority_len = after.find(['/', '?', '#']).unwrap_or(after.len());
        Parts {
            raw,
            scheme,
            slashes,
            after,
            at,
            authority_len,
        }
    }

    fn authority(&self) -> &'a str {
        &self.after[..self.authority_len]
    }

    /// Everything after the authority: path, query, fragment.
    fn tail(&self) -> &'a str {
        &self.after[self.authority_len..]
    }

    /// The user part's password as a range of `raw`, when the authority has one.
    fn password(&self) -> Option<std::ops::Range<usize>> {
        let auth = self.authority();
        let userinfo = &auth[..auth.rfind('@')?];
        let colon = userinfo.find(':')?;
        let start = self.at + colon + 1;
        Some(start..self.at + userinfo.len())
    }

    fn host_port(&self) -> &'a str {
        let auth = self.authority();
        auth.rfind('@').map_or(auth, |i| &auth[i + 1..])
    }

    /// Host and port text, split at the port's `:` (an IPv6 host keeps its brackets).
    fn host_and_port(&self) -> (&'a str, Option<&'a str>) {
        let hp = self.host_port();
        let split = if hp.starts_with('[') {
            hp.find(']').and_then(|i| hp[i..].find(':').map(|j| i + j))
        } else {
            hp.find(':')
        };
        match split {
            Some(i) => (&hp[..i], Some(&hp[i + 1..])),
            None => (hp, None),
        }
    }

    /// The query (after `?`, up to `#`) as a range of `raw`.
    fn query(&self) -> Option<std::ops::Range<usize>> {
        let tail = self.tail();
        let q = tail.find('?')?;
        let end = tail[q..].find('#').map_or(tail.len(), |f| q + f);
        let base = self.at + self.authority_len;
        Some(base + q + 1..base + end)
    }

    /// The fragment (after `#`) as a range of `raw`.
    fn fragment(&self) -> Option<std::ops::Range<usize>> {
        let tail = self.tail();
        let f = tail.find('#')?;
        let base = self.at + self.authority_len;
        Some(base + f + 1..base + tail.len())
    }

    /// Ranges of `raw` holding the values of query parameters named like a password. The
    /// query is cut at `&`, and also at `;` and `?`, which only ever masks more.
    fn secret_params(&self) -> Vec<std::ops::Range<usize>> {
        let Some(q) = self.query() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut pos = q.start;
        for pair in self.raw[q.clone()].split(['&', ';', '?']) {
            if let Some(eq) = pair.find('=') {
                let key = percent_decode(&pair[..eq]).to_ascii_lowercase();
                if key.contains("pass") {
                    out.push(pos + eq + 1..pos + pair.len());
                }
            }
            pos += pair.len() + 1;
        }
        out
    }

    /// Where an `@` after the host suggests a password holding a raw `/`, `?` or `#`
    /// (which end the authority early): the text that was probably that password.
    fn stray_at_password(&self) -> Option<&'a str> {
        let tail = self.tail();
        let at = tail.rfind('@')?;
        let guess = &self.after[..self.authority_len + at];
        guess.find(':').map(|c| &guess[c + 1..])
    }

    /// Whether an `@` sits in the path, the fragment or a query parameter's name.
    fn at_after_host(&self) -> bool {
        let tail = self.tail();
        let path_end = tail.find(['?', '#']).unwrap_or(tail.len());
        if tail[..path_end].contains('@') {
            return true;
        }
        if let Some(f) = self.fragment() {
            if self.raw[f].contains('@') {
                return true;
            }
        }
        match self.query() {
            Some(q) => self.raw[q]
                .split('&')
                .any(|pair| pair.split('=').next().unwrap_or("").contains('@')),
            None => false,
        }
    }

    /// Every text that may be a password, for [`register`].
    fn secrets(&self) -> Vec<&'a str> {
        let mut out: Vec<&str> = Vec::new();
        if let Some(p) = self.password() {
            out.push(&self.raw[p]);
        }
        for r in self.secret_params() {
            out.push(&self.raw[r]);
        }
        if let Some(p) = self.stray_at_password() {
            out.push(p);
        }
        out.retain(|s| !s.is_empty());
        out
    }

    /// What is wrong with the URL, naming the part and never repeating it.
    fn problem(&self) -> Option<String> {
        let Some(scheme) = self.scheme else {
            return Some(
                "it does not start with a scheme (postgres://, sqlite://, amqp://, ...)".into(),
            );
        };
        if !DIALLED.contains(&scheme.to_ascii_lowercase().as_str()) {
            return None;
        }
        if !self.slashes {
            return Some(format!("no `//` after the scheme (write {scheme}://...)"));
        }
        if self.at_after_host() {
            return Some(
                "there is an `@` after the host: a password holding `/`, `?` or `#` must be \
                 percent-encoded (%2F, %3F, %23)"
                    .into(),
            );
        }
        let (host, port) = self.host_and_port();
        if host.starts_with('[') && !host.ends_with(']') {
            return Some("the IPv6 host has no closing `]`".into());
        }
        if let Some(port) = port {
            if !port.is_empty() {
                if !port.bytes().all(|b| b.is_ascii_digit()) {
                    return Some(
                        "the port is not a number (a password holding `/`, `?` or `#` must be \
                         percent-encoded: %2F, %3F, %23)"
                            .into(),
                    );
                }
                if port.parse::<u16>().is_err() {
                    return Some("the port is not between 0 and 65535".into());
                }
            }
        }
        // What the position-only cut does not see (a bad character in the host, a bad
        // IPv6 address): the url crate's messages name the part, never the text.
        url::Url::parse(self.raw).err().map(|e| e.to_string())
    }

    /// The URL as typed, secrets replaced by `***`.
    fn redacted(&self) -> String {
        let mut ranges: Vec<std::ops::Range<usize>> = self.secret_params();
        ranges.extend(self.password());
        ranges.extend(self.fragment().filter(|f| !f.is_empty()));
        ranges.retain(|r| !r.is_empty());
        ranges.sort_by_key(|r| r.start);
        let mut out = String::with_capacity(self.raw.len());
        let mut pos = 0;
        for r in ranges {
            if r.start < pos {
                continue;
            }
            out.push_str(&self.raw[pos..r.start]);
            out.push_str("***");
            pos = r.end;
        }
        out.push_str(&self.raw[pos..]);
        out
    }

    /// At most the scheme and the host, for a URL that does not parse.
    fn scheme_and_host(&self) -> String {
        let Some(scheme) = self.scheme else {
            return "(not shown)".into();
        };
        let (host, _) = self.host_and_port();
        let host_is_known = !self.at_after_host()
            && !host.is_empty()
            && host.chars().all(|c| {
                c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':' | '[' | ']')
            });
        if host_is_known {
            format!("{scheme}://{host}/…")
        } else {
            format!("{scheme}:…")
        }
    }
}

impl fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
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

    #[track_caller]
    fn refused(raw: &str, secret: &str, why: &str, shown: &str) {
        let u = SecretUrl::new(raw);
        let problem = u.problem().unwrap_or_else(|| panic!("{raw} was accepted"));
        assert!(problem.contains(why), "{raw}: {problem}");
        assert!(!problem.contains(secret), "{problem}");
        assert_eq!(u.to_string(), shown);
        assert!(u.has_password(), "{raw}");
        let s = scrub(&format!("driver says: {raw}"));
        assert!(!s.contains(secret), "{s}");
    }

    #[test]
    fn a_url_that_does_not_parse_is_never_echoed() {
        refused(
            "amqp:guest:Sekr1tA@127.0.0.1",
            "Sekr1tA",
            "no `//` after the scheme",
            "amqp://127.0.0.1/…",
        );
        refused(
            "amqp://guest:Sekr1tB/WORD@127.0.0.1:5672/%2f",
            "Sekr1tB",
            "`@` after the host",
            "amqp:…",
        );
        refused(
            "postgres://root:Sekr1tC/WORD@127.0.0.1:5432/test",
            "Sekr1tC",
            "percent-encoded",
            "postgres:…",
        );
        refused(
            "postgres://root:12#Sekr1tD@127.0.0.1/x",
            "Sekr1tD",
            "`@` after the host",
            "postgres:…",
        );
        refused(
            "postgres://root:Sekr1tE@127.0.0.1:54x32/x",
            "Sekr1tE",
            "port is not a number",
            "postgres://127.0.0.1/…",
        );
        let u = SecretUrl::new("guest:Sekr1tF@127.0.0.1");
        assert!(!u.to_string().contains("Sekr1tF"), "{u}");
    }

    #[test]
    fn a_parsed_url_is_shown_without_any_password() {
        let u =
            SecretUrl::new("postgres://root@127.0.0.1:5432/db?password=Sekr1tG&sslmode=require");
        assert_eq!(u.problem(), None);
        assert_eq!(
            u.to_string(),
            "postgres://root@127.0.0.1:5432/db?password=***&sslmode=require"
        );
        assert!(u.has_password());
        assert!(!scrub("password=Sekr1tG").contains("Sekr1tG"));
        let u = SecretUrl::new("amqp://guest:p@ss w%rd@[::1]:5672/%2f");
        assert_eq!(u.problem(), None);
        assert_eq!(u.to_string(), "amqp://guest:***@[::1]:5672/%2f");
        assert_eq!(u.scheme(), "amqp");
        let u = SecretUrl::new("sqlite://dlq.db");
        assert_eq!(
            (u.problem(), u.to_string().as_str()),
            (None, "sqlite://dlq.db")
        );
        assert!(!u.has_password());
        let u = SecretUrl::new("sqlite:dlq.db?mode=rwc");
        assert_eq!((u.problem(), u.scheme()), (None, "sqlite"));
    }
}
