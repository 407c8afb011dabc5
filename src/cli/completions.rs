//! `dlq completions SHELL`: shell completion scripts, without the hidden helpers. Bash,
//! zsh and fish also complete, from the database the line names, the dead-letter IDs a
//! command can act on (`dlq __ids --for COMMAND PREFIX`: replay wants pending rows,
//! resolve uncertain ones, ...) and the values of `--reason`, `--producer`,
//! `--schema-version` and `--source-queue` (`dlq __values KEY`, the most common first).
//! Both are one bounded query each, and give up quickly so that TAB never hangs.

use super::Result;
use super::{Cli, Ctx};
use clap::{Args, CommandFactory, ValueEnum};
use dlq::model::{Dimension, State};
use std::time::Duration;

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// bash, zsh, fish, elvish or powershell
    pub shell: clap_complete::Shell,
}

/// The commands that take one ID, each wanting rows in its own state.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum IdsFor {
    Show,
    Claim,
    Release,
    Replay,
    Resolve,
    Discard,
    Restore,
    Note,
    Edit,
    Diff,
}

impl IdsFor {
    /// The state a row must be in for the command to act on it (`None`: any).
    fn state(self) -> Option<State> {
        match self {
            IdsFor::Replay | IdsFor::Claim | IdsFor::Discard | IdsFor::Edit => Some(State::Pending),
            IdsFor::Resolve => Some(State::Uncertain),
            IdsFor::Restore => Some(State::Discarded),
            IdsFor::Release => Some(State::Claimed),
            IdsFor::Show | IdsFor::Note | IdsFor::Diff => None,
        }
    }
}

#[derive(Debug, Args)]
pub struct IdsArgs {
    /// Only IDs the command can act on [default: any]
    #[arg(long = "for", value_enum)]
    pub command: Option<IdsFor>,
    /// Only IDs starting with this
    #[arg(default_value = "")]
    pub prefix: String,
}

/// The filters whose values completion offers.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ValueOf {
    Reason,
    Producer,
    SchemaVersion,
    SourceQueue,
}

impl ValueOf {
    fn dimension(self) -> Dimension {
        match self {
            ValueOf::Reason => Dimension::Reason,
            ValueOf::Producer => Dimension::Producer,
            ValueOf::SchemaVersion => Dimension::SchemaVersion,
            ValueOf::SourceQueue => Dimension::SourceQueue,
        }
    }
}

#[derive(Debug, Args)]
pub struct ValuesArgs {
    /// Which filter's values
    #[arg(value_enum)]
    pub of: ValueOf,
    /// Only values starting with this
    #[arg(default_value = "")]
    pub prefix: String,
}

/// Bash: IDs after the commands that take one and the values of the filters, from the
/// database options of the line being completed.
const BASH_EXTRA: &str = r#"
# Dead-letter IDs and filter values, from the database the line names.
_dlq_db_opts() {
    local -a words
    local i IFS=$' \t\n'
    read -ra words <<< "$COMP_LINE"
    for ((i = 1; i < ${#words[@]}; i++)); do
        case "${words[i]}" in
            --database-url|--database-url-file|--profile|--config)
                printf '%s\n' "${words[i]}" "${words[i+1]}"; ((i++)) ;;
            --database-url=*|--database-url-file=*|--profile=*|--config=*)
                printf '%s\n' "${words[i]}" ;;
        esac
    done
}
_dlq_with_ids() {
    local i sub="" cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"
    local -a opts
    local IFS=$'\n'
    case "$prev" in
        --reason|--producer|--schema-version|--source-queue)
            opts=($(_dlq_db_opts))
            COMPREPLY=($(dlq "${opts[@]}" __values "${prev#--}" "$cur" 2>/dev/null))
            return 0 ;;
    esac
    for ((i = 1; i < COMP_CWORD; i++)); do
        case "${COMP_WORDS[i]}" in
            show|claim|release|replay|resolve|discard|restore|note|edit|diff)
                sub="${COMP_WORDS[i]}"; break ;;
        esac
    done
    local at=$((COMP_CWORD - i))
    if [[ -n "$sub" && "$cur" != -* && ( $at -eq 1 || ( $sub == diff && $at -eq 2 ) ) ]]; then
        opts=($(_dlq_db_opts))
        COMPREPLY=($(dlq "${opts[@]}" __ids --for "$sub" "$cur" 2>/dev/null))
        return 0
    fi
    unset IFS
    _dlq "$@"
}
complete -F _dlq_with_ids -o bashdefault -o default dlq
"#;

