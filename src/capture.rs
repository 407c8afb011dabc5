//! `dlq capture`: the messages of a RabbitMQ dead-letter queue become rows of
//! `dead_letters`, at least once and never twice.
//!
//! - A delivery is acked only after the transaction holding its row has committed: a batch
//!   is one transaction, then one `multiple` ack. A crash, a lost broker connection or a
//!   lost database anywhere before the ack leaves the messages in the queue, and the broker
//!   delivers them again flagged `redelivered`.
//! - Each row carries a capture key ([`capture_key`]). For a delivery flagged
//!   `redelivered` the store first looks for the key and inserts nothing when a row has
//!   it; a first delivery is inserted without looking, so two identical but distinct
//!   messages still make two rows. What the key covers, and the limits of that rule, are
//!   in docs/capture.md.
//! - A message that cannot be stored (over the body limit, refused by the database) is
//!   never acked in a loop nor dropped: it is published to the parking queue (confirmed)
//!   and then acked, or the capture stops with an error and the message stays queued.

mod park;

use crate::error::{DlqError, Result};
use crate::publisher::{is_not_found, open_first_connection, ConnectOptions, Publisher};
use crate::secret::{scrub, SecretUrl};
use crate::store::{CaptureOutcome, CapturedLetter, NewDeadLetter, Store};
use crate::topology::BrokerTopology;
use base64::Engine;
use chrono::{DateTime, Utc};
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Connection};
use serde::Serialize;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::{timeout, Instant};

/// The largest body stored unless told otherwise (`--max-body-bytes`).
pub const DEFAULT_MAX_BODY_BYTES: usize = 64 * 1024 * 1024;

/// A batch is committed once its bodies reach this many bytes, even if it is not full:
/// bounds a transaction (and a PostgreSQL statement) when messages are large.
pub const MAX_BATCH_BYTES: usize = 32 * 1024 * 1024;

/// The header a parked message gets, saying why it could not be stored.
pub const PARK_ERROR_HEADER: &str = "x-dlq-capture-error";

/// Headers the broker may change between two deliveries of one message: left out of the
/// capture key. (A quorum queue counts its redeliveries in `x-delivery-count`.)
const REDELIVERY_HEADERS: [&str; 1] = ["x-delivery-count"];

/// Headers that may carry the consumer's error text, in the order they are looked at.
const ERROR_HEADERS: [&str; 3] = ["x-exception", "x-error", "x-exception-message"];

#[derive(Debug, Clone)]
pub struct CaptureOptions {
    /// The broker: the nodes of one cluster, tried in order (one URL for now).
    pub urls: Vec<SecretUrl>,
    pub queue: String,
    /// Stored as every row's reason instead of the one mapped from `x-death`.
    pub reason: Option<String>,
    /// Stop after this many messages (stored, found already there, or parked).
    pub max: Option<u64>,
    /// Keep consuming (and reconnecting) until stopped, instead of until the queue is empty.
    pub follow: bool,
    /// Messages per transaction and ack.
    pub batch: usize,
    /// Where a message that cannot be stored goes; without it the capture stops there.
    pub park_queue: Option<String>,
    pub max_body_bytes: usize,
    pub connect: ConnectOptions,
    /// Bounds a publish to the parking queue, and every other wait on the broker.
    pub confirm_timeout: Duration,
    /// What the operator says of the broker (the parking publish's nack wording).
    pub topology: BrokerTopology,
    /// How long a batch that is not full waits for more messages before it is committed.
    pub linger: Duration,
    /// Longest wait between two reconnection attempts (`--follow`).
    pub max_backoff: Duration,
}

impl CaptureOptions {
    pub fn new(urls: Vec<SecretUrl>, queue: impl Into<String>, connect: ConnectOptions) -> Self {
        CaptureOptions {
            urls,
            queue: queue.into(),
            reason: None,
            max: None,
            follow: false,
            batch: 500,
            park_queue: None,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            connect,
            confirm_timeout: Duration::from_secs(10),
            topology: BrokerTopology::Unknown,
            linger: Duration::from_millis(50),
            max_backoff: Duration::from_secs(15),
        }
    }
}

/// Why a capture ended without an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stopped {
    /// The queue was empty (without `--follow`).
    Empty,
    /// `--max` messages were taken.
    Max,
    /// SIGINT / SIGTERM: the batch in hand was finished first.
    Interrupted,
}

/// Counts of one run, printed at its end (and shown as progress).
#[derive(Debug, Clone, Serialize)]
pub struct CaptureSummary {
    pub queue: String,
    /// Rows inserted by this run.
    pub captured: u64,
    /// Redeliveries of messages that already had a row: acked, nothing inserted.
    pub already_there: u64,
    /// Messages that could not be stored, moved to the parking queue.
    pub parked: u64,
    /// Times the broker or database connection was lost and opened again.
    pub reconnects: u64,
    pub stopped: Option<Stopped>,
    pub seconds: f64,
}

impl CaptureSummary {
    fn handled(&self) -> u64 {
        self.captured + self.already_there + self.parked
    }
}

