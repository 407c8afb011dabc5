//! SQLite rows as the seed's Python workers write them: times in whatever storage class
//! their library picks (TEXT with microseconds and offsets, REAL, INTEGER seconds or
//! milliseconds), text columns bound as bytes, rows marked by the Python replayer. Every
//! command reads them right, on the database clock, and one row dlq cannot read never
//! stops a command for the others. Also: full time precision through export and import,
//! and what `dlq` says about a SQLite URL or file it cannot use.

use crate::common::*;
use serde_json::Value;
use std::collections::HashMap;

mod ids;
mod offsets;
mod prune;

/// Writes the Python workers' rows (tests/common/python_workers.py) into `db`.
fn python_workers(db: &TestDb, queue: &str) {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/common/python_workers.py"
    );
    let o = std::process::Command::new("python3")
        .args([script, file_of(db).as_str(), queue])
        .output()
        .expect("python3");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// The SQL a refusal to write a BLOB id names as its fix.
fn fix_of(said: &str) -> &str {
    said.split("make it text first: ")
        .nth(1)
        .unwrap_or_else(|| panic!("no fix named: {said}"))
        .lines()
        .next()
        .unwrap()
        .split("; ")
        .next()
        .unwrap()
}

fn file_of(db: &TestDb) -> String {
    db.url.trim_start_matches("sqlite://").to_string()
}

fn by_id(rows: &Value) -> HashMap<String, Value> {
    rows.as_array()
        .unwrap()
        .iter()
        .map(|r| (r["id"].as_str().unwrap().to_string(), r.clone()))
        .collect()
}

/// (id, state, dead_lettered_at as dlq prints it), newest first as `list` orders them;
/// the row whose time cannot be read comes last.
const EXPECTED: [(&str, &str, Option<&str>); 16] = [
    ("py-replayed", "replayed", Some("2026-11-30T12:00:07Z")),
    (
        "py-bytes-\\xff\\xfe",
        "pending",
        Some("2026-11-30T12:00:06Z"),
    ),
    ("py-blob-id", "pending", Some("2026-11-30T12:00:05Z")),
    (
        "py-replayed-garbage",
        "replayed",
        Some("2026-11-30T12:00:04Z"),
    ),
    ("py-discarded", "discarded", Some("2026-11-30T12:00:03Z")),
    ("py-attempt", "uncertain", Some("2026-11-30T12:00:02Z")),
    ("py-lease-lapsed", "pending", Some("2026-11-30T12:00:01Z")),
    ("py-lease-live", "claimed", Some("2026-11-30T12:00:00Z")),
    ("py-offset", "pending", Some("2026-11-29T08:00:00.500Z")),
    ("py-tz", "pending", Some("2026-11-29T08:00:00.250Z")),
    ("py-naive", "pending", Some("2026-11-28T22:10:00.123456Z")),
    ("py-millis", "pending", Some("2025-12-03T00:00:00.123Z")),
    ("py-seconds", "pending", Some("2025-12-02T00:00:00Z")),
    ("py-real", "pending", Some("2025-12-01T00:00:00.750Z")),
    ("py-julian", "pending", Some("2025-12-01T00:00:00Z")),
    ("py-unreadable-dla", "pending", None),
];

