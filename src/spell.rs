//! What the library tells an operator to do names CLI things by type, never by spelling:
//! a [`Flag`], a [`Cmd`], a [`NextStep`]. A caller spells them ([`Spell`]): the CLI as
//! the options and commands to type, anything else in plain words ([`InWords`]). Text
//! the library builds while a caller's `Spell` is at hand (a replay's details, a run's
//! stop, a parked message's reason) is spelled at once; an error keeps its [`Words`]
//! unspelled until whoever prints it spells them (`DlqError::render`).

use std::fmt;

/// An option of the CLI the library's words point to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flag {
    AllowMixed,
    AmqpUrlFile,
    BrokerTopology,
    By,
    Exchange,
    Field,
    Header,
    MaxBodyBytes,
    MaxFailures,
    MaxTargetDepth,
    ParkQueue,
    SkipExisting,
    State,
}

impl Flag {
    pub const ALL: [Flag; 13] = [
        Flag::AllowMixed,
        Flag::AmqpUrlFile,
        Flag::BrokerTopology,
        Flag::By,
        Flag::Exchange,
        Flag::Field,
        Flag::Header,
        Flag::MaxBodyBytes,
        Flag::MaxFailures,
        Flag::MaxTargetDepth,
        Flag::ParkQueue,
        Flag::SkipExisting,
        Flag::State,
    ];

    /// The option in plain words ("the park queue").
    fn words(self) -> &'static str {
        match self {
            Flag::AllowMixed => "allowing a mixed selection",
            Flag::AmqpUrlFile => "a URL file",
            Flag::BrokerTopology => "the broker topology",
            Flag::By => "the dimensions",
            Flag::Exchange => "the exchange",
            Flag::Field => "the field condition",
            Flag::Header => "the header condition",
            Flag::MaxBodyBytes => "the body limit",
            Flag::MaxFailures => "the failure limit",
            Flag::MaxTargetDepth => "the target depth limit",
            Flag::ParkQueue => "a park queue",
            Flag::SkipExisting => "skipping existing rows",
            Flag::State => "the states",
        }
    }
}

/// A command of the CLI the library's words point to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cmd {
    Export,
    Migrate,
    Plan,
    Show,
}

impl Cmd {
    pub const ALL: [Cmd; 4] = [Cmd::Export, Cmd::Migrate, Cmd::Plan, Cmd::Show];

    fn words(self) -> &'static str {
        match self {
            Cmd::Export => "the export",
            Cmd::Migrate => "the migration",
            Cmd::Plan => "planning",
            Cmd::Show => "showing the row",
        }
    }
}

/// What an operator can do next about a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NextStep {
    /// Read the row's stored values.
    ShowRow,
    /// Decide an uncertain row, after checking the consumers.
    Resolve,
    /// Decide this row either way, after checking the consumers.
    ResolveEither { id: String },
    /// It was published: decide it delivered.
    ResolveDelivered { id: String },
    /// Nothing was published: decide it not delivered.
    ResolveNotDelivered { id: String },
    /// Name where the replay goes.
    GiveTarget,
    /// Give the held claim back before its lease ends.
    ReleaseClaim,
    /// No queue is bound for the routing key: check the binding, or name another key.
    CheckBinding,
    /// The exchange does not exist: check its name, or name another.
    CheckExchange,
}

/// How a caller spells what the library names by type.
pub trait Spell: Send + Sync + fmt::Debug {
    fn next(&self, step: &NextStep) -> String;
    /// How the claim a run was given (not taken) is named.
    fn given_claim(&self) -> String;
    fn flag(&self, flag: Flag) -> String;
    fn command(&self, cmd: Cmd) -> String;
    /// Every way of setting `flag` to `value` (option, environment, profile).
    fn setting(&self, flag: Flag, value: &str) -> String;
}

/// Everything in words, for a caller that has no commands.
#[derive(Debug, Clone, Copy, Default)]
pub struct InWords;

impl Spell for InWords {
    fn next(&self, step: &NextStep) -> String {
        match step {
            NextStep::ShowRow => "the row's stored values".into(),
            NextStep::Resolve => "resolve it".into(),
            NextStep::ResolveEither { .. } => "resolve it delivered or not delivered".into(),
            NextStep::ResolveDelivered { .. } => "resolve it delivered".into(),
            NextStep::ResolveNotDelivered { .. } => "resolve it not delivered".into(),
            NextStep::GiveTarget => "give a routing key".into(),
            NextStep::ReleaseClaim => "releasing it".into(),
            NextStep::CheckBinding => "check the binding, or give another routing key".into(),
            NextStep::CheckExchange => "check the exchange's name, or give another".into(),
        }
    }

    fn given_claim(&self) -> String {
        "the claim given to this run".into()
    }

    fn flag(&self, flag: Flag) -> String {
        flag.words().into()
    }

    fn command(&self, cmd: Cmd) -> String {
        cmd.words().into()
    }

    fn setting(&self, flag: Flag, value: &str) -> String {
        format!("{} {value}", flag.words())
    }
}

/// One piece of [`Words`].
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Flag(Flag),
    Cmd(Cmd),
    Setting(Flag, String),
}

/// Text that names CLI things by type, spelled when it is printed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Words(Vec<Part>);

impl Words {
    /// Appends text.
    pub fn text(mut self, s: impl Into<String>) -> Self {
        self.0.push(Part::Text(s.into()));
        self
    }

    pub fn flag(mut self, flag: Flag) -> Self {
        self.0.push(Part::Flag(flag));
        self
    }

    pub fn cmd(mut self, cmd: Cmd) -> Self {
        self.0.push(Part::Cmd(cmd));
        self
    }

    /// Appends more words.
    pub fn and(mut self, more: Words) -> Self {
        self.0.extend(more.0);
        self
    }

    /// Appends every way of setting `flag` to `value`.
    pub fn setting(mut self, flag: Flag, value: &str) -> Self {
        self.0.push(Part::Setting(flag, value.into()));
        self
    }

    /// The text, CLI things spelled by `s`.
    pub fn spell(&self, s: &dyn Spell) -> String {
        self.0
            .iter()
            .map(|p| match p {
                Part::Text(t) => t.clone(),
                Part::Flag(f) => s.flag(*f),
                Part::Cmd(c) => s.command(*c),
                Part::Setting(f, v) => s.setting(*f, v),
            })
            .collect()
    }
}

impl From<String> for Words {
    fn from(s: String) -> Self {
        Words(vec![Part::Text(s)])
    }
}

impl From<&str> for Words {
    fn from(s: &str) -> Self {
        Words(vec![Part::Text(s.into())])
    }
}

/// In words (a caller that spells for the CLI uses [`Words::spell`]).
impl fmt::Display for Words {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.spell(&InWords))
    }
}

/// Starts [`Words`] with text.
pub fn words(s: impl Into<String>) -> Words {
    Words::default().text(s)
}
