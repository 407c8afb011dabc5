//! `dlq migrate`: twice is a no-op, every command without the schema says run it, the
//! workers' nine-column table keeps its rows, concurrent migrations of a new SQLite file.

use crate::common::*;
use serde_json::json;

/// Two `migrate` on a SQLite file that does not exist yet: both succeed (the busy
/// timeout applies from the first statement).
#[test]
fn concurrent_migrations_of_a_new_sqlite_file_both_succeed() {
    for round in 0..5 {
        let db = TestDb::new(Backend::Sqlite);
        let children: Vec<_> = (0..3)
            .map(|_| {
                db.cmd()
                    .args(["migrate"])
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for child in children {
            let r = Run::from(child.wait_with_output().unwrap());
            assert_eq!(r.code, 0, "round {round}: {}", r.all());
        }
        assert_eq!(db.dlq(&["list"]).code, 0);
    }
}

#[test]
fn migrate_twice_is_a_no_op() {
    for b in BACKENDS {
        let db = TestDb::new(b);
        let first = db.dlq(&["migrate"]);
        assert_eq!(first.code, 0, "{b:?}: {}", first.stderr);
        let dir = match b {
            Backend::Postgres => "migrations/postgres",
            Backend::Sqlite => "migrations/sqlite",
        };
        let files = std::fs::read_dir(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(dir))
            .unwrap()
            .count();
        assert_eq!(
            first.json()["applied"].as_array().unwrap().len(),
            files,
            "{b:?}"
        );
        let second = db.dlq(&["migrate"]);
        assert_eq!(second.code, 0);
        assert_eq!(second.json()["applied"], json!([]), "{b:?}");
    }
}

#[test]
fn without_schema_every_command_says_run_migrate() {
    for b in BACKENDS {
        let db = TestDb::new(b);
        if b == Backend::Sqlite {
            // An empty file (a missing one is a typo: see the next test).
            std::fs::write(db.url.trim_start_matches("sqlite://"), b"").unwrap();
        }
        for args in [
            vec!["list"],
            vec!["aggregate", "--by", "reason"],
            vec!["show", "x"],
            vec!["claim", "x"],
        ] {
            let r = db.dlq(&args);
            assert_eq!(r.code, 1, "{b:?} {args:?}: {}", r.all());
            assert!(
                r.stderr.contains("run `dlq migrate`"),
                "{b:?} {args:?}: {}",
                r.stderr
            );
            assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
        }
    }
}

/// A read names a SQLite file that does not exist (a typo of the URL): one line naming
/// the path and a similar file beside it, exit 1, and the file is not created.
/// Once broke: the error said "run `dlq migrate`", which then created an empty database.
#[test]
fn a_read_of_a_missing_sqlite_file_names_it_and_never_creates_it() {
    let db = TestDb::migrated(Backend::Sqlite);
    let real = std::path::PathBuf::from(db.url.trim_start_matches("sqlite://"));
    let typo = real.with_file_name("dql.db");
    let url = format!("sqlite://{}", typo.display());
    for args in [
        vec!["list"],
        vec!["aggregate", "--by", "reason"],
        vec!["show", "0123456789"],
        vec!["check", "--max-pending", "1"],
        vec!["metrics"],
        vec!["export"],
        vec!["__ids"],
    ] {
        let r = db.dlq_env(&args, &[("DLQ_DATABASE_URL", &url)]);
        assert!(!typo.exists(), "{args:?} created {}", typo.display());
        if args[0] == "__ids" {
            continue;
        }
        assert_eq!(r.code, 1, "{args:?}: {}", r.all());
        let line = r.stderr.trim();
        assert_eq!(line.lines().count(), 1, "{line}");
        assert!(line.contains(&typo.display().to_string()), "{line}");
        assert!(line.contains("does not exist"), "{line}");
        assert!(
            line.contains(&format!("did you mean {}?", real.display())),
            "{line}"
        );
    }
    // `migrate --create` makes it, as `migrate` without a terminal does.
    let r = db.dlq_env(&["migrate", "--create"], &[("DLQ_DATABASE_URL", &url)]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert!(typo.exists());
    let r = db.dlq_env(&["list"], &[("DLQ_DATABASE_URL", &url)]);
    assert_eq!(r.code, 0, "{}", r.all());
}

#[test]
fn migrate_keeps_rows_of_the_workers_nine_column_table() {
    for b in BACKENDS {
        let db = TestDb::new(b);
        let (blob, ts) = match b {
            Backend::Postgres => ("'\\x7b7d'::bytea", "TIMESTAMPTZ"),
            Backend::Sqlite => ("X'7b7d'", "TIMESTAMP"),
        };
        db.sql(&[
            &format!(
                "CREATE TABLE dead_letters (id TEXT PRIMARY KEY, body {} NOT NULL, reason TEXT NOT NULL, \
                 attempts INTEGER NOT NULL, headers_json TEXT NOT NULL, replayed_at {ts} NULL, \
                 replay_claim_owner TEXT NULL, replay_claim_expires_at {ts} NULL, last_replay_error TEXT NULL)",
                if b == Backend::Postgres { "BYTEA" } else { "BLOB" }
            ),
            &format!("INSERT INTO dead_letters (id, body, reason, attempts, headers_json) VALUES ('w1', {blob}, 'poison_message', 1, '{{\"x-producer\":\"billing\"}}')"),
            &format!("INSERT INTO dead_letters (id, body, reason, attempts, headers_json, replayed_at) VALUES ('w2', {blob}, 'retries_exhausted', 3, '{{}}', '2026-01-02 03:04:05+00:00')"),
            &format!("INSERT INTO dead_letters (id, body, reason, attempts, headers_json, replayed_at) VALUES ('w4', {blob}, 'retries_exhausted', 3, '{{}}', {})", if b == Backend::Postgres { "'2026-01-02 03:04:05+00'" } else { "'sometime last tuesday'" }),
        ]);
        let r = db.dlq(&["migrate"]);
        assert_eq!(r.code, 0, "{b:?}: {}", r.all());
        let rows = db.dlq(&["list", "--state", "all"]).json();
        assert_eq!(rows.as_array().unwrap().len(), 3, "{b:?}");
        assert_eq!(
            db.show("w4")["state"],
            "replayed",
            "{b:?}: an unreadable time keeps the row replayed"
        );
        let w1 = db.show("w1");
        assert_eq!(w1["producer"], "billing");
        assert_eq!(w1["state"], "pending");
        let w2 = db.show("w2");
        assert_eq!(w2["state"], "replayed", "{b:?}");
        assert_eq!(w2["replayed_at"], "2026-01-02T03:04:05Z", "{b:?}");
        // The workers keep writing their nine columns after the migration.
        db.sql(&[&format!("INSERT INTO dead_letters (id, body, reason, attempts, headers_json) VALUES ('w3', {blob}, 'poison_message', 1, '{{}}')")]);
        assert_eq!(db.show("w3")["state"], "pending");
    }
}

#[test]
fn fallbacks_hold_for_rows_inserted_by_plain_sql_after_migrate() {
    for b in BACKENDS {
        let db = TestDb::migrated(b);
        let body = r#"{"event_id":"e-body","producer":"from-body","schema_version":"7"}"#;
        let hex: String = body.bytes().map(|c| format!("{c:02x}")).collect();
        let blob = match b {
            Backend::Postgres => format!("'\\x{hex}'::bytea"),
            Backend::Sqlite => format!("X'{hex}'"),
        };
        db.sql(&[
            // Only the body knows.
            &format!("INSERT INTO dead_letters (id, body, reason, attempts, headers_json) VALUES ('b1', {blob}, 'poison_message', 1, '{{}}')"),
            // Headers win over the body.
            &format!("INSERT INTO dead_letters (id, body, reason, attempts, headers_json) VALUES ('h1', {blob}, 'poison_message', 1, '{{\"x-producer\":\"from-header\",\"x-schema-version\":\"8\",\"x-event-id\":\"e-header\"}}')"),
            // The column wins over both.
            &format!("INSERT INTO dead_letters (id, body, reason, attempts, headers_json, producer) VALUES ('c1', {blob}, 'poison_message', 1, '{{\"x-producer\":\"from-header\"}}', 'from-column')"),
            // Nothing known (not JSON, headers not JSON either).
            "INSERT INTO dead_letters (id, body, reason, attempts, headers_json) VALUES ('n1', X'ff00', 'poison_message', 1, 'not json')"
                .replace("X'ff00'", if b == Backend::Postgres { "'\\xff00'::bytea" } else { "X'ff00'" })
                .as_str(),
        ]);
        let s = db.show("b1");
        assert_eq!(
            (
                s["producer"].as_str(),
                s["schema_version"].as_str(),
                s["event_id"].as_str()
            ),
            (Some("from-body"), Some("7"), Some("e-body")),
            "{b:?}"
        );
        let s = db.show("h1");
        assert_eq!(
            (
                s["producer"].as_str(),
                s["schema_version"].as_str(),
                s["event_id"].as_str()
            ),
            (Some("from-header"), Some("8"), Some("e-header")),
            "{b:?}"
        );
        assert_eq!(db.show("c1")["producer"], "from-column");
        assert_eq!(db.show("n1")["producer"], serde_json::Value::Null);
        // The same values drive list filters and aggregate groups.
        let l = db.dlq(&["list", "--producer", "from-body"]).json();
        assert_eq!(l.as_array().unwrap().len(), 1);
        assert_eq!(l[0]["id"], "b1");
        let l = db.dlq(&["list", "--producer", "(unknown)"]).json();
        assert_eq!(l[0]["id"], "n1");
        let a = db.dlq(&["aggregate", "--by", "producer"]).json();
        let producers: Vec<&str> = a
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["producer"].as_str().unwrap_or("(null)"))
            .collect();
        for p in ["from-body", "from-header", "from-column", "(null)"] {
            assert!(producers.contains(&p), "{b:?}: {producers:?}");
        }
    }
}
