//! Opening a connection to RabbitMQ, shared by replay (the publisher) and capture: the
//! URL parsed the way an operator means it (and never echoed with its password), the TLS
//! files read, every wait bounded, and failures classified by reply code.

use crate::broker::reply::{connect_failure, ConnectFailure};
use crate::error::{DlqError, Result};
use crate::secret::{scrub, SecretUrl};
use crate::spell::{words, Flag, Spell};
use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};
use lapin::types::LongString;
use lapin::uri::AMQPUri;
use lapin::{Connection, ConnectionProperties, DefaultConnectionBuilder};
use std::time::Duration;
use tokio::time::timeout;

/// TLS material for `amqps://`, read when connecting.
#[derive(Debug, Clone, Default)]
pub struct TlsFiles {
    /// PEM bundle of CAs to trust (default: the system's roots).
    pub ca_file: Option<std::path::PathBuf>,
    /// For client-certificate authentication.
    pub client: Option<ClientIdentity>,
}

/// A PEM client certificate and its PKCS#8 PEM key: one is no use without the other.
#[derive(Debug, Clone)]
pub struct ClientIdentity {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
}

impl TlsFiles {
    pub(crate) fn load(&self) -> std::result::Result<OwnedTLSConfig, ConnectError> {
        let read = |p: &std::path::Path, what: &str| {
            std::fs::read(p).map_err(|source| ConnectError::File {
                what: format!("cannot read the {what} {}", p.display()),
                source,
            })
        };
        let cert_chain = match &self.ca_file {
            Some(p) => Some(String::from_utf8(read(p, "CA file")?).map_err(|_| {
                DlqError::usage(format!("the CA file {} is not PEM text", p.display()))
            })?),
            None => None,
        };
        let identity = match &self.client {
            Some(c) => Some(OwnedIdentity::PKCS8 {
                pem: read(&c.cert, "client certificate")?,
                key: read(&c.key, "client key")?,
            }),
            None => None,
        };
        Ok(OwnedTLSConfig {
            identity,
            cert_chain,
        })
    }
}

/// Why a connection (and so a publish) could not start: nothing was published.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The URL or the TLS files are unusable: fix the configuration.
    #[error("{0}")]
    Setup(#[from] DlqError),
    #[error("{what}")]
    File {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("timed out after {after} {doing} at {host}{hint}")]
    TimedOut {
        doing: &'static str,
        host: String,
        after: String,
        hint: &'static str,
    },
    #[error("RabbitMQ at {host} has blocked publishing (memory or disk alarm); nothing was sent")]
    Blocked { host: String },
    /// The broker or the network said no; `what` is the operator's reading of it.
    #[error("{what}")]
    Broker {
        what: String,
        #[source]
        source: lapin::Error,
    },
    #[error("connecting to RabbitMQ failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    #[error("no node of the cluster answers ({} tried): {}", .0.len(), join(.0))]
    NoNode(Vec<ConnectError>),
}

fn join(errors: &[ConnectError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

impl ConnectError {
    /// The error's text, what it names of the CLI spelled by `s`.
    pub fn render(&self, s: &dyn Spell) -> String {
        match self {
            ConnectError::Setup(e) => e.render(s),
            other => other.to_string(),
        }
    }

    pub(crate) fn broker(what: impl Into<String>, source: lapin::Error) -> Self {
        ConnectError::Broker {
            what: what.into(),
            source,
        }
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
    if let Some(why) = url.problem() {
        return Err(bad(format!(
            "{why}; expected amqp://USER:PASSWORD@HOST:PORT/VHOST"
        )));
    }
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
        return Err(DlqError::usage(
            words(format!(
                "AMQP URL {url} names user {:?} but no password; give one (or use ",
                u.username()
            ))
            .flag(Flag::AmqpUrlFile)
            .text(") rather than relying on a default"),
        ));
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
    // lapin sizes its two I/O buffers (32 frames each) by the frame size it knows when it
    // opens the socket and zero-fills them again once the broker's is negotiated: asked
    // for up front, they are allocated once and touched only as used (2 x 4 MiB less to
    // fault in per connection, ~6 ms of CPU for a one-shot replay). RabbitMQ's default.
    uri.query.frame_max.get_or_insert(FRAME_MAX);
    Ok(uri)
}

/// The frame size asked for when the URL gives none: RabbitMQ's default `frame_max`.
const FRAME_MAX: u32 = 131_072;

/// Checks an AMQP URL (see [`parse_amqp_url`]).
pub fn validate_amqp_url(url: &SecretUrl) -> Result<()> {
    parse_amqp_url(url).map(|_| ())
}

pub(crate) fn host_of(uri: &AMQPUri) -> String {
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
) -> std::result::Result<(Connection, String), ConnectError> {
    let uri = parse_amqp_url(url)?;
    let host = host_of(&uri);
    let tls = opts.tls.load()?;
    let props = ConnectionProperties::default()
        .with_connection_name(LongString::from(opts.connection_name.clone()));
    let builder = DefaultConnectionBuilder::new()
        .map_err(|e| ConnectError::broker("no async runtime for the broker connection", e))?
        .with_uri(uri)
        .with_properties(props)
        .with_tls_config(tls);
    match timeout(opts.connect_timeout, builder.connect()).await {
        Err(_) => Err(ConnectError::TimedOut {
            doing: "connecting to RabbitMQ",
            host,
            after: humantime::format_duration(opts.connect_timeout).to_string(),
            hint: " (unreachable, or the vhost does not exist)",
        }),
        Ok(Err(e)) => Err(ConnectError::broker(describe_connect_error(&e, &host), e)),
        Ok(Ok(c)) => Ok((c, host)),
    }
}

/// Tries the URLs in order (the nodes of one cluster) and returns the first connection
/// that opens, with the index of its URL; when none does, the last error.
pub async fn open_first_connection(
    urls: &[SecretUrl],
    opts: &ConnectOptions,
) -> std::result::Result<(Connection, String, usize), ConnectError> {
    let mut last = ConnectError::Setup(DlqError::usage("no AMQP URL given"));
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

fn describe_connect_error(e: &lapin::Error, host: &str) -> String {
    let text = scrub(&e.to_string());
    match connect_failure(e) {
        ConnectFailure::LoginRefused => {
            format!("RabbitMQ at {host} refused the login (wrong user or password): {text}")
        }
        ConnectFailure::VhostRefused => {
            format!("RabbitMQ at {host} refused the vhost (missing, or no access): {text}")
        }
        ConnectFailure::ConnectionRefused => {
            format!("could not connect to RabbitMQ at {host}: connection refused")
        }
        ConnectFailure::Other => format!("could not connect to RabbitMQ at {host}: {text}"),
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
    fn frame_size_is_asked_for_up_front_unless_the_url_gives_one() {
        assert_eq!(
            parse("amqp://u:p@h").unwrap().query.frame_max,
            Some(FRAME_MAX)
        );
        let given = parse("amqp://u:p@h/%2f?frame_max=16384").unwrap();
        assert_eq!(given.query.frame_max, Some(16384));
    }
}
