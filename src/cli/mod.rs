//! Command-line layer: [`args`] (what clap parses), [`context`] (what a command runs
//! with, resolved once), one module per subcommand, and [`output`], the only module that
//! writes what a person reads, on stdout and stderr. This file holds `main` and the
//! dispatch, and turns a result into an exit code.

mod aggregate;
mod args;
mod breakdown;
mod broker;
mod capture;
mod check;
mod claim;
mod completions;
mod context;
mod diff;
mod edit;
mod export;
mod filters;
mod ids;
mod import;
mod list;
mod logging;
mod man;
mod metrics;
mod migrate;
mod note;
mod output;
mod plan;
mod profile;
mod prompt;
mod prune;
mod release;
mod replay;
mod report;
mod resolve;
mod serve;
mod set_aside;
mod show;
mod spell;

use clap::FromArgMatches;
use dlq::error::DlqError;
use dlq::secret::SecretUrl;

/// A command's result: a library error ([`DlqError`], which decides the exit code) with
/// what the command was doing as context.
pub type Result<T, E = anyhow::Error> = std::result::Result<T, E>;

pub use args::{Cli, ColorWhen, Command, Format, GlobalOpts, Headers};
use context::{pick_url_sources, warn_if_password_in_flag};
pub use context::{warn_if_readable_by_others, Ctx};
use logging::init_logging;
pub use output::{say, Out};

/// Prints the error as `dlq: error: ...` (its context and causes on one line) and
/// returns its exit code: the one the library error says, else 1.
fn report(e: &anyhow::Error) -> u8 {
    say(&format!(
        "dlq: error: {}",
        dlq::error::one_line(e.as_ref(), &spell::Commands)
    ));
    e.downcast_ref::<DlqError>()
        .map_or(dlq::exit::ERROR, DlqError::exit_code)
}

/// The exit code once the command is done, given how its output went: a closed pipe ends
/// quietly; a write that failed otherwise is an error (exit 1) unless the command already
/// has a worse code to report.
fn finish(out: &Out, result: Result<u8>) -> u8 {
    if out.closed() {
        return result.unwrap_or(dlq::exit::OK);
    }
    let code = match result {
        Ok(code) => code,
        Err(e) => return report(&e),
    };
    match out.check() {
        Ok(()) => code,
        Err(e) => {
            report(&e.into());
            if code == dlq::exit::OK {
                dlq::exit::ERROR
            } else {
                code
            }
        }
    }
}

/// clap's error (its plain text) in dlq's one style: `dlq: error: ...` on one line, with
/// clap's suggestion kept and the command whose `--help` says more.
fn usage_error_line(text: &str, typed: &str) -> String {
    let mut said = Vec::new();
    let mut tips = Vec::new();
    let mut command = typed.to_string();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if let Some(rest) = line.strip_prefix("error: ") {
            said.push(rest.to_string());
        } else if let Some(tip) = line.strip_prefix("tip: ") {
            tips.push(tip.to_string());
        } else if let Some(usage) = line.strip_prefix("Usage: ") {
            let words = usage.split_whitespace();
            let named: Vec<&str> = words
                .take_while(|w| !w.starts_with(['-', '<', '[']))
                .collect();
            command = named.join(" ");
        } else if !line.starts_with("For more information") {
            said.push(line.to_string());
        }
    }
    let tips = match tips.is_empty() {
        true => String::new(),
        false => format!(" ({})", tips.join("; ")),
    };
    format!(
        "dlq: error: {}{tips}; see `{command} --help`",
        said.join(" ")
    )
}

/// The words of the command line that are text (one that is not UTF-8 is no command or
/// URL dlq could name).
fn words() -> impl Iterator<Item = String> {
    std::env::args_os()
        .skip(1)
        .filter_map(|a| a.to_str().map(str::to_string))
}

/// Before clap's error is printed (it echoes the argument it refuses): every word that
/// holds a URL is a secret as a whole, whatever its password holds (`'`, `/`, a space,
/// `?password=`) that a URL parse would cut short.
fn hide_urls_of_the_line() {
    for word in words().filter(|w| w.contains("://")) {
        let url = word.split_once('=').filter(|(k, _)| k.starts_with("--"));
        dlq::secret::register(url.map(|(_, v)| v).unwrap_or(&word));
    }
}

/// `dlq SUBCOMMAND` as typed on the command line (its first word that names one), or `dlq`.
fn typed_command() -> String {
    let cmd = args::command();
    let names: Vec<&str> = cmd.get_subcommands().map(|c| c.get_name()).collect();
    match words().find(|a| names.contains(&a.as_str())) {
        Some(name) => format!("dlq {name}"),
        None => "dlq".to_string(),
    }
}

