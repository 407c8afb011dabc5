//! Durations (`30m`, `2h`, `7d`) and points in time (RFC 3339, or a duration back from now).

use crate::error::{DlqError, Result};
use chrono::{DateTime, Utc};
use std::time::Duration;

const FORMS: &str =
    "a duration such as 30s, 30m, 2h or 7d, or an RFC 3339 time such as 2026-11-29T08:00:00Z";

/// A positive duration such as `30s`, `5m`, `2h`, `7d`, `1h30m`.
pub fn parse_duration(s: &str) -> Result<Duration> {
    let t = s.trim();
    let d = humantime::parse_duration(t).map_err(|_| {
        DlqError::usage(format!(
            "invalid duration {s:?}: expected a number and a unit, such as 500ms, 30s, 5m, 2h or 7d"
        ))
    })?;
    if d.is_zero() {
        return Err(DlqError::usage(format!(
            "invalid duration {s:?}: it must be greater than zero"
        )));
    }
    Ok(d)
}

/// The longest lease: a claim holds a row from every other operator, so a typo such as
/// `--lease 100000y` must not lock it for ever.
pub const MAX_LEASE: Duration = Duration::from_secs(24 * 3600);

/// A lease: a positive duration of at most [`MAX_LEASE`].
pub fn parse_lease(s: &str) -> Result<Duration> {
    let d = parse_duration(s)?;
    if d > MAX_LEASE {
        return Err(DlqError::usage(format!(
            "invalid lease {s:?}: a lease is at most 24h (release and claim again to hold it longer)"
        )));
    }
    Ok(d)
}

/// `--since` / `--until`: an RFC 3339 time, or a duration counted back from `now`.
pub fn parse_time(s: &str, now: DateTime<Utc>) -> Result<DateTime<Utc>> {
    let t = s.trim();
    if let Ok(dt) = DateTime::parse_from_rfc3339(t) {
        return Ok(dt.with_timezone(&Utc));
    }
    match humantime::parse_duration(t) {
        Ok(d) => chrono::Duration::from_std(d)
            .ok()
            .and_then(|d| now.checked_sub_signed(d))
            .ok_or_else(|| DlqError::usage(format!("time {s:?} is too far back"))),
        Err(_) => Err(DlqError::usage(format!(
            "invalid time {s:?}: expected {FORMS}"
        ))),
    }
}

/// clap value parser for durations.
pub fn duration_arg(s: &str) -> std::result::Result<Duration, String> {
    parse_duration(s).map_err(|e| e.to_string())
}

/// clap value parser for leases.
pub fn lease_arg(s: &str) -> std::result::Result<Duration, String> {
    parse_lease(s).map_err(|e| e.to_string())
}

/// clap value parser for times (validated now, resolved against the clock later).
pub fn time_arg(s: &str) -> std::result::Result<String, String> {
    parse_time(s, Utc::now())
        .map(|_| s.to_string())
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30m").unwrap(), Duration::from_secs(1800));
        assert_eq!(
            parse_duration("7d").unwrap(),
            Duration::from_secs(7 * 86400)
        );
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("-5m").is_err());
        assert_eq!(parse_lease("24h").unwrap(), MAX_LEASE);
        assert!(parse_lease("100000y").is_err());
        assert!(parse_lease("300000y").is_err());
        assert!(parse_lease("24h1s").is_err());
    }

    #[test]
    fn times() {
        let now = Utc::now();
        assert_eq!(
            parse_time("2h", now).unwrap(),
            now - chrono::Duration::hours(2)
        );
        assert_eq!(
            parse_time("2026-01-02T03:04:05Z", now)
                .unwrap()
                .to_rfc3339(),
            "2026-01-02T03:04:05+00:00"
        );
        let e = parse_time("yesterday", now).unwrap_err().to_string();
        assert!(e.contains("RFC 3339") && e.contains("30m"), "{e}");
    }
}
