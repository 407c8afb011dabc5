//! Benchmark baseline: consumes N messages with a bounded prefetch and acks them in
//! batches (one `multiple` ack per BATCH), storing nothing: the ceiling `dlq capture` is
//! compared with (benches/run.py). The prefetch is capture's: the batches it stores at
//! once, plus two.
//! Usage: bare_consumer QUEUE N BATCH; prints the elapsed seconds.

use futures_util::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [queue, n, batch] = args.as_slice() else {
        return Err("usage: bare_consumer QUEUE N BATCH".into());
    };
    let n: u64 = n.parse()?;
    let batch: u64 = batch.parse()?;
    let url = std::env::var("DLQ_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    let started = std::time::Instant::now();
    let conn = Connection::connect(&url, ConnectionProperties::default()).await?;
    let ch = conn.create_channel().await?;
    ch.basic_qos(
        (batch * (dlq::capture::STORING as u64 + 2)).min(u16::MAX as u64) as u16,
        BasicQosOptions::default(),
    )
    .await?;
    let mut consumer = ch
        .basic_consume(
            queue.as_str().into(),
            "bare-consumer".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut got = 0u64;
    let mut bytes = 0usize;
    while got < n {
        let Some(d) = consumer.next().await else {
            return Err("the consumer ended".into());
        };
        let d = d?;
        got += 1;
        bytes += d.data.len();
        if got.is_multiple_of(batch) || got == n {
            ch.basic_ack(d.delivery_tag, BasicAckOptions { multiple: true })
                .await?;
        }
    }
    println!("{:.6}", started.elapsed().as_secs_f64());
    eprintln!("{got} messages, {bytes} bytes");
    conn.close(200, "bye".into()).await?;
    Ok(())
}
