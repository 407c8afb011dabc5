//! Publishing with confirms: one connection, one channel in confirm mode, every wait
//! bounded. lapin can hang when the server closes the connection and when a vhost is
//! missing, hence a timeout around every await. Waiting for the confirms and judging
//! them is [`super::confirm`]; the run's connection over the nodes is [`super::run`].

use super::connect::{open_connection, ConnectError, ConnectOptions, TlsFiles};
use super::reply::is_not_found;
use crate::secret::{scrub, SecretUrl};
use crate::spell::{words, Words};
use crate::topology::BrokerTopology;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::types::{FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Connection, PublisherConfirm};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::time::{timeout, Instant};

/// Where a replay goes. An empty exchange is the default exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub exchange: String,
    pub routing_key: String,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ex = if self.exchange.is_empty() {
            "(default exchange)"
        } else {
            &self.exchange
        };
        write!(f, "exchange {ex} routing key {}", self.routing_key)
    }
}

#[derive(Debug, Clone)]
pub struct PublisherOptions {
    pub connect_timeout: Duration,
    pub confirm_timeout: Duration,
    /// Shown in the broker's management UI.
    pub connection_name: String,
    pub tls: TlsFiles,
    /// Whether a nack on the default exchange is certain (see [`BrokerTopology`]).
    pub topology: BrokerTopology,
}

/// The result of one publish, as the protocol needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublishResult {
    /// Ack with no returned message.
    Confirmed,
    /// The broker certainly does not have it.
    Failed(Words),
    /// It may have been published.
    Uncertain(Words),
    /// The publish itself did not complete: its frames may still sit in this process's
    /// send queue and go out later, so the row's lease must not end early.
    Stalled(Words),
}

/// A message ready to publish: body byte for byte, headers, properties. The body is
/// borrowed from the row: lapin copies it once into its frames, and no other copy is
/// made (a body may be tens of MiB).
#[derive(Debug, Clone)]
pub struct OutgoingMessage<'a> {
    pub body: &'a [u8],
    pub headers: FieldTable,
    pub message_id: Option<String>,
}

impl OutgoingMessage<'_> {
    fn properties(&self) -> BasicProperties {
        let mut p = BasicProperties::default()
            .with_delivery_mode(2)
            .with_headers(self.headers.clone())
            .with_timestamp(chrono::Utc::now().timestamp() as u64);
        if let Some(id) = &self.message_id {
            if let Ok(s) = ShortString::try_new(id.clone()) {
                p = p.with_message_id(s);
            }
        }
        p
    }
}

/// A publish handed to the broker, its confirm not yet awaited.
/// Where a publish found nowhere to go, as the broker's reply code said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nowhere {
    /// 312 NO_ROUTE: returned, no queue bound for the routing key on the exchange.
    NoRoute,
    /// 404 NOT_FOUND: the exchange does not exist in the vhost.
    NoExchange,
}

/// One publish as judged, and where it was sent.
#[derive(Debug, Clone)]
pub struct Judged {
    pub id: String,
    pub target: Target,
    pub result: PublishResult,
    /// When the broker said the target leads nowhere.
    pub nowhere: Option<Nowhere>,
}

pub struct Sent {
    pub id: String,
    pub(super) target: Target,
    pub(super) confirm: std::result::Result<std::pin::Pin<Box<PublisherConfirm>>, PublishResult>,
    pub(super) deadline: Instant,
}

pub struct Publisher {
    conn: Connection,
    channel: Channel,
    pub(super) opts: PublisherOptions,
    pub(super) host: String,
    /// Set once a confirm went unanswered: a late ack or return on this channel could be
    /// credited to a later publish, so the channel is not used again.
    pub(super) poisoned: AtomicBool,
    /// Set once a publish did not complete (see [`PublishResult::Stalled`]).
    stalled: AtomicBool,
}

impl Publisher {
    /// Connects and opens a channel in confirm mode. An error here means nothing was
    /// published: the caller treats it as a certain failure.
    pub async fn connect(
        url: &SecretUrl,
        opts: PublisherOptions,
    ) -> std::result::Result<Self, ConnectError> {
        let deadline = Instant::now() + opts.connect_timeout;
        let (conn, host) = open_connection(
            url,
            &ConnectOptions {
                connect_timeout: opts.connect_timeout,
                connection_name: opts.connection_name.clone(),
                tls: opts.tls.clone(),
            },
        )
        .await?;
        // A broker under a memory or disk alarm blocks the connection: lapin then holds
        // every frame, so say so at once instead of waiting for the timeout.
        let blocked = || ConnectError::Blocked { host: host.clone() };
        let timed_out = |doing| ConnectError::TimedOut {
            doing,
            host: host.clone(),
            after: humantime::format_duration(opts.connect_timeout).to_string(),
            hint: "",
        };
        let failed = |doing: &str, e: lapin::Error| {
            let what = format!("{doing} on {host}: {}", scrub(&e.to_string()));
            ConnectError::broker(what, e)
        };
        let channel = match until_blocked(&conn, deadline, conn.create_channel()).await {
            Step::Done(Ok(ch)) => ch,
            Step::Done(Err(e)) => return Err(failed("opening a channel", e)),
            Step::Blocked => return Err(blocked()),
            Step::TimedOut => return Err(timed_out("opening a channel")),
        };
        match until_blocked(
            &conn,
            deadline,
            channel.confirm_select(ConfirmSelectOptions::default()),
        )
        .await
        {
            Step::Done(Ok(())) => {}
            Step::Done(Err(e)) => return Err(failed("enabling publisher confirms", e)),
            Step::Blocked => return Err(blocked()),
            Step::TimedOut => return Err(timed_out("enabling publisher confirms")),
        }
        tracing::debug!(%host, "connected to RabbitMQ, confirm mode on");
        Ok(Publisher {
            conn,
            channel,
            opts,
            host,
            poisoned: Default::default(),
            stalled: Default::default(),
        })
    }

