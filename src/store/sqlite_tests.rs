//! Unit tests of the SQLite store against a real file.

use super::*;

/// A store on a new file in a temporary directory (kept while the guard lives).
pub(crate) async fn temp_store() -> (tempfile::TempDir, SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let url = SecretUrl::new(format!("sqlite://{}", dir.path().join("t.db").display()));
    let opts = StoreOptions {
        if_missing: super::IfMissing::Create,
        ..StoreOptions::default()
    };
    let store = SqliteStore::connect(&url, &opts).await.unwrap();
    (dir, store)
}

#[tokio::test]
async fn writes_are_committed_with_synchronous_full() {
    let (_dir, store) = temp_store().await;
    let level: i64 = sqlx::query_scalar("PRAGMA synchronous")
        .fetch_one(&store.pool)
        .await
        .unwrap();
    assert_eq!(level, 2, "FULL: a committed mark survives a power loss");
}

/// `identity_hint` gives what the triggers derive, so `dlq`'s inserts are written
/// once (a wrong hint would only cost a second write: the trigger corrects it).
#[tokio::test]
async fn the_identity_hint_agrees_with_the_triggers() {
    let (_dir, store) = temp_store().await;
    store.migrate().await.unwrap();
    let long = " \n".repeat(40);
    // (producer, schema_version, event_id columns; headers; body)
    type Case<'a> = ([Option<&'a str>; 3], &'a str, Vec<u8>);
    let cases: Vec<Case> = vec![
        (
            [None; 3],
            "{}",
            br#"{"producer":"p","schema_version":2,"event_id":1e2}"#.to_vec(),
        ),
        (
            [Some("c"), Some(""), None],
            r#"{"x-event-id":true}"#,
            b"{}".to_vec(),
        ),
        (
            [None; 3],
            r#"{"x-producer":false,"x-schema-version":-7E+1}"#,
            b"[1]".to_vec(),
        ),
        (
            [None; 3],
            r#"{"x-producer":null,"x-event-id":[1]}"#,
            br#"{"producer":{"a":1},"event_id":"caf\u00e9"}"#.to_vec(),
        ),
        (
            [None; 3],
            "not json",
            format!(r#"{long}{{"producer":"ws"}}"#).into_bytes(),
        ),
        ([None; 3], "[]", br#"{"producer":"cut""#.to_vec()),
        ([None; 3], "{}", vec![0xff, b'{', b'}']),
        (
            [None; 3],
            "{}",
            br#"{"producer":"a\"b","schema_version":0.5}"#.to_vec(),
        ),
    ];
    for (i, (cols, headers, body)) in cases.iter().enumerate() {
        sqlx::query(
            "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, producer, \
             schema_version, event_id) VALUES (?1, ?2, 'r', 1, ?3, ?4, ?5, ?6)",
        )
        .bind(format!("c{i}"))
        .bind(body.as_slice())
        .bind(*headers)
        .bind(cols[0])
        .bind(cols[1])
        .bind(cols[2])
        .execute(&store.pool)
        .await
        .unwrap();
        let got: (Option<String>, Option<String>, Option<String>) = sqlx::query_as(
            "SELECT eff_producer, eff_schema_version, eff_event_id FROM dead_letters \
             WHERE id = ?1",
        )
        .bind(format!("c{i}"))
        .fetch_one(&store.pool)
        .await
        .unwrap();
        assert_eq!(
            identity_hint(*cols, headers, body),
            [got.0, got.1, got.2],
            "case {i}"
        );
    }
}