/// What a run tells its caller as it goes.
pub enum Event<'a> {
    /// A batch was committed and acked; the counts so far.
    Batch(&'a CaptureSummary),
    /// A message could not be stored and was moved to the parking queue.
    Parked { why: &'a str },
    /// The broker or the database went away; the next attempt is in `wait`.
    Reconnecting { why: &'a str, wait: Duration },
    /// Consuming (again) from `host`.
    Connected { host: &'a str },
}

// ---------------------------------------------------------------------------------------
// A delivery → a row.

/// An AMQP header value as JSON: strings as strings, integers and floats as numbers,
/// timestamps as seconds since the epoch, decimals as numbers, tables as objects, arrays
/// as arrays, void as null. The one thing JSON cannot hold, bytes that are not UTF-8 (a
/// long string or a byte array), becomes `{"$bytes": "<base64>"}`; a replay sends it back
/// as those bytes.
pub fn amqp_to_json(v: &AMQPValue) -> Value {
    use AMQPValue as A;
    let float = |f: f64| {
        serde_json::Number::from_f64(f)
            .map(Value::Number)
            .unwrap_or_else(|| Value::String(f.to_string()))
    };
    let bytes = |b: &[u8]| match std::str::from_utf8(b) {
        Ok(s) => Value::String(s.to_string()),
        Err(_) => {
            let mut m = Map::new();
            m.insert(
                BYTES_KEY.into(),
                Value::String(base64::engine::general_purpose::STANDARD.encode(b)),
            );
            Value::Object(m)
        }
    };
    match v {
        A::Boolean(b) => Value::Bool(*b),
        A::ShortShortInt(i) => (*i).into(),
        A::ShortShortUInt(i) => (*i).into(),
        A::ShortInt(i) => (*i).into(),
        A::ShortUInt(i) => (*i).into(),
        A::LongInt(i) => (*i).into(),
        A::LongUInt(i) => (*i).into(),
        A::LongLongInt(i) => (*i).into(),
        // Through its shortest decimal form, so that 1.1f32 is 1.1, not 1.100000023841858.
        A::Float(f) => float(f.to_string().parse().unwrap_or(f64::NAN)),
        A::Double(f) => float(*f),
        A::DecimalValue(d) => float(
            format!("{}e-{}", d.value, d.scale)
                .parse()
                .unwrap_or(f64::NAN),
        ),
        A::ShortString(s) => Value::String(s.as_str().to_string()),
        A::LongString(s) => bytes(s.as_bytes()),
        A::ByteArray(b) => bytes(b.as_slice()),
        A::FieldArray(a) => Value::Array(a.as_slice().iter().map(amqp_to_json).collect()),
        A::Timestamp(t) => (*t).into(),
        A::FieldTable(t) => {
            // A table that looks like one of the escapes above is wrapped, so that
            // it cannot be read back as bytes.
            let m = headers_to_json(t);
            if m.len() == 1 && (m.contains_key(BYTES_KEY) || m.contains_key(TABLE_KEY)) {
                let mut wrapped = Map::new();
                wrapped.insert(TABLE_KEY.into(), Value::Object(m));
                Value::Object(wrapped)
            } else {
                Value::Object(m)
            }
        }
        A::Void => Value::Null,
    }
}

/// The key of the one-key object that holds non-UTF-8 header bytes (see [`amqp_to_json`]).
pub const BYTES_KEY: &str = "$bytes";

/// The key of the one-key object that wraps a header table whose only key is
/// [`BYTES_KEY`] or this one (see [`amqp_to_json`]).
pub const TABLE_KEY: &str = "$table";

/// AMQP headers as a JSON object, in the table's (sorted) key order.
pub fn headers_to_json(t: &FieldTable) -> Map<String, Value> {
    t.inner()
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), amqp_to_json(v)))
        .collect()
}

/// Maps an `x-death` reason to the dead letter's reason.
pub fn map_reason(x_death_reason: &str) -> String {
    match x_death_reason {
        "rejected" => "poison_message".into(),
        "delivery_limit" => "retries_exhausted".into(),
        other => other.to_string(),
    }
}

/// What identifies a message across its redeliveries: `v1:`, the time of its first
/// `x-death` entry (ten digits of seconds, zeros without one), `:` and the SHA-256 over
/// its body, its headers except those the broker changes on redelivery
/// (`x-delivery-count`), which include `x-death` and so the time of each death, and its
/// `message_id`, `correlation_id`, `timestamp`, `type` and `app_id` properties, each part
/// length-prefixed.
pub fn capture_key(body: &[u8], headers: &Map<String, Value>, props: &BasicProperties) -> String {
    let stable: Map<String, Value> = headers
        .iter()
        .filter(|(k, _)| !REDELIVERY_HEADERS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    // Read as `to_letter` reads it from the AMQP table: a number, or a string of one.
    let died = headers
        .get("x-death")
        .and_then(|d| d.get(0))
        .and_then(|d| d.get("time"))
        .and_then(|t| t.as_i64().or_else(|| t.as_str()?.trim().parse().ok()));
    key_of(body, &canonical_json(&Value::Object(stable)), props, died)
}

/// [`capture_key`] from the headers already as canonical JSON, without the redelivery
/// headers.
fn key_of(
    body: &[u8],
    stable_headers_json: &str,
    props: &BasicProperties,
    died: Option<i64>,
) -> String {
    let mut h = Sha256::new();
    let mut part = |b: &[u8]| {
        h.update((b.len() as u64).to_le_bytes());
        h.update(b);
    };
    part(b"dlq-capture-v1");
    part(body);
    part(stable_headers_json.as_bytes());
    let s = |v: &Option<ShortString>| v.as_ref().map(|s| s.as_str().to_string());
    for p in [
        s(props.message_id()),
        s(props.correlation_id()),
        props.timestamp().map(|t| t.to_string()),
        s(props.kind()),
        s(props.app_id()),
    ] {
        match p {
            Some(v) => part(format!("+{v}").as_bytes()),
            None => part(b"-"),
        }
    }
    // The death time first: keys of a queue's messages then mostly grow, and the index on
    // them takes new keys at its right edge rather than one random page per row.
    format!(
        "v1:{:010}:{}",
        died.unwrap_or(0).clamp(0, 9_999_999_999),
        hex::encode(h.finalize())
    )
}

/// JSON text with object keys sorted at every level, whatever order the map keeps.
fn canonical_json(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let inner: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{}:{}", Value::String(k.clone()), canonical_json(&m[k])))
                .collect();
            format!("{{{}}}", inner.join(","))
        }
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(canonical_json).collect::<Vec<_>>().join(",")
        ),
        other => other.to_string(),
    }
}

