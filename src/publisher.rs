//! The broker side of a replay: one connection, one channel in confirm mode, every wait
//! bounded.
//!
//! Results are classified for the protocol, conservatively: [`PublishResult::Failed`]
//! only where the broker certainly does not have the message (could not connect, the
//! connection was blocked before sending, a nack from the one queue of the default
//! exchange on a broker known to be one node, or an ack that came with the message
//! returned as unroutable); [`PublishResult::Uncertain`] wherever the message may have
//! reached a queue (lost connection or timeout after the publish was handed to the
//! socket, any other nack). lapin can hang when the server closes the connection and when a vhost is
//! missing, hence a timeout around every await.

pub use crate::broker::codec::{replay_headers, to_field_table, DEAD_LETTER_ID_HEADER};
use crate::broker::connect::host_of;
pub use crate::broker::connect::{
    open_connection, open_first_connection, parse_amqp_url, validate_amqp_url, ConnectError,
    ConnectOptions, TlsFiles,
};
use crate::broker::reply::is_not_found;
pub use crate::rate::Pacer;
use crate::secret::{scrub, SecretUrl};
use crate::topology::BrokerTopology;
use futures_util::FutureExt;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Connection};
use lapin::{Confirmation, PublisherConfirm};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
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
    Failed(String),
    /// It may have been published.
    Uncertain(String),
    /// The publish itself did not complete: its frames may still sit in this process's
    /// send queue and go out later, so the row's lease must not end early.
    Stalled(String),
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
pub struct Sent {
    pub id: String,
    target: Target,
    confirm: std::result::Result<std::pin::Pin<Box<PublisherConfirm>>, PublishResult>,
    deadline: Instant,
}

/// How waiting for one confirm ended.
enum Waited {
    Known(PublishResult),
    Confirmation(Box<Confirmation>),
    /// No answer by the deadline, or interrupted: the future is kept to look at once more.
    Open(std::pin::Pin<Box<PublisherConfirm>>, &'static str),
    Lost(String),
}

pub struct Publisher {
    conn: Connection,
    channel: Channel,
    opts: PublisherOptions,
    host: String,
    /// Set once a confirm went unanswered: a late ack or return on this channel could be
    /// credited to a later publish, so the channel is not used again.
    poisoned: AtomicBool,
    /// Set once a publish did not complete (see [`PublishResult::Stalled`]).
    stalled: AtomicBool,
}

/// The broker side of a run: one connection, opened on first use (or early, in the
/// background), reopened when it died or a confirm went unanswered; an optional publish
/// rate shared with other connections; and turns taken with them.
///
/// With several node URLs (one cluster), it connects to the first that answers, each
/// within the connect timeout; when the connection is lost it goes on through the next
/// node that answers (the one after the lost one first), and says so.
pub struct Broker {
    urls: Arc<Vec<SecretUrl>>,
    /// The node in use (or to try first).
    node: usize,
    /// How many times the run moved to another node.
    pub switches: usize,
    /// Set when no node answered the last time: the run stops.
    pub unreachable: bool,
    opts: PublisherOptions,
    publisher: Option<Publisher>,
    connecting:
        Option<tokio::task::JoinHandle<std::result::Result<(usize, Publisher), ConnectError>>>,
    /// Publishes at most this often (`--rate`), shared by all the brokers of a run.
    pacer: Option<Arc<Pacer>>,
    /// Held from a batch's first publish to its last confirm; see [`Broker::taking_turns`].
    turns: Option<Arc<tokio::sync::Mutex<()>>>,
    connected_once: bool,
}

/// This connection's turn to have a batch in the broker; others wait until it is dropped.
pub type Turn = tokio::sync::OwnedMutexGuard<()>;

/// Why there is no connection to publish on.
pub enum NoConnection {
    Failed(ConnectError),
    Interrupted,
}

/// Waits for `fut`, giving up as soon as `stop` is set.
pub async fn unless_stopped<T>(
    stop: &AtomicBool,
    fut: impl std::future::Future<Output = T>,
) -> Option<T> {
    tokio::pin!(fut);
    loop {
        tokio::select! {
            v = &mut fut => return Some(v),
            _ = tokio::time::sleep(Duration::from_millis(25)) => {
                if stop.load(Ordering::SeqCst) {
                    return None;
                }
            }
        }
    }
}

impl Broker {
    /// Several `urls` are the nodes of one cluster, whatever `opts` says.
    pub fn new(
        urls: Vec<SecretUrl>,
        mut opts: PublisherOptions,
        pacer: Option<Arc<Pacer>>,
    ) -> Self {
        opts.topology = opts.topology.for_nodes(urls.len());
        Broker {
            urls: Arc::new(urls),
            node: 0,
            switches: 0,
            unreachable: false,
            opts,
            publisher: None,
            connecting: None,
            pacer,
            turns: None,
            connected_once: false,
        }
    }

