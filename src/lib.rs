//! `dlq`: dead-letter triage and safe replay.
//!
//! The library holds everything that must behave the same whoever calls it: the model of
//! a dead letter ([`model`]), the two stores and their SQL ([`store`]), the broker side
//! ([`broker`]: connecting, publishing with confirms, the header codec), capture from a
//! dead-letter queue ([`capture`]), and the replay protocol itself ([`replay`]), which is
//! the only place that moves a row from pending to replayed. The `dlq` binary is a thin command layer.

pub mod broker;
pub mod capture;
pub mod error;
pub mod exit;
pub mod import;
pub mod model;
pub mod plan;
pub mod publisher;
pub mod rate;
pub mod replay;
pub mod revise;
pub mod sanitize;
pub mod secret;
pub mod spell;
pub mod store;
pub mod timeparse;
pub mod topology;

pub use error::{DlqError, Result};
pub use model::Outcome;
