//! Capture keys and what a capture stores: identical redelivered messages are two rows,
//! over-nested headers and `$bytes` tables, the key of a quorum redelivery. Each test a
//! regression found by the review of `dlq capture` (issue 13).

use super::deliver_and_drop;
use crate::common::*;
use lapin::options::*;
use lapin::types::{AMQPValue, ByteArray, FieldArray, FieldTable, LongString, ShortString};
use lapin::BasicProperties;
use std::time::{Duration, Instant};

fn s(v: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(v))
}

fn table(pairs: &[(&str, AMQPValue)]) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in pairs {
        t.insert(ShortString::from(*k), v.clone());
    }
    t
}

fn publish(r: &Rabbit, queue: &str, body: &[u8], props: BasicProperties) {
    r.block_on(async {
        r.channel()
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                body,
                props,
            )
            .await
            .unwrap()
            .await
            .unwrap();
    });
}

fn wait_for(r: &Rabbit, queue: &str, n: u32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while r.count(queue) < n {
        assert!(Instant::now() < deadline, "{queue} never held {n}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Once broke: on PostgreSQL, a batch with one refused row is retried row by row, and each
/// row's EXISTS check then sees the rows inserted earlier in the same transaction. Two
/// identical but distinct messages, both redelivered (a capture or any consumer died before
/// storing them), become ONE row; the other is acked as `already_there`: lost. The main
/// path (one INSERT) and SQLite (keys looked up before inserting) make two rows.
#[test]
fn refused_row_in_batch_swallows_an_identical_redelivered_message() {
    let mut got = Vec::new();
    for backend in BACKENDS {
        let db = TestDb::migrated(backend);
        let mut rabbit = Rabbit::new();
        let q = rabbit.queue("dlq_rev_q");
        let park = rabbit.queue("dlq_rev_park");
        match backend {
            Backend::Postgres => db.sql(&[
                "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
                 IF NEW.body = convert_to('refuse me', 'UTF8') THEN \
                 RAISE EXCEPTION 'refused by policy'; END IF; RETURN NEW; END $$",
                "CREATE TRIGGER refuse BEFORE INSERT ON dead_letters \
                 FOR EACH ROW EXECUTE FUNCTION refuse()",
            ]),
            Backend::Sqlite => db.sql(&["CREATE TRIGGER refuse BEFORE INSERT ON dead_letters \
                 WHEN NEW.body = CAST('refuse me' AS BLOB) \
                 BEGIN SELECT RAISE(ABORT, 'refused by policy'); END"]),
        }
        for b in [&b"same"[..], b"same", b"refuse me"] {
            publish(&rabbit, &q, b, BasicProperties::default());
        }
        wait_for(&rabbit, &q, 3);
        deliver_and_drop(&rabbit, &q, 3);
        wait_for(&rabbit, &q, 3);
        let r = db.dlq(&["capture", "--queue", &q, "--park-queue", &park]);
        assert_eq!(r.code, 0, "{backend:?}: {}", r.all());
        let sum = r.json();
        assert_eq!(rabbit.count(&q), 0, "{backend:?}: all acked");
        assert_eq!(sum["parked"], 1, "{backend:?}: {sum}");
        got.push((backend, db.scalar("SELECT count(*) FROM dead_letters"), sum));
    }
    for (backend, rows, sum) in &got {
        assert_eq!(
            *rows, 2,
            "{backend:?}: two distinct messages acked, rows stored: {sum}; all: {got:?}"
        );
    }
}

/// Once broke: headers nested deeper than serde_json's recursion limit (128) were stored,
/// acked, and then could not be read back (`show` and replay saw `(unparseable)`). Such a
/// message is now a message that cannot be stored: capture stops with it still queued, or
/// parks it.
#[test]
fn deeply_nested_headers_are_stored_but_cannot_be_read_back() {
    let db = TestDb::migrated(Backend::Sqlite);
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_rev_deep");
    let park = rabbit.queue("dlq_rev_deep_park");
    let mut v = s("leaf");
    for _ in 0..130 {
        v = AMQPValue::FieldTable(table(&[("a", v)]));
    }
    publish(
        &rabbit,
        &q,
        b"deep",
        BasicProperties::default().with_headers(table(&[("deep", v), ("tenant", s("acme"))])),
    );
    wait_for(&rabbit, &q, 1);
    let r = db.dlq(&["capture", "--queue", &q]);
    assert_eq!(r.code, 1, "{}", r.all());
    assert!(r.stderr.contains("nest too deeply"), "{}", r.stderr);
    wait_for(&rabbit, &q, 1);
    assert!(db.ids(&[]).is_empty(), "no unreadable row");
    let r = db.dlq(&["capture", "--queue", &q, "--park-queue", &park]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(rabbit.count(&q), 0);
    assert_eq!(rabbit.count(&park), 1, "parked, not lost");
}

/// Once broke: the JSON form of headers is not one-to-one: a table `{"$bytes": "/w=="}`
/// and the byte string 0xFF are stored identically (and a replay sends both as bytes).
#[test]
fn a_table_with_a_dollar_bytes_key_is_stored_as_bytes() {
    let t = table(&[("$bytes", s("/w=="))]);
    let as_table =
        BasicProperties::default().with_headers(table(&[("h", AMQPValue::FieldTable(t))]));
    let as_bytes = BasicProperties::default().with_headers(table(&[(
        "h",
        AMQPValue::ByteArray(ByteArray::from(vec![0xff_u8])),
    )]));
    let a = dlq::capture::to_letter(b"x", &as_table, false, None);
    let b = dlq::capture::to_letter(b"x", &as_bytes, false, None);
    assert_ne!(
        a.row.headers_json, b.row.headers_json,
        "two different headers, two different stored texts"
    );
}

/// Once broke: the key's death time is read two ways. Without `x-delivery-count` it is
/// parsed by `integer()` (which accepts a string), with it by `Value::as_i64` (which does
/// not). A quorum dead-letter queue adds `x-delivery-count` on redelivery, so a message
/// whose x-death time is a string gets a different key on redelivery: a second row.
#[test]
fn capture_key_of_a_redelivery_from_a_quorum_queue_equals_the_first_one() {
    let death = AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::FieldTable(table(&[
        ("queue", s("orders")),
        ("reason", s("rejected")),
        ("count", AMQPValue::LongLongInt(1)),
        ("time", s("1800000000")),
    ]))]));
    let first = BasicProperties::default().with_headers(table(&[("x-death", death.clone())]));
    let again = BasicProperties::default().with_headers(table(&[
        ("x-death", death),
        ("x-delivery-count", AMQPValue::LongLongInt(1)),
    ]));
    let a = dlq::capture::to_letter(b"x", &first, false, None);
    let b = dlq::capture::to_letter(b"x", &again, true, None);
    assert_eq!(a.capture_key, b.capture_key);
}

/// Once broke: two identical messages in two batches stored at once (PostgreSQL): the
/// older batch's transaction failed, the younger's committed, neither was acked, and on
/// the rerun both redeliveries found the younger's row: one message had no row, without
/// any crash. A batch that shares a capture key with one being stored now waits for it.
#[test]
fn identical_messages_in_two_batches_are_never_stored_at_once() {
    let db = TestDb::migrated(Backend::Postgres);
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_twin_q");
    // The first insert fails as a serialization failure would (a sequence: not undone).
    db.sql(&[
        "CREATE SEQUENCE fail_once",
        "CREATE FUNCTION fail_once() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
         IF nextval('fail_once') = 1 THEN \
         RAISE EXCEPTION 'could not serialize access' USING ERRCODE = '40001'; END IF; \
         RETURN NEW; END $$",
        "CREATE TRIGGER fail_once BEFORE INSERT ON dead_letters \
         FOR EACH STATEMENT EXECUTE FUNCTION fail_once()",
    ]);
    for _ in 0..2 {
        publish(&rabbit, &q, b"same", BasicProperties::default());
    }
    wait_for(&rabbit, &q, 2);
    let r = db.dlq(&["capture", "--queue", &q, "--batch", "1"]);
    assert_eq!(r.code, 1, "{}", r.all());
    wait_for(&rabbit, &q, 2);
    let r = db.dlq(&["capture", "--queue", &q, "--batch", "10"]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(rabbit.count(&q), 0);
    assert_eq!(
        db.scalar("SELECT count(*) FROM dead_letters"),
        2,
        "two messages acked: {}",
        r.stdout
    );
}
