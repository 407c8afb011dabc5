//! How output looks: snapshots of the main commands' tables and JSON, `--help`, tables at
//! 80 columns, Markdown, closed pipes.

mod colour;
mod formats;
mod help;
mod markdown;
mod pipes;
mod scripts;
mod show;
mod snapshots;
mod tables;
