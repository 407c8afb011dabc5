//! `dlq capture`: messages dead-lettered for real by RabbitMQ (a consumer's reject, a
//! quorum queue's delivery limit, a TTL), captured into both stores; crashes, lost
//! connections and lost commits; replay of a captured message.

mod common;
use common::*;
use futures_util::StreamExt;
use lapin::options::*;
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use lapin::BasicProperties;
use serde_json::{json, Value};
use std::process::Stdio;
use std::sync::atomic::Ordering;
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

/// A work queue whose dead letters go to a dead-letter queue, both unique and removed on
/// drop. `work_args` are added to the work queue's arguments.
struct Dlx {
    rabbit: Rabbit,
    work: String,
    dlq: String,
}

impl Dlx {
    fn new(work_args: &[(&str, AMQPValue)], dlq_args: &[(&str, AMQPValue)]) -> Dlx {
        Dlx::on(AMQP, work_args, dlq_args)
    }

    fn on(url: &str, work_args: &[(&str, AMQPValue)], dlq_args: &[(&str, AMQPValue)]) -> Dlx {
        let mut rabbit = Rabbit::on(url);
        let dlq = rabbit.queue_with("dlq_cap_dlq", table(dlq_args));
        let mut args = vec![
            ("x-dead-letter-exchange", s("")),
            ("x-dead-letter-routing-key", s(&dlq)),
        ];
        args.extend(work_args.iter().cloned());
        let work = rabbit.queue_with("dlq_cap_work", table(&args));
        Dlx { rabbit, work, dlq }
    }

    fn publish(&self, body: &[u8], props: BasicProperties) {
        publish(&self.rabbit, &self.work, body, props);
    }

    /// A consumer of the work queue that refuses `n` messages (`requeue` false: they are
    /// dead-lettered at once, in batches as a failing consumer under load does; true:
    /// they come back until the queue's delivery limit dead-letters them).
    fn refuse(&self, n: usize, requeue: bool) {
        self.refuse_only(n, requeue);
        wait_for(&self.rabbit, &self.dlq, n as u32);
    }