/// The first `x-death` entry: the most recent death, i.e. the queue the message was
/// dead-lettered from last.
fn first_death(headers: &FieldTable) -> Option<&FieldTable> {
    match headers.inner().get("x-death")? {
        AMQPValue::FieldArray(a) => match a.as_slice().first()? {
            AMQPValue::FieldTable(t) => Some(t),
            _ => None,
        },
        _ => None,
    }
}

fn text(v: &AMQPValue) -> Option<String> {
    match v {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_string()),
        _ => None,
    }
}

fn integer(v: &AMQPValue) -> Option<i64> {
    use AMQPValue as A;
    match v {
        A::ShortShortInt(i) => Some(*i as i64),
        A::ShortShortUInt(i) => Some(*i as i64),
        A::ShortInt(i) => Some(*i as i64),
        A::ShortUInt(i) => Some(*i as i64),
        A::LongInt(i) => Some(*i as i64),
        A::LongUInt(i) => Some(*i as i64),
        A::LongLongInt(i) => Some(*i),
        A::Timestamp(t) => i64::try_from(*t).ok(),
        A::LongString(_) | A::ShortString(_) => text(v)?.trim().parse().ok(),
        _ => None,
    }
}

/// PostgreSQL's TEXT cannot hold NUL: a derived column replaces it (the headers keep it).
fn derived_text(s: String) -> String {
    if s.contains('\0') {
        s.replace('\0', "\u{FFFD}")
    } else {
        s
    }
}

/// Whether the header or the body gives an event ID (the store's fallback rule finds it).
fn has_event_id(headers: &Map<String, Value>, body: &[u8]) -> bool {
    if headers.get("x-event-id").is_some_and(|v| !v.is_null()) {
        return true;
    }
    if !body.windows(10).any(|w| w == b"\"event_id\"") {
        return false;
    }
    matches!(
        serde_json::from_slice::<Value>(body),
        Ok(Value::Object(m)) if m.get("event_id").is_some_and(|v| !v.is_null())
    )
}