const FISH_EXTRA: &str = r#"
# Dead-letter IDs and filter values, from the database the line names.
function __dlq_db_opts
    set -l tokens (commandline -opc)
    set -l i 2
    while test $i -le (count $tokens)
        switch $tokens[$i]
            case --database-url --database-url-file --profile --config
                printf '%s\n' $tokens[$i] $tokens[(math $i + 1)]
                set i (math $i + 1)
            case '--database-url=*' '--database-url-file=*' '--profile=*' '--config=*'
                printf '%s\n' $tokens[$i]
        end
        set i (math $i + 1)
    end
end
function __dlq_ids
    for sub in show claim release replay resolve discard restore note edit diff
        if __fish_seen_subcommand_from $sub
            dlq (__dlq_db_opts) __ids --for $sub (commandline -ct) 2>/dev/null
            return
        end
    end
end
function __dlq_values
    dlq (__dlq_db_opts) __values $argv[1] (commandline -ct) 2>/dev/null
end
complete -c dlq -n "__fish_seen_subcommand_from show claim release replay resolve discard restore note edit diff" -f -a "(__dlq_ids)"
complete -c dlq -l reason -x -a "(__dlq_values reason)"
complete -c dlq -l producer -x -a "(__dlq_values producer)"
complete -c dlq -l schema-version -x -a "(__dlq_values schema-version)"
complete -c dlq -l source-queue -x -a "(__dlq_values source-queue)"
"#;

