//! One session with the broker: connect, check the queue, set the prefetch, consume
//! exclusively; and the small waits on that channel (cancel, is the queue empty). Every
//! await is bounded, and refusals are read by reply code.

use super::intake::prefetch_for;
use super::{CaptureOptions, CaptureSummary, Stopped};
use crate::broker::connect::open_first_connection;
use crate::broker::reply::{is_not_found, refusal, Refusal};
use crate::error::{DlqError, Result};
use crate::secret::scrub;
use lapin::options::{
    BasicCancelOptions, BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions,
};
use lapin::types::{FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Connection};
use std::time::Duration;
use tokio::time::timeout;

/// Why a session with the broker ended.
pub(super) enum SessionEnd {
    Done(Stopped),
    /// The broker or database went away: reconnect (`--follow`) or fail.
    Lost(String),
}

/// A delivery held until its batch is committed.
pub(super) struct Held {
    pub tag: u64,
    pub body: Vec<u8>,
    pub properties: BasicProperties,
    pub redelivered: bool,
}

pub(super) struct Session {
    conn: Connection,
    pub channel: Channel,
    pub consumer: lapin::Consumer,
    pub host: String,
    /// The prefetch the largest body seen asked for when it opened, before `--max` cut it.
    pub asked: u64,
    /// Messages `--max` allowed when it opened (`u64::MAX`: no `--max`).
    pub room: u64,
}

impl Session {
    pub async fn close(self, wait: Duration) {
        let _ = timeout(wait, self.conn.close(200, "bye".into())).await;
    }
}

pub(super) fn broker_text(e: &lapin::Error) -> String {
    scrub(&e.to_string())
}

/// Which session of a run this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Which {
    /// The first: every failure is an error.
    First,
    /// After a session was lost: failures are reported for a reconnect.
    Reconnect,
}

/// Connects, checks the queue and starts consuming. `Ok(None)`: the queue is empty and
/// the run is not `--follow` (nothing to do). On the first session every failure is an
/// error; later ones are reported for a reconnect.
pub(super) async fn open_session(
    opts: &CaptureOptions,
    summary: &CaptureSummary,
    which: Which,
    largest: Option<usize>,
) -> Result<Option<Session>> {
    let (conn, host, _) = open_first_connection(&opts.urls, &opts.connect)
        .await
        .map_err(|e| DlqError::other(e.render(&*opts.spell)))?;
    let wait = opts.connect.connect_timeout;
    let opened = Opening {
        opts,
        host: &host,
        wait,
    }
    .consume(&conn, summary, which, largest)
    .await;
    match opened {
        Ok(Some((channel, consumer, room))) => Ok(Some(Session {
            conn,
            channel,
            consumer,
            host,
            asked: prefetch_for(opts, largest),
            room,
        })),
        other => {
            let _ = timeout(wait, conn.close(200, "bye".into())).await;
            other.map(|_| None)
        }
    }
}

/// The steps of opening a session, each bounded by the connect timeout.
struct Opening<'a> {
    opts: &'a CaptureOptions,
    host: &'a str,
    wait: Duration,
}

