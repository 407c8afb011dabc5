//! The stores: migrations and upgrades, rows written by the workers' own SQL, IDs, the
//! identity rule, lock waits and contention.

mod contention;
mod identity;
mod identity_rule;
mod import_batches;
mod migrations;
mod sessions;
mod sqlite_rows;
mod upgrade;