pub fn main() -> u8 {
    std::panic::set_hook(Box::new(|info| {
        say(&format!("dlq: internal error (a bug): {info}"));
    }));
    let parsed = args::command()
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m).map(|c| (c, m)));
    let (mut cli, matches) = match parsed {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind::*;
            match e.kind() {
                DisplayHelp | DisplayVersion | DisplayHelpOnMissingArgumentOrSubcommand => {
                    let _ = e.print();
                }
                _ => {
                    hide_urls_of_the_line();
                    say(&usage_error_line(&e.render().to_string(), &typed_command()));
                }
            }
            return e.exit_code().clamp(0, 255) as u8;
        }
    };
    if let Err(e) = pick_url_sources(&mut cli.global, &matches) {
        return report(&e.into());
    }
    let applied = match profile::apply(&mut cli, &matches) {
        Ok(p) => p,
        Err(e) => return report(&e.into()),
    };
    // Register the passwords of the configured URLs before anything can print them.
    let _ = SecretUrl::new(cli.global.database_url.clone());
    for url in &cli.global.amqp_url {
        let _ = SecretUrl::new(url.trim().to_string());
    }
    warn_if_password_in_flag("--amqp-url", "DLQ_AMQP_URL", &cli.global.amqp_url);
    warn_if_password_in_flag(
        "--database-url",
        "DLQ_DATABASE_URL",
        std::slice::from_ref(&cli.global.database_url),
    );
    init_logging(cli.global.verbose);
    let format = output::pick_format(cli.global.output);
    let headers = match cli.global.no_headers {
        true => Headers::Left,
        false => Headers::Shown,
    };
    let colour = output::pick_colour(cli.global.color, format);
    let ctx = Ctx {
        global: cli.global,
        format,
        out: Out::new(format, headers, colour),
        profile: applied,
        opened: Default::default(),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return report(&anyhow::Error::new(e).context("cannot start the async runtime")),
    };
    let result = runtime.block_on(run(&ctx, cli.command));
    // The command has awaited all it needs; a thread still blocked (a prompt's read of
    // the terminal after Ctrl-C, say) is not waited for.
    runtime.shutdown_background();
    finish(&ctx.out, result)
}

async fn run(ctx: &Ctx, mut command: Command) -> Result<u8> {
    ctx.resolve_ids(command.single_ids()).await?;
    match command {
        Command::List(a) => list::run(ctx, a).await,
        Command::Aggregate(a) => aggregate::run(ctx, a).await,
        Command::Show(a) => show::run(ctx, a).await,
        Command::Claim(a) => claim::run(ctx, a).await,
        Command::Release(a) => release::run(ctx, a).await,
        Command::Replay(a) => replay::run(ctx, a).await,
        Command::Resolve(a) => resolve::run(ctx, a).await,
        Command::Plan(a) => plan::run(ctx, a).await,
        Command::Import(a) => import::run(ctx, a).await,
        Command::Capture(a) => capture::run(ctx, a).await,
        Command::Export(a) => export::run(ctx, a).await,
        Command::Discard(a) => set_aside::discard(ctx, a).await,
        Command::Restore(a) => set_aside::restore(ctx, a).await,
        Command::Note(a) => note::run(ctx, a).await,
        Command::Edit(a) => edit::run(ctx, a).await,
        Command::Diff(a) => diff::run(ctx, a).await,
        Command::Prune(a) => prune::run(ctx, a).await,
        Command::Metrics(a) => metrics::run(ctx, a).await,
        Command::Check(a) => check::run(ctx, a).await,
        Command::Migrate(a) => migrate::run(ctx, a).await,
        Command::Completions(a) => completions::run(ctx, a),
        Command::Man(a) => man::run(ctx, a),
        Command::Ids(a) => completions::ids(ctx, a).await,
        Command::Values(a) => completions::values(ctx, a).await,
    }
}

#[cfg(test)]
mod tests {
    use super::usage_error_line;

    #[test]
    fn clap_errors_read_as_dlq_errors_on_one_line() {
        let clap = "error: unexpected argument '--no-header' found\n\n  tip: a similar argument exists: '--no-headers'\n\nUsage: dlq list --no-headers\n\nFor more information, try '--help'.\n";
        assert_eq!(
            usage_error_line(clap, "dlq"),
            "dlq: error: unexpected argument '--no-header' found (a similar argument exists: '--no-headers'); see `dlq list --help`"
        );
        let missing = "error: the following required arguments were not provided:\n  <ID>\n\nUsage: dlq replay <ID>\n\nFor more information, try '--help'.\n";
        assert_eq!(
            usage_error_line(missing, "dlq"),
            "dlq: error: the following required arguments were not provided: <ID>; see `dlq replay --help`"
        );
        let value = "error: invalid value 'many' for '--limit <LIMIT>': invalid digit found in string\n\nFor more information, try '--help'.\n";
        assert_eq!(
            usage_error_line(value, "dlq list"),
            "dlq: error: invalid value 'many' for '--limit <LIMIT>': invalid digit found in string; see `dlq list --help`"
        );
    }
}