impl Opening<'_> {
    fn fail(&self, what: &str, e: String) -> DlqError {
        DlqError::other(format!("{what} on {}: {e}", self.host))
    }

    /// Awaits one step of the opening; a broker error or a timeout names the step.
    async fn step<T>(
        &self,
        what: &str,
        fut: impl std::future::Future<Output = lapin::Result<T>>,
    ) -> Result<std::result::Result<T, lapin::Error>> {
        match timeout(self.wait, fut).await {
            Ok(r) => Ok(r),
            Err(_) => Err(self.fail(what, "timed out".into())),
        }
    }

    async fn consume(
        &self,
        conn: &Connection,
        summary: &CaptureSummary,
        which: Which,
        largest: Option<usize>,
    ) -> Result<Option<(Channel, lapin::Consumer, u64)>> {
        let opts = self.opts;
        let channel = self
            .step("opening a channel", conn.create_channel())
            .await?
            .map_err(|e| self.fail("opening a channel", broker_text(&e)))?;
        let q = ShortString::try_new(opts.queue.clone()).map_err(|_| {
            DlqError::usage(format!(
                "queue {:?}: a queue name is at most 255 bytes",
                opts.queue
            ))
        })?;
        let (count, consumers) = self.declared(&channel, q.clone()).await?;
        // A quorum queue ignores an exclusive consume: the count says what it would.
        if which == Which::First && consumers > 0 {
            return Err(self.taken(&format!("{consumers} consumer(s) on it")));
        }
        if count == 0 && !opts.follow {
            return Ok(None);
        }
        let remaining = opts
            .max
            .map(|m| m.saturating_sub(summary.handled()))
            .unwrap_or(u64::MAX);
        // What the budget allows for the largest body seen (see `intake`); never more
        // than --max asks for, so that no message is taken only to be handed back.
        let prefetch = prefetch_for(opts, largest)
            .min(remaining)
            .clamp(1, u16::MAX as u64) as u16;
        self.step(
            "setting the prefetch",
            channel.basic_qos(prefetch, BasicQosOptions::default()),
        )
        .await?
        .map_err(|e| self.fail("setting the prefetch", broker_text(&e)))?;
        let consumer = self.start_consuming(&channel, q, which).await?;
        tracing::debug!(host = %self.host, queue = %opts.queue, prefetch, "consuming");
        Ok(Some((channel, consumer, remaining)))
    }

    /// The queue's ready messages and consumers, by a passive declare; a missing queue is
    /// named.
    async fn declared(&self, channel: &Channel, q: ShortString) -> Result<(u32, u32)> {
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        let declared = channel.queue_declare(q, passive, FieldTable::default());
        match self.step("checking the queue", declared).await? {
            Ok(q) => Ok((q.message_count(), q.consumer_count())),
            Err(e) if is_not_found(&e) => Err(DlqError::other(format!(
                "there is no queue {:?} on {} (in this vhost)",
                self.opts.queue, self.host
            ))),
            Err(e) => Err(self.fail("checking the queue", broker_text(&e))),
        }
    }

    /// The queue is another consumer's: capture is refused.
    fn taken(&self, why: &str) -> DlqError {
        DlqError::other(format!(
            "queue {:?} on {} already has a consumer, and capture consumes exclusively (is another dlq capture running?): {why}",
            self.opts.queue, self.host
        ))
    }

    /// An exclusive consumer: a second capture of the same queue is refused (403).
    async fn start_consuming(
        &self,
        channel: &Channel,
        q: ShortString,
        which: Which,
    ) -> Result<lapin::Consumer> {
        let consume = consume_exclusive(channel, q);
        match self.step("consuming", consume).await? {
            Ok(c) => Ok(c),
            Err(e) if which == Which::First && refusal(&e) == Some(Refusal::AccessRefused) => {
                Err(self.taken(&broker_text(&e)))
            }
            Err(e) => Err(self.fail("consuming", broker_text(&e))),
        }
    }
}

/// Consumes `q` exclusively under a new tag: while it consumes, no one else can.
pub(super) fn consume_exclusive(
    channel: &Channel,
    q: ShortString,
) -> impl std::future::Future<Output = lapin::Result<lapin::Consumer>> + '_ {
    let tag = format!("dlq-capture-{}", uuid::Uuid::new_v4().simple());
    let exclusive = BasicConsumeOptions {
        exclusive: true,
        ..BasicConsumeOptions::default()
    };
    channel.basic_consume(q, tag.as_str().into(), exclusive, FieldTable::default())
}

/// A delivery from the consumer stream, or why the stream gave none.
pub(super) fn held(
    next: Option<lapin::Result<lapin::message::Delivery>>,
    host: &str,
) -> std::result::Result<Held, String> {
    match next {
        Some(Ok(d)) => Ok(Held {
            tag: d.delivery_tag,
            body: d.data,
            properties: d.properties,
            redelivered: d.redelivered,
        }),
        Some(Err(e)) => Err(format!(
            "lost the broker connection to {host} ({})",
            broker_text(&e)
        )),
        None => Err(format!(
            "the broker {host} ended the consumer (queue deleted, or the connection closed)"
        )),
    }
}

/// Stops the deliveries of consumer `tag`; what was prefetched and not taken goes back
/// when the channel closes.
pub(super) async fn cancel(channel: &Channel, tag: ShortString, opts: &CaptureOptions) {
    let _ = timeout(
        opts.confirm_timeout,
        channel.basic_cancel(tag, BasicCancelOptions::default()),
    )
    .await;
}

/// Whether the queue has no ready message (asked after a quiet moment with nothing in hand).
pub(super) async fn queue_is_empty(session: &Session, opts: &CaptureOptions) -> Result<bool> {
    let q = ShortString::from(opts.queue.clone());
    match timeout(
        opts.confirm_timeout,
        session.channel.queue_declare(
            q,
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        ),
    )
    .await
    {
        Ok(Ok(q)) => Ok(q.message_count() == 0),
        // The loop sees the lost connection through the consumer.
        _ => Ok(false),
    }
}
