//! A stand-in for the consuming service in the quickstart and the runbooks:
//! `cargo run --example queue -- declare NAME` declares a durable queue;
//! `cargo run --example queue -- drain NAME` prints and removes what arrived there.
//! The AMQP URL comes from DLQ_AMQP_URL (default: the local broker).

use lapin::options::{BasicGetOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (verb, name) = match args.as_slice() {
        [v, n] => (v.as_str(), n.as_str()),
        _ => return Err("usage: queue declare|drain|delete NAME".into()),
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