/// Zsh: the functions the rewritten `_arguments` specs call ([`zsh`]), with `compadd`'s
/// options first and the command or key last. The database options are read from the
/// whole line (`$LBUFFER`): `$words` holds only the subcommand's words past it.
const ZSH_EXTRA: &str = r#"
# Dead-letter IDs and filter values, from the database the line names.
(( $+functions[_dlq_db_opts] )) ||
_dlq_db_opts() {
    local -a w
    local i
    w=(${(Q)${(z)LBUFFER}})
    for ((i = 2; i <= $#w; i++)); do
        case "$w[i]" in
            (--database-url|--database-url-file|--profile|--config)
                reply+=("$w[i]" "$w[i+1]"); ((i++)) ;;
            (--database-url=*|--database-url-file=*|--profile=*|--config=*)
                reply+=("$w[i]") ;;
        esac
    done
}
(( $+functions[_dlq_ids] )) ||
_dlq_ids() {
    local -a reply found
    _dlq_db_opts
    found=(${(f)"$(dlq "${reply[@]}" __ids --for "${@[-1]}" "$PREFIX" 2>/dev/null)"})
    compadd "${@[1,-2]}" -- "${found[@]}"
}
(( $+functions[_dlq_values] )) ||
_dlq_values() {
    local -a reply found
    _dlq_db_opts
    found=(${(f)"$(dlq "${reply[@]}" __values "${@[-1]}" "$PREFIX" 2>/dev/null)"})
    compadd "${@[1,-2]}" -- "${found[@]}"
}

"#;

/// The last lines of clap's zsh script, which run the completion (autoloaded) or
/// register it (sourced): [`ZSH_EXTRA`] goes before them.
const ZSH_TAIL: &str = "if [ \"$funcstack[1]\" = \"_dlq\" ]; then";

/// At most this many IDs or values are offered.
const LIMIT: i64 = 50;
/// Completion runs on every TAB: it gives up (offering nothing) after this long.
const BOUND: Duration = Duration::from_millis(900);

pub fn run(ctx: &Ctx, args: CompletionsArgs) -> Result<u8> {
    let mut buf = Vec::new();
    clap_complete::generate(args.shell, &mut visible(Cli::command()), "dlq", &mut buf);
    let mut text = String::from_utf8_lossy(&buf).into_owned();
    match args.shell {
        clap_complete::Shell::Bash => text.push_str(BASH_EXTRA),
        clap_complete::Shell::Fish => text.push_str(FISH_EXTRA),
        clap_complete::Shell::Zsh => text = zsh(&text),
        _ => {}
    }
    ctx.out.generated(&text);
    Ok(dlq::exit::OK)
}

/// Clap's zsh script with each ID argument completed by `_dlq_ids COMMAND` (inside the
/// `(COMMAND)` case of a command that takes one) and the four filters' values by
/// `_dlq_values KEY`, instead of `_default` (file names).
fn zsh(generated: &str) -> String {
    let mut out = String::with_capacity(generated.len() + ZSH_EXTRA.len());
    let mut command: Option<IdsFor> = None;
    for line in generated.lines() {
        if let Some(name) = line.strip_prefix('(').and_then(|l| l.strip_suffix(')')) {
            command = IdsFor::from_str(name, false).ok();
        } else if line == ";;" {
            command = None;
        }
        if line.starts_with(ZSH_TAIL) {
            out.push_str(ZSH_EXTRA);
        }
        out.push_str(&zsh_spec(line, command));
        out.push('\n');
    }
    out
}

/// One line of clap's zsh script, its `_default` action replaced when it is an ID
/// argument of `command` or one of the four filters.
fn zsh_spec(line: &str, command: Option<IdsFor>) -> String {
    const DEFAULT: &str = ":_default' \\";
    let Some(spec) = line.strip_suffix(DEFAULT) else {
        return line.to_string();
    };
    let id = ["':id -- ", "'::id -- ", "':a -- ", "':b -- "];
    let action = match command {
        Some(c) if id.iter().any(|p| line.starts_with(p)) => {
            let name = c.to_possible_value().map(|v| v.get_name().to_string());
            format!("_dlq_ids {}", name.unwrap_or_default())
        }
        _ => match ValueOf::value_variants()
            .iter()
            .filter_map(ValueOf::to_possible_value)
            .find(|v| line.starts_with(&format!("'--{}=[", v.get_name())))
        {
            Some(v) => format!("_dlq_values {}", v.get_name()),
            None => return line.to_string(),
        },
    };
    format!("{spec}:{action}' \\")
}

/// The command line without its hidden subcommands (clap's generators list them).
fn visible(cli: clap::Command) -> clap::Command {
    let shown: Vec<clap::Command> = cli
        .get_subcommands()
        .filter(|s| !s.is_hide_set())
        .cloned()
        .collect();
    let mut out = clap::Command::new("dlq")
        .version(env!("CARGO_PKG_VERSION"))
        .args(cli.get_arguments().cloned())
        .subcommands(shown);
    if let Some(a) = cli.get_about() {
        out = out.about(a.clone());
    }
    out
}

/// `dlq __ids [--for COMMAND] PREFIX`: IDs that start with PREFIX, of rows the command
/// can act on, newest first, within [`BOUND`]; nothing (and exit 0) when the database
/// is slow to answer.
pub async fn ids(ctx: &Ctx, args: IdsArgs) -> Result<u8> {
    let state = args.command.and_then(IdsFor::state);
    offer(ctx, bounded(ctx, Wanted::Ids(&args.prefix, state)).await)
}

/// `dlq __values KEY PREFIX`: the stored values of a filter that start with PREFIX, the
/// most common first (of the [`LIMIT`] most common).
pub async fn values(ctx: &Ctx, args: ValuesArgs) -> Result<u8> {
    let found = bounded(ctx, Wanted::Values(args.of.dimension())).await;
    let found = found.map(|r| {
        r.map(|all| {
            all.into_iter()
                .filter(|v| v.starts_with(&args.prefix))
                .collect()
        })
    });
    offer(ctx, found)
}

/// What completion reads.
enum Wanted<'a> {
    Ids(&'a str, Option<State>),
    Values(Dimension),
}

type Found = std::result::Result<Result<Vec<String>>, tokio::time::error::Elapsed>;

/// Reads what is wanted within [`BOUND`].
async fn bounded(ctx: &Ctx, wanted: Wanted<'_>) -> Found {
    tokio::time::timeout(BOUND, async {
        let store = ctx.store().await?;
        let found = match wanted {
            Wanted::Ids(prefix, state) => store.ids_starting_with(prefix, state, LIMIT).await,
            Wanted::Values(dim) => store
                .common_values(dim, LIMIT)
                .await
                .map(|common| common.into_iter().map(|(v, _)| v).collect()),
        };
        store.close().await;
        Ok(found?)
    })
    .await
}

/// One per line. Slow: nothing to offer. Failed: an error like any command's (the shell
/// hides it).
fn offer(ctx: &Ctx, found: Found) -> Result<u8> {
    if let Ok(found) = found {
        let out: String = found?
            .iter()
            .map(|v| format!("{}\n", dlq::sanitize::line(v)))
            .collect();
        ctx.out.text(&out);
    }
    Ok(dlq::exit::OK)
}
