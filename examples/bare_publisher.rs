//! Benchmark baseline: publishes N copies of a body with pipelined publisher confirms and
//! no database, the ceiling `dlq replay --plan` is compared with (benches/run.py).
//! Usage: bare_publisher QUEUE N BODY_BYTES; prints the elapsed seconds.

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Confirmation, Connection, ConnectionProperties};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [queue, n, size] = args.as_slice() else {
        return Err("usage: bare_publisher QUEUE N BODY_BYTES".into());
    };
    let n: usize = n.parse()?;
    let body = vec![b'x'; size.parse()?];
    let url = std::env::var("DLQ_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    let conn = Connection::connect(&url, ConnectionProperties::default()).await?;
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    let started = std::time::Instant::now();
    let mut pending = Vec::with_capacity(n);
    for _ in 0..n {
        let c = ch
            .basic_publish(
                "".into(),
                queue.as_str().into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..Default::default()
                },
                &body,
                BasicProperties::default().with_delivery_mode(2),
            )
            .await?;
        pending.push(c);
    }
    for c in pending {
        match c.await? {
            Confirmation::Ack(None) => {}
            other => return Err(format!("not confirmed: {other:?}").into()),
        }
    }
    println!("{:.6}", started.elapsed().as_secs_f64());
    conn.close(200, "bye".into()).await?;
    Ok(())
}