    /// Makes this connection take turns with the others sharing `turns`: one batch at a
    /// time is in the broker, from its first publish to its last confirm. RabbitMQ confirms
    /// persistent messages once the queue has stored them and has nothing else to do, so
    /// batches published side by side are confirmed together, and their connections then
    /// run their SQL together while the broker idles. Taking turns, one connection's mark
    /// and next claim overlap another's publishing.
    pub fn taking_turns(mut self, turns: Arc<tokio::sync::Mutex<()>>) -> Self {
        self.turns = Some(turns);
        self
    }

    /// Whether this connection takes turns with others (see [`Broker::taking_turns`]).
    pub fn takes_turns(&self) -> bool {
        self.turns.is_some()
    }

    /// Waits for this connection's turn to publish, if it takes turns; gives up when
    /// stopped (the caller sees the flag).
    pub async fn turn(&self, stop: &AtomicBool) -> Option<Turn> {
        let turns = self.turns.clone()?;
        unless_stopped(stop, turns.lock_owned()).await
    }

    /// Starts connecting in the background, so that the connection is ready when the
    /// claim is. Connecting publishes nothing.
    pub fn connect_early(&mut self) {
        if self.publisher.is_none() && self.connecting.is_none() {
            let (urls, first, opts) = (self.urls.clone(), self.node, self.opts.clone());
            self.connecting = Some(tokio::spawn(async move {
                let mut failures = Vec::new();
                for i in (0..urls.len()).map(|k| (first + k) % urls.len()) {
                    match Publisher::connect(&urls[i], opts.clone()).await {
                        Ok(p) => return Ok((i, p)),
                        Err(why) => failures.push(why),
                    }
                }
                Err(match failures.len() {
                    1 => failures.remove(0),
                    _ => ConnectError::NoNode(failures),
                })
            }));
        }
    }

    /// A usable connection, opening a new one if needed (on the next node after one that
    /// was lost).
    pub async fn connect(&mut self, stop: &AtomicBool) -> std::result::Result<(), NoConnection> {
        let mut lost = None;
        if self.publisher.as_ref().is_some_and(|p| !p.is_usable()) {
            if let Some(p) = self.publisher.take() {
                // Closed, or a confirm went unanswered (a node cut off from the cluster
                // still looks connected): the next node is tried first either way.
                lost = Some(self.node_name());
                self.node = (self.node + 1) % self.urls.len();
                p.close().await;
            }
        }
        if self.publisher.is_some() {
            return Ok(());
        }
        self.connect_early();
        let handle = self.connecting.as_mut().expect("connect_early set it");
        let Some(joined) = unless_stopped(stop, handle).await else {
            return Err(NoConnection::Interrupted);
        };
        self.connecting = None;
        let joined = joined.unwrap_or_else(|e| Err(ConnectError::Task(e)));
        self.unreachable = joined.is_err();
        let (node, p) = joined.map_err(NoConnection::Failed)?;
        match lost {
            Some(was) if self.urls.len() > 1 => {
                self.switches += 1;
                tracing::warn!(
                    "the connection to {was} was lost or stopped answering; going on through node {} (of {})",
                    p.host,
                    self.urls.len()
                );
            }
            None if !self.connected_once && node != 0 => tracing::warn!(
                "connected to node {} (of {}): the nodes before it did not answer",
                p.host,
                self.urls.len()
            ),
            _ => {}
        }
        self.node = node;
        self.connected_once = true;
        self.publisher = Some(p);
        Ok(())
    }

    fn node_name(&self) -> String {
        parse_amqp_url(&self.urls[self.node])
            .map(|u| host_of(&u))
            .unwrap_or_else(|_| "(invalid URL)".into())
    }

    pub fn publisher(&self) -> Option<&Publisher> {
        self.publisher.as_ref()
    }

    /// Whether a publish did not complete: the broker or the link stopped taking
    /// messages, and what this process queued may still go out.
    pub fn stalled(&self) -> bool {
        self.publisher.as_ref().is_some_and(|p| p.stalled())
    }

    pub fn confirm_timeout(&self) -> Duration {
        self.opts.confirm_timeout
    }

