//! Migrations, import, list, aggregate, show and bad input, on PostgreSQL and SQLite.

mod common;
use common::*;
use serde_json::json;

const LIST_KEYS: [&str; 20] = [
    "id",
    "reason",
    "attempts",
    "replayed_at",
    "replay_claim_owner",
    "replay_claim_expires_at",
    "last_replay_error",
    "event_id",
    "error",
    "producer",
    "schema_version",
    "source_queue",
    "exchange",
    "routing_key",
    "dead_lettered_at",
    "replay_attempt_at",
    "discarded_at",
    "discard_note",
    // Contract v3: the column of a revision (`dlq edit`).
    "revision_of",
    "state",
];

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
        if b == Backend::Postgres {
            // An empty database, as a fresh one would be.
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

#[test]
fn list_shape_filters_order_and_truncation() {
    for b in BACKENDS {
        let db = TestDb::migrated(b);
        db.import_examples();
        let all = db.dlq(&["list", "--limit", "100"]).json();
        let rows = all.as_array().unwrap();
        assert_eq!(rows.len(), 33, "{b:?}");
        for r in rows {
            let keys: Vec<&str> = r.as_object().unwrap().keys().map(String::as_str).collect();
            assert_eq!(keys.len(), LIST_KEYS.len(), "{keys:?}");
            for k in LIST_KEYS {
                assert!(r.get(k).is_some(), "missing {k}");
            }
            assert!(r.get("body").is_none() && r.get("headers_json").is_none());
        }
        let times: Vec<&str> = rows
            .iter()
            .map(|r| r["dead_lettered_at"].as_str().unwrap())
            .collect();
        let mut sorted = times.clone();
        sorted.sort_by(|a, b| b.cmp(a));
        assert_eq!(times, sorted, "newest first");

        let r = db.dlq(&["list", "--limit", "5"]);
        assert_eq!(r.json().as_array().unwrap().len(), 5);
        assert!(r.stderr.contains("5 of 33 shown"), "{}", r.stderr);

        let r = db
            .dlq(&[
                "list",
                "--reason",
                "retries_exhausted",
                "--producer",
                "inventory",
                "--schema-version",
                "5",
            ])
            .json();
        assert_eq!(r.as_array().unwrap().len(), 9);
        let r = db
            .dlq(&[
                "list",
                "--since",
                "2026-11-28T22:00:00Z",
                "--until",
                "2026-11-28T23:00:00Z",
            ])
            .json();
        assert_eq!(r.as_array().unwrap().len(), 12, "{b:?}: billing flood only");
        let r = db
            .dlq(&["list", "--since", "1000d", "--state", "replayed"])
            .json();
        assert_eq!(r.as_array().unwrap().len(), 0);
        let r = db
            .dlq(&["list", "--state", "pending", "--limit", "100"])
            .json();
        assert_eq!(r.as_array().unwrap().len(), 33);
    }
}

#[test]
fn aggregate_groups_counts_and_buckets() {
    for b in BACKENDS {
        let db = TestDb::migrated(b);
        db.import_examples();
        let a = db
            .dlq(&["aggregate", "--by", "reason,producer,schema_version"])
            .json();
        let groups = a.as_array().unwrap();
        assert_eq!(groups[0]["reason"], "poison_message");
        assert_eq!(groups[0]["producer"], "billing");
        assert_eq!(groups[0]["schema_version"], "3");
        assert_eq!(groups[0]["count"], 12);
        assert_eq!(groups[0]["pending"], 12);
        assert_eq!(groups[0]["first_seen"], "2026-11-28T22:10:00Z");
        assert_eq!(groups[0]["last_seen"], "2026-11-28T22:21:00Z");
        let counts: Vec<i64> = groups
            .iter()
            .map(|g| g["count"].as_i64().unwrap())
            .collect();
        assert!(
            counts.windows(2).all(|w| w[0] >= w[1]),
            "largest first: {counts:?}"
        );
        assert_eq!(counts.iter().sum::<i64>(), 33);
        for g in groups {
            for k in [
                "count",
                "pending",
                "claimed",
                "replayed",
                "first_seen",
                "last_seen",
            ] {
                assert!(g.get(k).is_some(), "{k}");
            }
        }
        let h = db
            .dlq(&["aggregate", "--by", "hour", "--reason", "retries_exhausted"])
            .json();
        assert_eq!(h[0]["hour"], "2026-11-28T23:00:00Z", "{b:?}: {h}");
        assert_eq!(h[0]["count"], 9);
        let d = db.dlq(&["aggregate", "--by", "day,source_queue"]).json();
        assert!(
            d.as_array()
                .unwrap()
                .iter()
                .any(|g| g["day"] == "2026-11-28T00:00:00Z"
                    && g["source_queue"] == "inventory.adjust"
                    && g["count"] == 9),
            "{d}"
        );
    }
}

#[test]
fn show_prints_every_column_body_hash_and_headers() {
    for b in BACKENDS {
        let db = TestDb::migrated(b);
        db.import_examples();
        let lines = std::fs::read_to_string(examples_file()).unwrap();
        let original: Vec<serde_json::Value> = lines
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        // The non-UTF-8 poison body.
        let poison = original
            .iter()
            .find(|r| {
                r["error"]
                    .as_str()
                    .unwrap_or("")
                    .starts_with("UnicodeDecodeError")
            })
            .unwrap();
        let s = db.show(poison["id"].as_str().unwrap());
        assert_eq!(s["body_base64"], poison["body_base64"]);
        assert_eq!(s["sha256"], poison["sha256"]);
        assert!(s.get("body_text").is_none(), "not UTF-8: no body_text");
        assert_eq!(s["history"], json!([]));
        assert_eq!(s["headers"]["x-first-death-queue"], "orders.created");
        for k in LIST_KEYS {
            assert!(s.get(k).is_some(), "show misses {k}");
        }
        // The hex dump in the table view.
        let t = db.dlq(&["show", poison["id"].as_str().unwrap(), "-o", "table"]);
        assert!(
            t.stdout.contains("hex dump") && t.stdout.contains("ff fe 00"),
            "{}",
            t.stdout
        );
        // JSON bodies are pretty printed; the large body is cut in the table view only.
        let large = original
            .iter()
            .find(|r| {
                r["error"]
                    .as_str()
                    .unwrap_or("")
                    .starts_with("PayloadTooLarge")
            })
            .unwrap();
        let t = db.dlq(&["show", large["id"].as_str().unwrap(), "-o", "table"]);
        assert!(t.stdout.contains("more bytes not shown"), "{b:?}");
        let s = db.show(large["id"].as_str().unwrap());
        assert_eq!(s["body_base64"], large["body_base64"]);
        assert!(s["body_text"].as_str().unwrap().len() > 100_000);
    }
}

#[test]
fn export_and_import_round_trip_byte_for_byte() {
    for b in BACKENDS {
        let a = TestDb::migrated(b);
        a.import_examples();
        let ids: Vec<String> = a.ids(&["--limit", "100"]);
        let mut export = String::new();
        for id in &ids {
            let s = a.dlq(&["show", id]);
            let v: serde_json::Value = s.json();
            export.push_str(&serde_json::to_string(&v).unwrap());
            export.push('\n');
        }
        let other = TestDb::migrated(if b == Backend::Postgres {
            Backend::Sqlite
        } else {
            Backend::Postgres
        });
        let r = other.dlq_stdin(&["import", "-"], export.as_bytes());
        assert_eq!(r.code, 0, "{}", r.stderr);
        assert_eq!(r.json()["imported"], 33);
        for id in &ids {
            let x = a.show(id);
            let y = other.show(id);
            for k in [
                "body_base64",
                "sha256",
                "headers",
                "reason",
                "attempts",
                "producer",
                "schema_version",
                "event_id",
                "dead_lettered_at",
                "source_queue",
                "error",
            ] {
                assert_eq!(x[k], y[k], "{k} of {id}");
            }
        }
    }
}

#[test]
fn import_is_all_or_nothing_and_names_line_and_field() {
    for b in BACKENDS {
        let db = TestDb::migrated(b);
        let good = json!({"id": "g1", "body_text": "{}", "reason": "poison_message"});
        let bad = json!({"id": "g2", "body_base64": "!!!", "reason": "poison_message"});
        let r = db.dlq_stdin(&["import", "-"], format!("{good}\n{bad}\n").as_bytes());
        assert_eq!(r.code, 2, "{}", r.all());
        assert!(
            r.stderr.contains("line 2") && r.stderr.contains("body_base64"),
            "{}",
            r.stderr
        );
        assert_eq!(db.dlq(&["list"]).json(), json!([]), "nothing written");

        let r = db.dlq_stdin(&["import", "-"], b"{\"id\": \"x\"\nnot json\n");
        assert_eq!(r.code, 2);
        assert!(r.stderr.contains("line 1"), "{}", r.stderr);

        db.add(good.clone());
        let dup = json!({"id": "g3", "body_text": "{}", "reason": "poison_message"});
        let r = db.dlq_stdin(&["import", "-"], format!("{dup}\n{good}\n").as_bytes());
        assert_eq!(r.code, 2, "{}", r.all());
        assert!(
            r.stderr.contains("already exists") && r.stderr.contains("line 2"),
            "{}",
            r.stderr
        );
        assert_eq!(
            db.dlq(&["list"]).json().as_array().unwrap().len(),
            1,
            "g3 not written"
        );
        let r = db.dlq_stdin(
            &["import", "--skip-existing", "-"],
            format!("{dup}\n{good}\n").as_bytes(),
        );
        assert_eq!(r.code, 0, "{}", r.all());
        assert_eq!(r.json(), json!({"imported": 1, "skipped_existing": 1}));
    }
}

#[test]
fn bad_input_gets_one_line_and_exit_2() {
    let db = TestDb::migrated(Backend::Sqlite);
    for args in [
        vec!["list", "--since", "yesterday"],
        vec!["list", "--limit", "0"],
        vec!["list", "--limit", "-3"],
        vec!["aggregate", "--by", "reason,colour"],
        vec!["claim", "x", "--lease", "0s"],
        vec!["claim", "x", "--lease", "soon"],
        vec!["show", "  "],
        vec!["show", "a\u{7}b"],
        vec!["list", "--reason", ""],
        vec![
            "replay",
            "x",
            "--yes",
            "--lease",
            "5s",
            "--confirm-timeout",
            "10s",
        ],
    ] {
        let r = db.dlq(&args);
        assert_eq!(r.code, 2, "{args:?}: {}", r.all());
        assert!(!r.stderr.trim().is_empty());
    }
    let r = db.dlq(&["list", "--since", "yesterday"]);
    assert!(
        r.stderr.contains("30m") && r.stderr.contains("RFC 3339"),
        "{}",
        r.stderr
    );
    let r = db.dlq(&["show", "no-such-id"]);
    assert_eq!(r.code, 4, "{}", r.all());
    assert_eq!(r.json()["outcome"], "not_found");
    assert_eq!(r.json()["id"], "no-such-id");
}

#[test]
fn read_commands_never_connect_to_rabbitmq() {
    let proxy = Proxy::start("127.0.0.1:5672", OnServerBytes::Nothing);
    let db = TestDb::migrated(Backend::Sqlite);
    db.import_examples();
    let amqp = format!("amqp://guest:guest@{}/%2f", proxy.addr());
    let env = [("DLQ_AMQP_URL", amqp.as_str())];
    for args in [
        vec!["list"],
        vec!["aggregate", "--by", "reason"],
        vec!["show", "6ee0b5b6-0000-0000-0000-000000000000"],
    ] {
        let _ = db.dlq_env(&args, &env);
    }
    let first = db.dlq(&["list", "--limit", "1"]).json()[0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(db.dlq_env(&["show", &first], &env).code, 0);
    assert_eq!(
        proxy.connections.load(std::sync::atomic::Ordering::SeqCst),
        0
    );
}
