//! How an ID a worker stored as bytes (a SQLite BLOB) is shown and typed back: UTF-8 as
//! it is, any other byte as `\xNN`. The model owns the form (a refusal names the bytes);
//! the SQLite reads use it to find such a row.

/// The bytes a BLOB id shown as `id` holds: what [`escaped`] shows as `id`.
pub(crate) fn id_bytes(id: &str) -> Vec<u8> {
    unescape(id).unwrap_or_else(|| id.as_bytes().to_vec())
}

/// Bytes as text: UTF-8 as it is, any other byte as `\xNN` (so `show` can find an ID
/// that holds one: see [`unescape`]).
pub(crate) fn escaped(bytes: &[u8]) -> String {
    // Nearly always UTF-8: checked a word at a time, where the chunks go byte by byte.
    if let Ok(text) = std::str::from_utf8(bytes) {
        return text.to_string();
    }
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        out.push_str(chunk.valid());
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// The bytes of an ID typed as [`escaped`] shows it; None unless it escapes a byte and
/// [`escaped`] shows those bytes as exactly this ID (`ord\x31` is not `ord1`: `1` is
/// never escaped), so a read by ID never decodes to another row's.
pub(crate) fn unescape(id: &str) -> Option<Vec<u8>> {
    if !id.contains("\\x") {
        return None;
    }
    let mut out = Vec::new();
    let mut rest = id.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        let byte = (b == b'\\' && tail.first() == Some(&b'x'))
            .then(|| tail.get(1..3))
            .flatten()
            .and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok());
        match byte {
            Some(v) => {
                out.push(v);
                rest = &tail[3..];
            }
            None => {
                out.push(b);
                rest = tail;
            }
        }
    }
    (escaped(&out) == id).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaped_bytes_come_back() {
        let bytes = b"id-\xff\xfe-caf\xc3\xa9";
        let shown = escaped(bytes);
        assert_eq!(shown, "id-\\xff\\xfe-caf\u{e9}");
        assert_eq!(unescape(&shown).as_deref(), Some(&bytes[..]));
        assert_eq!(unescape("plain"), None);
        // `\x31` spells `1`, which `escaped` never escapes: not another row's bytes.
        assert_eq!(unescape("ord\\x31"), None);
        assert_eq!(id_bytes("ord\\x31"), b"ord\\x31");
    }
}
