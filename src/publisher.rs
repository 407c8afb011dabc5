//! The broker side of a replay: one connection, one channel in confirm mode, every wait
//! bounded.
//!
//! Results are classified for the protocol, conservatively: [`PublishResult::Failed`]
//! only where the broker certainly does not have the message (could not connect, the
//! connection was blocked before sending, a nack, or an ack that came with the message
//! returned as unroutable); [`PublishResult::Uncertain`] wherever the message may have
//! reached a queue (lost connection or timeout after the publish was handed to the
//! socket). lapin can hang when the server closes the connection and when a vhost is
//! missing, hence a timeout around every await.

use crate::error::{DlqError, Result};
use crate::secret::{scrub, SecretUrl};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use lapin::uri::AMQPUri;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, DefaultConnectionBuilder};
use lapin::{Confirmation, PublisherConfirm};
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
}

/// A message ready to publish: body byte for byte, headers, properties.
#[derive(Debug, Clone)]
pub struct OutgoingMessage {
    pub body: Vec<u8>,
    pub headers: FieldTable,
    pub message_id: Option<String>,
}

impl OutgoingMessage {
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
pub struct Pending {
    confirm: std::result::Result<PublisherConfirm, PublishResult>,
}

pub struct Publisher {
    conn: Connection,
    channel: Channel,
    opts: PublisherOptions,
    host: String,
}

/// TLS material for `amqps://`, read when connecting.
#[derive(Debug, Clone, Default)]
pub struct TlsFiles {
    /// PEM bundle of CAs to trust (default: the system's roots).
    pub ca_file: Option<std::path::PathBuf>,
    /// PEM client certificate and PKCS#8 PEM key, for client-certificate authentication.
    pub client_cert: Option<std::path::PathBuf>,
    pub client_key: Option<std::path::PathBuf>,
}

impl TlsFiles {
    fn load(&self) -> std::result::Result<OwnedTLSConfig, String> {
        let read = |p: &std::path::Path, what: &str| {
            std::fs::read(p).map_err(|e| format!("cannot read the {what} {}: {e}", p.display()))
        };
        let cert_chain = match &self.ca_file {
            Some(p) => Some(
                String::from_utf8(read(p, "CA file")?)
                    .map_err(|_| format!("the CA file {} is not PEM text", p.display()))?,
            ),
            None => None,
        };
        let identity = match (&self.client_cert, &self.client_key) {
            (Some(c), Some(k)) => Some(OwnedIdentity::PKCS8 {
                pem: read(c, "client certificate")?,
                key: read(k, "client key")?,
            }),
            (None, None) => None,
            _ => return Err("--amqp-client-cert and --amqp-client-key go together".into()),
        };
        Ok(OwnedTLSConfig {
            identity,
            cert_chain,
        })
    }
}

/// Parses an AMQP URL the way an operator means it, before any driver sees it (their
/// parse errors echo the password). Unlike the AMQP URI parser underneath lapin, an IP
/// host (`10.0.0.5`, `[::1]`) is kept, not replaced by `localhost`; a user without a
/// password is refused rather than given `guest`'s; `amqp://host` and `amqp://host/%2f`
/// mean vhost `/`, and a bare trailing `/` (the empty vhost) is refused with an
/// explanation.
pub fn parse_amqp_url(url: &SecretUrl) -> Result<AMQPUri> {
    let bad = |why: String| DlqError::usage(format!("invalid AMQP URL {url}: {why}"));
    let u = url::Url::parse(url.expose()).map_err(|e| {
        bad(format!(
            "{e}; expected amqp://USER:PASSWORD@HOST:PORT/VHOST"
        ))
    })?;
    if u.scheme() != "amqp" && u.scheme() != "amqps" {
        return Err(bad("the scheme must be amqp or amqps".into()));
    }
    let host = match u.host() {
        Some(url::Host::Domain(d)) if !d.is_empty() => d.to_string(),
        Some(url::Host::Ipv4(ip)) => ip.to_string(),
        Some(url::Host::Ipv6(ip)) => ip.to_string(),
        _ => return Err(bad("no host".into())),
    };
    if !u.username().is_empty() && u.password().is_none() {
        return Err(DlqError::usage(format!(
            "AMQP URL {url} names user {:?} but no password; give one (or use --amqp-url-file) rather than relying on a default",
            u.username()
        )));
    }
    let decode = |s: &str| {
        url::form_urlencoded::parse(format!("x={}", s.replace('+', "%2B")).as_bytes())
            .next()
            .map(|(_, v)| v.into_owned())
            .unwrap_or_default()
    };
    let vhost = match u.path() {
        "" => "/".to_string(),
        "/" => {
            return Err(bad(
                "it ends in '/', which names the empty vhost \"\"; for the default vhost write /%2f (or leave the path out)".into(),
            ))
        }
        p if p[1..].contains('/') => {
            return Err(bad(format!(
                "vhost path {p:?} has more than one segment; encode a '/' inside a vhost name as %2f"
            )))
        }
        p => decode(&p[1..]),
    };
    // The query (heartbeat, connection_timeout, ...) is parsed by the AMQP URI parser;
    // its error text is not shown since it repeats the URL.
    let mut uri: AMQPUri = url
        .expose()
        .parse()
        .map_err(|_| bad("unsupported query parameters".into()))?;
    uri.authority.host = host;
    uri.authority.port = u
        .port()
        .unwrap_or(if u.scheme() == "amqps" { 5671 } else { 5672 });
    if !u.username().is_empty() {
        uri.authority.userinfo.username = decode(u.username());
        uri.authority.userinfo.password = decode(u.password().unwrap_or_default());
    }
    uri.vhost = vhost;
    Ok(uri)
}

/// Checks an AMQP URL (see [`parse_amqp_url`]).
pub fn validate_amqp_url(url: &SecretUrl) -> Result<()> {
    parse_amqp_url(url).map(|_| ())
}

fn host_of(uri: &AMQPUri) -> String {
    if uri.authority.host.contains(':') {
        format!("[{}]:{}", uri.authority.host, uri.authority.port)
    } else {
        format!("{}:{}", uri.authority.host, uri.authority.port)
    }
}

/// How to open a connection to the broker (shared by the publisher and `capture`).
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    pub connect_timeout: Duration,
    /// Shown in the broker's management UI.
    pub connection_name: String,
    pub tls: TlsFiles,
}

