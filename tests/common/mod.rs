//! Test harness: real PostgreSQL, real SQLite files, real RabbitMQ, the real binary.
//! Every test makes its own database and queues and removes them afterwards. One module
//! per thing it provides: databases (`db`), runs of `dlq` (`run`, `process`), the broker
//! (`broker`), TCP proxies that cut a service at the moment that matters (`proxy`), dead
//! letters and bodies (`letters`), and a gate on PostgreSQL's slice reads (`slices`).
// Each test binary uses a part of it.
#![allow(dead_code, unused_imports)]

mod broker;
mod db;
mod letters;
mod process;
mod proxy;
mod run;
mod slices;

pub use broker::*;
pub use db::*;
pub use letters::*;
pub use process::*;
pub use proxy::*;
pub use run::*;
pub use slices::*;

pub const PG_ADMIN: &str = "postgres://postgres@127.0.0.1:5432/postgres";

pub const AMQP: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

pub fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}
