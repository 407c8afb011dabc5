//! One rule, on both stores, for producer / schema_version / event_id taken from a header
//! or the body when the value is not a JSON string (docs/json-output.md).

use crate::common::*;

#[test]
fn non_string_identity_values_read_the_same_on_both_stores() {
    // (id, headers, body): as a worker inserts them, with no identity columns.
    let rows = [
        (
            "n1",
            r#"{"x-producer":true,"x-schema-version":1e2,"x-event-id":12}"#,
            r#"{"producer":"not-this"}"#,
        ),
        (
            "n2",
            "{}",
            r#"{"producer":false,"schema_version":2.50,"event_id":-7E+1}"#,
        ),
        (
            "n3",
            r#"{"x-producer":null,"x-schema-version":{"v":1},"x-event-id":[1]}"#,
            r#"{"producer":"svc-b","schema_version":[2],"event_id":null}"#,
        ),
    ];
    for backend in BACKENDS {
        let db = TestDb::migrated(backend);
        for (i, (id, headers, body)) in rows.iter().enumerate() {
            let body = match backend {
                Backend::Postgres => format!("convert_to('{body}', 'UTF8')"),
                Backend::Sqlite => format!("CAST('{body}' AS BLOB)"),
            };
            db.sql(&[&format!(
                "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, dead_lettered_at) \
                 VALUES ('{id}', {body}, 'poison_message', 1, '{headers}', {})",
                match backend {
                    Backend::Postgres => format!("now() - interval '{i} minutes'"),
                    Backend::Sqlite => format!("1700000000000 - {i} * 60000"),
                }
            )]);
        }
        let r = db.dlq(&["list"]);
        assert_eq!(r.code, 0, "{backend:?}: {}", r.all());
        let got: Vec<[serde_json::Value; 3]> = r
            .json()
            .as_array()
            .unwrap()
            .iter()
            .map(|x| {
                [
                    x["producer"].clone(),
                    x["schema_version"].clone(),
                    x["event_id"].clone(),
                ]
            })
            .collect();
        use serde_json::json;
        assert_eq!(
            got,
            vec![
                // Numbers and booleans: their JSON text as written.
                [json!("true"), json!("1e2"), json!("12")],
                [json!("false"), json!("2.50"), json!("-7E+1")],
                // null, arrays and objects are no value: the next source, else unknown.
                [json!("svc-b"), json!(null), json!(null)],
            ],
            "{backend:?}"
        );
        // Filters and groups read the same values.
        assert_eq!(db.ids(&["--producer", "true"]), ["n1"], "{backend:?}");
        assert_eq!(db.ids(&["--schema-version", "2.50"]), ["n2"], "{backend:?}");
        let groups = db.dlq(&["aggregate", "--by", "schema_version"]).json();
        let mut keys: Vec<String> = groups
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["schema_version"].to_string())
            .collect();
        keys.sort();
        assert_eq!(keys, ["\"1e2\"", "\"2.50\"", "null"], "{backend:?}");
    }
}

/// producer / schema_version / event_id as `dlq show` reads them.
fn identity(db: &TestDb, id: &str) -> [serde_json::Value; 3] {
    let r = db.show(id);
    [
        r["producer"].clone(),
        r["schema_version"].clone(),
        r["event_id"].clone(),
    ]
}

fn body_sql(backend: Backend, body: &str) -> String {
    match backend {
        Backend::Postgres => format!("convert_to('{body}', 'UTF8')"),
        Backend::Sqlite => format!("CAST('{body}' AS BLOB)"),
    }
}

