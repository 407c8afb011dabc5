//! RabbitMQ for tests: unique queues and exchanges (deleted on drop), vhosts of a test's
//! own, and messages as a consumer receives them.

use super::*;
use lapin::options::*;
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};

/// A message as a consumer received it.
#[derive(Debug)]
pub struct Received {
    pub body: Vec<u8>,
    pub headers: serde_json::Map<String, serde_json::Value>,
    pub message_id: Option<String>,
    pub delivery_mode: Option<u8>,
    pub timestamp: Option<u64>,
}

/// RabbitMQ helper for tests: unique queues, deleted on drop.
pub struct Rabbit {
    rt: tokio::runtime::Runtime,
    conn: Connection,
    channel: lapin::Channel,
    queues: Vec<String>,
    exchanges: Vec<String>,
}

impl Rabbit {
    pub fn new() -> Rabbit {
        Rabbit::on(AMQP)
    }

    /// Connected to `url` (another vhost, say).
    pub fn on(url: &str) -> Rabbit {
        let rt = rt();
        let (conn, channel) = rt.block_on(async {
            let conn = Connection::connect(url, ConnectionProperties::default())
                .await
                .expect("RabbitMQ at 127.0.0.1:5672");
            let channel = conn.create_channel().await.unwrap();
            (conn, channel)
        });
        Rabbit {
            rt,
            conn,
            channel,
            queues: vec![],
            exchanges: vec![],
        }
    }

    /// The helper's channel, for tests that drive the broker themselves.
    pub fn channel(&self) -> &lapin::Channel {
        &self.channel
    }

    /// Runs a future on the helper's runtime.
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    pub fn queue_with(&mut self, prefix: &str, args: FieldTable) -> String {
        let name = unique(prefix);
        self.rt
            .block_on(self.channel.queue_declare(
                name.as_str().into(),
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                args,
            ))
            .unwrap();
        self.queues.push(name.clone());
        name
    }

    pub fn queue(&mut self, prefix: &str) -> String {
        self.queue_with(prefix, FieldTable::default())
    }

    pub fn exchange(&mut self, prefix: &str) -> String {
        self.exchange_of(prefix, lapin::ExchangeKind::Direct)
    }

    pub fn exchange_of(&mut self, prefix: &str, kind: lapin::ExchangeKind) -> String {
        let name = unique(prefix);
        self.rt
            .block_on(self.channel.exchange_declare(
                name.as_str().into(),
                kind,
                ExchangeDeclareOptions::default(),
                FieldTable::default(),
            ))
            .unwrap();
        self.exchanges.push(name.clone());
        name
    }

    pub fn bind(&self, queue: &str, exchange: &str, key: &str) {
        self.rt
            .block_on(self.channel.queue_bind(
                queue.into(),
                exchange.into(),
                key.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            ))
            .unwrap();
    }

    /// Everything in the queue now (acked).
    pub fn drain(&self, queue: &str) -> Vec<Received> {
        let mut out = Vec::new();
        self.rt.block_on(async {
            loop {
                let got = self
                    .channel
                    .basic_get(queue.into(), BasicGetOptions { no_ack: true })
                    .await
                    .unwrap();
                let Some(msg) = got else { break };
                let props = msg.delivery.properties.clone();
                let headers = props
                    .headers()
                    .as_ref()
                    .map(field_table_json)
                    .unwrap_or_default();
                out.push(Received {
                    body: msg.delivery.data.clone(),
                    headers,
                    message_id: props.message_id().as_ref().map(|s| s.as_str().to_string()),
                    delivery_mode: *props.delivery_mode(),
                    timestamp: *props.timestamp(),
                });
            }
        });
        out
    }

    pub fn count(&self, queue: &str) -> u32 {
        self.declared(queue).message_count()
    }

    /// The consumers the broker still lists on the queue.
    pub fn consumers(&self, queue: &str) -> u32 {
        self.declared(queue).consumer_count()
    }

    /// Waits until the broker has dropped the consumers of a killed process: a capture
    /// rerun before that is refused as a second capture.
    pub fn wait_for_no_consumer(&self, queue: &str) {
        wait_until("the broker to drop the killed consumer", 60, || {
            self.consumers(queue) == 0
        });
    }

