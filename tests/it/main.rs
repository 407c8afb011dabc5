//! The integration tests: one binary, one module per behaviour (tests/README.md says
//! where a new test goes). Every test runs against the real services and the real `dlq`
//! binary; the heavy chaos runs (soak, 3-node cluster) are the `chaos` binary's.
//!
//! Run one module: `cargo test --test it replay::`; one test: `cargo test --test it
//! NAME`.

#[path = "../common/mod.rs"]
mod common;

mod alerting;
mod bodies;
mod capture;
mod cli;
mod connect;
mod model;
mod output;
mod plan;
mod replay;
mod revisions;
mod runbooks;
mod security;
mod store;
mod triage;
