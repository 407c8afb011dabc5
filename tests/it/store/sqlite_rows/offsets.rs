//! Times a worker wrote with a four-digit UTC offset (`+0000`, as Python's
//! `strftime('%z')` writes it): read as the same offset with a colon, in lists, ranges,
//! aggregates and the leases of the protocol.

use super::*;
use chrono::{DateTime, Duration, FixedOffset, SecondsFormat, Utc};

/// `t` as text in the offset `east_s` seconds east of UTC, ending `±HHMM`.
fn hhmm(t: DateTime<Utc>, east_s: i32, fraction: bool) -> String {
    let f = if fraction { "%.6f" } else { "" };
    let fmt = format!("%Y-%m-%dT%H:%M:%S{f}%z");
    t.with_timezone(&FixedOffset::east_opt(east_s).unwrap())
        .format(&fmt)
        .to_string()
}

fn shown(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// A worker's row in the SQLite file, its `dead_lettered_at` as the SQL `at`.
fn worker_row(db: &TestDb, id: &str, at: &str) {
    db.sql(&[&format!(
        "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, dead_lettered_at) \
         VALUES ('{id}', X'7b7d', 'hhmm', 1, '{{}}', {at})"
    )]);
}

/// Once broke: a worker writing `+0000` had every row left out of `list --since 2h` and
/// `aggregate --since 2h`, and listed last as `(unreadable)`.
#[test]
fn rows_with_a_four_digit_offset_are_listed_counted_and_ranged_by_their_time() {
    let db = TestDb::migrated(Backend::Sqlite);
    let now = DateTime::from_timestamp(Utc::now().timestamp(), 0).unwrap();
    let ago = |m: i64| now - Duration::minutes(m);
    let east = ago(60) + Duration::microseconds(123_456);
    let text = |t, east_s, fraction| format!("'{}'", hhmm(t, east_s, fraction));
    let colon = format!("'{}'", ago(45).to_rfc3339());
    let micros = ago(75).timestamp_micros().to_string();
    let garbage = format!("'{}0'", hhmm(ago(10), 0, false));
    // (id, stored, what dlq shows), newest first.
    let rows = [
        ("utc", text(ago(30), 0, false), Some(ago(30))),
        ("colon", colon, Some(ago(45))),
        ("east", text(east, 3600, true), Some(east)),
        ("micros", micros, Some(ago(75))),
        ("west", text(ago(90), -19800, false), Some(ago(90))),
        ("old", text(ago(180), 0, false), Some(ago(180))),
        ("garbage", garbage, None),
    ];
    for (id, at, _) in &rows {
        worker_row(&db, id, at);
    }
    let r = db.dlq(&["list", "--limit", "100"]);
    assert_eq!(r.code, 0, "{}", r.all());
    let list = r.json();
    let order: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    let want: Vec<&str> = rows.iter().map(|r| r.0).collect();
    assert_eq!(order, want, "newest first, on the time each one means");
    let got = by_id(&list);
    for (id, at, t) in &rows {
        let row = &got[*id];
        assert_eq!(
            row["dead_lettered_at"].as_str(),
            t.map(shown).as_deref(),
            "{at}"
        );
        assert_eq!(row.get("unreadable").is_some(), t.is_none(), "{at}: {row}");
    }
    let table = db.dlq(&["list", "-o", "table", "--limit", "100"]).stdout;
    assert_eq!(table.matches("(unreadable)").count(), 1, "{table}");

    let recent = ["utc", "colon", "east", "micros", "west"];
    assert_eq!(db.ids(&["--since", "2h", "--limit", "100"]), recent);
    let range = &shown(ago(60));
    // The fraction of a `±HHMM` time counts: `east` is 0.123456 s after `range`.
    assert_eq!(db.ids(&["--until", range]), ["micros", "west", "old"]);
    assert_eq!(db.ids(&["--since", range]), ["utc", "colon", "east"]);
    let a = db.dlq(&["aggregate", "--by", "reason", "--since", "2h"]);
    assert_eq!(a.code, 0, "{}", a.all());
    assert_eq!(a.json()[0]["count"], 5, "{}", a.stdout);
    assert_eq!(a.json()[0]["last_seen"], shown(ago(30)), "{}", a.stdout);
}

/// A lease end written `±HHMM` is compared by its time: a live one holds its row against
/// `replay` and `claim` (read in the wrong offset it would look ended, and two tools
/// would publish the row), an ended one frees it.
// Once broke: a `+0000` lease end could not be read, so an ended lease held its row.
#[test]
fn a_four_digit_offset_lease_holds_its_row_until_it_ends() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("hhmm_lease");
    let db = TestDb::migrated(Backend::Sqlite);
    let now = Utc::now();
    let leases = [
        ("live-utc", hhmm(now + Duration::hours(1), 0, false)),
        (
            "live-west",
            hhmm(now + Duration::minutes(30), -5 * 3600, true),
        ),
        ("ended-east", hhmm(now - Duration::minutes(30), 3600, true)),
        ("ended-utc", hhmm(now - Duration::hours(1), 0, false)),
    ];
    for (id, end) in &leases {
        db.add(letter(id, &q, id.as_bytes()));
        db.sql(&[&format!(
            "UPDATE dead_letters SET replay_claim_owner = 'replayer:1', \
             replay_claim_expires_at = '{end}' WHERE id = '{id}'"
        )]);
    }
    for id in ["live-utc", "live-west"] {
        assert_eq!(db.show(id)["state"], "claimed", "{id}");
        let r = db.dlq(&["replay", id, "--yes"]);
        assert_eq!(r.code, 3, "{id}: {}", r.all());
        let r = db.dlq(&["claim", id]);
        assert_eq!(r.code, 3, "{id}: {}", r.all());
        assert!(
            r.stdout.contains("claimed by replayer until"),
            "{id}: {}",
            r.all()
        );
    }
    for id in ["ended-east", "ended-utc"] {
        assert_eq!(db.show(id)["state"], "pending", "{id}");
    }
    let r = db.dlq(&["replay", "ended-east", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.all());
    let r = db.dlq(&["claim", "ended-utc"]);
    assert_eq!(r.code, 0, "{}", r.all());
    let got = per_id(&rabbit.drain(&q));
    assert_eq!(got, HashMap::from([("ended-east".to_string(), 1)]));
    assert_eq!(db.show("ended-east")["state"], "replayed");
    assert_eq!(db.show("live-west")["state"], "claimed");
}
