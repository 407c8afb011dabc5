//! After a batch's transaction: what could not be stored is parked (or handed back, and
//! the capture stops), then the batch is acked with one `multiple` ack. Nothing is acked
//! before its row has committed.

use super::batch::StoredBatch;
use super::park::{self, Copy, Parked};
use super::session::{broker_text, Held, Session};
use super::{CaptureOptions, CaptureSummary, Event};
use crate::broker::Publisher;
use crate::error::{DlqError, Result};
use crate::spell::{words, Flag};
use lapin::options::{BasicAckOptions, BasicNackOptions};
use tokio::time::timeout;

/// Where a run parks: its connection to the parking queue, and what it parked.
pub(super) struct Parking<'a> {
    pub publisher: &'a mut Option<Publisher>,
    pub parked: &'a mut Parked,
}

/// After a batch's transaction: parks what could not be stored, then acks the batch.
/// `Some`: the broker or the database went away (nothing of this batch acked).
pub(super) async fn settle(
    session: &Session,
    opts: &CaptureOptions,
    stored: Result<StoredBatch>,
    summary: &mut CaptureSummary,
    parking: Parking<'_>,
    on_event: &mut impl FnMut(Event<'_>),
) -> Result<Option<String>> {
    let StoredBatch {
        batch,
        captured,
        already,
        refused,
    } = match stored {
        Ok(s) => s,
        Err(e @ (DlqError::SchemaMissing(_) | DlqError::Usage(_))) => return Err(e),
        Err(e) => return Ok(Some(format!("the database did not take the batch ({e})"))),
    };
    summary.captured += captured;
    summary.already_there += already;
    if !refused.is_empty() {
        let Some(park) = &opts.park_queue else {
            hand_back(session, &batch, &refused).await;
            let (i, why) = &refused[0];
            return Err(DlqError::other(
                words(format!(
                    "a message from {} cannot be stored{}: {why}; it is back in the queue, nothing was dropped ({} stored before it in this run). Give ",
                    opts.queue,
                    describe(&batch[*i]),
                    summary.captured
                ))
                .flag(Flag::ParkQueue)
                .text(" QUEUE to set such messages aside and go on"),
            ));
        };
        for (n, (i, why)) in refused.iter().enumerate() {
            let h = &batch[*i];
            let copy = match parking.parked.holds(h) {
                true => Copy::MaybeSecond,
                false => Copy::First,
            };
            on_event(Event::Parking);
            if let Err(e) = park::park_one(opts, park, h, why, copy, parking.publisher).await {
                return Err(also_parked(opts, park, n, e));
            }
            parking.parked.remember(h);
            summary.parked += 1;
            on_event(Event::Parked { why, copy });
        }
    }
    ack_all(session, opts, &batch).await
}

/// A park that failed after `before` others of its batch were confirmed: those are in
/// the parking queue and, not acked, still in their queue too; the error says so.
fn also_parked(opts: &CaptureOptions, park: &str, before: usize, e: DlqError) -> DlqError {
    if before == 0 {
        return e;
    }
    DlqError::other(words(e.render(&*opts.spell)).text(format!(
        "; {before} message(s) of this batch moved to {park} before it are also still in {}: look in {park} before running again, or the rerun parks them a second time",
        opts.queue
    )))
}

/// Acks the stored messages one by one and hands the refused ones back (requeued), so
/// that the capture can stop with nothing dropped.
async fn hand_back(session: &Session, batch: &[Held], refused: &[(usize, String)]) {
    let bad: std::collections::HashSet<usize> = refused.iter().map(|(i, _)| *i).collect();
    for (i, h) in batch.iter().enumerate() {
        let res = if bad.contains(&i) {
            let requeue = BasicNackOptions {
                multiple: false,
                requeue: true,
            };
            session.channel.basic_nack(h.tag, requeue).await
        } else {
            let one = BasicAckOptions { multiple: false };
            session.channel.basic_ack(h.tag, one).await
        };
        if let Err(e) = res {
            tracing::debug!(error = %broker_text(&e), "ack after a refused message");
        }
    }
}

/// One `multiple` ack up to the batch's last tag; `Some` when it may not have gone out.
async fn ack_all(
    session: &Session,
    opts: &CaptureOptions,
    batch: &[Held],
) -> Result<Option<String>> {
    let last = batch.last().map(|h| h.tag).unwrap_or_default();
    let ack = session
        .channel
        .basic_ack(last, BasicAckOptions { multiple: true });
    match timeout(opts.confirm_timeout, ack).await {
        Ok(Ok(())) => Ok(None),
        Ok(Err(e)) => Ok(Some(format!(
            "lost the broker connection to {} before the ack ({}); the stored messages come back flagged redelivered and are not stored twice",
            session.host,
            broker_text(&e)
        ))),
        Err(_) => Ok(Some(format!(
            "the ack to {} did not go out within {}",
            session.host,
            humantime::format_duration(opts.confirm_timeout)
        ))),
    }
}

/// " (message_id ...)" when the message has one, for error lines.
pub(super) fn describe(h: &Held) -> String {
    match h.properties.message_id() {
        Some(m) => format!(" (message_id {:?})", m.as_str()),
        None => String::new(),
    }
}
