//! Why a replayed item ended as it did, typed: the protocol decides on a [`Reason`] and
//! a [`NextStep`] the operator can take, and never spells a command. A caller spells
//! the next steps ([`Spell`]): the CLI as the commands to type, anything else in words
//! ([`InWords`]). The same rendering gives the report's detail and the history entry
//! the protocol writes, so what an operator reads on stdout and in `show` agrees.

use super::why::RowUnavailable;
use crate::publisher::{Nowhere, Target};
use crate::spell::Words;
pub use crate::spell::{InWords, NextStep, Spell};
use std::fmt::Write;
use std::time::Duration;

/// A publish that the broker said leads nowhere, and what it was sent to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Miss {
    pub target: Target,
    pub nowhere: Nowhere,
}

impl Miss {
    /// The target and why it leads nowhere, with what to do (`s` spells it).
    fn write(&self, s: &dyn Spell, o: &mut String) {
        let Target {
            exchange,
            routing_key: key,
        } = &self.target;
        let _ = match (self.nowhere, exchange.is_empty()) {
            (Nowhere::NoRoute, true) => write!(
                o,
                "; no queue named {key:?} exists (the default exchange routes to the queue of the routing key's name); check the name, or {}",
                s.next(&NextStep::GiveTarget)
            ),
            (Nowhere::NoRoute, false) => write!(
                o,
                "; no queue is bound for routing key {key:?} on exchange {exchange:?}; {}",
                s.next(&NextStep::CheckBinding)
            ),
            (Nowhere::NoExchange, _) => write!(
                o,
                "; exchange {exchange:?} (routing key {key:?}) does not exist in this vhost; {}",
                s.next(&NextStep::CheckExchange)
            ),
        };
    }
}

/// Why one item of a replay ended as it did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// No row has this ID.
    NotFound,
    /// The row was not available to claim; `token_refused`: the run was given a claim
    /// and the row is held, by another claim or by an attempt that already used it.
    Unavailable {
        why: RowUnavailable,
        token_refused: bool,
    },
    /// Another run's attempt is open on a row this run also held.
    AttemptedFirst(RowUnavailable),
    /// A body too large to come with the claim could not be read after it.
    BodyUnreadable { cause: String },
    /// The stored body is not the one a person reviewed.
    BodyChanged { stored: String, reviewed: String },
    /// The row names nowhere to publish to.
    NoTarget,
    /// The broker could not be reached.
    NoConnection { cause: String },
    /// A signal came before this row was published.
    Interrupted,
    /// An earlier chunk's attempt could not be recorded: this one was not tried.
    AttemptNotTried,
    /// Recording the attempt failed.
    AttemptFailed { cause: String },
    /// The attempt step did not take the row: its lease ends too soon, or the token no
    /// longer holds it.
    LeaseTooShort { outlive: Duration },
    /// Sending took longer than the attempt's lease check allowed.
    SendTooSlow,
    /// The broker certainly did not take it; `miss`: it said where the target leads nowhere.
    PublishFailed { cause: Words, miss: Option<Miss> },
    /// Handed to the broker, its confirm not in yet.
    AwaitingConfirm,
    /// Published, confirmed, marked.
    Replayed { target: Option<String> },
    /// The publish's outcome is unknown; `in_flight`: the message may still be on its
    /// way out of this process, so the row waits for its lease.
    Unconfirmed {
        cause: Words,
        event_id: Option<String>,
        in_flight: bool,
        miss: Option<Miss>,
    },
    /// Confirmed by the broker, but the mark could not be written.
    MarkFailed { cause: String },
    /// A claim given to the run stays with its holder, after `why`.
    ClaimKept(Box<Reason>),
    /// The release after `why` could not be written.
    ReleaseNotWritten { why: Box<Reason>, cause: String },
}

const NOTHING: &str = "nothing was published";

impl Reason {
    /// What the operator can do next, if anything: the last step the detail names.
    pub fn next(&self, id: &str) -> Option<NextStep> {
        match self {
            Reason::Unavailable { why, .. } | Reason::AttemptedFirst(why) => why.next(),
            Reason::NoTarget => Some(NextStep::GiveTarget),
            Reason::PublishFailed { miss: Some(m), .. } => Some(match m.nowhere {
                Nowhere::NoRoute if m.target.exchange.is_empty() => NextStep::GiveTarget,
                Nowhere::NoRoute => NextStep::CheckBinding,
                Nowhere::NoExchange => NextStep::CheckExchange,
            }),
            Reason::Unconfirmed { .. } => Some(NextStep::ResolveEither { id: id.into() }),
            Reason::MarkFailed { .. } => Some(NextStep::ResolveDelivered { id: id.into() }),
            Reason::ClaimKept(_) => Some(NextStep::ReleaseClaim),
            Reason::ReleaseNotWritten { .. } => {
                Some(NextStep::ResolveNotDelivered { id: id.into() })
            }
            _ => None,
        }
    }

    /// The detail of row `id`'s report and history entry, next steps spelled by `s`.
    pub fn render(&self, id: &str, s: &dyn Spell) -> String {
        let mut out = String::new();
        self.write(id, s, &mut out);
        out
    }

