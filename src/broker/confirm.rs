//! Waiting for a set of publisher confirms and judging each publish by the contract,
//! conservatively: [`PublishResult::Failed`] only where the broker certainly does not
//! have the message (the connection was blocked before sending, a nack from the one
//! queue of the default exchange on a broker known to be one node, an ack that came
//! with the message returned as unroutable, or the 404 of a missing exchange when one
//! publish alone can have drawn it); [`PublishResult::Uncertain`] wherever the
//! message may have reached a queue (lost connection or timeout after the publish was
//! handed to the socket, any other nack). Apart from [`super::publish`] because judging
//! is the part the contract is about, and it needs no socket code to read.

use super::codec::DEAD_LETTER_ID_HEADER;
use super::publish::{Judged, Nowhere, PublishResult, Publisher, Sent, Target};
use super::reply::missing_exchange;
use crate::secret::scrub;
use crate::spell::{words, Flag};
use crate::topology::BrokerTopology;
use futures_util::FutureExt;
use lapin::types::AMQPValue;
use lapin::{Confirmation, PublisherConfirm};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// How waiting for one confirm ended.
enum Waited {
    Known(PublishResult),
    Confirmation(Box<Confirmation>),
    /// No answer by the deadline, or interrupted: the future is kept to look at once more.
    Open(std::pin::Pin<Box<PublisherConfirm>>, Unanswered),
    /// The channel or connection closed; `Some`: the exchange the broker's 404 names.
    Lost(String, Option<String>),
    /// The publish the broker's 404 was about ([`refused_by_404`]): never routed.
    Refused(String),
}

/// Why a confirm is still open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unanswered {
    Interrupted,
    TimedOut,
}

/// The error of a lost confirm, and whether it was the broker's 404 (no such exchange).
fn lost(e: &lapin::Error) -> Waited {
    Waited::Lost(scrub(&e.to_string()), missing_exchange(e))
}

/// The returns the confirms carry, by the publish each names, with why it came back; a
/// return naming no publish of the wait (no `x-dead-letter-id`, or another row's, as a
/// parked message keeps) is unmatched.
fn returns(waited: &mut [(String, Target, Waited)]) -> (HashMap<String, (String, u16)>, usize) {
    let mut carried = Vec::new();
    for (_, _, w) in waited.iter_mut() {
        if let Waited::Confirmation(c) = w {
            if let Confirmation::Ack(r) | Confirmation::Nack(r) = c.as_mut() {
                carried.extend(r.take());
            }
        }
    }
    let mut returned = HashMap::new();
    let mut unmatched = 0;
    for ret in carried {
        let ours = dead_letter_id(&ret).filter(|id| waited.iter().any(|(o, _, _)| o == id));
        match ours {
            Some(id) => {
                let why = format!("{} {}", ret.reply_code, ret.reply_text);
                returned.insert(id, (why, ret.reply_code));
            }
            None => unmatched += 1,
        }
    }
    (returned, unmatched)
}

/// Whether this publish's target leads nowhere: returned as unroutable (312), or lost to
/// a 404 that names its exchange.
fn nowhere_of(w: &Waited, back: Option<&(String, u16)>, target: &Target) -> Option<Nowhere> {
    match (w, back) {
        (Waited::Known(_), _) => None,
        (Waited::Refused(_), _) => Some(Nowhere::NoExchange),
        (_, Some((_, 312))) => Some(Nowhere::NoRoute),
        (Waited::Lost(_, missing), None) => {
            names_exchange(missing.as_deref(), target).then_some(Nowhere::NoExchange)
        }
        _ => None,
    }
}

/// Whether the exchange a 404 named is this publish's: the 404 closes the channel for
/// every confirm still open, also those of publishes to other exchanges (the default one
/// always exists).
fn names_exchange(missing: Option<&str>, target: &Target) -> bool {
    !target.exchange.is_empty() && missing == Some(target.exchange.as_str())
}

