//! One rule, on both stores, for producer / schema_version / event_id taken from a header
//! or the body when the value is not a JSON string (docs/json-output.md).

mod common;
use common::*;

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