/// Opens one AMQP connection: the URL parsed as [`parse_amqp_url`] does, the TLS files
/// read, every wait bounded by the connect timeout, errors in one line without the
/// password. Returns the connection and `host:port` for messages.
pub async fn open_connection(
    url: &SecretUrl,
    opts: &ConnectOptions,
) -> std::result::Result<(Connection, String), String> {
    let uri = parse_amqp_url(url).map_err(|e| e.to_string())?;
    let host = host_of(&uri);
    let tls = opts.tls.load()?;
    let props = ConnectionProperties::default()
        .with_connection_name(LongString::from(opts.connection_name.clone()));
    let builder = DefaultConnectionBuilder::new()
        .map_err(|e| format!("no async runtime for the broker connection: {e}"))?
        .with_uri(uri)
        .with_properties(props)
        .with_tls_config(tls);
    match timeout(opts.connect_timeout, builder.connect()).await {
        Err(_) => Err(format!(
            "timed out after {} connecting to RabbitMQ at {host} (unreachable, or the vhost does not exist)",
            humantime::format_duration(opts.connect_timeout)
        )),
        Ok(Err(e)) => Err(describe_connect_error(&e, &host)),
        Ok(Ok(c)) => Ok((c, host)),
    }
}

/// Tries the URLs in order (the nodes of one cluster) and returns the first connection
/// that opens, with the index of its URL; when none does, the last error.
pub async fn open_first_connection(
    urls: &[SecretUrl],
    opts: &ConnectOptions,
) -> std::result::Result<(Connection, String, usize), String> {
    let mut last = "no AMQP URL given".to_string();
    for (i, url) in urls.iter().enumerate() {
        match open_connection(url, opts).await {
            Ok((c, host)) => return Ok((c, host, i)),
            Err(e) => {
                tracing::debug!(error = %e, "broker node did not answer");
                last = e;
            }
        }
    }
    Err(last)
}

