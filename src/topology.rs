//! What `dlq` knows of the broker's shape: one node, a cluster, or not known.
//!
//! It decides whether a nack on the default exchange is a certain failure. On one node it
//! is (the route has one queue, and that queue refused the message: a full
//! `reject-publish` queue). In a cluster it is not: RabbitMQ nacks a publish routed to a
//! queue whose leader or node went away, even when a replica kept the message. A cluster
//! behind one address (a load balancer) looks like one node, and the broker does not say
//! which it is: `connection.start` carries a `cluster_name`, which a lone node has too
//! (its own node name), and a passive `queue.declare` gives only message and consumer
//! counts. So only the operator's word makes such a nack certain; without it `dlq` treats
//! the broker as a possible cluster and the nack as `uncertain`.

/// The broker's shape as far as `dlq` knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BrokerTopology {
    /// Not said: possibly a cluster behind one address.
    #[default]
    Unknown,
    /// The operator says the broker is one node (`--broker-topology single`).
    Single,
    /// Several node URLs, or the operator says so.
    Cluster,
}

impl BrokerTopology {
    /// The values an operator can give.
    pub const NAMES: [&'static str; 2] = ["single", "cluster"];

    /// Reads an operator's value (`single` or `cluster`).
    pub fn parse(s: &str) -> Option<BrokerTopology> {
        match s.trim().to_ascii_lowercase().as_str() {
            "single" => Some(BrokerTopology::Single),
            "cluster" => Some(BrokerTopology::Cluster),
            _ => None,
        }
    }

    /// The topology of a run with `nodes` URLs: several URLs are one cluster, whatever
    /// was said.
    pub fn for_nodes(self, nodes: usize) -> BrokerTopology {
        match nodes {
            0 | 1 => self,
            _ => BrokerTopology::Cluster,
        }
    }
}