    /// [`Dlx::refuse`] without waiting for the dead-letter queue to hold them.
    fn refuse_only(&self, n: usize, requeue: bool) {
        let r = &self.rabbit;
        r.block_on(async {
            let ch = r.channel();
            ch.basic_qos(500, BasicQosOptions::default()).await.unwrap();
            let mut consumer = ch
                .basic_consume(
                    self.work.as_str().into(),
                    "refuser".into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await
                .unwrap();
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut refused = 0;
            loop {
                assert!(Instant::now() < deadline, "refused only {refused}");
                if requeue {
                    let q = ch
                        .queue_declare(
                            self.dlq.as_str().into(),
                            QueueDeclareOptions {
                                passive: true,
                                ..Default::default()
                            },
                            FieldTable::default(),
                        )
                        .await
                        .unwrap();
                    if q.message_count() as usize >= n {
                        break;
                    }
                } else if refused == n {
                    break;
                }
                let d =
                    match tokio::time::timeout(Duration::from_millis(200), consumer.next()).await {
                        Ok(Some(Ok(d))) => d,
                        _ => continue,
                    };
                refused += 1;
                if requeue {
                    d.acker
                        .nack(BasicNackOptions {
                            multiple: false,
                            requeue: true,
                        })
                        .await
                        .unwrap();
                } else if refused.is_multiple_of(250) || refused == n {
                    ch.basic_nack(
                        d.delivery_tag,
                        BasicNackOptions {
                            multiple: true,
                            requeue: false,
                        },
                    )
                    .await
                    .unwrap();
                }
            }
            ch.basic_cancel("refuser".into(), BasicCancelOptions::default())
                .await
                .unwrap();
        });
    }
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

/// Waits until `queue` holds `n` messages.
fn wait_for(r: &Rabbit, queue: &str, n: u32) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let c = r.count(queue);
        if c >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{queue} holds {c} of {n} messages"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn capture(db: &TestDb, args: &[&str]) -> Run {
    let mut a = vec!["capture"];
    a.extend_from_slice(args);
    db.dlq(&a)
}

/// Every row's JSON as `show` prints it, oldest first by body.
fn shown(db: &TestDb) -> Vec<Value> {
    let mut rows: Vec<Value> = db
        .ids(&["--limit", "100000"])
        .iter()
        .map(|id| db.show(id))
        .collect();
    rows.sort_by_key(|r| r["body_base64"].as_str().unwrap_or_default().to_string());
    rows
}

#[test]
fn rejected_messages_are_captured_byte_for_byte_with_their_x_death() {
    for backend in BACKENDS {
        let db = TestDb::migrated(backend);
        let dlx = Dlx::new(&[], &[]);
        let headers = table(&[
            ("tenant", s("acme")),
            ("x-exception", s("ValueError: bad amount")),
            ("retries", AMQPValue::LongInt(3)),
            ("big", AMQPValue::LongLongInt(1 << 40)),
            ("ratio", AMQPValue::Double(0.25)),
            ("flag", AMQPValue::Boolean(true)),
            ("nested", AMQPValue::FieldTable(table(&[("k", s("v"))]))),
            (
                "list",
                AMQPValue::FieldArray(FieldArray::from(vec![s("a"), AMQPValue::LongInt(1)])),
            ),
            (
                "raw",
                AMQPValue::LongString(LongString::from(vec![0xff_u8, 0x00, 0x41])),
            ),
            ("x-producer", s("billing")),
        ]);
        let binary_body: &[u8] = &[0x00, 0xff, 0xfe, b'{', 0x80];
        dlx.publish(
            binary_body,
            BasicProperties::default()
                .with_headers(headers.clone())
                .with_message_id("msg-1".into()),
        );
        dlx.publish(
            br#"{"event_id":"evt-2","amount":"x"}"#,
            BasicProperties::default().with_message_id("msg-2".into()),
        );
        dlx.publish(b"plain text", BasicProperties::default());
        dlx.refuse(3, false);

        let r = capture(&db, &["--queue", &dlx.dlq]);
        assert_eq!(r.code, 0, "{}", r.all());
        let summary = r.json();
        assert_eq!(summary["captured"], 3, "{summary}");
        assert_eq!(summary["already_there"], 0);
        assert_eq!(summary["stopped"], "empty");
        assert_eq!(dlx.rabbit.count(&dlx.dlq), 0, "the queue is empty after");

        let rows = shown(&db);
        assert_eq!(rows.len(), 3);
        let by_body = |b: &[u8]| {
            rows.iter()
                .find(|r| r["body_base64"] == b64(b))
                .unwrap_or_else(|| panic!("no row with body {b:?}: {rows:#?}"))
                .clone()
        };
        let now = chrono::Utc::now();
        for row in &rows {
            assert_eq!(row["reason"], "poison_message", "{row}");
            assert_eq!(row["source_queue"], dlx.work.as_str());
            assert_eq!(row["exchange"], Value::Null, "the default exchange");
            assert_eq!(row["routing_key"], dlx.work.as_str());
            assert_eq!(row["attempts"], 1);
            let at: chrono::DateTime<chrono::Utc> =
                row["dead_lettered_at"].as_str().unwrap().parse().unwrap();
            assert!((now - at).num_seconds().abs() < 60, "{at}");
            let death = &row["headers"]["x-death"][0];
            assert_eq!(death["queue"], dlx.work.as_str(), "{row}");
            assert_eq!(death["reason"], "rejected");
            assert_eq!(death["count"], 1);
            assert_eq!(death["exchange"], "");
            assert_eq!(death["routing-keys"], json!([dlx.work]));
            assert_eq!(
                death["time"].as_i64().unwrap(),
                at.timestamp(),
                "dead_lettered_at is the x-death time"
            );
        }
        let first = by_body(binary_body);
        assert_eq!(first["body_text"], Value::Null, "not UTF-8");
        let h = &first["headers"];
        assert_eq!(h["tenant"], "acme");
        assert_eq!(h["retries"], 3);
        assert_eq!(h["big"], 1_i64 << 40);
        assert_eq!(h["ratio"], 0.25);
        assert_eq!(h["flag"], true);
        assert_eq!(h["nested"], json!({"k": "v"}));
        assert_eq!(h["list"], json!(["a", 1]));
        assert_eq!(h["raw"], json!({"$bytes": b64(&[0xff, 0x00, 0x41])}));
        assert_eq!(first["error"], "ValueError: bad amount");
        assert_eq!(first["producer"], "billing", "the x-producer header");
        assert_eq!(
            first["event_id"], "msg-1",
            "message_id when nothing else gives one"
        );

        let second = by_body(br#"{"event_id":"evt-2","amount":"x"}"#);
        assert_eq!(
            second["event_id"], "evt-2",
            "the body's event_id wins over message_id"
        );
        assert_eq!(second["error"], Value::Null);
        let third = by_body(b"plain text");
        assert_eq!(third["event_id"], Value::Null);

        // Nothing left: a second run captures nothing.
        let again = capture(&db, &["--queue", &dlx.dlq]);
        assert_eq!(again.code, 0, "{}", again.all());
        assert_eq!(again.json()["captured"], 0);
    }
}

#[test]
fn quorum_delivery_limit_is_retries_exhausted_and_a_quorum_dead_letter_queue_works() {
    for backend in BACKENDS {
        let db = TestDb::migrated(backend);
        let quorum = ("x-queue-type", s("quorum"));
        let dlx = Dlx::new(
            &[quorum.clone(), ("x-delivery-limit", AMQPValue::LongInt(2))],
            std::slice::from_ref(&quorum),
        );
        dlx.publish(
            br#"{"event_id":"evt-q","amount":1}"#,
            BasicProperties::default()
                .with_headers(table(&[("x-error", s("TimeoutError: ledger"))])),
        );
        dlx.refuse(1, true);

        let r = capture(&db, &["--queue", &dlx.dlq]);
        assert_eq!(r.code, 0, "{}", r.all());
        assert_eq!(r.json()["captured"], 1, "{}", r.stdout);
        assert_eq!(dlx.rabbit.count(&dlx.dlq), 0);
        let rows = shown(&db);
        let row = &rows[0];
        assert_eq!(row["reason"], "retries_exhausted");
        assert_eq!(row["headers"]["x-death"][0]["reason"], "delivery_limit");
        assert_eq!(row["source_queue"], dlx.work.as_str());
        assert_eq!(row["error"], "TimeoutError: ledger");
        assert_eq!(row["event_id"], "evt-q");
        // RabbitMQ 3.10 keeps no delivery count on a message a quorum queue dead-letters,
        // so attempts is the x-death count (a later broker's x-delivery-count wins).
        assert!(row["attempts"].as_i64().unwrap() >= 1, "{row}");
    }
}

#[test]
fn expired_messages_keep_their_reason_and_reason_can_be_given() {
    let db = TestDb::migrated(Backend::Sqlite);
    let dlx = Dlx::new(&[("x-message-ttl", AMQPValue::LongInt(20))], &[]);
    for i in 0..4 {
        dlx.publish(format!("ttl {i}").as_bytes(), BasicProperties::default());
    }
    wait_for(&dlx.rabbit, &dlx.dlq, 4);
    let r = capture(&db, &["--queue", &dlx.dlq, "--max", "2"]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(r.json()["captured"], 2);
    assert_eq!(r.json()["stopped"], "max");
    assert_eq!(
        dlx.rabbit.count(&dlx.dlq),
        2,
        "--max leaves the rest queued"
    );
    let rows = shown(&db);
    for row in &rows {
        assert_eq!(row["reason"], "expired");
        assert_eq!(row["attempts"], 0, "nobody consumed it");
        assert_eq!(row["headers"]["x-death"][0]["reason"], "expired");
    }
    let r = capture(&db, &["--queue", &dlx.dlq, "--reason", "permanent_failure"]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(r.json()["captured"], 2);
    let given = db.ids(&["--reason", "permanent_failure"]);
    assert_eq!(given.len(), 2);
    assert_eq!(dlx.rabbit.count(&dlx.dlq), 0);
}

#[test]
fn two_identical_messages_make_two_rows() {
    let db = TestDb::migrated(Backend::Postgres);
    let dlx = Dlx::new(&[], &[]);
    for _ in 0..2 {
        dlx.publish(b"same bytes", BasicProperties::default());
    }
    dlx.refuse(2, false);
    let dlq_rows = dlx.rabbit.drain(&dlx.dlq);
    assert_eq!(dlq_rows.len(), 2);
    assert_eq!(
        dlq_rows[0].headers, dlq_rows[1].headers,
        "the broker gave both the same x-death"
    );
    for m in &dlq_rows {
        dlx.rabbit.block_on(async {
            dlx.rabbit
                .channel()
                .basic_publish(
                    "".into(),
                    dlx.dlq.as_str().into(),
                    BasicPublishOptions::default(),
                    &m.body,
                    BasicProperties::default().with_headers(to_table(&m.headers)),
                )
                .await
                .unwrap()
                .await
                .unwrap();
        });
    }
    wait_for(&dlx.rabbit, &dlx.dlq, 2);
    let r = capture(&db, &["--queue", &dlx.dlq]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(r.json()["captured"], 2, "{}", r.stdout);
    assert_eq!(
        db.scalar("SELECT count(DISTINCT capture_key) FROM dead_letters"),
        1,
        "one key, two rows"
    );
}

/// JSON headers back to AMQP (strings, integers, arrays, tables), for re-publishing.
fn to_table(h: &serde_json::Map<String, Value>) -> FieldTable {
    fn val(v: &Value) -> AMQPValue {
        match v {
            Value::String(x) => s(x),
            Value::Number(n) => AMQPValue::LongLongInt(n.as_i64().unwrap()),
            Value::Bool(b) => AMQPValue::Boolean(*b),
            Value::Array(a) => {
                AMQPValue::FieldArray(FieldArray::from(a.iter().map(val).collect::<Vec<_>>()))
            }
            Value::Object(m) => AMQPValue::FieldTable(to_table(m)),
            Value::Null => AMQPValue::Void,
        }
    }
    let mut t = FieldTable::default();
    for (k, v) in h {
        t.insert(k.as_str().into(), val(v));
    }
    t
}

/// Publishes `n` distinct messages to the work queue and dead-letters them all.
fn fill(dlx: &Dlx, n: usize) {
    let r = &dlx.rabbit;
    r.block_on(async {
        for i in 0..n {
            r.channel()
                .basic_publish(
                    "".into(),
                    dlx.work.as_str().into(),
                    BasicPublishOptions::default(),
                    format!("{{\"n\":{i},\"pad\":\"{}\"}}", "x".repeat(200)).as_bytes(),
                    BasicProperties::default().with_delivery_mode(2),
                )
                .await
                .unwrap();
        }
    });
    dlx.refuse(n, false);
}

fn rows(db: &TestDb) -> i64 {
    db.scalar("SELECT count(*) FROM dead_letters")
}

/// Every one of the `n` messages has exactly one row.
fn assert_exactly_once(db: &TestDb, n: i64) {
    assert_eq!(rows(db), n, "rows");
    assert_eq!(
        db.scalar("SELECT count(DISTINCT body) FROM dead_letters"),
        n,
        "distinct bodies"
    );
}

fn wait_until(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn sigkill_during_a_capture_of_thousands_then_a_rerun_stores_each_message_once() {
    for backend in BACKENDS {
        let db = TestDb::migrated(backend);
        let dlx = Dlx::new(&[], &[]);
        let n = 3000;
        fill(&dlx, n);
        let mut child = db
            .cmd()
            .args(["capture", "--queue", &dlx.dlq, "--batch", "50"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        wait_until("a few batches", 60, || rows(&db) >= 400);
        child.kill().unwrap();
        child.wait().unwrap();
        let before = rows(&db);
        assert!(before < n as i64, "killed mid-run ({before} rows)");

        let r = capture(&db, &["--queue", &dlx.dlq]);
        assert_eq!(r.code, 0, "{}", r.all());
        let sum = r.json();
        assert_eq!(
            before + sum["captured"].as_i64().unwrap(),
            n as i64,
            "{backend:?}: {sum}"
        );
        assert_exactly_once(&db, n as i64);
        assert_eq!(dlx.rabbit.count(&dlx.dlq), 0);
    }
}

#[test]
fn broker_connection_cut_during_follow_loses_nothing_and_doubles_nothing() {
    for backend in BACKENDS {
        let db = TestDb::migrated(backend);
        let dlx = Dlx::new(&[], &[]);
        let n = 2000;
        fill(&dlx, n);
        let proxy = Proxy::start("127.0.0.1:5672", OnServerBytes::Nothing);
        let url = format!("amqp://guest:guest@{}/%2f", proxy.addr());
        let child = db
            .cmd()
            .env("DLQ_AMQP_URL", &url)
            .args(["capture", "--queue", &dlx.dlq, "--batch", "50", "--follow"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_until("a few batches", 60, || rows(&db) >= 300);
        proxy.cut.store(true, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(1500));
        assert!(rows(&db) < n as i64, "cut mid-run");
        proxy.cut.store(false, Ordering::SeqCst);
        wait_until("every message stored", 60, || rows(&db) >= n as i64);
        wait_until("the queue acked", 30, || dlx.rabbit.count(&dlx.dlq) == 0);
        signal(&child, "TERM");
        let out = Run::from(child.wait_with_output().unwrap());
        assert_eq!(out.code, 0, "{}", out.all());
        let sum = out.json();
        assert!(sum["reconnects"].as_i64().unwrap() >= 1, "{sum}");
        assert_eq!(sum["stopped"], "interrupted");
        assert!(out.stderr.contains("trying again in"), "{}", out.stderr);
        assert!(!out.stderr.contains("guest:guest"), "{}", out.stderr);
        assert_exactly_once(&db, n as i64);
    }
}

#[test]
fn a_commit_whose_answer_is_lost_is_not_stored_twice() {
    // The proxy forwards PostgreSQL until the server answers the first COMMIT, and drops
    // the connection instead: the batch is committed, dlq cannot know it, acks nothing.
    let db = TestDb::migrated(Backend::Postgres);
    let dlx = Dlx::new(&[], &[]);
    let n = 500;
    fill(&dlx, n);
    let commit_complete = b"C\0\0\0\x0bCOMMIT\0".to_vec();
    let proxy = Proxy::start(
        "127.0.0.1:5432",
        OnServerBytes::CutOnce(commit_complete, Default::default()),
    );
    let url = format!(
        "{}?sslmode=disable",
        db.url.replace("127.0.0.1:5432", &proxy.addr())
    );
    let child = db
        .cmd()
        .env("DLQ_DATABASE_URL", &url)
        .args(["capture", "--queue", &dlx.dlq, "--batch", "100", "--follow"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until("the first commit", 60, || proxy.cut.load(Ordering::SeqCst));
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(rows(&db), 100, "the first batch is committed");
    assert_eq!(
        dlx.rabbit.count(&dlx.dlq) as usize,
        n,
        "and nothing acked: the broker has every message back"
    );
    proxy.cut.store(false, Ordering::SeqCst);
    wait_until("every message stored", 60, || rows(&db) >= n as i64);
    wait_until("the queue acked", 30, || dlx.rabbit.count(&dlx.dlq) == 0);
    signal(&child, "TERM");
    let out = Run::from(child.wait_with_output().unwrap());
    assert_eq!(out.code, 0, "{}", out.all());
    let sum = out.json();
    assert_eq!(sum["already_there"], 100, "{sum}");
    assert_eq!(sum["captured"], n as i64 - 100, "{sum}");
    assert_exactly_once(&db, n as i64);
}

#[test]
fn a_captured_message_replays_to_its_original_queue_without_its_x_death() {
    for backend in BACKENDS {
        let db = TestDb::migrated(backend);
        let dlx = Dlx::new(&[], &[]);
        let body = br#"{"order":"o-17","amount":12}"#;
        dlx.publish(
            body,
            BasicProperties::default()
                .with_message_id("m-17".into())
                .with_headers(table(&[("tenant", s("acme"))])),
        );
        dlx.refuse(1, false);
        let r = capture(&db, &["--queue", &dlx.dlq]);
        assert_eq!(r.code, 0, "{}", r.all());
        let id = db.ids(&[]).pop().unwrap();
        let r = db.dlq(&["replay", &id, "--yes"]);
        assert_eq!(r.code, 0, "{}", r.all());
        assert_eq!(r.json()["outcome"], "replayed");
        let got = dlx.rabbit.drain(&dlx.work);
        assert_eq!(got.len(), 1, "one message back in {}", dlx.work);
        let m = &got[0];
        assert_eq!(m.body, body);
        assert_eq!(m.message_id.as_deref(), Some("m-17"));
        assert_eq!(m.headers["tenant"], "acme");
        assert_eq!(m.headers["x-replayed-from-dlq"], "true");
        assert_eq!(m.headers["x-dead-letter-id"], id.as_str());
        assert_eq!(m.headers["x-dead-letter-reason"], "poison_message");
        assert!(
            !m.headers.keys().any(|k| k.contains("death")),
            "{:?}",
            m.headers
        );
    }
}

#[test]
fn a_message_that_cannot_be_stored_stops_the_capture_or_is_parked() {
    for backend in BACKENDS {
        let db = TestDb::migrated(backend);
        let mut dlx = Dlx::new(&[], &[]);
        let park = dlx.rabbit.queue("dlq_cap_park");
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
        let big = vec![b'x'; 2000];
        for b in [&b"ok 1"[..], &big, b"ok 2"] {
            dlx.publish(b, BasicProperties::default());
        }
        dlx.refuse(3, false);

        // Without a parking queue: the storable ones are stored, the capture stops there,
        // the big one stays queued.
        let r = capture(&db, &["--queue", &dlx.dlq, "--max-body-bytes", "1KiB"]);
        assert_eq!(r.code, 1, "{}", r.all());
        assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
        assert!(
            r.stderr.contains("cannot be stored") && r.stderr.contains("--park-queue"),
            "{}",
            r.stderr
        );
        assert_eq!(rows(&db), 2);
        assert_eq!(dlx.rabbit.count(&dlx.dlq), 1, "the big one is still queued");

        // A parking queue that does not exist is named (it was a replay's "returned ...
        // without an x-dead-letter-id header"), before any message is taken.
        let nosuch = unique("dlq_cap_nosuch_park");
        let r = capture(&db, &["--queue", &dlx.dlq, "--park-queue", &nosuch]);
        assert_eq!(r.code, 1, "{}", r.all());
        let want = format!("the park queue {nosuch} does not exist");
        assert!(r.stderr.contains(&want), "{}", r.stderr);
        assert!(!r.stderr.contains("x-dead-letter-id"), "{}", r.stderr);
        assert_eq!(dlx.rabbit.count(&dlx.dlq), 1, "still queued");

        // With one: over the limit, or refused by the database, both are moved aside.
        dlx.publish(b"refuse me", BasicProperties::default());
        dlx.refuse(1, false);
        wait_for(&dlx.rabbit, &dlx.dlq, 2);
        let r = capture(
            &db,
            &[
                "--queue",
                &dlx.dlq,
                "--max-body-bytes",
                "1KiB",
                "--park-queue",
                &park,
            ],
        );
        assert_eq!(r.code, 0, "{}", r.all());
        let sum = r.json();
        assert_eq!(sum["parked"], 2, "{sum}");
        assert_eq!(sum["captured"], 0, "{sum}");
        assert_eq!(dlx.rabbit.count(&dlx.dlq), 0);
        let mut parked = dlx.rabbit.drain(&park);
        parked.sort_by_key(|m| m.body.len());
        assert_eq!(parked.len(), 2);
        assert_eq!(parked[0].body, b"refuse me");
        let why = parked[0].headers["x-dlq-capture-error"].as_str().unwrap();
        assert!(why.contains("refused by policy"), "{why}");
        assert_eq!(parked[1].body, big);
        let why = parked[1].headers["x-dlq-capture-error"].as_str().unwrap();
        assert!(why.contains("over the limit"), "{why}");
        assert!(
            parked[1].headers.contains_key("x-death"),
            "a parked message keeps its headers"
        );
        assert_eq!(rows(&db), 2);
    }
}

#[test]
fn a_missing_queue_or_schema_is_one_clear_line() {
    let db = TestDb::migrated(Backend::Sqlite);
    let r = capture(&db, &["--queue", "dlq_cap_no_such_queue"]);
    assert_eq!(r.code, 1, "{}", r.all());
    assert!(r.stderr.contains("no queue"), "{}", r.stderr);
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);

    let bare = TestDb::new(Backend::Postgres);
    bare.sql(&[
        "CREATE TABLE dead_letters (id TEXT PRIMARY KEY, body BYTEA NOT NULL, \
         reason TEXT NOT NULL, attempts INTEGER NOT NULL, headers_json TEXT NOT NULL, \
         replayed_at TIMESTAMPTZ, replay_claim_owner TEXT, replay_claim_expires_at TIMESTAMPTZ, \
         last_replay_error TEXT)",
    ]);
    let r = capture(&bare, &["--queue", "anything"]);
    assert_eq!(r.code, 1, "{}", r.all());
    assert!(r.stderr.contains("dlq migrate"), "{}", r.stderr);
}

#[test]
fn sigkill_on_a_quorum_dead_letter_queue_then_a_rerun_stores_each_message_once() {
    // A quorum queue writes its own x-delivery-count on each redelivery: the capture key
    // must not see it, and attempts must not take it.
    let db = TestDb::migrated(Backend::Sqlite);
    let dlx = Dlx::new(&[], &[("x-queue-type", s("quorum"))]);
    let n = 2000;
    fill(&dlx, n);
    let mut child = db
        .cmd()
        .args(["capture", "--queue", &dlx.dlq, "--batch", "50"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until("a few batches", 60, || rows(&db) >= 300);
    child.kill().unwrap();
    child.wait().unwrap();
    let r = capture(&db, &["--queue", &dlx.dlq]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert_exactly_once(&db, n as i64);
    assert_eq!(dlx.rabbit.count(&dlx.dlq), 0);
    assert_eq!(
        db.scalar("SELECT count(*) FROM dead_letters WHERE attempts <> 1"),
        0,
        "each was rejected once, whatever the dead-letter queue counted"
    );
}

fn consumers(r: &Rabbit, queue: &str) -> u32 {
    r.block_on(r.channel().queue_declare(
        queue.into(),
        QueueDeclareOptions {
            passive: true,
            ..Default::default()
        },
        FieldTable::default(),
    ))
    .unwrap()
    .consumer_count()
}

#[test]
fn one_capture_per_queue_and_no_password_in_errors() {
    let db = TestDb::migrated(Backend::Sqlite);
    let dlx = Dlx::new(&[], &[]);
    let child = db
        .cmd()
        .args(["capture", "--queue", &dlx.dlq, "--follow"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until("the first capture consuming", 30, || {
        consumers(&dlx.rabbit, &dlx.dlq) == 1
    });
    let r = capture(&db, &["--queue", &dlx.dlq, "--follow"]);
    assert_eq!(r.code, 1, "{}", r.all());
    assert!(r.stderr.contains("already has a consumer"), "{}", r.stderr);

    // Messages arriving while it follows are stored as they come.
    dlx.publish(b"late", BasicProperties::default());
    dlx.refuse_only(1, false);
    wait_until("the late one stored", 30, || rows(&db) == 1);
    signal(&child, "INT");
    let out = Run::from(child.wait_with_output().unwrap());
    assert_eq!(out.code, 0, "{}", out.all());
    assert_eq!(out.json()["captured"], 1);

    let r = db.dlq_env(
        &["capture", "--queue", &dlx.dlq],
        &[(
            "DLQ_AMQP_URL",
            "amqp://guest:s3cr%40t-pw@127.0.0.1:5672/%2f",
        )],
    );
    assert_eq!(r.code, 1, "{}", r.all());
    assert!(r.stderr.contains("refused the login"), "{}", r.stderr);
    assert!(
        !r.all().contains("s3cr") && !r.all().contains("t-pw"),
        "{}",
        r.all()
    );
}

#[test]
fn the_documented_rights_are_enough_even_for_a_redelivered_batch() {
    // docs/security.md: a PostgreSQL role with the operator's grants, a RabbitMQ user that
    // may only read the dead-letter queue. The batch is redelivered, so the capture takes
    // its lock and looks keys up.
    let db = TestDb::migrated(Backend::Postgres);
    let dlx = Dlx::new(&[], &[]);
    for i in 0..3 {
        dlx.publish(format!("r{i}").as_bytes(), BasicProperties::default());
    }
    dlx.refuse(3, false);
    let r = &dlx.rabbit;
    r.block_on(async {
        let ch = r.channel();
        let mut c = ch
            .basic_consume(
                dlx.dlq.as_str().into(),
                "peek".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        let mut last = 0;
        for _ in 0..3 {
            last = c.next().await.unwrap().unwrap().delivery_tag;
        }
        ch.basic_cancel("peek".into(), BasicCancelOptions::default())
            .await
            .unwrap();
        ch.basic_nack(
            last,
            BasicNackOptions {
                multiple: true,
                requeue: true,
            },
        )
        .await
        .unwrap();
    });
    wait_for(r, &dlx.dlq, 3);

    let role = unique("dlq_cap_role");
    let name = db.url.rsplit('/').next().unwrap().to_string();
    db.sql(&[
        &format!("CREATE ROLE {role} LOGIN"),
        &format!(
            "GRANT SELECT, UPDATE (replayed_at, replay_claim_owner, replay_claim_expires_at, \
             last_replay_error) ON dead_letters TO {role}"
        ),
        &format!("GRANT INSERT ON dead_letters TO {role}"),
        &format!("GRANT SELECT, INSERT ON dead_letter_history TO {role}"),
    ]);
    let user = unique("dlq_cap_user");
    let ctl = |args: &[&str]| {
        std::process::Command::new("rabbitmqctl")
            .args(args)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let own_user = ctl(&["add_user", &user, "pw-capture"])
        && ctl(&[
            "set_permissions",
            "-p",
            "/",
            &user,
            "^$",
            "^$",
            &format!("^{}$", dlx.dlq),
        ]);
    let amqp = if own_user {
        format!("amqp://{user}:pw-capture@127.0.0.1:5672/%2f")
    } else {
        eprintln!("note: rabbitmqctl could not add a user; using guest");
        AMQP.to_string()
    };
    let out = db.dlq_env(
        &["capture", "--queue", &dlx.dlq],
        &[
            (
                "DLQ_DATABASE_URL",
                &format!("postgres://{role}@127.0.0.1:5432/{name}"),
            ),
            ("DLQ_AMQP_URL", &amqp),
        ],
    );
    if own_user {
        ctl(&["delete_user", &user]);
    }
    db.sql(&[
        &format!("REVOKE ALL ON dead_letters, dead_letter_history FROM {role}"),
        &format!("DROP ROLE {role}"),
    ]);
    assert_eq!(out.code, 0, "{}", out.all());
    assert_eq!(out.json()["captured"], 3, "{}", out.stdout);
    assert_exactly_once(&db, 3);
}

#[test]
fn a_locked_sqlite_database_during_follow_loses_nothing_and_doubles_nothing() {
    // SQLite does not go away like a server, but another writer can hold it for longer
    // than the lock timeout: each attempt fails, the broker keeps the messages, and the
    // capture goes on once the lock is released.
    use sqlx::Connection;
    let db = TestDb::migrated(Backend::Sqlite);
    let dlx = Dlx::new(&[], &[]);
    let n = 300;
    fill(&dlx, n);
    let rt = rt();
    let mut locker = rt
        .block_on(sqlx::SqliteConnection::connect(&db.url))
        .unwrap();
    rt.block_on(sqlx::query("BEGIN IMMEDIATE").execute(&mut locker))
        .unwrap();
    let child = db
        .cmd()
        .env("DLQ_LOCK_TIMEOUT", "300ms")
        .args(["capture", "--queue", &dlx.dlq, "--batch", "50", "--follow"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(rows(&db), 0);
    assert!(
        dlx.rabbit.count(&dlx.dlq) as usize >= n - 150,
        "at most a prefetch (3 x 50) is out, unacked"
    );
    rt.block_on(sqlx::query("ROLLBACK").execute(&mut locker))
        .unwrap();
    wait_until("every message stored", 60, || rows(&db) >= n as i64);
    wait_until("the queue acked", 30, || dlx.rabbit.count(&dlx.dlq) == 0);
    signal(&child, "TERM");
    let out = Run::from(child.wait_with_output().unwrap());
    assert_eq!(out.code, 0, "{}", out.all());
    assert!(out.stderr.contains("locked"), "{}", out.stderr);
    assert!(out.json()["reconnects"].as_i64().unwrap() >= 1);
    assert_exactly_once(&db, n as i64);
}