/// The publish a 404 closing the channel was certainly about, made [`Waited::Refused`].
/// The broker checks the exchange before routing and discards what follows on the closed
/// channel, so the publish that drew the 404 reached no queue. It is known only when one
/// publish of the wait to the named exchange has no ack: the others to it were acked (the
/// exchange existed for them), and an earlier settle on this channel left none open.
/// Two or more unanswered ones stay uncertain: the exchange may have been deleted after
/// the first was routed.
fn refused_by_404(waited: &mut [(String, Target, Waited)]) {
    let named = waited.iter().find_map(|(_, _, w)| match w {
        Waited::Lost(_, Some(x)) => Some(x.clone()),
        _ => None,
    });
    let Some(named) = named else {
        return;
    };
    let candidates: Vec<usize> = (0..waited.len())
        .filter(|&i| {
            let (_, target, w) = &waited[i];
            names_exchange(Some(&named), target) && !matches!(w, Waited::Confirmation(_))
        })
        .collect();
    if let [i] = candidates[..] {
        if let Waited::Lost(text, Some(_)) = &mut waited[i].2 {
            waited[i].2 = Waited::Refused(std::mem::take(text));
        }
    }
}

impl Publisher {
    /// Waits for the confirms of `sent` (each until its deadline, or until `stop` is
    /// set) and judges each publish. Returned messages are matched to publishes by their
    /// `x-dead-letter-id` header over the whole set: lapin hands a `basic.return` to
    /// whichever confirm completes next, not to the message it belongs to. Every
    /// publish on this channel must be in one call, so that no return can land on a
    /// confirm outside it; after an unanswered confirm the channel is not used again.
    pub async fn settle(&self, sent: Vec<Sent>, stop: &AtomicBool) -> Vec<Judged> {
        let mut waited = Vec::with_capacity(sent.len());
        for s in sent {
            let w = match s.confirm {
                Err(known) => Waited::Known(known),
                Ok(mut confirm) => {
                    match until_deadline_or_stop(&mut confirm, s.deadline, stop).await {
                        Some(Ok(c)) => Waited::Confirmation(Box::new(c)),
                        Some(Err(e)) => lost(&e),
                        None if stop.load(Ordering::SeqCst) => {
                            Waited::Open(confirm, Unanswered::Interrupted)
                        }
                        None => Waited::Open(confirm, Unanswered::TimedOut),
                    }
                }
            };
            waited.push((s.id, s.target, w));
        }
        // A confirm given up on may have completed meanwhile (and carry a return).
        for (_, _, w) in &mut waited {
            if let Waited::Open(confirm, _) = w {
                if let Some(r) = confirm.as_mut().now_or_never() {
                    *w = match r {
                        Ok(c) => Waited::Confirmation(Box::new(c)),
                        Err(e) => lost(&e),
                    };
                }
            }
        }
        let (returned, unmatched) = returns(&mut waited);
        refused_by_404(&mut waited);
        if waited
            .iter()
            .any(|(_, _, w)| matches!(w, Waited::Open(..) | Waited::Lost(..) | Waited::Refused(_)))
        {
            self.poisoned.store(true, Ordering::SeqCst);
        }
        let results: Vec<Judged> = waited
            .into_iter()
            .map(|(id, target, w)| {
                let back = returned.get(&id);
                let nowhere = nowhere_of(&w, back, &target);
                let result = self.judge(&target, w, back.map(|(why, _)| why), unmatched);
                Judged {
                    id,
                    target,
                    result,
                    nowhere,
                }
            })
            .collect();
        let count = |f: fn(&PublishResult) -> bool| results.iter().filter(|r| f(&r.result)).count();
        tracing::debug!(
            "published {}: {} confirmed, {} failed, {} uncertain",
            results.len(),
            count(|r| *r == PublishResult::Confirmed),
            count(|r| matches!(r, PublishResult::Failed(_))),
            count(|r| matches!(r, PublishResult::Uncertain(_)))
        );
        results
    }

