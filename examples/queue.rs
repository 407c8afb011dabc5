//! A stand-in for the consuming service in the quickstart and the runbooks:
//! `cargo run --example queue -- declare NAME` declares a durable queue;
//! `cargo run --example queue -- drain NAME` prints and removes what arrived there;
//! `queue count NAME` prints how many messages are ready;
//! `queue dead-letter-into NAME DLQ` declares NAME so that every message published to it
//! expires at once and is dead-lettered into DLQ (with a real x-death), as benches/run.py
//! fills a dead-letter queue.
//! The AMQP URL comes from DLQ_AMQP_URL (default: the local broker).

use lapin::options::{BasicGetOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (verb, name, dlq) =
        match args.as_slice() {
            [v, n] => (v.as_str(), n.as_str(), None),
            [v, n, d] if v == "dead-letter-into" => (v.as_str(), n.as_str(), Some(d.as_str())),
            _ => return Err(
                "usage: queue declare|drain|delete|count NAME, or queue dead-letter-into NAME DLQ"
                    .into(),
            ),
        };
    let url = std::env::var("DLQ_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    let conn = Connection::connect(&url, ConnectionProperties::default()).await?;
    let ch = conn.create_channel().await?;
    match verb {
        "declare" => {
            ch.queue_declare(
                name.into(),
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await?;
            println!("queue {name} declared");
        }
        "drain" => {
            let mut n = 0;
            while let Some(m) = ch
                .basic_get(name.into(), BasicGetOptions { no_ack: true })
                .await?
            {
                n += 1;
                let p = &m.delivery.properties;
                println!(
                    "message_id={} x-dead-letter-id={} bytes={}",
                    p.message_id().as_ref().map(|s| s.as_str()).unwrap_or("-"),
                    p.headers()
                        .as_ref()
                        .and_then(|h| h.inner().get("x-dead-letter-id").cloned())
                        .map(|v| match v {
                            lapin::types::AMQPValue::LongString(s) =>
                                String::from_utf8_lossy(s.as_bytes()).into_owned(),
                            other => format!("{other:?}"),
                        })
                        .unwrap_or_else(|| "-".into()),
                    m.delivery.data.len()
                );
            }
            println!("{n} messages drained from {name}");
        }
        "count" => {
            let q = ch
                .queue_declare(
                    name.into(),
                    QueueDeclareOptions {
                        passive: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                )
                .await?;
            println!("{}", q.message_count());
        }
        "dead-letter-into" => {
            let mut args = FieldTable::default();
            let dlq = dlq.unwrap_or_default();
            args.insert(
                "x-dead-letter-exchange".into(),
                AMQPValue::LongString("".into()),
            );
            args.insert(
                "x-dead-letter-routing-key".into(),
                AMQPValue::LongString(dlq.into()),
            );
            args.insert("x-message-ttl".into(), AMQPValue::LongInt(0));
            ch.queue_declare(
                name.into(),
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                args,
            )
            .await?;
            println!("queue {name} declared: what is published to it goes to {dlq}");
        }
        "delete" => {
            ch.queue_delete(name.into(), QueueDeleteOptions::default())
                .await?;
            println!("queue {name} deleted");
        }
        other => return Err(format!("unknown verb {other}").into()),
    }
    conn.close(200, "bye".into()).await?;
    Ok(())
}