    /// Before anything was published: why not.
    fn write(&self, id: &str, s: &dyn Spell, o: &mut String) {
        let _ = match self {
            Reason::NotFound => write!(o, "no dead letter with id {id:?}"),
            Reason::Unavailable { why, token_refused } => {
                if *token_refused {
                    o.push_str("the token does not hold it (or was already used): ");
                }
                write!(o, "{}; {NOTHING}", why.render(s))
            }
            Reason::AttemptedFirst(why) => write!(
                o,
                "{}; another replay attempted it first, {NOTHING} by this one",
                why.render(s)
            ),
            Reason::BodyUnreadable { cause } => {
                write!(o, "its body could not be read ({cause}); {NOTHING}")
            }
            Reason::BodyChanged { stored, reviewed } => write!(
                o,
                "the stored body's sha256 is {stored}, not the reviewed {reviewed}; {NOTHING}"
            ),
            Reason::NoTarget => write!(
                o,
                "no target: the row has no exchange, routing key or source queue; {}",
                s.next(&NextStep::GiveTarget)
            ),
            Reason::NoConnection { cause } => write!(o, "{cause}; {NOTHING}"),
            Reason::Interrupted => write!(o, "interrupted before publishing; {NOTHING}"),
            Reason::AttemptNotTried => write!(
                o,
                "not attempted: the database could not record the attempt; {NOTHING}"
            ),
            Reason::AttemptFailed { cause } => {
                write!(o, "recording the attempt failed ({cause}); {NOTHING}")
            }
            Reason::LeaseTooShort { outlive } => write!(
                o,
                "not attempted: the lease ends within {} (the confirm wait and sending), or the token no longer holds it; {NOTHING}",
                humantime::format_duration(*outlive)
            ),
            Reason::SendTooSlow => write!(
                o,
                "sending took longer than the attempt's lease check allowed; {NOTHING}"
            ),
            _ => return self.write_settled(id, s, o),
        };
    }

    /// Handed to the broker (or wrapping another reason): how it settled.
    fn write_settled(&self, id: &str, s: &dyn Spell, o: &mut String) {
        let _ = match self {
            Reason::PublishFailed { cause, miss } => {
                o.push_str(&cause.spell(s));
                if let Some(m) = miss {
                    m.write(s, o);
                }
                Ok(())
            }
            Reason::AwaitingConfirm => write!(o, "published; awaiting the confirm"),
            Reason::Replayed { target } => write!(
                o,
                "published to {}, confirmed by the broker, marked replayed",
                target.as_deref().unwrap_or("(unknown)")
            ),
            Reason::Unconfirmed {
                cause,
                event_id,
                in_flight,
                miss,
            } => {
                o.push_str(&cause.spell(s));
                if let Some(m) = miss {
                    m.write(s, o);
                }
                write!(
                o,
                "; check the consumers' receipts for event {}, then {}{}",
                event_id.as_deref().unwrap_or("(unknown)"),
                s.next(&NextStep::ResolveEither { id: id.into() }),
                if *in_flight { " once its lease has ended" } else { "" }
            )
            }
            Reason::MarkFailed { cause } => write!(
                o,
                "published and confirmed by the broker, but the mark could not be written ({cause}): it WAS published; {}",
                s.next(&NextStep::ResolveDelivered { id: id.into() })
            ),
            Reason::ClaimKept(why) => {
                why.write(id, s, o);
                write!(
                    o,
                    "; {} stays held until its lease ends ({} gives it back)",
                    s.given_claim(),
                    s.next(&NextStep::ReleaseClaim)
                )
            }
            Reason::ReleaseNotWritten { why, cause } => {
                why.write(id, s, o);
                write!(
                    o,
                    "; the release could not be written ({cause}): if it shows uncertain, {NOTHING}: {}",
                    s.next(&NextStep::ResolveNotDelivered { id: id.into() })
                )
            }
            // The rest are written by `write`, which hands these here.
            _ => Ok(()),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spelled in words, no detail names a command or a flag.
    #[test]
    fn in_words_spells_no_command() {
        let reasons = [
            Reason::NoTarget,
            Reason::Unconfirmed {
                cause: "no confirm".into(),
                event_id: None,
                in_flight: true,
                miss: Some(Miss {
                    target: Target {
                        exchange: "x".into(),
                        routing_key: "k".into(),
                    },
                    nowhere: Nowhere::NoExchange,
                }),
            },
            Reason::PublishFailed {
                cause: "312 NO_ROUTE".into(),
                miss: Some(Miss {
                    target: Target {
                        exchange: String::new(),
                        routing_key: "k".into(),
                    },
                    nowhere: Nowhere::NoRoute,
                }),
            },
            Reason::MarkFailed { cause: "x".into() },
            Reason::ClaimKept(Box::new(Reason::Interrupted)),
            Reason::ReleaseNotWritten {
                why: Box::new(Reason::NoTarget),
                cause: "x".into(),
            },
        ];
        for r in reasons {
            let text = r.render("a", &InWords);
            assert!(!text.contains("dlq ") && !text.contains("--"), "{text}");
            assert!(r.next("a").is_some(), "{r:?}");
        }
    }
}