// Each of these once failed every read of the table ("mismatched types; Rust type
// Option<i64> ... not compatible with SQL type TEXT"), or read seconds as milliseconds.
#[test]
fn python_workers_rows_are_read_whatever_their_storage_class() {
    let db = TestDb::migrated(Backend::Sqlite);
    python_workers(&db, "orders");
    let r = db.dlq(&["list", "--limit", "100"]);
    assert_eq!(r.code, 0, "{}", r.all());
    let list = r.json();
    let order: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    let expected: Vec<&str> = EXPECTED.iter().map(|e| e.0).collect();
    assert_eq!(order, expected, "newest first, on the time each one means");
    let rows = by_id(&list);
    for (id, state, at) in EXPECTED {
        assert_eq!(rows[id]["state"], state, "{id}");
        assert_eq!(rows[id]["dead_lettered_at"].as_str(), at, "{id}");
    }
    // Every other time column, each in a worker's storage class.
    let t = |id: &str, col: &str| rows[id][col].clone();
    assert_eq!(
        t("py-replayed", "replayed_at"),
        "2026-12-01T13:41:34.334875Z"
    );
    assert_eq!(t("py-replayed", "replay_claim_owner"), Value::Null);
    assert_eq!(
        t("py-lease-live", "replay_claim_expires_at"),
        "2099-01-01T00:00:00.000001Z"
    );
    assert_eq!(
        t("py-attempt", "replay_attempt_at"),
        "2026-11-30T12:04:00.654321Z"
    );
    assert_eq!(
        t("py-attempt", "replay_claim_expires_at"),
        "2026-11-30T12:05:00Z"
    );
    assert_eq!(
        t("py-discarded", "discarded_at"),
        "2026-11-30T13:00:00.000007Z"
    );
    // What cannot be read is said on its row, and the row keeps its state.
    assert_eq!(
        t("py-replayed-garbage", "unreadable"),
        serde_json::json!({"replayed_at": "'yesterday'"})
    );
    assert_eq!(
        t("py-unreadable-dla", "unreadable"),
        serde_json::json!({"dead_lettered_at": "'last tuesday'"})
    );
    // Text columns bound as bytes: UTF-8 as text, other bytes escaped.
    assert_eq!(t("py-blob-id", "reason"), "retries_exhausted");
    assert_eq!(t("py-blob-id", "producer"), "billing");
    assert_eq!(t("py-blob-id", "error"), "KeyError: 'sku'");
    assert_eq!(t("py-bytes-\\xff\\xfe", "error"), "bad \\xff byte");

    let r = db.dlq(&["list", "--count", "--limit", "1"]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert!(r.stderr.contains("16"), "{}", r.stderr);
    for format in ["table", "markdown"] {
        let r = db.dlq(&["list", "-o", format, "--limit", "100"]);
        assert_eq!(r.code, 0, "{}", r.all());
        assert!(r.stdout.contains("(unreadable)"), "{}", r.stdout);
    }

    let a = db.dlq(&["aggregate", "--by", "reason"]);
    assert_eq!(a.code, 0, "{}", a.all());
    let poison = a.json()[0].clone();
    assert_eq!(poison["reason"], "poison_message");
    for (state, n) in [
        ("count", 15),
        ("pending", 10),
        ("claimed", 1),
        ("uncertain", 1),
        ("replayed", 2),
        ("discarded", 1),
    ] {
        assert_eq!(poison[state], n, "{state}: {poison}");
    }
    assert_eq!(poison["first_seen"], "2025-12-01T00:00:00Z");
    let d = db.dlq(&["aggregate", "--by", "day"]);
    assert_eq!(d.code, 0, "{}", d.all());
    let days: Vec<String> = d
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["day"].to_string())
        .collect();
    assert!(
        days.contains(&"\"2025-12-01T00:00:00Z\"".to_string()),
        "{days:?}"
    );

    // Ranges compare the times to the microsecond; an unreadable one matches none.
    let since = db.ids(&["--since", "2026-11-29T08:00:00.250Z", "--limit", "100"]);
    assert_eq!(since.len(), 10, "{since:?}");
    assert!(since.contains(&"py-tz".to_string()) && !since.contains(&"py-naive".to_string()));
    let until = db.ids(&["--until", "2026-11-29T08:00:00.500Z", "--limit", "100"]);
    assert!(until.contains(&"py-tz".to_string()) && !until.contains(&"py-offset".to_string()));
    assert_eq!(until.len(), 6, "{until:?}");
    assert!(!until.contains(&"py-unreadable-dla".to_string()));
    // States on the database clock: the text lease of 2099 is live, the lapsed one not.
    assert_eq!(db.ids(&["--state", "claimed"]), vec!["py-lease-live"]);
    assert_eq!(db.ids(&["--state", "uncertain"]), vec!["py-attempt"]);
}

