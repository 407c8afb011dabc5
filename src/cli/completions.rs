//! `dlq completions SHELL`: shell completion scripts. Bash and fish also complete
//! dead-letter IDs after `show`, `claim`, `release` and `replay`, by asking
//! `dlq __ids` (pending and claimed IDs of the configured database, newest first).

use super::{Cli, Ctx};
use clap::{Args, CommandFactory};
use dlq::error::Result;
use dlq::model::{Filter, State};

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

const BASH_IDS: &str = r#"
# Dead-letter IDs for the commands that take one (asks the configured database).
_dlq_with_ids() {
    local i sub="" cur="${COMP_WORDS[COMP_CWORD]}"
    for ((i = 1; i < COMP_CWORD; i++)); do
        case "${COMP_WORDS[i]}" in
            show|claim|release|replay) sub="${COMP_WORDS[i]}"; break ;;
        esac
    done
    if [[ -n "$sub" && "$cur" != -* && $((COMP_CWORD - i)) -eq 1 ]]; then
        COMPREPLY=($(compgen -W "$(dlq __ids "$cur" 2>/dev/null)" -- "$cur"))
        return 0
    fi
    _dlq "$@"
}
complete -F _dlq_with_ids -o bashdefault -o default dlq
"#;

const FISH_IDS: &str = r#"
# Dead-letter IDs for the commands that take one (asks the configured database).
complete -c dlq -n "__fish_seen_subcommand_from show claim release replay" -f -a "(dlq __ids 2>/dev/null)"
"#;

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

pub async fn ids(ctx: &Ctx, args: IdsArgs) -> Result<u8> {
    let store = ctx.store().await?;
    let mut out = String::new();
    for state in [State::Pending, State::Claimed, State::Uncertain] {
        let filter = Filter {
            states: vec![state],
            ..Filter::default()
        };
        let (rows, _) = store.list(&filter, 200).await?;
        for r in rows.iter().filter(|r| r.id.starts_with(&args.prefix)) {
            out.push_str(&dlq::sanitize::line(&r.id));
            out.push('\n');
        }
    }
    store.close().await;
    ctx.out.text(&out);
    Ok(dlq::exit::OK)
}
