//! Process exit codes. They are part of the contract: scripts branch on them.

/// `replayed`, `claimed`, `released`, or a read command that ran.
pub const OK: u8 = 0;
/// Could not run: database unreachable, bad configuration, missing schema.
pub const ERROR: u8 = 1;
/// Bad arguments, or a replay with no terminal and no `--yes`.
pub const USAGE: u8 = 2;
/// `not_replayed` / `not_claimed` / `not_released`.
pub const NOT_DONE: u8 = 3;
/// `not_found`: no dead letter with that ID.
pub const NOT_FOUND: u8 = 4;
/// `publish_failed`: the broker certainly did not take it; the claim was released.
pub const PUBLISH_FAILED: u8 = 5;
/// `uncertain`: it may have been published; see `dlq show` before acting again.
pub const UNCERTAIN: u8 = 6;
/// `check`: a threshold is breached.
pub const BREACHED: u8 = 7;
/// Interrupted (SIGINT/SIGTERM) before anything was published.
pub const INTERRUPTED: u8 = 130;
