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
                let d = match tokio::time::timeout(Duration::from_millis(200), consumer.next())
                    .await
                {
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
                } else if refused % 250 == 0 || refused == n {
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
        wait_for(&self.rabbit, &self.dlq, n as u32);
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
        assert!(Instant::now() < deadline, "{queue} holds {c} of {n} messages");
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

fn b64(b: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(b)
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
            ("list", AMQPValue::FieldArray(FieldArray::from(vec![s("a"), AMQPValue::LongInt(1)]))),
            ("raw", AMQPValue::LongString(LongString::from(vec![0xff_u8, 0x00, 0x41]))),
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
        assert_eq!(first["event_id"], "msg-1", "message_id when nothing else gives one");

        let second = by_body(br#"{"event_id":"evt-2","amount":"x"}"#);
        assert_eq!(second["event_id"], "evt-2", "the body's event_id wins over message_id");
        assert_eq!(second["error"], Value::Null);
        let third = by_body(b"plain text");
        assert_eq!(third["event_id"], Value::Null);

        // Nothing left: a second run captures nothing.
        let again = capture(&db, &["--queue", &dlx.dlq]);
        assert_eq!(again.code, 0, "{}", again.all());
        assert_eq!(again.json()["captured"], 0);
    }
}
