//! The deliveries of one session, and a prefetch that follows the largest body seen.
//!
//! RabbitMQ counts a prefetch in messages and ignores one in bytes, so a prefetch that
//! suits 1 KiB bodies lets gigabytes of large ones into the consumer's buffer. Capture
//! starts with a few messages, and when a body larger than any before shows how many the
//! budget (`--max-held-bytes`) holds, it cancels its consumer and consumes again with
//! that prefetch (per consumer: quorum queues refuse a global one). Deliveries already
//! received stay unacked on the same channel; they are taken before the new consumer's
//! and acked by their tags as any other.

use super::session::{broker_text, cancel, consume_exclusive, held, Held, Session};
use super::CaptureOptions;
use futures_util::StreamExt;
use lapin::options::BasicQosOptions;
use std::collections::VecDeque;
use tokio::time::timeout;

/// The first prefetch of a run, before any body is seen, is at most this many messages.
const FIRST_AT_MOST: u64 = 16;

/// The prefetch when nothing bounds it but the batches: room for the batches being
/// stored, the one being received and the next one on its way.
pub(super) fn full_prefetch(opts: &CaptureOptions) -> u64 {
    (opts.batch.get() as u64 * (super::batch::STORING as u64 + 2)).min(u16::MAX as u64)
}

/// The prefetch the budget allows for bodies of up to `largest` bytes; before any body is
/// seen, as many of the largest storable body as the budget holds, and only a few.
pub(super) fn prefetch_for(opts: &CaptureOptions, largest: Option<usize>) -> u64 {
    let full = full_prefetch(opts);
    match largest {
        None => ((opts.max_held_bytes / opts.max_body_bytes.max(1)) as u64)
            .clamp(1, FIRST_AT_MOST.min(full)),
        Some(n) => ((opts.max_held_bytes / n.max(1)) as u64).clamp(1, full),
    }
}

/// A batch is closed once its bodies reach this: its share of the budget, so that the
/// batches being stored and received stay within it too.
pub(super) fn batch_bytes(opts: &CaptureOptions) -> usize {
    let share = opts.max_held_bytes / (super::batch::STORING + 2);
    share.clamp(1, super::MAX_BATCH_BYTES)
}

/// Where a session's deliveries come from.
pub(super) struct Intake {
    consumer: Option<lapin::Consumer>,
    /// Deliveries of a cancelled consumer, not yet taken into a batch.
    pending: VecDeque<Held>,
    /// What the largest body seen asked for, before `--max` cut it.
    asked: u64,
    /// Messages `--max` allowed this session when it opened (`u64::MAX`: no `--max`).
    room: u64,
    /// Deliveries received this session, from every consumer.
    delivered: u64,
}

impl Intake {
    pub fn new(session: &Session) -> Intake {
        Intake {
            consumer: Some(session.consumer.clone()),
            pending: VecDeque::new(),
            asked: session.asked,
            room: session.room,
            delivered: 0,
        }
    }

    /// The next delivery: a cancelled consumer's first. Without a consumer (`--max`
    /// reached) it waits forever; the caller's other waits end it.
    pub async fn next(&mut self, host: &str) -> Result<Held, String> {
        if let Some(h) = self.pending.pop_front() {
            return Ok(h);
        }
        let Some(consumer) = self.consumer.as_mut() else {
            return std::future::pending().await;
        };
        let h = held(consumer.next().await, host)?;
        self.delivered += 1;
        Ok(h)
    }

    /// A delivery already received, if any.
    pub fn try_next(&mut self, host: &str) -> Option<Result<Held, String>> {
        use futures_util::FutureExt;
        if let Some(h) = self.pending.pop_front() {
            return Some(Ok(h));
        }
        let next = self.consumer.as_mut()?.next().now_or_never()?;
        self.delivered += u64::from(next.as_ref().is_some_and(|r| r.is_ok()));
        Some(held(next, host))
    }

    /// Stops the deliveries (the run ends).
    pub async fn cancel(&self, session: &Session, opts: &CaptureOptions) {
        if let Some(c) = &self.consumer {
            cancel(&session.channel, c.tag(), opts).await;
        }
    }

    /// After a body of `largest` bytes, the largest yet: consumes again when the budget
    /// now asks for a prefetch at least twice smaller or larger than the current one.
    pub async fn follow(
        &mut self,
        session: &Session,
        opts: &CaptureOptions,
        largest: usize,
    ) -> Result<(), String> {
        let want = prefetch_for(opts, Some(largest));
        if want < self.asked * 2 && want * 2 > self.asked {
            return Ok(());
        }
        let Some(old) = self.consumer.take() else {
            return Ok(());
        };
        self.drain(session, opts, old).await?;
        self.asked = want;
        // Never more than `--max` still allows, counting what is in hand.
        let prefetch = want.min(self.room.saturating_sub(self.delivered));
        if prefetch == 0 {
            return Ok(());
        }
        let host = &session.host;
        let qos = session
            .channel
            .basic_qos(prefetch as u16, BasicQosOptions::default());
        match timeout(opts.confirm_timeout, qos).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                return Err(format!(
                    "setting the prefetch on {host} failed ({})",
                    broker_text(&e)
                ))
            }
            Err(_) => return Err(format!("setting the prefetch on {host} timed out")),
        }
        let q = opts.queue.as_str().into();
        let consumer = match timeout(opts.confirm_timeout, consume_exclusive(&session.channel, q)).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(format!(
                "could not consume from {:?} on {host} again after changing the prefetch for bodies of {largest} bytes (has another consumer taken the queue meanwhile? is another dlq capture running?): {}",
                opts.queue,
                broker_text(&e)
            )),
            Err(_) => return Err(format!("consuming again on {host} timed out")),
        };
        tracing::debug!(host = %host, prefetch, largest, "consuming again");
        self.consumer = Some(consumer);
        Ok(())
    }

    /// Cancels `old` and keeps what it had received: after the broker's cancel-ok its
    /// stream gives every delivery sent before, then ends.
    async fn drain(
        &mut self,
        session: &Session,
        opts: &CaptureOptions,
        mut old: lapin::Consumer,
    ) -> Result<(), String> {
        let host = &session.host;
        let cancelled = session.channel.basic_cancel(old.tag(), Default::default());
        match timeout(opts.confirm_timeout, cancelled).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(cancel_failed(host, &e)),
            Err(_) => return Err(format!("cancelling the consumer on {host} timed out")),
        }
        loop {
            match timeout(opts.confirm_timeout, old.next()).await {
                Ok(None) => return Ok(()),
                Ok(next) => {
                    self.pending.push_back(held(next, host)?);
                    self.delivered += 1;
                }
                Err(_) => return Err(format!("the cancelled consumer on {host} did not end")),
            }
        }
    }
}

fn cancel_failed(host: &str, e: &lapin::Error) -> String {
    format!(
        "lost the broker connection to {host} while cancelling the consumer ({})",
        broker_text(e)
    )
}
