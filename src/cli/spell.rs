//! The CLI's spelling of what the library names by type ([`dlq::spell`]): the options
//! and commands an operator types. The library never spells them; a test below scans its
//! string literals so that no spelling creeps back.

use dlq::spell::{Cmd, Flag, NextStep, Spell};

/// The CLI's spelling of what an operator does next: the command to type.
#[derive(Debug, Clone, Copy, Default)]
pub struct Commands;

impl Spell for Commands {
    fn next(&self, step: &NextStep) -> String {
        match step {
            NextStep::ShowRow => "`dlq show`".into(),
            NextStep::Resolve => "`dlq resolve`".into(),
            NextStep::ResolveEither { id } => {
                format!("`dlq resolve {id} --delivered|--not-delivered`")
            }
            NextStep::ResolveDelivered { id } => format!("`dlq resolve {id} --delivered`"),
            NextStep::ResolveNotDelivered { id } => format!("`dlq resolve {id} --not-delivered`"),
            NextStep::GiveTarget => "give --routing-key".into(),
            NextStep::ReleaseClaim => "`dlq release`".into(),
            NextStep::CheckBinding => {
                "check the queue's binding, or give --routing-key (and --exchange)".into()
            }
            NextStep::CheckExchange => "check the exchange's name, or give --exchange".into(),
        }
    }

    fn given_claim(&self) -> String {
        "the claim given with --token".into()
    }

    fn flag(&self, flag: Flag) -> String {
        format!("--{}", flag_name(flag))
    }

    fn command(&self, cmd: Cmd) -> String {
        format!("`dlq {}`", command_name(cmd))
    }

    fn setting(&self, flag: Flag, value: &str) -> String {
        match flag {
            Flag::BrokerTopology => format!(
                "--broker-topology {value}, DLQ_BROKER_TOPOLOGY={value} or broker_topology = \"{value}\" in the profile"
            ),
            _ => format!("{} {value}", self.flag(flag)),
        }
    }
}

/// The option's long name, as clap knows it.
pub fn flag_name(flag: Flag) -> &'static str {
    match flag {
        Flag::AllowMixed => "allow-mixed",
        Flag::AmqpUrlFile => "amqp-url-file",
        Flag::BrokerTopology => "broker-topology",
        Flag::By => "by",
        Flag::Exchange => "exchange",
        Flag::Field => "field",
        Flag::Header => "header",
        Flag::MaxBodyBytes => "max-body-bytes",
        Flag::MaxFailures => "max-failures",
        Flag::MaxTargetDepth => "max-target-depth",
        Flag::ParkQueue => "park-queue",
        Flag::SkipExisting => "skip-existing",
        Flag::State => "state",
    }
}

