//! The broker side of a whole run ([`Broker`]): which node of a cluster is in use and
//! moving to the next when it is lost, connecting early, the shared publish pace, and
//! the turns several connections take. Apart from [`super::publish`] because a replay,
//! a plan and a test drive a run through it, while capture's parking publishes on one
//! [`Publisher`] of its own.

use super::connect::{host_of, parse_amqp_url, ConnectError};
use super::publish::{Publisher, PublisherOptions};
use crate::rate::Pacer;
use crate::secret::SecretUrl;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

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