    /// One publish's outcome by the contract: a certain failure only where the broker
    /// surely holds no copy (returned as unroutable, or nacked on the default exchange,
    /// whose route has exactly one queue, by a broker known to be one node); uncertain
    /// wherever a copy may exist.
    fn judge(
        &self,
        target: &Target,
        w: Waited,
        returned: Option<&String>,
        unmatched: usize,
    ) -> PublishResult {
        let host = &self.host;
        let confirmation = match (w, returned) {
            (Waited::Known(r), _) => return r,
            (_, Some(why)) => {
                return PublishResult::Failed(words(format!(
                    "the broker returned it as unroutable: {why}"
                )))
            }
            (Waited::Open(_, Unanswered::Interrupted), None) => return PublishResult::Uncertain(
                "interrupted after publishing, before the broker's confirm: the message may or may not have been published".into(),
            ),
            (Waited::Open(..), None) => {
                return PublishResult::Uncertain(words(format!(
                    "no publisher confirm from {host} within {}: the message may or may not have been published",
                    humantime::format_duration(self.opts.confirm_timeout)
                )))
            }
            (Waited::Refused(e), None) => {
                return PublishResult::Failed(words(format!(
                    "the broker refused it before routing it ({e}): nothing was published"
                )))
            }
            (Waited::Lost(e, _), None) => return PublishResult::Uncertain(words(format!(
                "the connection to {host} was lost after publishing and before the confirm ({e}): the message may or may not have been published"
            ))),
            (Waited::Confirmation(c), None) => *c,
        };
        match confirmation {
            Confirmation::NotRequested => PublishResult::Uncertain(
                "the channel was not in confirm mode; the outcome is unknown".into(),
            ),
            _ if unmatched > 0 => PublishResult::Uncertain(words(format!(
                "the broker returned {unmatched} message(s) on this channel that name none of the messages it was waiting for (no x-dead-letter-id header, or another one), so returns cannot be matched: this one may or may not have been routed"
            ))),
            Confirmation::Ack(_) => PublishResult::Confirmed,
            Confirmation::Nack(_) if target.exchange.is_empty() => default_exchange_nack(self.opts.topology),
            Confirmation::Nack(_) => PublishResult::Uncertain(words(format!(
                "the broker refused it (nack) through exchange {}: one bound queue refused it while others may hold it",
                target.exchange
            ))),
        }
    }
}

/// A nack on the default exchange (a route of exactly one queue): certain only on a
/// broker known to be one node.
fn default_exchange_nack(topology: BrokerTopology) -> PublishResult {
    match topology {
        BrokerTopology::Single => PublishResult::Failed(
            "the broker refused it (nack) on the default exchange, whose route has one queue, on a broker known to be one node (e.g. a full queue with reject-publish)".into(),
        ),
        BrokerTopology::Cluster => PublishResult::Uncertain(
            "the broker refused it (nack) in a cluster: a queue whose node or leader went away is nacked even when a replica kept the message".into(),
        ),
        BrokerTopology::Unknown => PublishResult::Uncertain(
            words("the broker refused it (nack) on the default exchange, and dlq does not know that the broker is one node: a cluster, also one behind a single address, nacks what a replica may still hold. If this broker is one node, say so (")
                .setting(Flag::BrokerTopology, "single")
                .text(") and such a nack is publish_failed"),
        ),
    }
}

/// Awaits `confirm` until `deadline`; `None` when the deadline passed or `stop` was set.
async fn until_deadline_or_stop(
    confirm: &mut std::pin::Pin<Box<PublisherConfirm>>,
    deadline: Instant,
    stop: &AtomicBool,
) -> Option<lapin::Result<Confirmation>> {
    loop {
        if stop.load(Ordering::SeqCst) {
            return None;
        }
        tokio::select! {
            r = confirm.as_mut() => return Some(r),
            _ = tokio::time::sleep_until(deadline) => return None,
            _ = tokio::time::sleep(Duration::from_millis(25)) => {}
        }
    }
}

/// The `x-dead-letter-id` header of a returned message: the row it belongs to.
fn dead_letter_id(ret: &lapin::message::BasicReturnMessage) -> Option<String> {
    let headers = ret.delivery.properties.headers().as_ref()?;
    match headers.inner().get(DEAD_LETTER_ID_HEADER)? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_string()),
        _ => None,
    }
}
