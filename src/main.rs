//! The `dlq` binary: parse, validate once, run one subcommand, return its exit code.

mod cli;

fn main() -> std::process::ExitCode {
    one_malloc_arena();
    std::process::ExitCode::from(cli::main())
}

/// A short-lived command gains nothing from glibc's per-thread malloc arenas, and growing
/// a fresh one costs the SQLite worker thread a system call per step (about 0.7 ms of a
/// 6 ms `dlq list`). Called before any thread starts.
fn one_malloc_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets a tunable; no other thread exists yet to race with it.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}