/// The subcommand's name, as clap knows it.
pub fn command_name(cmd: Cmd) -> &'static str {
    match cmd {
        Cmd::Export => "export",
        Cmd::Migrate => "migrate",
        Cmd::Plan => "plan",
        Cmd::Show => "show",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::path::Path;

    /// Every long option and every subcommand name of the CLI.
    fn cli_names() -> (BTreeSet<String>, BTreeSet<String>) {
        let (mut flags, mut commands) = (BTreeSet::new(), BTreeSet::new());
        let root = super::super::args::command();
        let mut todo = vec![&root];
        while let Some(c) = todo.pop() {
            flags.extend(
                c.get_arguments()
                    .filter_map(|a| a.get_long().map(String::from)),
            );
            for sub in c.get_subcommands() {
                commands.insert(sub.get_name().to_string());
                todo.push(sub);
            }
        }
        (flags, commands)
    }

    /// Each option and command the library names by type is one the CLI has.
    #[test]
    fn every_spelling_is_the_clis() {
        let (flags, commands) = cli_names();
        for f in Flag::ALL {
            assert!(flags.contains(flag_name(f)), "{f:?}: no --{}", flag_name(f));
        }
        for c in Cmd::ALL {
            assert!(commands.contains(command_name(c)), "{c:?}");
        }
    }

    /// The library's errors, spelled by the CLI, read as they did when the library
    /// spelled them itself.
    #[test]
    fn library_errors_read_as_before() {
        use dlq::error::DlqError;
        use dlq::model::{ContentMatch, Dimension, MatchOn, State};
        let said = |e: DlqError| e.render(&Commands);
        assert_eq!(
            said(DlqError::SchemaMissing("no such table".into())),
            "the database has no dlq schema or an older one: run `dlq migrate` first (no such table)"
        );
        assert_eq!(
            said(State::parse_list(",").unwrap_err()),
            "--state is empty"
        );
        assert_eq!(
            said(Dimension::parse_list("hour,day").unwrap_err()),
            "--by takes hour or day, not both"
        );
        assert_eq!(
            said(ContentMatch::parse(MatchOn::Header, "x").unwrap_err()),
            "--header \"x\": expected KEY=VALUE"
        );
        assert_eq!(
            said(ContentMatch::parse(MatchOn::Field, "a..b=1").unwrap_err()),
            "--field \"a..b=1\": an empty key in PATH=VALUE"
        );
        // Spelled in words, the same errors name no option.
        let e = Dimension::parse_list("nope").unwrap_err().to_string();
        assert!(!e.contains("--"), "{e}");
    }

    /// The string literals of a Rust source file, up to its `#[cfg(test)]` module.
    fn literals(src: &str) -> Vec<String> {
        let code = src.split("#[cfg(test)]").next().unwrap_or(src);
        let (mut out, mut chars) = (Vec::new(), code.chars().peekable());
        let mut prev = ' ';
        while let Some(c) = chars.next() {
            let word = prev.is_alphanumeric() || prev == '_';
            prev = c;
            match c {
                'r' if !word && matches!(chars.peek(), Some('#' | '"')) => {
                    let mut hashes = 0;
                    while chars.next_if_eq(&'#').is_some() {
                        hashes += 1;
                    }
                    if chars.next_if_eq(&'"').is_none() {
                        continue;
                    }
                    let end = format!("\"{}", "#".repeat(hashes));
                    let mut lit = String::new();
                    for c in chars.by_ref() {
                        lit.push(c);
                        if lit.ends_with(&end) {
                            lit.truncate(lit.len() - end.len());
                            break;
                        }
                    }
                    out.push(lit);
                    prev = ' ';
                }
                '/' if chars.peek() == Some(&'/') => {
                    chars.by_ref().find(|&c| c == '\n');
                }
                '\'' => {
                    // A char literal ('"', '\''); a lifetime has no closing quote.
                    let s: String = chars.clone().take(4).collect();
                    if let Some(end) = s.find('\'').filter(|&e| e > 0 || s.starts_with('\\')) {
                        let skip = if s.starts_with("\\'") { 3 } else { end + 1 };
                        chars.by_ref().take(skip).for_each(drop);
                    }
                }
                '"' => {
                    let mut lit = String::new();
                    while let Some(c) = chars.next() {
                        match c {
                            '\\' => match chars.next() {
                                // A line continuation skips the newline and the indent.
                                Some('\n') => {
                                    while chars.next_if(|c| c.is_whitespace()).is_some() {}
                                }
                                Some('n' | 't' | 'r') => lit.push(' '),
                                Some(n) => lit.push(n),
                                None => {}
                            },
                            '"' => break,
                            c => lit.push(c),
                        }
                    }
                    out.push(lit);
                }
                _ => {}
            }
        }
        out
    }

    fn library_sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).expect("src is readable").flatten() {
            let p = e.path();
            match (p.is_dir(), p.file_name().and_then(|n| n.to_str())) {
                (true, Some("cli")) => {}
                (true, _) => library_sources(&p, out),
                (false, Some(n)) if n.ends_with(".rs") && n != "main.rs" => out.push(p),
                _ => {}
            }
        }
    }

    /// The library spells no option and no command in the text it builds: it names them
    /// by type ([`Flag`], [`Cmd`], [`NextStep`]) and the CLI spells them. "dlq" as the
    /// product's name ("dlq never writes", "another dlq import") is fine.
    /// Once broke: ~30 library errors said `--skip-existing`, `dlq migrate`, `--by`...
    #[test]
    fn the_library_spells_no_cli_option_or_command() {
        let (flags, commands) = cli_names();
        let flag = regex::Regex::new(r"--([a-z][a-z0-9-]*)").expect("regex");
        let command = regex::Regex::new(r"(\S*)\s*\bdlq ([a-z-]+)").expect("regex");
        let (root, mut files) = (Path::new(env!("CARGO_MANIFEST_DIR")), Vec::new());
        library_sources(&root.join("src"), &mut files);
        assert!(files.len() > 20, "{files:?}");
        let mut found = Vec::new();
        for f in &files {
            let src = std::fs::read_to_string(f).expect("readable");
            let f = f.strip_prefix(root).unwrap_or(f);
            for lit in literals(&src) {
                for m in flag.captures_iter(&lit) {
                    if flags.contains(&m[1]) {
                        found.push(format!("{}: --{} in {lit:?}", f.display(), &m[1]));
                    }
                }
                for m in command.captures_iter(&lit) {
                    let noun = matches!(&m[1], "a" | "another" | "(a" | "(another");
                    if commands.contains(&m[2]) && !noun {
                        found.push(format!("{}: dlq {} in {lit:?}", f.display(), &m[2]));
                    }
                }
                if lit.contains("`dlq") {
                    found.push(format!("{}: `dlq in {lit:?}", f.display()));
                }
            }
        }
        assert!(found.is_empty(), "{}", found.join("\n"));
    }

    /// The scan sees text across a line continuation and skips comments and char literals.
    #[test]
    fn literals_are_read_as_rust_reads_them() {
        let src = "// \"--by\"\nlet c = '\"'; let s = \"run dlq \\\n migrate\"; fn f<'a>() {}\n";
        assert_eq!(literals(src), vec!["run dlq migrate".to_string()]);
        assert_eq!(literals("\"a\\nb\\\"c\""), vec!["a b\"c".to_string()]);
        assert_eq!(literals("r#\"x\"y\"# for\"z\""), vec!["x\"y", "z"]);
    }
}