/// A delivered message as the row `dlq capture` inserts (see the module docs and
/// docs/capture.md for each column's source).
pub fn to_letter(
    body: &[u8],
    props: &BasicProperties,
    redelivered: bool,
    reason_override: Option<&str>,
) -> CapturedLetter {
    let empty = FieldTable::default();
    let table = props.headers().as_ref().unwrap_or(&empty);
    let headers = headers_to_json(table);
    let death = first_death(table);
    let field = |name: &str| death.and_then(|d| d.inner().get(name));
    let death_reason = field("reason").and_then(text);
    let reason = match (reason_override, &death_reason) {
        (Some(r), _) => r.to_string(),
        (None, Some(r)) => derived_text(map_reason(r)),
        (None, None) => "unknown".to_string(),
    };
    // Deliveries a consumer took before the message died: the delivery count when the
    // message carries one (on a redelivery from a quorum dead-letter queue it would be
    // that queue's own count, so only on a first delivery), else one per rejection
    // recorded in x-death. Expired and overflowed messages were never consumed.
    let delivery_count = table
        .inner()
        .get("x-delivery-count")
        .and_then(integer)
        .filter(|_| !redelivered);
    let attempts = match (delivery_count, death_reason.as_deref()) {
        (Some(n), _) => n,
        (None, Some("rejected" | "delivery_limit")) => {
            field("count").and_then(integer).unwrap_or(1)
        }
        _ => 0,
    }
    .clamp(0, i32::MAX as i64);
    let routing_key = match field("routing-keys") {
        Some(AMQPValue::FieldArray(a)) => a.as_slice().first().and_then(text),
        _ => None,
    };
    let dead_lettered_at = field("time")
        .and_then(integer)
        .and_then(|secs| DateTime::<Utc>::from_timestamp(secs, 0));
    let error = ERROR_HEADERS
        .iter()
        .find_map(|h| headers.get(*h).filter(|v| !v.is_null()))
        .map(|v| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .map(derived_text);
    let message_id = props.message_id().as_ref().map(|m| m.as_str().to_string());
    let event_id = if has_event_id(&headers, body) {
        None
    } else {
        message_id.map(derived_text)
    };
    // Built from the (sorted) field table, the stored JSON is already canonical.
    let headers_json = Value::Object(headers).to_string();
    let key = if REDELIVERY_HEADERS
        .iter()
        .any(|h| table.inner().contains_key(*h))
    {
        capture_key(body, &headers_to_json(table), props)
    } else {
        key_of(body, &headers_json, props, field("time").and_then(integer))
    };
    CapturedLetter {
        row: NewDeadLetter {
            line: 0,
            // Time-ordered: new rows go to the right edge of the primary key's B-tree
            // instead of a random page each (a random UUID made each batch rewrite a page
            // per row).
            id: uuid::Uuid::now_v7().to_string(),
            body: body.to_vec(),
            reason,
            attempts,
            headers_json,
            event_id,
            error,
            source_queue: field("queue").and_then(text).map(derived_text),
            exchange: field("exchange")
                .and_then(text)
                .filter(|e| !e.is_empty())
                .map(derived_text),
            routing_key: routing_key.map(derived_text),
            dead_lettered_at,
            ..NewDeadLetter::default()
        },
        capture_key: key,
        redelivered,
    }
}

// ---------------------------------------------------------------------------------------
// The consume → commit → ack loop.

/// Why a session with the broker ended.
enum SessionEnd {
    Done(Stopped),
    /// The broker or database went away: reconnect (`--follow`) or fail.
    Lost(String),
}

/// A delivery held until its batch is committed.
struct Held {
    tag: u64,
    body: Vec<u8>,
    properties: BasicProperties,
    redelivered: bool,
}

struct Session {
    conn: Connection,
    channel: Channel,
    consumer: lapin::Consumer,
    host: String,
}

impl Session {
    async fn close(self, wait: Duration) {
        let _ = timeout(wait, self.conn.close(200, "bye".into())).await;
    }
}

fn broker_text(e: &lapin::Error) -> String {
    scrub(&e.to_string())
}

/// Runs `dlq capture`. `stop` turns true on SIGINT / SIGTERM: the batch in hand is
/// committed and acked, then the run ends.
pub async fn capture(
    store: Arc<dyn Store>,
    opts: &CaptureOptions,
    mut stop: watch::Receiver<bool>,
    mut on_event: impl FnMut(Event<'_>),
) -> Result<CaptureSummary> {
    if opts.batch == 0 {
        return Err(DlqError::usage("--batch must be at least 1"));
    }
    // Checks that `dlq migrate` has added the capture key, before taking any message.
    store.capture(&[]).await?;
    let started = Instant::now();
    let mut summary = CaptureSummary {
        queue: opts.queue.clone(),
        captured: 0,
        already_there: 0,
        parked: 0,
        reconnects: 0,
        stopped: None,
        seconds: 0.0,
    };
    // A parking queue that does not exist is said before any message is taken.
    let mut parker: Option<Publisher> = match &opts.park_queue {
        Some(park) => Some(park::connect(opts, park).await?),
        None => None,
    };
    let mut backoff = Duration::from_millis(250);
    let mut first = true;
    let result = loop {
        if *stop.borrow() {
            break Ok(Stopped::Interrupted);
        }
        let end = match open_session(opts, &summary, first).await {
            Ok(Some(session)) => {
                first = false;
                on_event(Event::Connected {
                    host: &session.host,
                });
                let end = run_session(
                    &store,
                    &session,
                    opts,
                    &mut stop,
                    &mut summary,
                    &mut parker,
                    &mut backoff,
                    &mut on_event,
                )
                .await;
                session.close(opts.confirm_timeout).await;
                end
            }
            Ok(None) => Ok(SessionEnd::Done(Stopped::Empty)),
            Err(e) if first => Err(e),
            Err(e) => Ok(SessionEnd::Lost(e.to_string())),
        };
        match end {
            Ok(SessionEnd::Done(why)) => break Ok(why),
            Err(e) => break Err(e),
            Ok(SessionEnd::Lost(why)) if !opts.follow => {
                break Err(DlqError::other(format!(
                "{why}; stopped: every message not yet acked is still in {} (run again to go on)",
                opts.queue
            )))
            }
            Ok(SessionEnd::Lost(why)) => {
                // Wait, and wait again until the database answers: no point taking
                // messages that cannot be stored.
                loop {
                    on_event(Event::Reconnecting {
                        why: &why,
                        wait: backoff,
                    });
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = stop.wait_for(|s| *s) => {}
                    }
                    backoff = (backoff * 2).min(opts.max_backoff);
                    if *stop.borrow() {
                        break;
                    }
                    match store.now().await {
                        Ok(_) => break,
                        Err(e) => {
                            tracing::debug!(error = %e, "database still unreachable");
                        }
                    }
                }
                summary.reconnects += 1;
            }
        }
    };
    if let Some(p) = parker.take() {
        p.close().await;
    }
    summary.seconds = started.elapsed().as_secs_f64();
    summary.stopped = Some(result?);
    Ok(summary)
}

/// Connects, checks the queue and starts consuming. `Ok(None)`: the queue is empty and
/// the run is not `--follow` (nothing to do). On the first session every failure is an
/// error; later ones are reported for a reconnect.
async fn open_session(
    opts: &CaptureOptions,
    summary: &CaptureSummary,
    first: bool,
) -> Result<Option<Session>> {
    let wait = opts.connect.connect_timeout;
    let (conn, host, _) = open_first_connection(&opts.urls, &opts.connect)
        .await
        .map_err(|e| DlqError::other(e.to_string()))?;
    let fail = |what: &str, e: String| DlqError::other(format!("{what} on {host}: {e}"));
    let channel = match timeout(wait, conn.create_channel()).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return Err(fail("opening a channel", broker_text(&e))),
        Err(_) => return Err(fail("opening a channel", "timed out".into())),
    };
    let q = ShortString::try_new(opts.queue.clone())
        .map_err(|_| DlqError::usage("--queue: a queue name is at most 255 bytes"))?;
    let declared = timeout(
        wait,
        channel.queue_declare(
            q.clone(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        ),
    )
    .await;
    let count = match declared {
        Ok(Ok(q)) => q.message_count(),
        Ok(Err(e)) => {
            let text = broker_text(&e);
            let _ = timeout(wait, conn.close(200, "bye".into())).await;
            if is_not_found(&e) {
                return Err(DlqError::other(format!(
                    "there is no queue {:?} on {host} (in this vhost)",
                    opts.queue
                )));
            }
            return Err(fail("checking the queue", text));
        }
        Err(_) => return Err(fail("checking the queue", "timed out".into())),
    };
    if count == 0 && !opts.follow {
        let _ = timeout(wait, conn.close(200, "bye".into())).await;
        return Ok(None);
    }
    let remaining = opts
        .max
        .map(|m| m.saturating_sub(summary.handled()))
        .unwrap_or(u64::MAX);
    // Room for the batch being stored, the one being received and the next one on its
    // way; never more than --max asks for, so that no message is taken only to be handed
    // back.
    let prefetch = (opts.batch as u64 * 3)
        .min(remaining)
        .clamp(1, u16::MAX as u64) as u16;
    match timeout(
        wait,
        channel.basic_qos(prefetch, BasicQosOptions::default()),
    )
    .await
    {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(fail("setting the prefetch", broker_text(&e))),
        Err(_) => return Err(fail("setting the prefetch", "timed out".into())),
    }
    let tag = format!("dlq-capture-{}", uuid::Uuid::new_v4().simple());
    let consumer = match timeout(
        wait,
        channel.basic_consume(
            q,
            tag.as_str().into(),
            BasicConsumeOptions {
                exclusive: true,
                ..BasicConsumeOptions::default()
            },
            FieldTable::default(),
        ),
    )
    .await
    {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            let text = broker_text(&e);
            let _ = timeout(wait, conn.close(200, "bye".into())).await;
            if text.contains("ACCESS_REFUSED") && first {
                return Err(DlqError::other(format!(
                    "queue {:?} on {host} already has a consumer, and capture consumes exclusively (is another dlq capture running?): {text}",
                    opts.queue
                )));
            }
            return Err(fail("consuming", text));
        }
        Err(_) => return Err(fail("consuming", "timed out".into())),
    };
    tracing::debug!(%host, queue = %opts.queue, prefetch, "consuming");
    Ok(Some(Session {
        conn,
        channel,
        consumer,
        host,
    }))
}

