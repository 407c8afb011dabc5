//! `dlq completions SHELL`: shell completion scripts. Bash and fish also complete
//! dead-letter IDs after `show`, `claim`, `release` and `replay`, by asking
//! `dlq __ids PREFIX` with the line's database options: IDs not yet replayed or
//! discarded, by prefix, newest first, bounded in count and time.

use super::Result;
use super::{Cli, Ctx};
use clap::{Args, CommandFactory};
use std::time::Duration;

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// bash, zsh, fish, elvish or powershell
    pub shell: clap_complete::Shell,
}

#[derive(Debug, Args)]
pub struct IdsArgs {
    /// Only IDs starting with this
    #[arg(default_value = "")]
    pub prefix: String,
}

/// Bash: IDs after the commands that take one, from `dlq __ids` given the database
/// options of the line being completed.
const BASH_IDS: &str = r#"
# Dead-letter IDs for the commands that take one, from the database the line names.
_dlq_with_ids() {
    local i sub="" cur="${COMP_WORDS[COMP_CWORD]}"
    for ((i = 1; i < COMP_CWORD; i++)); do
        case "${COMP_WORDS[i]}" in
            show|claim|release|replay) sub="${COMP_WORDS[i]}"; break ;;
        esac
    done
    if [[ -n "$sub" && "$cur" != -* && $((COMP_CWORD - i)) -eq 1 ]]; then
        local -a words opts=()
        read -ra words <<< "$COMP_LINE"
        for ((i = 1; i < ${#words[@]}; i++)); do
            case "${words[i]}" in
                --database-url|--database-url-file|--profile|--config)
                    opts+=("${words[i]}" "${words[i+1]}"); ((i++)) ;;
                --database-url=*|--database-url-file=*|--profile=*|--config=*)
                    opts+=("${words[i]}") ;;
            esac
        done
        COMPREPLY=($(compgen -W "$(dlq "${opts[@]}" __ids "$cur" 2>/dev/null)" -- "$cur"))
        return 0
    fi
    _dlq "$@"
}
complete -F _dlq_with_ids -o bashdefault -o default dlq
"#;

const FISH_IDS: &str = r#"
# Dead-letter IDs for the commands that take one, from the database the line names.
function __dlq_ids
    set -l tokens (commandline -opc)
    set -l opts
    set -l i 2
    while test $i -le (count $tokens)
        switch $tokens[$i]
            case --database-url --database-url-file --profile --config
                set -a opts $tokens[$i] $tokens[(math $i + 1)]
                set i (math $i + 1)
            case '--database-url=*' '--database-url-file=*' '--profile=*' '--config=*'
                set -a opts $tokens[$i]
        end
        set i (math $i + 1)
    end
    dlq $opts __ids (commandline -ct) 2>/dev/null
end
complete -c dlq -n "__fish_seen_subcommand_from show claim release replay" -f -a "(__dlq_ids)"
"#;

/// At most this many IDs are offered.
const IDS_LIMIT: i64 = 50;
/// Completion runs on every TAB: it gives up (offering nothing) after this long.
const IDS_BOUND: Duration = Duration::from_millis(900);

pub fn run(ctx: &Ctx, args: CompletionsArgs) -> Result<u8> {
    let mut buf = Vec::new();
    clap_complete::generate(args.shell, &mut Cli::command(), "dlq", &mut buf);
    let mut text = String::from_utf8_lossy(&buf).into_owned();
    match args.shell {
        clap_complete::Shell::Bash => text.push_str(BASH_IDS),
        clap_complete::Shell::Fish => text.push_str(FISH_IDS),
        _ => {}
    }
    ctx.out.generated(&text);
    Ok(dlq::exit::OK)
}

/// `dlq __ids PREFIX`: IDs not yet replayed or discarded that start with PREFIX, found
/// by one query, within [`IDS_BOUND`]; nothing (and exit 0) when the database is slow
/// to answer, so that TAB never hangs.
pub async fn ids(ctx: &Ctx, args: IdsArgs) -> Result<u8> {
    let found = tokio::time::timeout(IDS_BOUND, async {
        let store = ctx.store().await?;
        let ids = store.ids_starting_with(&args.prefix, None, IDS_LIMIT).await;
        store.close().await;
        Ok::<_, anyhow::Error>(ids?)
    })
    .await;
    // Slow: nothing to offer. Failed: an error like any command's (the shell hides it).
    if let Ok(ids) = found {
        let out: String = ids?
            .iter()
            .map(|id| format!("{}\n", dlq::sanitize::line(id)))
            .collect();
        ctx.out.text(&out);
    }
    Ok(dlq::exit::OK)
}
