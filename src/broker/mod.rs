//! The broker side that replay and capture share: opening a connection ([`connect`]),
//! publishing with confirms ([`publish`]) and judging them ([`confirm`]), the run's
//! connection over a cluster's nodes ([`run`]), the header codec in both directions
//! ([`codec`]) and the reading of the broker's answers by reply code ([`reply`]). None
//! of it knows about rows or the replay protocol, so both `replay` and `capture` use it
//! without using each other.

pub mod codec;
pub mod confirm;
pub mod connect;
pub mod publish;
pub mod reply;
pub mod run;

pub use publish::{OutgoingMessage, PublishResult, Publisher, PublisherOptions, Sent, Target};
pub use run::{unless_stopped, Broker, NoConnection, Turn};