/// A batch being stored by its own task, and how many messages it holds.
type StoreTask = (tokio::task::JoinHandle<Result<StoredBatch>>, usize);

async fn joined(task: StoreTask) -> Result<StoredBatch> {
    task.0
        .await
        .map_err(|e| DlqError::other(format!("storing a batch failed: {e}")))?
}

#[allow(clippy::too_many_arguments)]
async fn run_session(
    store: &Arc<dyn Store>,
    session: &Session,
    opts: &CaptureOptions,
    stop: &mut watch::Receiver<bool>,
    summary: &mut CaptureSummary,
    parker: &mut Option<Publisher>,
    backoff: &mut Duration,
    on_event: &mut impl FnMut(Event<'_>),
) -> Result<SessionEnd> {
    let mut consumer = session.consumer.clone();
    let idle = opts.linger.max(Duration::from_millis(100));
    // Deliveries taken while making sure the queue is empty: they start the next batch.
    let mut carried: Vec<Held> = Vec::new();
    // The batch being stored while the next one is received. It is acked (settled) before
    // the next one is stored, so acks go out in delivery order.
    let mut inflight: Option<StoreTask> = None;
    let spawn_store = |batch: Vec<Held>| -> StoreTask {
        let n = batch.len();
        let task = tokio::spawn(store_batch(
            store.clone(),
            opts.reason.clone(),
            opts.max_body_bytes,
            batch,
        ));
        (task, n)
    };
    loop {
        let in_flight = inflight.as_ref().map_or(0, |t| t.1 as u64);
        let remaining = opts
            .max
            .map(|m| m.saturating_sub(summary.handled() + in_flight))
            .unwrap_or(u64::MAX);
        if remaining == 0 && carried.is_empty() {
            if let Some(task) = inflight.take() {
                let stored = joined(task).await;
                if let Some(why) = settle(session, opts, stored, summary, parker, on_event).await? {
                    return Ok(SessionEnd::Lost(why));
                }
                on_event(Event::Batch(summary));
            }
            cancel(session, opts).await;
            return Ok(SessionEnd::Done(Stopped::Max));
        }
        let want = (opts.batch as u64).min(remaining) as usize;
        let mut batch: Vec<Held> = std::mem::take(&mut carried);
        let mut interrupted = false;
        let mut lost: Option<String> = None;
        let mut deadline = Instant::now() + if batch.is_empty() { idle } else { opts.linger };
        let mut bytes: usize = batch.iter().map(|h| h.body.len()).sum();
        while batch.len() < want && bytes < MAX_BATCH_BYTES {
            tokio::select! {
                biased;
                _ = stop.wait_for(|s| *s) => { interrupted = true; break; }
                next = consumer.next() => match held(next, &session.host) {
                    Ok(h) => {
                        if batch.is_empty() {
                            deadline = Instant::now() + opts.linger;
                        }
                        bytes += h.body.len();
                        batch.push(h);
                    }
                    Err(why) => {
                        lost = Some(why);
                        break;
                    }
                },
                _ = tokio::time::sleep_until(deadline) => break,
            }
        }
        if let Some(why) = lost {
            // Nothing of the batch in hand is stored or acked, nor is the one being stored
            // acked: the broker has them all. Its transaction ends before reconnecting.
            if let Some(task) = inflight.take() {
                let _ = joined(task).await;
            }
            return Ok(SessionEnd::Lost(why));
        }
        if let Some(task) = inflight.take() {
            let stored = joined(task).await;
            if let Some(why) = settle(session, opts, stored, summary, parker, on_event).await? {
                return Ok(SessionEnd::Lost(why));
            }
            *backoff = Duration::from_millis(250);
            on_event(Event::Batch(summary));
        }
        // The broker had no more to give when the wait for a full batch ran out.
        let drained = batch.len() < want && bytes < MAX_BATCH_BYTES && !interrupted;
        let last = batch.len() as u64 >= remaining;
        if !batch.is_empty() {
            let task = spawn_store(batch);
            if drained || interrupted || last {
                // Nothing more to receive meanwhile: settle it now.
                let stored = joined(task).await;
                if let Some(why) = settle(session, opts, stored, summary, parker, on_event).await? {
                    return Ok(SessionEnd::Lost(why));
                }
                *backoff = Duration::from_millis(250);
                on_event(Event::Batch(summary));
            } else {
                inflight = Some(task);
            }
        }
        if interrupted {
            cancel(session, opts).await;
            return Ok(SessionEnd::Done(Stopped::Interrupted));
        }
        if drained && !opts.follow && queue_is_empty(session, opts).await? {
            // The broker sends a queue's deliveries to a channel before its answer to the
            // declare, so any delivery still on its way is already in the consumer's buffer.
            while carried.len() < want {
                match timeout(Duration::ZERO, consumer.next()).await {
                    Err(_) => break,
                    Ok(next) => match held(next, &session.host) {
                        Ok(h) => carried.push(h),
                        Err(why) => return Ok(SessionEnd::Lost(why)),
                    },
                }
            }
            if carried.is_empty() {
                cancel(session, opts).await;
                return Ok(SessionEnd::Done(Stopped::Empty));
            }
        }
    }
}

/// A delivery from the consumer stream, or why the stream gave none.
fn held(
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

/// Stops the deliveries; what was prefetched and not taken goes back when the channel
/// closes.
async fn cancel(session: &Session, opts: &CaptureOptions) {
    let tag = session.consumer.tag();
    let _ = timeout(
        opts.confirm_timeout,
        session
            .channel
            .basic_cancel(tag, BasicCancelOptions::default()),
    )
    .await;
}

/// Whether the queue has no ready message (asked after a quiet moment with nothing in hand).
async fn queue_is_empty(session: &Session, opts: &CaptureOptions) -> Result<bool> {
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

/// A batch after its transaction: what was inserted, found already there, or refused.
struct StoredBatch {
    batch: Vec<Held>,
    captured: u64,
    already: u64,
    /// Index in `batch` and why it cannot be stored.
    refused: Vec<(usize, String)>,
}

/// Maps the batch to rows and stores them in one transaction (run as a task of its own,
/// while the next batch is being received).
async fn store_batch(
    store: Arc<dyn Store>,
    reason: Option<String>,
    max_body_bytes: usize,
    batch: Vec<Held>,
) -> Result<StoredBatch> {
    let started = Instant::now();
    // Rows for the messages within the body limit; the others are refused up front.
    let mut refused: Vec<(usize, String)> = Vec::new();
    let mut rows: Vec<CapturedLetter> = Vec::with_capacity(batch.len());
    let mut row_of: Vec<Option<usize>> = Vec::with_capacity(batch.len());
    for (i, h) in batch.iter().enumerate() {
        if h.body.len() > max_body_bytes {
            refused.push((
                i,
                format!(
                    "its body of {} bytes is over the limit of {max_body_bytes} bytes (--max-body-bytes)",
                    h.body.len(),
                ),
            ));
            row_of.push(None);
        } else {
            let letter = to_letter(&h.body, &h.properties, h.redelivered, reason.as_deref());
            // Headers nested deeper than a JSON reader takes could be stored but never
            // shown or replayed as they were.
            if serde_json::from_str::<Value>(&letter.row.headers_json).is_err() {
                refused.push((
                    i,
                    "its headers nest too deeply to be read back (more than 128 levels)".into(),
                ));
                row_of.push(None);
                continue;
            }
            row_of.push(Some(rows.len()));
            rows.push(letter);
        }
    }
    let mapped = Instant::now();
    let outcomes = store.capture(&rows).await;
    tracing::debug!(
        messages = batch.len(),
        map_ms = (mapped - started).as_secs_f64() * 1000.0,
        store_ms = mapped.elapsed().as_secs_f64() * 1000.0,
        "batch stored"
    );
    let outcomes = outcomes?;
    let mut captured = 0;
    let mut already = 0;
    for (i, slot) in row_of.iter().enumerate() {
        if let Some(r) = slot {
            match &outcomes[*r] {
                CaptureOutcome::Inserted => captured += 1,
                CaptureOutcome::AlreadyThere => already += 1,
                CaptureOutcome::Refused(why) => {
                    refused.push((i, format!("the database refused it: {why}")))
                }
            }
        }
    }
    refused.sort_by_key(|(i, _)| *i);
    Ok(StoredBatch {
        batch,
        captured,
        already,
        refused,
    })
}

/// After a batch's transaction: parks what could not be stored, then acks the batch.
/// `Some`: the broker or the database went away (nothing of this batch acked).
async fn settle(
    session: &Session,
    opts: &CaptureOptions,
    stored: Result<StoredBatch>,
    summary: &mut CaptureSummary,
    parker: &mut Option<Publisher>,
    on_event: &mut impl FnMut(Event<'_>),
) -> Result<Option<String>> {
    let StoredBatch {
        batch,
        captured,
        already,
        refused,
    } = match stored {
        Ok(s) => s,
        Err(e @ (DlqError::SchemaMissing(_) | DlqError::Usage(_))) => return Err(e),
        Err(e) => return Ok(Some(format!("the database did not take the batch ({e})"))),
    };
    summary.captured += captured;
    summary.already_there += already;
    if !refused.is_empty() {
        match &opts.park_queue {
            Some(park) => {
                for (i, why) in &refused {
                    park::park_one(opts, park, &batch[*i], why, parker).await?;
                    summary.parked += 1;
                    on_event(Event::Parked { why });
                }
            }
            None => {
                // Ack the stored ones one by one, hand the refused back, stop.
                let bad: std::collections::HashSet<usize> =
                    refused.iter().map(|(i, _)| *i).collect();
                for (i, h) in batch.iter().enumerate() {
                    let res = if bad.contains(&i) {
                        session
                            .channel
                            .basic_nack(
                                h.tag,
                                BasicNackOptions {
                                    multiple: false,
                                    requeue: true,
                                },
                            )
                            .await
                    } else {
                        session
                            .channel
                            .basic_ack(h.tag, BasicAckOptions { multiple: false })
                            .await
                    };
                    if let Err(e) = res {
                        tracing::debug!(error = %broker_text(&e), "ack after a refused message");
                    }
                }
                let (i, why) = &refused[0];
                return Err(DlqError::other(format!(
                    "a message from {} cannot be stored{}: {why}; it is back in the queue, nothing was dropped ({} stored before it in this run). Give --park-queue QUEUE to set such messages aside and go on",
                    opts.queue,
                    describe(&batch[*i]),
                    summary.captured
                )));
            }
        }
    }
    let last = batch.last().map(|h| h.tag).unwrap_or_default();
    match timeout(
        opts.confirm_timeout,
        session
            .channel
            .basic_ack(last, BasicAckOptions { multiple: true }),
    )
    .await
    {
        Ok(Ok(())) => Ok(None),
        Ok(Err(e)) => Ok(Some(format!(
            "lost the broker connection to {} before the ack ({}); the stored messages come back flagged redelivered and are not stored twice",
            session.host,
            broker_text(&e)
        ))),
        Err(_) => Ok(Some(format!(
            "the ack to {} did not go out within {}",
            session.host,
            humantime::format_duration(opts.confirm_timeout)
        ))),
    }
}

/// " (message_id ...)" when the message has one, for error lines.
fn describe(h: &Held) -> String {
    match h.properties.message_id() {
        Some(m) => format!(" (message_id {:?})", m.as_str()),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::{ByteArray, DecimalValue, FieldArray};

    fn t(pairs: Vec<(&str, AMQPValue)>) -> FieldTable {
        let mut t = FieldTable::default();
        for (k, v) in pairs {
            t.insert(k.into(), v);
        }
        t
    }

    fn ls(s: &str) -> AMQPValue {
        AMQPValue::LongString(s.into())
    }

    fn death(reason: &str, count: i64) -> AMQPValue {
        AMQPValue::FieldArray(FieldArray::from(vec![
            AMQPValue::FieldTable(t(vec![
                ("queue", ls("orders")),
                ("reason", ls(reason)),
                ("count", AMQPValue::LongLongInt(count)),
                ("exchange", ls("shop")),
                (
                    "routing-keys",
                    AMQPValue::FieldArray(FieldArray::from(vec![ls("orders.created")])),
                ),
                ("time", AMQPValue::Timestamp(1_800_000_000)),
            ])),
            AMQPValue::FieldTable(t(vec![("queue", ls("older")), ("reason", ls("expired"))])),
        ]))
    }

    #[test]
    fn header_values_as_json() {
        let j = |v: AMQPValue| amqp_to_json(&v);
        assert_eq!(j(AMQPValue::Float(1.1)), serde_json::json!(1.1));
        assert_eq!(
            j(AMQPValue::DecimalValue(DecimalValue {
                scale: 2,
                value: 1234
            })),
            serde_json::json!(12.34)
        );
        assert_eq!(j(AMQPValue::Timestamp(17)), serde_json::json!(17));
        assert_eq!(j(AMQPValue::ShortShortInt(-3)), serde_json::json!(-3));
        assert_eq!(j(AMQPValue::Void), Value::Null);
        assert_eq!(
            j(AMQPValue::ByteArray(ByteArray::from(vec![0xc3_u8, 0x28]))),
            serde_json::json!({"$bytes": "wyg="})
        );
        assert_eq!(j(ls("é")), serde_json::json!("é"));
        assert_eq!(j(AMQPValue::Double(f64::NAN)), serde_json::json!("NaN"));
    }

    #[test]
    fn reasons() {
        assert_eq!(map_reason("rejected"), "poison_message");
        assert_eq!(map_reason("delivery_limit"), "retries_exhausted");
        assert_eq!(map_reason("expired"), "expired");
        assert_eq!(map_reason("maxlen"), "maxlen");
    }

    #[test]
    fn a_delivery_as_a_row() {
        let props = BasicProperties::default()
            .with_message_id("m-1".into())
            .with_headers(t(vec![
                ("x-death", death("rejected", 4)),
                ("x-error", ls("KeyError: 'sku'\0")),
            ]));
        let c = to_letter(b"not json", &props, false, None);
        let r = &c.row;
        assert_eq!(r.reason, "poison_message");
        assert_eq!(r.attempts, 4, "one delivery per rejection");
        assert_eq!(r.source_queue.as_deref(), Some("orders"), "the first entry");
        assert_eq!(r.exchange.as_deref(), Some("shop"));
        assert_eq!(r.routing_key.as_deref(), Some("orders.created"));
        assert_eq!(r.dead_lettered_at.unwrap().timestamp(), 1_800_000_000);
        assert_eq!(r.error.as_deref(), Some("KeyError: 'sku'\u{FFFD}"));
        assert!(
            r.headers_json.contains("\\u0000"),
            "the headers keep the NUL"
        );
        assert_eq!(r.event_id.as_deref(), Some("m-1"));
        assert!(!c.redelivered);

        let over = to_letter(b"{}", &props, true, Some("permanent_failure"));
        assert_eq!(over.row.reason, "permanent_failure");
        assert!(over.redelivered);

        let with_event = to_letter(br#"{"event_id":"e-9"}"#, &props, false, None);
        assert_eq!(with_event.row.event_id, None, "the store's rule finds e-9");

        let bare = to_letter(b"x", &BasicProperties::default(), false, None);
        assert_eq!(bare.row.reason, "unknown");
        assert_eq!(bare.row.attempts, 0);
        assert_eq!(bare.row.source_queue, None);
        assert_eq!(bare.row.dead_lettered_at, None, "the database's now()");
        assert_eq!(bare.row.headers_json, "{}");
    }

    #[test]
    fn expired_messages_were_never_consumed_and_delivery_count_wins_on_a_first_delivery() {
        let h = |extra: Vec<(&str, AMQPValue)>| {
            let mut v = vec![("x-death", death("expired", 1))];
            v.extend(extra);
            BasicProperties::default().with_headers(t(v))
        };
        assert_eq!(to_letter(b"", &h(vec![]), false, None).row.attempts, 0);
        let counted = h(vec![("x-delivery-count", AMQPValue::LongInt(6))]);
        assert_eq!(to_letter(b"", &counted, false, None).row.attempts, 6);
        assert_eq!(
            to_letter(b"", &counted, true, None).row.attempts,
            0,
            "on a redelivery the count may be the dead-letter queue's own"
        );
    }

    #[test]
    fn the_capture_key() {
        let headers = |count: Option<i32>| {
            let mut v = vec![("x-death", death("rejected", 1)), ("a", ls("1"))];
            if let Some(c) = count {
                v.push(("x-delivery-count", AMQPValue::LongInt(c)));
            }
            t(v)
        };
        let key = |body: &[u8], h: FieldTable, id: Option<&str>| {
            let mut p = BasicProperties::default().with_headers(h.clone());
            if let Some(id) = id {
                p = p.with_message_id(id.into());
            }
            capture_key(body, &headers_to_json(&h), &p)
        };
        let json = Value::Object(headers_to_json(&headers(None)));
        assert_eq!(
            json.to_string(),
            canonical_json(&json),
            "built from a field table, the JSON is canonical already"
        );
        let direct = to_letter(
            b"b",
            &BasicProperties::default().with_headers(headers(None)),
            false,
            None,
        );
        assert_eq!(direct.capture_key, key(b"b", headers(None), None));
        let k = key(b"b", headers(None), None);
        assert!(k.starts_with("v1:1800000000:") && k.len() == 78, "{k}");
        assert_eq!(k, key(b"b", headers(None), None), "stable");
        assert_eq!(
            k,
            key(b"b", headers(Some(3)), None),
            "a quorum queue's redelivery count is not part of it"
        );
        assert_ne!(k, key(b"c", headers(None), None));
        assert_ne!(k, key(b"b", headers(None), Some("m")));
        assert_ne!(k, key(b"b", t(vec![("a", ls("1"))]), None));
        // Length prefixes: moving bytes between parts changes the key.
        assert_ne!(
            key(b"ab", FieldTable::default(), None),
            key(b"a", FieldTable::default(), Some("b"))
        );
    }
}