    /// Hands one message to the broker (mandatory, persistent) without waiting for its
    /// confirm; [`Publisher::settle`] waits. The confirm is awaited until the confirm
    /// timeout counted from now.
    pub async fn send(&self, id: &str, target: &Target, msg: &OutgoingMessage<'_>) -> Sent {
        let deadline = Instant::now() + self.opts.confirm_timeout;
        let sent = |confirm| Sent {
            id: id.to_string(),
            target: target.clone(),
            confirm,
            deadline,
        };
        let not_sent = |why: String| sent(Err(PublishResult::Failed(why.into())));
        if self.conn.status().blocked() {
            return not_sent(format!(
                "RabbitMQ at {} has blocked publishing (memory or disk alarm); nothing was sent",
                self.host
            ));
        }
        if !self.channel.status().connected() {
            return not_sent(format!(
                "the channel to {} is closed; nothing was sent",
                self.host
            ));
        }
        let (ex, rk) = match (
            ShortString::try_new(target.exchange.clone()),
            ShortString::try_new(target.routing_key.clone()),
        ) {
            (Ok(e), Ok(r)) => (e, r),
            _ => return not_sent("exchange or routing key longer than 255 bytes".into()),
        };
        let publish = self.channel.basic_publish(
            ex,
            rk,
            BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            },
            msg.body,
            msg.properties(),
        );
        let result = timeout(self.opts.confirm_timeout, publish).await;
        if !matches!(result, Ok(Ok(_))) {
            // Frames of this publish may still be queued: never use this connection again.
            self.poisoned.store(true, Ordering::SeqCst);
            self.stalled.store(true, Ordering::SeqCst);
        }
        sent(match result {
            Ok(Ok(c)) => Ok(Box::pin(c)),
            Ok(Err(e)) => Err(PublishResult::Stalled(
                format!(
                    "the connection to {} failed while publishing ({}); the broker may have the message",
                    self.host,
                    scrub(&e.to_string())
                )
                .into(),
            )),
            Err(_) => Err(PublishResult::Stalled(words(format!(
                "publishing to {} did not complete within {}; the broker may have the message, and it may still go out while this run lasts",
                self.host,
                humantime::format_duration(self.opts.confirm_timeout)
            )))),
        })
    }

    /// Whether a publish on this connection did not complete.
    pub fn stalled(&self) -> bool {
        self.stalled.load(Ordering::SeqCst)
    }

    /// Whether the connection itself is still up (its node answers).
    pub fn is_connected(&self) -> bool {
        self.conn.status().connected()
    }

    /// False once the connection or channel is gone, or a confirm went unanswered (a
    /// new one is needed).
    pub fn is_usable(&self) -> bool {
        self.conn.status().connected()
            && self.channel.status().connected()
            && !self.poisoned.load(Ordering::SeqCst)
    }

    pub fn confirm_timeout(&self) -> Duration {
        self.opts.confirm_timeout
    }

    pub async fn close(self) {
        let _ = timeout(Duration::from_secs(2), self.conn.close(200, "bye".into())).await;
    }

    /// Whether the queue `name` exists in this connection's vhost. `Err`: the broker did
    /// not say.
    pub async fn queue_exists(&self, name: &str) -> std::result::Result<bool, String> {
        self.queue_ready(name).await.map(|n| n.is_some())
    }

    /// The ready count of the queue `name` (`None`: no such queue in this vhost): a
    /// passive declare on a channel of its own, since the broker closes the channel that
    /// asks for a missing queue (reply code 404). `Err`: the broker did not say.
    pub async fn queue_ready(&self, name: &str) -> std::result::Result<Option<u32>, String> {
        let wait = self.opts.confirm_timeout;
        let q = ShortString::try_new(name.to_string())
            .map_err(|_| "a queue name is at most 255 bytes".to_string())?;
        let channel = match timeout(wait, self.conn.create_channel()).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(scrub(&e.to_string())),
            Err(_) => return Err(format!("no channel from {} within {wait:?}", self.host)),
        };
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        let declared = timeout(
            wait,
            channel.queue_declare(q, passive, FieldTable::default()),
        )
        .await;
        match declared {
            Ok(Ok(queue)) => {
                let _ = timeout(wait, channel.close(200, "bye".into())).await;
                Ok(Some(queue.message_count()))
            }
            Ok(Err(e)) if is_not_found(&e) => Ok(None),
            Ok(Err(e)) => Err(scrub(&e.to_string())),
            Err(_) => Err(format!("no answer from {} within {wait:?}", self.host)),
        }
    }
}

enum Step<T> {
    Done(T),
    Blocked,
    TimedOut,
}

/// Awaits `fut` until `deadline`, giving up early if the broker blocks the connection.
async fn until_blocked<T>(
    conn: &Connection,
    deadline: Instant,
    fut: impl std::future::Future<Output = T>,
) -> Step<T> {
    tokio::pin!(fut);
    loop {
        if conn.status().blocked() {
            return Step::Blocked;
        }
        tokio::select! {
            v = &mut fut => return Step::Done(v),
            _ = tokio::time::sleep_until(deadline) => return Step::TimedOut,
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
}