    /// How many of `n` ready items to attempt at once: about a second's worth at the
    /// pace, all of them unpaced.
    pub fn chunk_len(&self, n: usize) -> usize {
        match &self.pacer {
            Some(p) => (p.rate_now().ceil() as usize).clamp(1, n.max(1)),
            None => n.max(1),
        }
    }

    /// How long sending `n` items of `bytes` in all may take: their pacing, their size
    /// at a slow 8 MiB/s, and at least a second.
    pub fn send_budget(&self, n: usize, bytes: usize) -> Duration {
        let paced = self
            .pacer
            .as_ref()
            .map(|p| {
                p.period_now()
                    .saturating_mul(n.try_into().unwrap_or(u32::MAX))
            })
            .unwrap_or_default();
        let sized = Duration::from_secs_f64(bytes as f64 / (8.0 * 1024.0 * 1024.0));
        paced.max(sized).max(Duration::from_secs(1))
    }

    /// Waits for the next publish slot, if paced.
    pub async fn pace(&self) {
        if let Some(p) = &self.pacer {
            p.wait().await;
        }
    }

    pub async fn close(&mut self) {
        if let Some(h) = self.connecting.take() {
            h.abort();
        }
        if let Some(p) = self.publisher.take() {
            p.close().await;
        }
    }
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
        let not_sent = |why: String| sent(Err(PublishResult::Failed(why)));
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
            Ok(Err(e)) => Err(PublishResult::Stalled(format!(
                "the connection to {} failed while publishing ({}); the broker may have the message",
                self.host,
                scrub(&e.to_string())
            ))),
            Err(_) => Err(PublishResult::Stalled(format!(
                "publishing to {} did not complete within {}; the broker may have the message, and it may still go out while this run lasts",
                self.host,
                humantime::format_duration(self.opts.confirm_timeout)
            ))),
        })
    }

    /// Waits for the confirms of `sent` (each until its deadline, or until `stop` is
    /// set) and judges each publish. Returned messages are matched to publishes by their
    /// `x-dead-letter-id` header over the whole set: lapin hands a `basic.return` to
    /// whichever confirm completes next, not to the message it belongs to. Every
    /// publish on this channel must be in one call, so that no return can land on a
    /// confirm outside it; after an unanswered confirm the channel is not used again.
    pub async fn settle(&self, sent: Vec<Sent>, stop: &AtomicBool) -> Vec<(String, PublishResult)> {
        let mut waited = Vec::with_capacity(sent.len());
        for s in sent {
            let w = match s.confirm {
                Err(known) => Waited::Known(known),
                Ok(mut confirm) => {
                    match until_deadline_or_stop(&mut confirm, s.deadline, stop).await {
                        Some(Ok(c)) => Waited::Confirmation(Box::new(c)),
                        Some(Err(e)) => Waited::Lost(scrub(&e.to_string())),
                        None if stop.load(Ordering::SeqCst) => Waited::Open(confirm, "interrupted"),
                        None => Waited::Open(confirm, "timeout"),
                    }
                }
            };
            waited.push((s.id, s.target, w));
        }
        // A confirm given up on may have completed meanwhile (and carry a return).
        for (_, _, w) in &mut waited {
            if let Waited::Open(confirm, _) = w {
                if let Some(r) = confirm.as_mut().now_or_never() {
                    *w = match r {
                        Ok(c) => Waited::Confirmation(Box::new(c)),
                        Err(e) => Waited::Lost(scrub(&e.to_string())),
                    };
                }
            }
        }
        let mut returned = HashMap::new();
        let mut unmatched = 0usize;
        for (_, _, w) in &mut waited {
            if let Waited::Confirmation(c) = w {
                let (Confirmation::Ack(r) | Confirmation::Nack(r)) = c.as_mut() else {
                    continue;
                };
                if let Some(ret) = r.take() {
                    match dead_letter_id(&ret) {
                        Some(id) => {
                            let why = format!("{} {}", ret.reply_code, ret.reply_text);
                            returned.insert(id, why);
                        }
                        None => unmatched += 1,
                    }
                }
            }
        }
        if waited
            .iter()
            .any(|(_, _, w)| matches!(w, Waited::Open(..) | Waited::Lost(_)))
        {
            self.poisoned.store(true, Ordering::SeqCst);
        }
        let results: Vec<(String, PublishResult)> = waited
            .into_iter()
            .map(|(id, target, w)| {
                let result = self.judge(&target, w, returned.get(&id), unmatched);
                (id, result)
            })
            .collect();
        let count = |f: fn(&PublishResult) -> bool| results.iter().filter(|r| f(&r.1)).count();
        tracing::debug!(
            "published {}: {} confirmed, {} failed, {} uncertain",
            results.len(),
            count(|r| *r == PublishResult::Confirmed),
            count(|r| matches!(r, PublishResult::Failed(_))),
            count(|r| matches!(r, PublishResult::Uncertain(_)))
        );
        results
    }

    /// One publish's outcome by the contract: a certain failure only where the broker
    /// surely holds no copy (returned as unroutable, or nacked on the default exchange,
    /// whose route has exactly one queue, by a broker known to be one node); uncertain
    /// wherever a copy may exist.
    fn judge(
        &self,
        target: &Target,
        w: Waited,
        returned: Option<&String>,
        unmatched: usize,
    ) -> PublishResult {
        let host = &self.host;
        let confirmation = match (w, returned) {
            (Waited::Known(r), _) => return r,
            (_, Some(why)) => {
                return PublishResult::Failed(format!(
                    "the broker returned it as unroutable: {why} (no queue is bound for this exchange and routing key)"
                ))
            }
            (Waited::Open(_, "interrupted"), None) => return PublishResult::Uncertain(
                "interrupted after publishing, before the broker's confirm: the message may or may not have been published".into(),
            ),
            (Waited::Open(..), None) => {
                return PublishResult::Uncertain(format!(
                    "no publisher confirm from {host} within {}: the message may or may not have been published",
                    humantime::format_duration(self.opts.confirm_timeout)
                ))
            }
            (Waited::Lost(e), None) => return PublishResult::Uncertain(format!(
                "the connection to {host} was lost after publishing and before the confirm ({e}): the message may or may not have been published"
            )),
            (Waited::Confirmation(c), None) => *c,
        };
        match confirmation {
            Confirmation::NotRequested => PublishResult::Uncertain(
                "the channel was not in confirm mode; the outcome is unknown".into(),
            ),
            _ if unmatched > 0 => PublishResult::Uncertain(format!(
                "the broker returned {unmatched} message(s) without an x-dead-letter-id header on this channel, so returns cannot be matched to rows: this one may or may not have been routed"
            )),
            Confirmation::Ack(_) => PublishResult::Confirmed,
            Confirmation::Nack(_) if target.exchange.is_empty() => default_exchange_nack(self.opts.topology),
            Confirmation::Nack(_) => PublishResult::Uncertain(format!(
                "the broker refused it (nack) through exchange {}: one bound queue refused it while others may hold it",
                target.exchange
            )),
        }
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

/// A nack on the default exchange (a route of exactly one queue): certain only on a
/// broker known to be one node.
fn default_exchange_nack(topology: BrokerTopology) -> PublishResult {
    match topology {
        BrokerTopology::Single => PublishResult::Failed(
            "the broker refused it (nack) on the default exchange, whose route has one queue, on a broker known to be one node (e.g. a full queue with reject-publish)".into(),
        ),
        BrokerTopology::Cluster => PublishResult::Uncertain(
            "the broker refused it (nack) in a cluster: a queue whose node or leader went away is nacked even when a replica kept the message".into(),
        ),
        BrokerTopology::Unknown => PublishResult::Uncertain(
            "the broker refused it (nack) on the default exchange, and dlq does not know that the broker is one node: a cluster, also one behind a single address, nacks what a replica may still hold. If this broker is one node, say so (--broker-topology single, DLQ_BROKER_TOPOLOGY=single or broker_topology = \"single\" in the profile) and such a nack is publish_failed".into(),
        ),
    }
}

/// Awaits `confirm` until `deadline`; `None` when the deadline passed or `stop` was set.
async fn until_deadline_or_stop(
    confirm: &mut std::pin::Pin<Box<PublisherConfirm>>,
    deadline: Instant,
    stop: &AtomicBool,
) -> Option<lapin::Result<Confirmation>> {
    loop {
        if stop.load(Ordering::SeqCst) {
            return None;
        }
        tokio::select! {
            r = confirm.as_mut() => return Some(r),
            _ = tokio::time::sleep_until(deadline) => return None,
            _ = tokio::time::sleep(Duration::from_millis(25)) => {}
        }
    }
}

/// The `x-dead-letter-id` header of a returned message: the row it belongs to.
fn dead_letter_id(ret: &lapin::message::BasicReturnMessage) -> Option<String> {
    let headers = ret.delivery.properties.headers().as_ref()?;
    match headers.inner().get(DEAD_LETTER_ID_HEADER)? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_string()),
        _ => None,
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
