//! Named environments (`--profile prod`) from a TOML file at
//! `$XDG_CONFIG_HOME/dlq/config.toml` (else `~/.config/dlq/config.toml`, or `--config`).
//!
//! A profile fills in what neither a flag nor an environment variable gave: flag > env >
//! profile > built-in default.

use super::Cli;
use clap::parser::ValueSource;
use clap::ArgMatches;
use dlq::error::{DlqError, Result};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    #[serde(default)]
    profiles: BTreeMap<String, Profile>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    database_url: Option<String>,
    database_url_file: Option<PathBuf>,
    amqp_url: Option<String>,
    amqp_url_file: Option<PathBuf>,
    operator: Option<String>,
    /// Default `--lease` for claim and replay.
    lease: Option<String>,
    /// `single` or `cluster` (`--broker-topology`), checked by the commands that publish.
    broker_topology: Option<String>,
    /// Ask for the profile's name before any replay (unless `--yes`).
    #[serde(default)]
    production: bool,
}

pub fn default_config_path() -> Option<PathBuf> {
    std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
        .map(|d| d.join("dlq").join("config.toml"))
}

fn explicit(m: &ArgMatches, id: &str) -> bool {
    matches!(
        m.value_source(id),
        Some(ValueSource::CommandLine) | Some(ValueSource::EnvVariable)
    )
}

/// What the selected profile gave.
#[derive(Debug, Default)]
pub struct Applied {
    /// The profile's name when it is marked production.
    pub production: Option<String>,
    /// "profile NAME in FILE" when the database URL came from the profile.
    pub database_url: Option<String>,
    /// The same for the AMQP URL(s).
    pub amqp_url: Option<String>,
    /// The profile's `broker_topology` as written, and where it came from, when no flag
    /// or variable gave one.
    pub broker_topology: Option<(String, String)>,
}

/// Applies the selected profile to the parsed command line. A value is checked by the
/// command that uses it (a bad `lease` does not stop `list`); what comes from the
/// config file is a configuration error (exit 1), not a usage error.
pub fn apply(cli: &mut Cli, matches: &ArgMatches) -> Result<Applied> {
    let Some(name) = cli.global.profile.clone() else {
        return Ok(Applied::default());
    };
    let path = cli
        .global
        .config
        .clone()
        .or_else(default_config_path)
        .ok_or_else(|| {
            DlqError::Config("--profile: no config file (set --config or XDG_CONFIG_HOME)".into())
        })?;
    let text = std::fs::read_to_string(&path).map_err(|e| {
        DlqError::Config(format!(
            "--profile {name}: cannot read {}: {e}",
            path.display()
        ))
    })?;
    let file: ConfigFile = toml::from_str(&text)
        .map_err(|e| DlqError::Config(format!("{}: {}", path.display(), toml_error(&text, &e))))?;
    // SecretUrl::new also registers each password, so that no error can print it.
    let holds_password = file.profiles.values().any(|p| {
        [&p.database_url, &p.amqp_url]
            .into_iter()
            .flatten()
            .any(|u| dlq::secret::SecretUrl::new(u.clone()).has_password())
    });
    if holds_password {
        super::warn_if_readable_by_others(&path);
    }
    let profile = file.profiles.get(&name).cloned().ok_or_else(|| {
        DlqError::Config(format!(
            "no profile {name:?} in {} (profiles: {})",
            path.display(),
            file.profiles.keys().cloned().collect::<Vec<_>>().join(", ")
        ))
    })?;
    let origin = format!("profile {name} in {}", path.display());
    let mut applied = Applied::default();
    let g = &mut cli.global;
    let db_given = explicit(matches, "database_url") || explicit(matches, "database_url_file");
    if !db_given {
        if let Some(f) = profile.database_url_file {
            g.database_url_file = Some(f);
            applied.database_url = Some(origin.clone());
        } else if let Some(u) = profile.database_url {
            g.database_url = u;
            applied.database_url = Some(origin.clone());
        }
    }
    let amqp_given = explicit(matches, "amqp_url") || explicit(matches, "amqp_url_file");
    if !amqp_given {
        if let Some(f) = profile.amqp_url_file {
            g.amqp_url_file = Some(f);
            applied.amqp_url = Some(origin.clone());
        } else if let Some(u) = profile.amqp_url {
            g.amqp_url = u.split(',').map(|s| s.trim().to_string()).collect();
            applied.amqp_url = Some(origin.clone());
        }
    }
    if !explicit(matches, "broker_topology") {
        applied.broker_topology = profile.broker_topology.map(|t| (t, origin.clone()));
    }
    if !explicit(matches, "operator") {
        if let Some(op) = profile.operator {
            g.operator = Some(op);
        }
    }
    if let (Some(lease), Some((_, sub))) = (&profile.lease, matches.subcommand()) {
        if sub.try_get_raw("lease").is_ok() && !explicit(sub, "lease") {
            let d = dlq::timeparse::parse_duration(lease)
                .map_err(|e| DlqError::Config(format!("{origin}: lease: {e}")))?;
            cli.command.set_default_lease(d);
        }
    }
    applied.production = profile.production.then_some(name);
    Ok(applied)
}

/// A TOML error on one line: where it is and what is wrong ("line 3, column 1: unknown
/// field `bogus`, expected one of ..."), without quoting the file's text (it may hold a
/// password).
fn toml_error(text: &str, e: &toml::de::Error) -> String {
    let what = e.message().trim().replace('\n', " ");
    match e.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            format!("line {line}, column {column}: {what}")
        }
        None => what,
    }
}
