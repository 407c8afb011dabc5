//! The broker side of a replay, under the path replay, plan, the CLI and the tests
//! import it from. The code lives in [`crate::broker`]: publishing with confirms
//! ([`crate::broker::publish`]), judging the confirms ([`crate::broker::confirm`]) and
//! the run's connection over the nodes ([`crate::broker::run`]). New code imports from
//! `crate::broker`; these names stay so that no caller had to change with the move.

pub use crate::broker::codec::{
    as_delivered, replay_headers, to_field_table, DEAD_LETTER_ID_HEADER,
};
pub use crate::broker::connect::{
    open_connection, open_first_connection, parse_amqp_url, validate_amqp_url, ClientIdentity,
    ConnectError, ConnectOptions, TlsFiles,
};
pub use crate::broker::publish::{
    Judged, Nowhere, OutgoingMessage, PublishResult, Publisher, PublisherOptions, Sent, Target,
};
pub use crate::broker::run::{unless_stopped, Broker, NoConnection, Turn};
pub use crate::rate::Pacer;
