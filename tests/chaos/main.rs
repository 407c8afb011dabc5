//! The chaos runs, a binary of their own: a bounded soak (captures, plan runs and single
//! replays at once, with kill -9 and database cuts) and replays through a throw-away
//! 3-node RabbitMQ cluster (tests/cluster/cluster.sh) that loses a node. Each needs the
//! machine to itself, so they run one at a time (`alone`) and never beside the `it`
//! binary's parallel tests (cargo runs test binaries one after another).
//!
//! Run them: `cargo test --test chaos` (or `cargo test --test chaos cluster::`).

#[path = "../common/mod.rs"]
mod common;

mod cluster;
mod soak;

/// Holds the machine for one chaos run at a time (three broker nodes, or the soak's
/// dozens of processes, are heavy on a small machine).
pub fn alone() -> std::sync::MutexGuard<'static, ()> {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}