impl Publisher {
    /// Connects and opens a channel in confirm mode. An error here means nothing was
    /// published: the caller treats it as a certain failure.
    pub async fn connect(
        url: &SecretUrl,
        opts: PublisherOptions,
    ) -> std::result::Result<Self, String> {
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
        let blocked = || {
            format!("RabbitMQ at {host} has blocked publishing (memory or disk alarm); nothing was sent")
        };
        let channel = match until_blocked(&conn, deadline, conn.create_channel()).await {
            Step::Done(Ok(ch)) => ch,
            Step::Done(Err(e)) => {
                return Err(format!(
                    "opening a channel on {host}: {}",
                    scrub(&e.to_string())
                ))
            }
            Step::Blocked => return Err(blocked()),
            Step::TimedOut => return Err(format!("timed out opening a channel on {host}")),
        };
        match until_blocked(
            &conn,
            deadline,
            channel.confirm_select(ConfirmSelectOptions::default()),
        )
        .await
        {
            Step::Done(Ok(())) => {}
            Step::Done(Err(e)) => {
                return Err(format!(
                    "enabling publisher confirms on {host}: {}",
                    scrub(&e.to_string())
                ))
            }
            Step::Blocked => return Err(blocked()),
            Step::TimedOut => {
                return Err(format!("timed out enabling publisher confirms on {host}"))
            }
        }
        tracing::debug!(%host, "connected to RabbitMQ, confirm mode on");
        Ok(Publisher {
            conn,
            channel,
            opts,
            host,
        })
    }