    fn declared(&self, queue: &str) -> lapin::Queue {
        self.rt
            .block_on(self.channel.queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            ))
            .unwrap()
    }

    /// Declares a durable queue with a fixed name, or empties it if it exists.
    pub fn purge_or_declare(&self, name: &str) {
        self.rt.block_on(async {
            self.channel
                .queue_declare(
                    name.into(),
                    QueueDeclareOptions {
                        durable: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                )
                .await
                .unwrap();
            self.channel
                .queue_purge(name.into(), QueuePurgeOptions::default())
                .await
                .unwrap();
        });
    }

    pub fn delete(&self, name: &str) {
        let _ = self.rt.block_on(
            self.channel
                .queue_delete(name.into(), QueueDeleteOptions::default()),
        );
    }

    pub fn publish_raw(&self, queue: &str, body: &[u8]) {
        self.rt
            .block_on(async {
                self.channel
                    .basic_publish(
                        "".into(),
                        queue.into(),
                        BasicPublishOptions::default(),
                        body,
                        BasicProperties::default(),
                    )
                    .await
            })
            .unwrap();
    }
}

impl Drop for Rabbit {
    fn drop(&mut self) {
        let ch = self.channel.clone();
        let qs = std::mem::take(&mut self.queues);
        let xs = std::mem::take(&mut self.exchanges);
        // Bounded: lapin can wait for ever on a connection whose node went away.
        let bounded = std::time::Duration::from_secs(5);
        self.rt.block_on(async move {
            for q in qs {
                let _ = tokio::time::timeout(
                    bounded,
                    ch.queue_delete(q.as_str().into(), QueueDeleteOptions::default()),
                )
                .await;
            }
            for x in xs {
                let _ = tokio::time::timeout(
                    bounded,
                    ch.exchange_delete(x.as_str().into(), ExchangeDeleteOptions::default()),
                )
                .await;
            }
        });
        let conn = &self.conn;
        let _ = self.rt.block_on(async move {
            tokio::time::timeout(bounded, conn.close(200, "bye".into())).await
        });
    }
}

fn field_table_json(t: &FieldTable) -> serde_json::Map<String, serde_json::Value> {
    t.inner()
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), amqp_json(v)))
        .collect()
}

fn amqp_json(v: &lapin::types::AMQPValue) -> serde_json::Value {
    use lapin::types::AMQPValue::*;
    match v {
        LongString(s) => {
            serde_json::Value::String(String::from_utf8_lossy(s.as_bytes()).into_owned())
        }
        ShortString(s) => serde_json::Value::String(s.as_str().to_string()),
        Boolean(b) => (*b).into(),
        LongLongInt(i) => (*i).into(),
        LongInt(i) => (*i).into(),
        ShortInt(i) => (*i).into(),
        Double(d) => (*d).into(),
        FieldTable(t) => serde_json::Value::Object(field_table_json(t)),
        FieldArray(a) => a.as_slice().iter().map(amqp_json).collect(),
        Void => serde_json::Value::Null,
        other => serde_json::Value::String(format!("{other:?}")),
    }
}

/// A vhost of the test's own on the local broker, deleted on drop: for a test that must
/// use fixed queue names (the runbooks show the examples' real queues). Made with
/// `rabbitmqctl`; where that cannot run, the test falls back to the default vhost.
pub struct Vhost {
    name: Option<String>,
    pub url: String,
}

impl Vhost {
    pub fn new() -> Vhost {
        let name = unique("dlq-test");
        let ctl = |args: &[&str]| {
            std::process::Command::new("rabbitmqctl")
                .args(args)
                .output()
                .is_ok_and(|o| o.status.success())
        };
        if ctl(&["add_vhost", &name])
            && ctl(&["set_permissions", "-p", &name, "guest", ".*", ".*", ".*"])
        {
            let url = format!("amqp://guest:guest@127.0.0.1:5672/{name}");
            return Vhost {
                name: Some(name),
                url,
            };
        }
        eprintln!("note: rabbitmqctl could not make a vhost; using the default one");
        Vhost {
            name: None,
            url: AMQP.to_string(),
        }
    }

    /// Whether this is a vhost of the test's own (else the shared default one).
    pub fn is_own(&self) -> bool {
        self.name.is_some()
    }
}

impl Drop for Vhost {
    fn drop(&mut self) {
        if let Some(name) = &self.name {
            let _ = std::process::Command::new("rabbitmqctl")
                .args(["delete_vhost", name])
                .output();
        }
    }
}

/// How many times each dead letter arrived, by the `x-dead-letter-id` a replay sets.
pub fn per_id(msgs: &[Received]) -> std::collections::HashMap<String, usize> {
    let mut m = std::collections::HashMap::new();
    for x in msgs {
        *m.entry(x.headers["x-dead-letter-id"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    m
}

/// Arguments of a queue that refuses every publish (max length 0, reject-publish): the
/// broker nacks what is routed to it.
pub fn refusing_queue_args() -> FieldTable {
    let mut args = FieldTable::default();
    args.insert(
        "x-max-length".into(),
        lapin::types::AMQPValue::LongLongInt(0),
    );
    args.insert(
        "x-overflow".into(),
        lapin::types::AMQPValue::LongString("reject-publish".into()),
    );
    args
}
