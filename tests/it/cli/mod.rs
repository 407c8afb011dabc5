//! The operator's surface: configuration and profiles, prompts, completions, usage errors.

mod completions;
mod config;
mod ids;
mod prompts;
mod usage;
