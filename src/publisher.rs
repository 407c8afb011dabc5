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
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
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

/// Checks an AMQP URL before any driver sees it (their parse errors echo the password).
pub fn validate_amqp_url(url: &SecretUrl) -> Result<()> {
    let u = url::Url::parse(url.expose()).map_err(|e| {
        DlqError::usage(format!(
            "invalid AMQP URL {url}: {e}; expected amqp://USER:PASSWORD@HOST:PORT/VHOST"
        ))
    })?;
    if u.scheme() != "amqp" && u.scheme() != "amqps" {
        return Err(DlqError::usage(format!(
            "invalid AMQP URL {url}: the scheme must be amqp or amqps"
        )));
    }
    if u.host_str().unwrap_or("").is_empty() {
        return Err(DlqError::usage(format!("invalid AMQP URL {url}: no host")));
    }
    if !u.username().is_empty() && u.password().is_none() {
        return Err(DlqError::usage(format!(
            "AMQP URL {url} names user {:?} but no password; give one (or use --amqp-url-file) rather than relying on the default",
            u.username()
        )));
    }
    Ok(())
}

fn host_of(url: &SecretUrl) -> String {
    url::Url::parse(url.expose())
        .ok()
        .map(|u| {
            format!(
                "{}:{}",
                u.host_str().unwrap_or("?"),
                u.port()
                    .unwrap_or(if u.scheme() == "amqps" { 5671 } else { 5672 })
            )
        })
        .unwrap_or_else(|| "?".into())
}

impl Publisher {
    /// Connects and opens a channel in confirm mode. An error here means nothing was
    /// published: the caller treats it as a certain failure.
    pub async fn connect(
        url: &SecretUrl,
        opts: PublisherOptions,
    ) -> std::result::Result<Self, String> {
        validate_amqp_url(url).map_err(|e| e.to_string())?;
        let host = host_of(url);
        let props = ConnectionProperties::default()
            .with_connection_name(LongString::from(opts.connection_name.clone()));
        let deadline = Instant::now() + opts.connect_timeout;
        let conn = match timeout(opts.connect_timeout, Connection::connect(url.expose(), props)).await {
            Err(_) => {
                return Err(format!(
                    "timed out after {} connecting to RabbitMQ at {host} (unreachable, or the vhost does not exist)",
                    humantime::format_duration(opts.connect_timeout)
                ))
            }
            Ok(Err(e)) => return Err(describe_connect_error(&e, &host)),
            Ok(Ok(c)) => c,
        };
        let channel = match tokio::time::timeout_at(deadline, conn.create_channel()).await {
            Ok(Ok(ch)) => ch,
            Ok(Err(e)) => {
                return Err(format!(
                    "opening a channel on {host}: {}",
                    scrub(&e.to_string())
                ))
            }
            Err(_) => return Err(format!("timed out opening a channel on {host}")),
        };
        match tokio::time::timeout_at(
            deadline,
            channel.confirm_select(ConfirmSelectOptions::default()),
        )
        .await
        {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                return Err(format!(
                    "enabling publisher confirms on {host}: {}",
                    scrub(&e.to_string())
                ))
            }
            Err(_) => return Err(format!("timed out enabling publisher confirms on {host}")),
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

    /// One publish, one confirm.
    pub async fn publish(&self, target: &Target, msg: &OutgoingMessage) -> PublishResult {
        let deadline = Instant::now() + self.opts.confirm_timeout;
        let pending = self.send(target, msg).await;
        self.settle(pending, deadline).await
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
        Value::Object(m) => AMQPValue::FieldTable(to_field_table(m)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