#[test]
fn an_update_by_sql_of_a_source_recomputes_the_identity() {
    use serde_json::json;
    for backend in BACKENDS {
        let db = TestDb::migrated(backend);
        let body = body_sql(backend, r#"{"producer":"from-body","schema_version":3}"#);
        db.sql(&[&format!(
            "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, producer) \
             VALUES ('u1', {body}, 'poison_message', 1, '{{\"x-event-id\":\"h-1\"}}', 'from-column')"
        )]);
        assert_eq!(
            identity(&db, "u1"),
            [json!("from-column"), json!("3"), json!("h-1")],
            "{backend:?}: the column first, then the header, then the body"
        );
        db.sql(&["UPDATE dead_letters SET producer = NULL WHERE id = 'u1'"]);
        assert_eq!(identity(&db, "u1")[0], json!("from-body"), "{backend:?}");
        db.sql(&[r#"UPDATE dead_letters SET headers_json = '{"x-producer":7}' WHERE id = 'u1'"#]);
        assert_eq!(
            identity(&db, "u1"),
            [json!("7"), json!("3"), json!(null)],
            "{backend:?}"
        );
        let body = body_sql(
            backend,
            r#"{"producer":"b2","schema_version":true,"event_id":"e2"}"#,
        );
        db.sql(&[
            &format!("UPDATE dead_letters SET body = {body} WHERE id = 'u1'"),
            "UPDATE dead_letters SET headers_json = '{}' WHERE id = 'u1'",
        ]);
        assert_eq!(
            identity(&db, "u1"),
            [json!("b2"), json!("true"), json!("e2")],
            "{backend:?}"
        );
        db.sql(&["UPDATE dead_letters SET event_id = 'c3', schema_version = 'v9' WHERE id = 'u1'"]);
        assert_eq!(
            identity(&db, "u1"),
            [json!("b2"), json!("v9"), json!("c3")],
            "{backend:?}"
        );
        assert_eq!(db.ids(&["--producer", "b2"]), ["u1"], "{backend:?}");
    }
}

/// The PRAGMA table_xinfo `hidden` of each eff_ column: 0 an ordinary column, 2 a
/// VIRTUAL and 3 a STORED generated one.
/// The identity columns as stored, for a schema older than what `show` reads.
fn stored_identity(db: &TestDb, id: &str) -> [serde_json::Value; 3] {
    let id = id.to_string();
    let (p, s, e): (Option<String>, Option<String>, Option<String>) =
        sqlite(db, |pool| async move {
            sqlx::query_as(
                "SELECT eff_producer, eff_schema_version, eff_event_id FROM dead_letters \
                 WHERE id = ?1",
            )
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap()
        });
    [p.into(), s.into(), e.into()]
}

fn sqlite_hidden(db: &TestDb) -> Vec<(String, i64)> {
    sqlite(db, |pool| async move {
        sqlx::query_as(
            "SELECT name, hidden FROM pragma_table_xinfo('dead_letters') \
             WHERE name LIKE 'eff%' ORDER BY cid",
        )
        .fetch_all(&pool)
        .await
        .unwrap()
    })
}

/// Runs `f` with a pool on the test's SQLite file.
fn sqlite<T, F: std::future::Future<Output = T>>(
    db: &TestDb,
    f: impl FnOnce(sqlx::SqlitePool) -> F,
) -> T {
    rt().block_on(async {
        let pool = sqlx::SqlitePool::connect(&db.url).await.unwrap();
        let out = f(pool.clone()).await;
        pool.close().await;
        out
    })
}

/// SQLite recomputes every STORED generated column on every UPDATE of a row, so each
/// claim, attempt, mark and release parsed a JSON body again (issue 14). The identity
/// columns are ordinary columns kept by triggers on the columns they come from.
#[test]
fn sqlite_protocol_updates_do_not_derive_the_identity_again() {
    use serde_json::json;
    let db = TestDb::migrated(Backend::Sqlite);
    assert_eq!(
        sqlite_hidden(&db),
        [
            ("eff_producer".to_string(), 0),
            ("eff_schema_version".to_string(), 0),
            ("eff_event_id".to_string(), 0),
            ("eff_error_class".to_string(), 2),
        ]
    );
    let body = body_sql(Backend::Sqlite, r#"{"producer":"svc-a","event_id":"e-1"}"#);
    db.sql(&[&format!(
        "INSERT INTO dead_letters (id, body, reason, attempts, headers_json) \
         VALUES ('p1', {body}, 'poison_message', 1, '{{}}')"
    )]);
    assert_eq!(
        identity(&db, "p1"),
        [json!("svc-a"), json!(null), json!("e-1")]
    );
    // A marker no derivation gives: an UPDATE that derived the values again (as a
    // generated column's did) would put "svc-a" back.
    db.sql(&["UPDATE dead_letters SET eff_producer = 'marker' WHERE id = 'p1'"]);
    let r = db.dlq(&["claim", "p1"]);
    assert_eq!(r.code, 0, "{}", r.all());
    let token = r.json()["token"].as_str().unwrap().to_string();
    let r = db.dlq(&["release", "p1", "--token", &token]);
    assert_eq!(r.code, 0, "{}", r.all());
    let r = db.dlq(&["discard", "p1", "--note", "JIRA-14", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.all());
    let r = db.dlq(&["restore", "p1", "--note", "JIRA-14", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(db.show("p1")["producer"], json!("marker"));
    // A change of a source derives them again.
    db.sql(&["UPDATE dead_letters SET headers_json = '{}' WHERE id = 'p1'"]);
    assert_eq!(db.show("p1")["producer"], json!("svc-a"));
}

/// A database at 20261201000001 (generated columns) with rows in it: `dlq migrate`
/// keeps every row's identity values, indexes and the claim guard.
#[test]
fn sqlite_upgrade_from_generated_identity_columns_keeps_the_values() {
    use serde_json::json;
    let db = TestDb::new(Backend::Sqlite);
    let dir = tempfile::tempdir().unwrap();
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations/sqlite");
    for f in std::fs::read_dir(&src).unwrap() {
        let f = f.unwrap();
        if f.file_name().to_string_lossy().as_ref() < "20261201000002" {
            std::fs::copy(f.path(), dir.path().join(f.file_name())).unwrap();
        }
    }
    rt().block_on(async {
        let m = sqlx::migrate::Migrator::new(dir.path()).await.unwrap();
        let pool = sqlx::SqlitePool::connect(&format!("{}?mode=rwc", db.url))
            .await
            .unwrap();
        m.run(&pool).await.unwrap();
        pool.close().await;
    });
    assert_eq!(
        sqlite_hidden(&db).iter().map(|c| c.1).collect::<Vec<_>>(),
        [3, 3, 3, 2],
        "the old schema: STORED generated columns"
    );
    let rows = [
        (
            "g1",
            "{}",
            r#"{"producer":true,"schema_version":1e2}"#,
            "NULL",
        ),
        (
            "g2",
            r#"{"x-producer":"hdr","x-event-id":5}"#,
            r#"{"producer":"body"}"#,
            "NULL",
        ),
        (
            "g3",
            "{}",
            r#"{"producer":"body","event_id":"e3"}"#,
            "'col'",
        ),
        ("g4", "not json", "[1, 2]", "NULL"),
    ];
    for (id, headers, body, producer) in rows {
        db.sql(&[&format!(
            "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, producer, error) \
             VALUES ('{id}', CAST('{body}' AS BLOB), 'poison_message', 1, '{headers}', {producer}, 'Timeout: x')"
        )]);
    }
    // Read with SQL: today's `show` names columns (`revision_of`) this old schema lacks.
    let before: Vec<_> = rows.iter().map(|r| stored_identity(&db, r.0)).collect();
    assert_eq!(
        before,
        [
            [json!("true"), json!("1e2"), json!(null)],
            [json!("hdr"), json!(null), json!("5")],
            [json!("col"), json!(null), json!("e3")],
            [json!(null), json!(null), json!(null)],
        ]
    );
    let schema = |db: &TestDb| -> Vec<String> {
        sqlite(db, |pool| async move {
            sqlx::query_scalar(
                "SELECT type || ' ' || name FROM sqlite_master \
                 WHERE tbl_name = 'dead_letters' ORDER BY type, name",
            )
            .fetch_all(&pool)
            .await
            .unwrap()
        })
    };
    let old_schema = schema(&db);
    let r = db.dlq(&["migrate"]);
    assert_eq!(r.code, 0, "{}", r.all());
    // Later migrations may follow it.
    assert_eq!(r.json()["applied"][0], "20261201000002 identity columns");
    assert_eq!(
        sqlite_hidden(&db).iter().map(|c| c.1).collect::<Vec<_>>(),
        [0, 0, 0, 2]
    );
    let after: Vec<_> = rows.iter().map(|r| identity(&db, r.0)).collect();
    assert_eq!(after, before);
    let mut expected = old_schema;
    expected.extend([
        "trigger dead_letters_identity_insert".to_string(),
        "trigger dead_letters_identity_update".to_string(),
        // A later migration's (revisions, 20261203000100).
        "index dead_letters_revision_of_idx".to_string(),
    ]);
    expected.sort();
    assert_eq!(schema(&db), expected, "every index and trigger made again");
    assert_eq!(db.ids(&["--producer", "true"]), ["g1"]);
    assert_eq!(db.ids(&["--event-id", "5"]), ["g2"]);
    assert_eq!(
        db.scalar("SELECT count(*) FROM dead_letters WHERE eff_error_class = 'Timeout'"),
        4,
        "eff_error_class stays VIRTUAL"
    );
    // The claim guard is back: a discarded row cannot be claimed by SQL.
    let r = db.dlq(&["discard", "g4", "--note", "JIRA-14", "--yes"]);
    assert_eq!(r.code, 0, "{}", r.all());
    let refused = sqlite(&db, |pool| async move {
        sqlx::query("UPDATE dead_letters SET replay_claim_owner = 'x:1' WHERE id = 'g4'")
            .execute(&pool)
            .await
    });
    assert!(
        format!("{:?}", refused.unwrap_err()).contains("cannot be claimed"),
        "the guard trigger"
    );
}

/// SQLite's triggers skip the body's parse when its first non-blank byte (within the
/// first 64) is not `{`; blanks beyond those 64 bytes still lead to the full parse.
#[test]
fn a_body_object_after_long_leading_whitespace_gives_its_fields() {
    use serde_json::json;
    let long = " \n\t\r".repeat(40);
    let rows = [
        ("w1", format!(r#"{long}{{"producer":"ws","event_id":1}}"#)),
        ("w2", r#" [{"producer":"no"}]"#.to_string()),
        ("w3", r#"{"producer":"cut""#.to_string()),
        ("w4", format!(r#"{long}"producer""#)),
    ];
    for backend in BACKENDS {
        let db = TestDb::migrated(backend);
        for (id, body) in &rows {
            let body = body_sql(backend, body);
            db.sql(&[&format!(
                "INSERT INTO dead_letters (id, body, reason, attempts, headers_json) \
                 VALUES ('{id}', {body}, 'poison_message', 1, '{{}}')"
            )]);
        }
        let got: Vec<_> = rows.iter().map(|r| identity(&db, r.0)).collect();
        assert_eq!(
            got,
            [
                [json!("ws"), json!(null), json!("1")],
                [json!(null), json!(null), json!(null)],
                [json!(null), json!(null), json!(null)],
                [json!(null), json!(null), json!(null)],
            ],
            "{backend:?}"
        );
    }
}

/// `dlq` gives the values with its INSERTs so that SQLite's trigger need not write the
/// row again; the trigger still derives them: a wrong value given is replaced.
#[test]
fn sqlite_identity_values_given_with_an_insert_are_checked() {
    use serde_json::json;
    let db = TestDb::migrated(Backend::Sqlite);
    let body = body_sql(
        Backend::Sqlite,
        r#"{"producer":"svc-a","schema_version":2}"#,
    );
    db.sql(&[&format!(
        "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, \
         eff_producer, eff_schema_version, eff_event_id) \
         VALUES ('h1', {body}, 'poison_message', 1, '{{\"x-event-id\":\"e\"}}', \
         'wrong', NULL, 'e')"
    )]);
    assert_eq!(
        identity(&db, "h1"),
        [json!("svc-a"), json!("2"), json!("e")]
    );
}