    /// Hands one message to the broker (mandatory, persistent) without waiting for its
    /// confirm; [`Publisher::settle`] waits.
    pub async fn send(&self, target: &Target, msg: &OutgoingMessage) -> Pending {
        if self.conn.status().blocked() {
            return Pending {
                confirm: Err(PublishResult::Failed(format!(
                    "RabbitMQ at {} has blocked publishing (memory or disk alarm); nothing was sent",
                    self.host
                ))),
            };
        }
        if !self.channel.status().connected() {
            return Pending {
                confirm: Err(PublishResult::Failed(format!(
                    "the channel to {} is closed; nothing was sent",
                    self.host
                ))),
            };
        }
        let (ex, rk) = match (
            ShortString::try_new(target.exchange.clone()),
            ShortString::try_new(target.routing_key.clone()),
        ) {
            (Ok(e), Ok(r)) => (e, r),
            _ => {
                return Pending {
                    confirm: Err(PublishResult::Failed(
                        "exchange or routing key longer than 255 bytes".into(),
                    )),
                }
            }
        };
        let publish = self.channel.basic_publish(
            ex,
            rk,
            BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            },
            &msg.body,
            msg.properties(),
        );
        let confirm = match timeout(self.opts.confirm_timeout, publish).await {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(e)) => Err(PublishResult::Uncertain(format!(
                "the connection to {} failed while publishing ({}); the broker may have the message",
                self.host,
                scrub(&e.to_string())
            ))),
            Err(_) => Err(PublishResult::Uncertain(format!(
                "publishing to {} did not complete within {}; the broker may have the message",
                self.host,
                humantime::format_duration(self.opts.confirm_timeout)
            ))),
        };
        Pending { confirm }
    }

    /// Waits for a confirm, until `deadline` at most.
    pub async fn settle(&self, pending: Pending, deadline: Instant) -> PublishResult {
        let confirm = match pending.confirm {
            Ok(c) => c,
            Err(result) => return result,
        };
        match tokio::time::timeout_at(deadline, confirm).await {
            Err(_) => PublishResult::Uncertain(format!(
                "no publisher confirm from {} within {}: the message may or may not have been published",
                self.host,
                humantime::format_duration(self.opts.confirm_timeout)
            )),
            Ok(Err(e)) => PublishResult::Uncertain(format!(
                "the connection to {} was lost after publishing and before the confirm ({}): the message may or may not have been published",
                self.host,
                scrub(&e.to_string())
            )),
            Ok(Ok(Confirmation::Ack(None))) => PublishResult::Confirmed,
            Ok(Ok(Confirmation::Ack(Some(ret)))) => PublishResult::Failed(format!(
                "the broker returned it as unroutable: {} {} (no queue is bound for this exchange and routing key)",
                ret.reply_code, ret.reply_text
            )),
            Ok(Ok(Confirmation::Nack(ret))) => PublishResult::Failed(match ret {
                Some(r) => format!("the broker refused it (nack): {} {}", r.reply_code, r.reply_text),
                None => "the broker refused it (nack; e.g. a full queue with reject-publish)".into(),
            }),
            Ok(Ok(Confirmation::NotRequested)) => PublishResult::Uncertain(
                "the channel was not in confirm mode; the outcome is unknown".into(),
            ),
        }
    }

    /// False once the connection or channel is gone (a new one is needed).
    pub fn is_usable(&self) -> bool {
        self.conn.status().connected() && self.channel.status().connected()
    }

    pub fn confirm_timeout(&self) -> Duration {
        self.opts.confirm_timeout
    }

    pub async fn close(self) {
        let _ = timeout(Duration::from_secs(2), self.conn.close(200, "bye".into())).await;
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

fn describe_connect_error(e: &lapin::Error, host: &str) -> String {
    let text = scrub(&e.to_string());
    let lower = text.to_lowercase();
    if lower.contains("access_refused")
        || lower.contains("access-refused")
        || lower.contains("authentication")
        || lower.contains("login was refused")
    {
        format!("RabbitMQ at {host} refused the login (wrong user or password): {text}")
    } else if lower.contains("not_allowed") || lower.contains("vhost") {
        format!("RabbitMQ at {host} refused the vhost (missing, or no access): {text}")
    } else if lower.contains("refused") {
        format!("could not connect to RabbitMQ at {host}: connection refused")
    } else {
        format!("could not connect to RabbitMQ at {host}: {text}")
    }
}

/// Headers the broker added while delivering and dead-lettering; not part of the event.
fn is_delivery_bookkeeping(name: &str) -> bool {
    name == "x-death"
        || name == "x-delivery-count"
        || name.starts_with("x-first-death-")
        || name.starts_with("x-last-death-")
}

/// The headers of a replay: the originals minus the broker's bookkeeping, plus ours.
pub fn replay_headers(
    original: &serde_json::Map<String, serde_json::Value>,
    id: &str,
    reason: &str,
    operator: &str,
) -> serde_json::Map<String, serde_json::Value> {
    let mut out: serde_json::Map<String, serde_json::Value> = original
        .iter()
        .filter(|(k, _)| !is_delivery_bookkeeping(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    out.insert("x-replayed-from-dlq".into(), "true".into());
    out.insert("x-dead-letter-reason".into(), reason.into());
    out.insert("x-dead-letter-id".into(), id.into());
    out.insert("x-replayed-by".into(), operator.into());
    out
}

/// JSON headers to AMQP field values.
pub fn to_field_table(headers: &serde_json::Map<String, serde_json::Value>) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in headers {
        if let Ok(key) = ShortString::try_new(k.clone()) {
            t.insert(key, to_amqp(v));
        }
    }
    t
}

fn to_amqp(v: &serde_json::Value) -> AMQPValue {
    use serde_json::Value;
    match v {
        Value::Null => AMQPValue::Void,
        Value::Bool(b) => AMQPValue::Boolean(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => AMQPValue::LongLongInt(i),
            None => AMQPValue::Double(n.as_f64().unwrap_or(0.0)),
        },
        Value::String(s) => AMQPValue::LongString(LongString::from(s.clone())),
        Value::Array(a) => {
            let mut arr = FieldArray::default();
            for x in a {
                arr.push(to_amqp(x));
            }
            AMQPValue::FieldArray(arr)
        }
        Value::Object(m) => match captured_bytes(m) {
            Some(bytes) => AMQPValue::LongString(LongString::from(bytes)),
            None => AMQPValue::FieldTable(to_field_table(m)),
        },
    }
}

/// Header bytes that were not UTF-8 when `dlq capture` stored them, as
/// `{"$bytes": "<base64>"}` (see [`crate::capture::amqp_to_json`]).
fn captured_bytes(m: &serde_json::Map<String, serde_json::Value>) -> Option<Vec<u8>> {
    use base64::Engine;
    match (m.len(), m.get(crate::capture::BYTES_KEY)) {
        (1, Some(serde_json::Value::String(b64))) => {
            base64::engine::general_purpose::STANDARD.decode(b64).ok()
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<AMQPUri> {
        parse_amqp_url(&SecretUrl::new(s))
    }

    #[test]
    fn ip_hosts_are_kept_not_turned_into_localhost() {
        assert_eq!(
            parse("amqp://u:p@10.1.2.3:5673/%2f")
                .unwrap()
                .authority
                .host,
            "10.1.2.3"
        );
        let v6 = parse("amqp://u:p@[::1]:5672/%2f").unwrap();
        assert_eq!(v6.authority.host, "::1");
        assert_eq!(host_of(&v6), "[::1]:5672");
    }

    #[test]
    fn vhosts() {
        assert_eq!(parse("amqp://u:p@h").unwrap().vhost, "/");
        assert_eq!(parse("amqp://u:p@h/%2f").unwrap().vhost, "/");
        assert_eq!(parse("amqp://u:p@h/orders").unwrap().vhost, "orders");
        assert_eq!(parse("amqp://u:p@h/a%2fb").unwrap().vhost, "a/b");
        let e = parse("amqp://u:p@h/").unwrap_err().to_string();
        assert!(e.contains("empty vhost") && e.contains("%2f"), "{e}");
    }

    #[test]
    fn credentials() {
        let u = parse("amqp://bob:s%40cret@h/%2f").unwrap();
        assert_eq!(u.authority.userinfo.username, "bob");
        assert_eq!(u.authority.userinfo.password, "s@cret");
        let e = parse("amqp://bob@h/%2f").unwrap_err().to_string();
        assert!(e.contains("no password"), "{e}");
        let d = parse("amqp://h/%2f").unwrap();
        assert_eq!(d.authority.userinfo.username, "guest");
        assert_eq!(parse("amqps://u:p@h").unwrap().authority.port, 5671);
    }

    #[test]
    fn bookkeeping_headers_are_dropped_and_ours_added() {
        let orig: serde_json::Map<_, _> = serde_json::from_str(
            r#"{"x-death":[{}],"x-first-death-queue":"q","x-last-death-reason":"r",
                "x-delivery-count":3,"x-event-id":"e1","tenant":"acme"}"#,
        )
        .unwrap();
        let h = replay_headers(&orig, "id1", "retries_exhausted", "alice");
        let keys: Vec<&str> = h.keys().map(String::as_str).collect();
        assert!(!keys
            .iter()
            .any(|k| k.contains("death") || *k == "x-delivery-count"));
        assert_eq!(h["tenant"], "acme");
        assert_eq!(h["x-event-id"], "e1");
        assert_eq!(h["x-replayed-from-dlq"], "true");
        assert_eq!(h["x-dead-letter-id"], "id1");
        assert_eq!(h["x-replayed-by"], "alice");
        assert_eq!(h["x-dead-letter-reason"], "retries_exhausted");
    }

    #[test]
    fn captured_non_utf8_header_bytes_go_back_as_bytes() {
        let h: serde_json::Map<_, _> =
            serde_json::from_str(r#"{"raw":{"$bytes":"/wBB"},"t":{"$bytes":"x","other":1}}"#)
                .unwrap();
        let t = to_field_table(&h);
        match t.inner().get("raw") {
            Some(AMQPValue::LongString(s)) => assert_eq!(s.as_bytes(), &[0xff, 0x00, 0x41]),
            other => panic!("{other:?}"),
        }
        assert!(
            matches!(t.inner().get("t"), Some(AMQPValue::FieldTable(_))),
            "only a one-key object is bytes"
        );
    }
}