#[test]
fn show_and_export_read_every_row_a_worker_wrote() {
    let db = TestDb::migrated(Backend::Sqlite);
    python_workers(&db, "orders");
    // `show` finds a row by any ID that `list` prints, a BLOB one included.
    for (id, state, _) in EXPECTED {
        let s = db.show(id);
        assert_eq!(s["id"], id);
        assert_eq!(s["state"], state, "{id}");
    }
    assert_eq!(db.show("py-blob-id")["headers"]["x-producer"], "billing");
    let r = db.dlq(&["show", "-o", "table", "py-replayed-garbage"]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert!(
        r.stdout.contains("replayed_at holds 'yesterday'"),
        "show says what is stored: {}",
        r.stdout
    );
    let r = db.dlq(&["show", "-o", "table", "py-unreadable-dla"]);
    assert!(r.stdout.contains("(unreadable)"), "{}", r.stdout);

    // A note on a BLOB id is refused (dlq writes only a TEXT id), naming the SQL that
    // makes it text; that SQL works, and the row is then written like any other.
    let r = db.dlq(&["note", "py-blob-id", "looked at it"]);
    assert_eq!(r.code, 1, "{}", r.all());
    db.sql(&[fix_of(&r.stderr)]);
    assert_eq!(
        db.scalar("SELECT count(*) FROM dead_letters WHERE id = 'py-blob-id'"),
        1
    );
    assert_eq!(db.dlq(&["note", "py-blob-id", "looked at it"]).code, 0);
    assert_eq!(
        db.show("py-blob-id")["history"][0]["detail"],
        "looked at it"
    );
    // The export of the whole table, one line per row, times to the microsecond.
    let r = db.dlq(&["export"]);
    assert_eq!(r.code, 0, "{}", r.all());
    let lines = r.lines();
    assert_eq!(lines.len(), 16);
    let exported = |id: &str| lines.iter().find(|l| l["id"] == id).unwrap().clone();
    assert_eq!(
        exported("py-naive")["dead_lettered_at"],
        "2026-11-28T22:10:00.123456Z"
    );
    assert_eq!(exported("py-bytes-\\xff\\xfe")["error"], "bad \\xff byte");
    assert_eq!(
        exported("py-blob-id")["history"][0]["detail"],
        "looked at it"
    );
    assert_eq!(
        unb64(&exported("py-bytes-\\xff\\xfe")["body_base64"]),
        b"\x00\x01"
    );
    // A time the source could not read is not exported as "no time" (a replayed row
    // would come back replayable): import refuses that line and says why.
    let garbage = exported("py-replayed-garbage");
    assert_eq!(garbage["unreadable"]["replayed_at"], "'yesterday'");
    let other = TestDb::migrated(Backend::Sqlite);
    let r = other.dlq_stdin(&["import", "-"], format!("{garbage}\n").as_bytes());
    assert_eq!(r.code, 2, "{}", r.all());
    assert!(
        r.stderr.contains("replayed_at") && r.stderr.contains("'yesterday'"),
        "{}",
        r.stderr
    );
    assert_eq!(other.scalar("SELECT count(*) FROM dead_letters"), 0);
    // The rest goes through.
    let readable: String = lines
        .iter()
        .filter(|l| l.get("unreadable").is_none())
        .map(|l| format!("{l}\n"))
        .collect();
    let r = other.dlq_stdin(&["import", "-"], readable.as_bytes());
    assert_eq!(r.code, 0, "{}", r.all());
    let again: Vec<Value> = other.dlq(&["export"]).lines();
    assert_eq!(again.len(), 14);
    let a = again.iter().find(|l| l["id"] == "py-attempt").unwrap();
    assert_eq!(a["replay_attempt_at"], "2026-11-30T12:04:00.654321Z");
}

#[test]
fn plan_replay_and_resolve_work_on_the_workers_rows() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("sqlite_rows");
    let db = TestDb::migrated(Backend::Sqlite);
    python_workers(&db, &q);
    let plan = db.plan_file(&["--allow-mixed", "--limit", "100"]);
    let p: Value = serde_json::from_slice(&std::fs::read(plan.path()).unwrap()).unwrap();
    let planned: Vec<&str> = p["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_str().unwrap())
        .collect();
    let pending: Vec<&str> = EXPECTED
        .iter()
        .filter(|e| e.1 == "pending")
        .map(|e| e.0)
        .collect();
    let mut sorted = planned.clone();
    sorted.sort();
    let mut want = pending.clone();
    want.sort();
    assert_eq!(sorted, want, "a plan selects the pending rows only");
    // The worker's BLOB ids are refused (3), each naming the SQL that makes it text.
    let r = db.dlq(&["replay", "--plan", plan.path().to_str().unwrap(), "--yes"]);
    assert_eq!(r.code, 3, "{}", r.all());
    let blob_ids = ["py-blob-id", "py-bytes-\\xff\\xfe"];
    let mut got = per_id(&rabbit.drain(&q));
    assert_eq!(got.len(), pending.len() - 2, "{got:?}");
    for id in blob_ids {
        let line = r.lines().into_iter().find(|l| l["id"] == id).unwrap();
        assert_eq!(line["outcome"], "not_replayed", "{line}");
        db.sql(&[fix_of(line["detail"].as_str().unwrap())]);
        let again = db.dlq(&["replay", id, "--yes"]);
        assert_eq!(again.code, 0, "{}", again.all());
        for (k, n) in per_id(&rabbit.drain(&q)) {
            *got.entry(k).or_default() += n;
        }
    }
    assert_eq!(got.len(), pending.len(), "{got:?}");
    assert!(got.values().all(|n| *n == 1), "{got:?}");
    for id in &pending {
        let s = db.show(id);
        assert_eq!(s["state"], "replayed", "{id}");
        assert!(s["replayed_at"].is_string(), "{id}: {s}");
    }
    // Nothing left to replay: the replayed, claimed, uncertain and discarded rows stay.
    let r = db.dlq(&["plan", "--allow-mixed"]);
    if r.code == 0 {
        assert_eq!(r.json()["count"], 0, "nothing pending: {}", r.all());
    }
    assert_eq!(db.show("py-lease-live")["state"], "claimed");
    assert_eq!(db.show("py-replayed-garbage")["state"], "replayed");

    // The worker's own attempt (text times, lease lapsed) is resolvable.
    let r = db.dlq(&[
        "resolve",
        "py-attempt",
        "--not-delivered",
        "--note",
        "checked the consumers",
    ]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(db.show("py-attempt")["state"], "pending");
    let r = db.dlq(&["replay", "py-attempt", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(per_id(&rabbit.drain(&q))["py-attempt"], 1);
    // dlq's own times are microseconds, read back as such.
    let stored = db.scalar("SELECT replayed_at FROM dead_letters WHERE id = 'py-attempt'");
    assert!(stored > 1_700_000_000_000_000, "{stored}");
}

// The export cut PostgreSQL's microseconds to milliseconds, so a round trip was not
// byte for byte against the source.
#[test]
fn export_keeps_microseconds_from_postgres_through_sqlite_and_back() {
    let pg = TestDb::migrated(Backend::Postgres);
    pg.import_examples();
    pg.sql(&[
        "UPDATE dead_letters SET dead_lettered_at = dead_lettered_at + interval '123457 microseconds'",
        "UPDATE dead_letters SET replayed_at = timestamptz '2026-12-01 13:41:34.334875+00' \
         WHERE id = (SELECT min(id) FROM dead_letters)",
    ]);
    let id = pg.ids(&["--limit", "1"])[0].clone();
    let r = pg.dlq(&["claim", &id]);
    assert_eq!(r.code, 0, "{}", r.all());
    let export = |db: &TestDb| {
        let r = db.dlq(&["export"]);
        assert_eq!(r.code, 0, "{}", r.all());
        r.stdout
    };
    let e1 = export(&pg);
    assert!(e1.contains(".123457Z"), "microseconds exported: {e1:.600}");
    assert!(e1.contains("2026-12-01T13:41:34.334875Z"));
    let claimed = e1
        .lines()
        .find(|l| l.contains(&format!("\"id\":\"{id}\"")))
        .unwrap();
    let v: Value = serde_json::from_str(claimed).unwrap();
    let at = v["history"][0]["at"].as_str().unwrap();
    assert_eq!(
        Some(at),
        pg.show(&id)["history"][0]["at"].as_str(),
        "history times too"
    );
    let sq = TestDb::migrated(Backend::Sqlite);
    let r = sq.dlq_stdin(&["import", "-"], e1.as_bytes());
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(
        export(&sq),
        e1,
        "PostgreSQL -> SQLite -> export: identical lines"
    );
    let pg2 = TestDb::migrated(Backend::Postgres);
    let r = pg2.dlq_stdin(&["import", "-"], export(&sq).as_bytes());
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(export(&pg2), e1, "and back into PostgreSQL");
}

#[test]
fn a_sqlite_url_or_file_dlq_cannot_use_is_named_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let cases = [
        (
            "sqlite::memory:",
            2,
            "in-memory SQLite database is not supported",
        ),
        ("sqlite://", 2, "names no database file"),
        (
            &*format!("sqlite://{d}/nope/dlq.db"),
            2,
            "/nope does not exist",
        ),
        (
            &*format!("sqlite://{d}"),
            2,
            "is a directory, not a SQLite database file",
        ),
    ];
    for (url, code, says) in cases {
        for cmd in ["migrate", "list"] {
            let o = std::process::Command::new(env!("CARGO_BIN_EXE_dlq"))
                .args(["--database-url", url, cmd])
                .env_remove("DLQ_DATABASE_URL")
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(code), "{url} {cmd}: {err}");
            assert!(err.contains(says), "{url} {cmd}: {err}");
            assert_eq!(err.lines().count(), 1, "{err}");
        }
    }
}

// Migrating over a worker table with a NULL id failed with "NOT NULL constraint failed:
// dead_letters_v1.id", naming neither the row nor the fix.
#[test]
fn migrating_over_worker_rows_without_an_id_names_them_and_the_fix() {
    let db = TestDb::new(Backend::Sqlite);
    db.sql(&[
        "CREATE TABLE dead_letters (id TEXT PRIMARY KEY, body BLOB NOT NULL, reason TEXT NOT NULL, \
         attempts INTEGER NOT NULL, headers_json TEXT NOT NULL, replayed_at TIMESTAMP NULL, \
         replay_claim_owner TEXT NULL, replay_claim_expires_at TIMESTAMP NULL, \
         last_replay_error TEXT NULL)",
        "INSERT INTO dead_letters VALUES ('ok', X'7b7d', 'r', 1, '{}', NULL, NULL, NULL, NULL)",
        "INSERT INTO dead_letters VALUES (NULL, X'7b7d', 'r', 1, '{}', NULL, NULL, NULL, NULL)",
        "INSERT INTO dead_letters VALUES ('', X'7b7d', 'r', 1, '{}', NULL, NULL, NULL, NULL)",
    ]);
    let r = db.dlq(&["migrate"]);
    assert_eq!(r.code, 1, "{}", r.all());
    assert!(r.stderr.contains("rowid 2, 3"), "{}", r.stderr);
    assert!(
        r.stderr.contains("UPDATE dead_letters SET id ="),
        "{}",
        r.stderr
    );
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    // Nothing was changed, and the fix it names works.
    assert_eq!(db.scalar("SELECT count(*) FROM dead_letters"), 3);
    db.sql(&[
        "UPDATE dead_letters SET id = lower(hex(randomblob(16))) WHERE id IS NULL OR id = ''",
    ]);
    let r = db.dlq(&["migrate"]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(db.ids(&[]).len(), 3);
}

// `list` in a directory this user cannot write said only "attempt to write a readonly
// database".
#[test]
fn a_read_only_directory_is_named_with_what_sqlite_needs() {
    let db = TestDb::migrated(Backend::Sqlite);
    db.import_examples();
    let file = std::path::PathBuf::from(file_of(&db));
    let dir = file.parent().unwrap().to_path_buf();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o555)).unwrap();
    // Root may write anywhere: run dlq as another user there.
    let root = is_root();
    let mut c = if root {
        let mut c = std::process::Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_dlq"));
        c
    } else {
        std::process::Command::new(env!("CARGO_BIN_EXE_dlq"))
    };
    let o = c
        .args(["--database-url", &db.url, "list"])
        .env_remove("DLQ_DATABASE_URL")
        .output()
        .unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains(&file.display().to_string()), "{err}");
    assert!(err.contains("write access to the directory"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

fn is_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

#[test]
fn an_import_killed_midway_leaves_all_of_it_or_none() {
    let n = 40_000;
    let lines: String = (0..n)
        .map(|i| {
            format!(
                "{}\n",
                serde_json::json!({"id": format!("imp-{i:06}"), "reason": "retries_exhausted",
                    "headers": {"x-producer": "p"}, "source_queue": "q",
                    "body_text": format!("{{\"n\":{i},\"pad\":\"{}\"}}", "x".repeat(1000))})
            )
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    std::fs::write(&input, &lines).unwrap();
    let db = TestDb::migrated(Backend::Sqlite);
    let mut child = db
        .cmd()
        .args(["import", input.to_str().unwrap()])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    signal(&child, "KILL");
    let _ = child.wait();
    // The import commits in batches (it/store/import_batches.rs): what a killed one left,
    // the next dlq command undoes before anything else.
    let r = db.dlq(&["list", "--limit", "1"]);
    assert_eq!(r.code, 0, "{}", r.all());
    let count = db.scalar("SELECT count(*) FROM dead_letters");
    assert!(count == 0 || count == n, "all or nothing: {count}");
    // And the next import of the same file goes through.
    let r = db.dlq(&["import", "--skip-existing", input.to_str().unwrap()]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(db.scalar("SELECT count(*) FROM dead_letters"), n);
}

/// Every storage class, in every time column: (SQL literal, what dlq shows).
const FORMS: [(&str, Option<&str>); 11] = [
    (
        "'2026-11-28 22:10:00.500000'",
        Some("2026-11-28T22:10:00.500Z"),
    ),
    (
        "'2026-11-28 22:10:00.500000+00:00'",
        Some("2026-11-28T22:10:00.500Z"),
    ),
    (
        "'2026-11-28T23:10:00.5+01:00'",
        Some("2026-11-28T22:10:00.500Z"),
    ),
    (
        "'2026-11-28T22:10:00.000001Z'",
        Some("2026-11-28T22:10:00.000001Z"),
    ),
    ("'2026-11-28 22:10'", Some("2026-11-28T22:10:00Z")),
    ("1795903800.5", Some("2026-11-28T22:10:00.500Z")),
    ("2461372.25", Some("2026-11-27T18:00:00Z")),
    ("1795903800", Some("2026-11-28T22:10:00Z")),
    ("1795903800500", Some("2026-11-28T22:10:00.500Z")),
    ("1795903800500001", Some("2026-11-28T22:10:00.500001Z")),
    ("X'0102'", None),
];

#[test]
fn each_storage_class_of_each_time_column_is_read() {
    let db = TestDb::migrated(Backend::Sqlite);
    let columns = [
        "dead_lettered_at",
        "replayed_at",
        "replay_claim_expires_at",
        "replay_attempt_at",
        "discarded_at",
    ];
    for (c, col) in columns.iter().enumerate() {
        for (f, (literal, _)) in FORMS.iter().enumerate() {
            db.sql(&[&format!(
                "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, \
                 replay_claim_owner, {col}) VALUES ('t{c}-{f}', X'7b7d', 'r', 1, '{{}}', 'w', {literal})"
            )]);
            db.sql(&[&format!(
                "INSERT INTO dead_letter_history (dead_letter_id, at, operator, action, outcome) \
                 VALUES ('t{c}-{f}', {literal}, 'w', 'note', 'noted')"
            )]);
        }
    }
    let r = db.dlq(&["list", "--limit", "100"]);
    assert_eq!(r.code, 0, "{}", r.all());
    let rows = by_id(&r.json());
    for (c, col) in columns.iter().enumerate() {
        for (f, (literal, shown)) in FORMS.iter().enumerate() {
            let row = &rows[&format!("t{c}-{f}")];
            assert_eq!(row[*col].as_str(), *shown, "{col} = {literal}: {row}");
            if shown.is_none() {
                assert_eq!(row["unreadable"][*col], "X'0102'", "{row}");
            }
        }
    }
    // The states follow the times on the database clock: every lease above is past.
    assert_eq!(rows["t1-0"]["state"], "replayed");
    assert_eq!(
        rows["t1-10"]["state"], "replayed",
        "an unreadable replayed_at is set"
    );
    assert_eq!(rows["t2-3"]["state"], "pending");
    assert_eq!(rows["t3-6"]["state"], "uncertain");
    assert_eq!(rows["t4-10"]["state"], "discarded");
    // History times, in `show` and in the export.
    for (f, (literal, shown)) in FORMS.iter().enumerate() {
        let id = format!("t1-{f}");
        let at = db.show(&id)["history"][0]["at"].clone();
        let want = shown.unwrap_or("1970-01-01T00:00:00Z");
        assert_eq!(at.as_str(), Some(want), "history at = {literal}");
    }
    let r = db.dlq(&["export"]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(r.lines().len(), columns.len() * FORMS.len());
}

/// `metrics` and `check` read the workers' rows by the same time rule as `list`. Once
/// broke (merge of metrics): their oldest-pending read took `dead_lettered_at` as stored,
/// so one TEXT time made both exit 1, and the state counts compared the stored lease end.
#[test]
fn metrics_and_check_read_the_workers_rows() {
    let db = TestDb::migrated(Backend::Sqlite);
    python_workers(&db, "orders");
    let list = db.dlq(&["list", "--state", "all", "--limit", "100"]).json();
    let rows = list.as_array().unwrap();
    let count = |state: &str| rows.iter().filter(|r| r["state"] == state).count() as i64;
    let oldest = rows
        .iter()
        .filter(|r| r["state"] == "pending")
        .filter_map(|r| r["dead_lettered_at"].as_str())
        .filter_map(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .min()
        .expect("a pending row with a readable time");

    let m = db.dlq(&["metrics"]);
    assert_eq!(m.code, 0, "{}", m.all());
    let sum = |state: &str| -> i64 {
        let label = format!("state=\"{state}\"");
        m.stdout
            .lines()
            .filter(|l| l.starts_with("dlq_dead_letters{") && l.contains(&label))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<i64>().unwrap())
            .sum()
    };
    for state in ["pending", "claimed", "uncertain", "replayed", "discarded"] {
        assert_eq!(sum(state), count(state), "{state}: {}", m.stdout);
    }
    assert!(
        m.stdout
            .lines()
            .any(|l| l == "dlq_uncertain_dead_letters 1"),
        "{}",
        m.stdout
    );

    let c = db.dlq(&["check", "--max-pending", "1000", "-o", "json"]);
    assert_eq!(c.code, 0, "{}", c.all());
    let age = c.json()["oldest_pending_age_seconds"].as_f64().unwrap();
    let expected = (chrono::Utc::now() - oldest.with_timezone(&chrono::Utc)).num_seconds() as f64;
    assert!(
        (age - expected).abs() < 300.0,
        "age {age}, expected about {expected}"
    );
    assert_eq!(c.json()["pending"], count("pending"));
}
