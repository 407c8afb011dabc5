//! What can be wrong with a SQLite file before and while it is opened, said with the
//! path and the fix: SQLite's own words ("unable to open database file", "attempt to
//! write a readonly database") name neither.

use crate::error::{DlqError, Result};
use crate::spell::{words, Cmd};
use crate::store::IfMissing;
use sqlx::SqlitePool;
use std::path::Path;

/// Refuses, before SQLite tries, a URL that names no file dlq can use.
pub(crate) fn check_target(url: &str, file: &Path, if_missing: IfMissing) -> Result<()> {
    let shown = file.display();
    if url.contains(":memory:") || url.contains("mode=memory") {
        return Err(DlqError::usage(
            "an in-memory SQLite database is not supported: it is gone when dlq \
             exits and no worker can write to it; give a file, e.g. sqlite://dlq.db",
        ));
    }
    if file.as_os_str().is_empty() {
        return Err(DlqError::usage(
            "the URL names no database file: give one, e.g. sqlite://dlq.db (relative to \
             the current directory) or sqlite:///var/lib/dlq/dlq.db",
        ));
    }
    if file.is_dir() {
        return Err(DlqError::usage(format!(
            "{shown} is a directory, not a SQLite database file: name a file in it, e.g. \
             sqlite://{}",
            file.join("dlq.db").display()
        )));
    }
    let dir = match file.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(DlqError::usage(format!(
            "cannot open {shown}: the directory {} does not exist (create it, or fix the \
             path)",
            dir.display()
        )));
    }
    if if_missing == IfMissing::Refuse && !file.exists() {
        let guess = similar_file(dir, file)
            .map(|g| format!(" (did you mean {}?)", g.display()))
            .unwrap_or_default();
        return Err(DlqError::other(
            words(format!(
                "the SQLite database file {shown} does not exist{guess}: check the database \
                 URL; only "
            ))
            .cmd(Cmd::Migrate)
            .text(" creates a new, empty database"),
        ));
    }
    Ok(())
}

/// A SQLite file in `dir` whose name is close to `file`'s (a typo: `dql.db`).
fn similar_file(dir: &Path, file: &Path) -> Option<std::path::PathBuf> {
    let wanted = file.file_name()?.to_string_lossy().into_owned();
    let entries = std::fs::read_dir(dir).ok()?;
    entries
        .flatten()
        .take(1000)
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let sqlite = [".db", ".sqlite", ".sqlite3"]
                .iter()
                .any(|ext| name.ends_with(ext));
            let distance = strsim::damerau_levenshtein(&wanted, &name);
            (sqlite && e.path().is_file() && distance <= 2).then_some((distance, name))
        })
        .min()
        .map(|(_, name)| file.with_file_name(name))
}

/// SQLite's open and read-only errors with the path and what to do; others unchanged.
pub(crate) fn explain(file: &Path, e: DlqError) -> DlqError {
    let text = e.to_string();
    let shown = file.display();
    if text.contains("readonly database") {
        return DlqError::other(format!(
            "{shown} cannot be opened for writing (SQLite: attempt to write a readonly \
             database): the file or its directory is not writable by this user. SQLite \
             in WAL mode creates {shown}-wal and {shown}-shm beside the file even to read \
             it, so dlq needs write access to the directory; grant it (or run dlq as the \
             workers' user)"
        ));
    }
    if text.contains("unable to open database file") {
        return DlqError::other(format!(
            "cannot open {shown} (SQLite: unable to open database file): check that the \
             file and its directory exist and that this user may read and write them"
        ));
    }
    e
}

/// Before the first migration copies the workers' table into one whose `id` is NOT NULL
/// and not empty: names the rows that would make it fail, and how to fix them.
pub(crate) async fn check_ids_before_upgrade(pool: &SqlitePool) -> Result<()> {
    let upgraded: Option<i64> = sqlx::query_scalar(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'",
    )
    .fetch_optional(pool)
    .await
    .map_err(super::db_error)?;
    let workers: Option<i64> = sqlx::query_scalar(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'dead_letters'",
    )
    .fetch_optional(pool)
    .await
    .map_err(super::db_error)?;
    if upgraded.is_some() || workers.is_none() {
        return Ok(());
    }
    let rows: Vec<i64> = sqlx::query_scalar(
        "SELECT rowid FROM dead_letters WHERE id IS NULL OR length(id) = 0 ORDER BY rowid LIMIT 11",
    )
    .fetch_all(pool)
    .await
    .map_err(super::db_error)?;
    if rows.is_empty() {
        return Ok(());
    }
    let mut listed: Vec<String> = rows.iter().take(10).map(|r| r.to_string()).collect();
    if rows.len() > 10 {
        listed.push("...".into());
    }
    Err(DlqError::other(
        words(format!(
            "cannot migrate: dead_letters has rows with no id (rowid {}); dlq needs an ID to \
             name each dead letter. Give them one and run ",
            listed.join(", ")
        ))
        .cmd(Cmd::Migrate)
        .text(
            " again, e.g. UPDATE dead_letters SET id = lower(hex(randomblob(16))) WHERE id IS \
             NULL OR id = ''; nothing was changed",
        ),
    ))
}
