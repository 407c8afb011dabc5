//! The broker settings every command that talks to RabbitMQ shares: the node URLs, the
//! TLS files, and what the operator says of the broker's shape (docs/cluster.md), which
//! decides whether a nack is certain.

use super::context::read_url_file;
use super::Ctx;
use dlq::error::DlqError;
use dlq::secret::SecretUrl;
use dlq::topology::BrokerTopology;

impl Ctx {
    pub fn tls_files(&self) -> dlq::publisher::TlsFiles {
        dlq::publisher::TlsFiles {
            ca_file: self.global.amqp_ca_file.clone(),
            // clap takes the two together or neither.
            client: match (&self.global.amqp_client_cert, &self.global.amqp_client_key) {
                (Some(cert), Some(key)) => Some(dlq::publisher::ClientIdentity {
                    cert: cert.clone(),
                    key: key.clone(),
                }),
                _ => None,
            },
        }
    }

    /// The broker's node URLs, in the order to try them: one for a single broker,
    /// several for the nodes of one cluster.
    pub fn amqp_urls(&self) -> dlq::error::Result<Vec<SecretUrl>> {
        self.amqp_urls_as_given()
            .map_err(|e| Self::bad_value(&self.profile.amqp_url, e))
    }

    fn amqp_urls_as_given(&self) -> dlq::error::Result<Vec<SecretUrl>> {
        let raw: Vec<String> = match &self.global.amqp_url_file {
            Some(p) => read_url_file(p, "AMQP URL")?
                .split([',', '\n'])
                .map(|u| u.trim().to_string())
                .collect(),
            None => self.global.amqp_url.clone(),
        };
        let urls: Vec<SecretUrl> = raw
            .into_iter()
            .map(|u| u.trim().to_string())
            .filter(|u| !u.is_empty())
            .map(SecretUrl::new)
            .collect();
        if urls.is_empty() {
            return Err(DlqError::usage("no AMQP URL given"));
        }
        for url in &urls {
            dlq::publisher::validate_amqp_url(url)?;
            if self.global.require_tls && url.scheme() != "amqps" {
                return Err(DlqError::usage(format!(
                    "--require-tls: the AMQP URL {url} is not amqps://"
                )));
            }
        }
        Ok(urls)
    }

    /// What the operator says of the broker's shape (flag, env, then profile), checked
    /// against the URLs: several URLs are the nodes of one cluster, so `single` with
    /// several is refused. Not said: [`BrokerTopology::Unknown`], a possible cluster.
    pub fn broker_topology(&self, urls: &[SecretUrl]) -> dlq::error::Result<BrokerTopology> {
        let (said, origin) = match (&self.global.broker_topology, &self.profile.broker_topology) {
            (Some(t), _) => (*t, None),
            (None, Some((raw, origin))) => match BrokerTopology::parse(raw) {
                Some(t) => (t, Some(origin.clone())),
                None => {
                    return Err(DlqError::Config(format!(
                        "{origin}: broker_topology: {raw:?} is not one of {}",
                        BrokerTopology::NAMES.join(", ")
                    )))
                }
            },
            (None, None) => (BrokerTopology::Unknown, None),
        };
        if said == BrokerTopology::Single && urls.len() > 1 {
            let e = DlqError::usage(format!(
                "the broker topology is single, but {} AMQP URLs are given: several URLs are the nodes of one cluster",
                urls.len()
            ));
            return Err(Self::bad_value(&origin, e));
        }
        Ok(said.for_nodes(urls.len()))
    }
}
