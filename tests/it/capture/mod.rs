//! `dlq capture`: messages dead-lettered for real by RabbitMQ captured into both stores;
//! crashes, lost connections and lost commits; what cannot be stored; capture keys.

mod crashes;
mod dead_letters;
mod held;
mod keys;
mod refusals;

use crate::common::*;
use futures_util::StreamExt;
use lapin::options::*;
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use lapin::BasicProperties;
use serde_json::Value;
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

/// Takes `n` deliveries on a connection of its own without acking, then closes it: the
/// broker puts them back flagged `redelivered` (as after a consumer crash before commit).
pub(super) fn deliver_and_drop(r: &Rabbit, queue: &str, n: usize) {
    r.block_on(async {
        let conn = lapin::Connection::connect(AMQP, lapin::ConnectionProperties::default())
            .await
            .unwrap();
        let ch = conn.create_channel().await.unwrap();
        let mut c = ch
            .basic_consume(
                queue.into(),
                "peek".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        for _ in 0..n {
            let d = tokio::time::timeout(Duration::from_secs(10), c.next())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            assert!(!d.redelivered);
        }
        conn.close(200, "bye".into()).await.unwrap();
    });
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

/// A transaction of the test's own holding `dead_letters` in SHARE mode: every writer
/// waits until [`WritesHeld::release`].
struct WritesHeld {
    rt: tokio::runtime::Runtime,
    conn: sqlx::PgConnection,
}

impl WritesHeld {
    fn on(db: &TestDb) -> WritesHeld {
        use sqlx::Connection;
        let rt = rt();
        let mut conn = rt.block_on(sqlx::PgConnection::connect(&db.url)).unwrap();
        rt.block_on(async {
            sqlx::query("BEGIN").execute(&mut conn).await.unwrap();
            sqlx::query("LOCK TABLE dead_letters IN SHARE MODE")
                .execute(&mut conn)
                .await
                .unwrap();
        });
        WritesHeld { rt, conn }
    }

    fn release(mut self) {
        self.rt
            .block_on(sqlx::query("ROLLBACK").execute(&mut self.conn))
            .unwrap();
    }
}

/// How many of dlq's statements wait for a lock; `and` narrows them (SQL, or "").
fn waiting_for_a_lock(db: &TestDb, and: &str) -> i64 {
    db.scalar(&format!(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
         AND application_name = 'dlq' AND wait_event_type = 'Lock' {and}"
    ))
}

/// Whether `child` exits within `secs`.
fn exits_within(child: &mut std::process::Child, secs: u64) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
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
