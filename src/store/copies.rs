//! Two live copies of one event: what an import or a restore must never leave behind.
//!
//! An edit keeps one copy of an event live: it sets the original aside (discarded) in the
//! transaction that makes the revision. A row that arrives live afterwards may be a
//! second copy (an export of the original taken before its edit, a revision made in
//! another store, an original discarded here and restored beside a revision imported
//! from the store that edited it); then the event could go out through both.
//! [`live_pair`] finds such a pair (what counts as copies, and what is not caught, is
//! said there); an import with one is refused whole ([`live_pair_refused`]), a restore
//! leaves such a row discarded ([`push_no_live_copy`], [`restored_copies`]).
//!
//! Cheap: the chains' rows (the revision rows, a partial index, and the IDs they name),
//! and for the event rule the live rows of the arriving rows' event IDs and their
//! ancestors' (one probe of the event index per event), with the live descendants of
//! those events' rows (one probe of the primary key per chain row), grouped by time; only
//! the groups that can hold a pair are paired, each row with the broken revisions of its
//! group: never every row, never every pair of a hot event's rows.

use super::read::{Bind, Decoded, Dialect, NotUtf8, TimeCol};
use super::NOT_REVISED;
use crate::error::DlqError;
use crate::spell::{words, Cmd};
use futures_util::TryStreamExt;
use sqlx::QueryBuilder;

/// The rows that arrive live: the rows the check is for, and how it reads their state
/// (alias `d`, with SQLite's staged values as `s`).
#[derive(Clone, Copy)]
pub(crate) enum Arriving<'a> {
    /// Imported rows, these IDs, with their times as inserted (PostgreSQL: one
    /// transaction).
    Imported(&'a [String]),
    /// SQLite's staged import of this token: its rows hold the token as their claim and
    /// their own times wait in `dlq_import_rows`.
    Staged(&'a str),
    /// These rows, which a restore would make live again: the discarded ones no
    /// revision was made of (a revised original stays set aside anyway: [`NOT_REVISED`]).
    Restored(&'a [String]),
}

impl Arriving<'_> {
    /// The arriving rows' IDs, as a SELECT (the CTE `arr`).
    fn push_ids<D: Dialect>(self, qb: &mut QueryBuilder<'static, D>) {
        match self {
            Arriving::Imported(ids) => {
                qb.push("SELECT id FROM dead_letters WHERE ");
                D::push_ids(qb, ids);
            }
            Arriving::Staged(token) => {
                qb.push("SELECT id FROM dlq_import_rows WHERE token = ");
                D::bind(qb, Bind::Text(token.to_string()));
            }
            Arriving::Restored(ids) => {
                qb.push("SELECT id FROM dead_letters WHERE ");
                D::push_ids(qb, ids);
                qb.push(" AND discarded_at IS NOT NULL AND replayed_at IS NULL AND ");
                qb.push(NOT_REVISED);
            }
        }
    }

    /// Joins a staged import's own values of the rows `d`, as `s` (SQLite), if any.
    fn push_staged<D: Dialect>(self, qb: &mut QueryBuilder<'static, D>) {
        if let Arriving::Staged(token) = self {
            qb.push(" LEFT JOIN dlq_import_rows s ON s.token = ");
            D::bind(qb, Bind::Text(token.to_string()));
            qb.push(" AND s.id = d.id");
        }
    }

    /// Whether `d` is live (not set aside) once the rows have arrived.
    fn live(self) -> &'static str {
        match self {
            Arriving::Imported(_) => "d.discarded_at IS NULL",
            Arriving::Staged(_) => "COALESCE(s.discarded_at, d.discarded_at) IS NULL",
            Arriving::Restored(_) => "(d.discarded_at IS NULL OR d.id IN (SELECT id FROM arr))",
        }
    }

    /// `d`'s `replayed_at` once the rows have arrived (only its nullness counts).
    fn replayed(self) -> &'static str {
        match self {
            Arriving::Staged(_) => "COALESCE(s.replayed_at, d.replayed_at)",
            _ => "d.replayed_at",
        }
    }

    /// Whether `d` is an arriving row.
    fn arriving(self) -> &'static str {
        match self {
            Arriving::Staged(_) => "s.id IS NOT NULL",
            _ => "d.id IN (SELECT id FROM arr)",
        }
    }
}

/// Each row of a revision chain with each of its ancestors `anc`: every ID reached by
/// following `revision_of` (its row here or not) and, for a row some revision names,
/// itself. Two rows are copies of one event when they share an `anc` (a row no revision
/// names shares nothing through itself, so it needs no seed). Seeded from the revision
/// rows (a partial index) and the IDs they name, never every row; UNION, not UNION ALL,
/// so that a crafted `revision_of` cycle ends. A `revision_of` names a worker's BLOB id
/// too ([`Dialect::id_named`]).
fn chain<D: Dialect>() -> String {
    format!(
        "WITH RECURSIVE chain(id, anc) AS (\
         SELECT id, revision_of FROM dead_letters WHERE revision_of IS NOT NULL \
         UNION SELECT revision_of, revision_of FROM dead_letters WHERE revision_of IS NOT NULL \
         UNION SELECT chain.id, d.revision_of FROM chain JOIN dead_letters d ON {} \
         WHERE d.revision_of IS NOT NULL), ",
        D::id_named("d.id", "chain.anc")
    )
}

/// The CTEs up to `pairs(id, other, event)`: each arriving row `id` with a live copy
/// `other` of its event; `event` is the shared event ID when only the event rule links
/// them (see the module docs). The statement's SELECT follows.
fn push_pairs<D: Dialect>(qb: &mut QueryBuilder<'static, D>, arriving: Arriving<'_>) {
    qb.push(chain::<D>());
    qb.push("arr(id) AS (");
    arriving.push_ids(qb);
    qb.push("), ");
    push_chain_rows(qb, arriving);
    push_event_rows(qb, arriving);
    qb.push(
        "pairs(id, other, event) AS (SELECT a.id, b.id, NULL FROM live a \
         JOIN live b ON b.anc = a.anc AND b.id <> a.id \
         WHERE a.arriving AND (a.replayed_at IS NULL OR b.replayed_at IS NULL) \
         UNION ALL SELECT a.id, b.id, a.event FROM twin a CROSS JOIN rev b \
         WHERE b.event = a.event AND b.t = a.t AND b.id <> a.id AND a.arriving \
         AND (a.replayed_at IS NULL OR b.replayed_at IS NULL) \
         UNION ALL SELECT a.id, b.id, a.event FROM rev a CROSS JOIN twin b \
         WHERE b.event = a.event AND b.t = a.t AND b.id <> a.id AND a.arriving \
         AND NOT b.broken AND (a.replayed_at IS NULL OR b.replayed_at IS NULL)) ",
    );
}

/// `kin`: the live rows of the chains, as the rows arrive, and `live`: each with its
/// ancestors. MATERIALIZED: SQLite 3.46 otherwise computed `kin` again inside the pair
/// join, for every row of an import (an import of 40,000 rows ran for 20 minutes).
fn push_chain_rows<D: Dialect>(qb: &mut QueryBuilder<'static, D>, arriving: Arriving<'_>) {
    qb.push(format!(
        "kin(id, replayed_at, arriving) AS MATERIALIZED (SELECT {}, {}, {} \
         FROM (SELECT id FROM chain) p JOIN dead_letters d ON {}",
        D::id_text("d.id"),
        arriving.replayed(),
        arriving.arriving(),
        D::id_named("d.id", "p.id")
    ));
    arriving.push_staged(qb);
    qb.push(format!(
        " WHERE {}), live(id, anc, replayed_at, arriving) AS (SELECT c.id, c.anc, \
         k.replayed_at, k.arriving FROM chain c JOIN kin k ON k.id = c.id), ",
        arriving.live()
    ));
}

/// `near`: each live row with each identity it has in the arriving rows' events
/// ([`push_near`]), its time `t` an instant. `broken`: the revisions among them whose
/// chain reaches an ID with no row here. `twin`: the rows of the (event, time) groups that
/// can hold a pair (two rows, a broken revision, an arriving row, one not replayed), so
/// that a group of one event's replayed revisions at one time is never paired row by row;
/// `rev`: the broken revisions among them, apart, so that pairing on (event, time) never
/// walks a hot event's plain rows. MATERIALIZED, as `kin` is.
fn push_event_rows<D: Dialect>(qb: &mut QueryBuilder<'static, D>, arriving: Arriving<'_>) {
    push_near(qb, arriving);
    qb.push(format!(
        "broken(id) AS MATERIALIZED (SELECT DISTINCT c.id FROM chain c \
         WHERE c.id IN (SELECT id FROM near WHERE revision) \
         AND NOT EXISTS (SELECT 1 FROM dead_letters p WHERE {})), ",
        D::id_named("p.id", "c.anc"),
    ));
    // A join, not `IN (SELECT id FROM broken)`: PostgreSQL, misled by the chain's
    // estimate, scanned `broken` again for each row.
    let some = |what: &str| format!("sum(CASE WHEN {what} THEN 1 ELSE 0 END) > 0");
    qb.push(format!(
        "grp(event, t) AS MATERIALIZED (SELECT n.event, n.t FROM near n \
         LEFT JOIN broken b ON b.id = n.id GROUP BY n.event, n.t \
         HAVING count(*) > 1 AND {} AND {} AND {}), \
         twin(id, event, t, replayed_at, arriving, broken) AS MATERIALIZED (SELECT n.id, \
         n.event, n.t, n.replayed_at, n.arriving, b.id IS NOT NULL FROM near n \
         JOIN grp g ON g.event = n.event AND g.t = n.t LEFT JOIN broken b ON b.id = n.id), \
         rev(id, event, t, replayed_at, arriving) AS MATERIALIZED (SELECT id, event, t, \
         replayed_at, arriving FROM twin WHERE broken), ",
        some("b.id IS NOT NULL"),
        some("n.arriving"),
        some("n.replayed_at IS NULL"),
    ));
}

/// `near(id, event, t, ...)`: each live row with each of its identities (event ID and
/// time, [`Dialect::at`]: SQLite's times in whatever form a worker wrote them) among the
/// `probe` events. A row's identities are its own and those of its ancestors here, in
/// any state (`held`): a revision made with `--new-event-id` is still a copy of its
/// original's event, at its time. `probe`: the arriving rows' event IDs and those of
/// their ancestors here. Cheap: one probe of the event index per event, and one probe of
/// the primary key per chain row (CROSS JOIN: SQLite walks the chain, never the rows of
/// a hot event against it); UNION, so that a row is once in a group.
fn push_near<D: Dialect>(qb: &mut QueryBuilder<'static, D>, arriving: Arriving<'_>) {
    let anc = D::id_named("p.id", "c.anc");
    qb.push(format!(
        "probe(event) AS MATERIALIZED (SELECT a.eff_event_id FROM dead_letters a \
         WHERE a.id IN (SELECT id FROM arr) UNION SELECT p.eff_event_id FROM chain c \
         CROSS JOIN dead_letters p WHERE c.id IN (SELECT id FROM arr) AND {anc}), \
         held(id, event, t) AS MATERIALIZED (SELECT c.id, p.eff_event_id, {} FROM chain c \
         CROSS JOIN dead_letters p WHERE {anc} \
         AND p.eff_event_id IN (SELECT event FROM probe)), \
         near(id, event, t, replayed_at, arriving, revision) AS MATERIALIZED (SELECT {}, \
         d.eff_event_id, {}, {}, {}, d.revision_of IS NOT NULL FROM dead_letters d",
        D::at(TimeCol::DeadLetteredAt),
        D::id_text("d.id"),
        D::at(TimeCol::DeadLetteredAt),
        arriving.replayed(),
        arriving.arriving(),
    ));
    arriving.push_staged(qb);
    qb.push(format!(
        " WHERE d.eff_event_id IN (SELECT event FROM probe) AND {} \
         UNION SELECT {}, h.event, h.t, {}, {}, d.revision_of IS NOT NULL \
         FROM held h CROSS JOIN dead_letters d",
        arriving.live(),
        D::id_text("d.id"),
        arriving.replayed(),
        arriving.arriving(),
    ));
    arriving.push_staged(qb);
    qb.push(format!(
        " WHERE {} AND {}), ",
        D::id_named("d.id", "h.id"),
        arriving.live()
    ));
}

/// A live copy of an arriving row's event ([`live_pair`], [`restored_copies`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveCopy {
    /// The arriving row: imported, or to be restored.
    pub id: String,
    /// The other copy, live (or arriving too).
    pub other: String,
    /// The shared event ID when only the event rule links them (no chain here does).
    pub event: Option<String>,
}

impl LiveCopy {
    /// How the two rows are copies of one event, in words.
    pub fn why(&self) -> String {
        match &self.event {
            None => "a revision and an original it descends from, or revisions of one original"
                .to_string(),
            Some(e) => format!(
                "the same event ID {e:?} and the same dead-lettered time (a row's own, or an original's it descends from here), and one of them a revision, made by an edit"
            ),
        }
    }
}

/// After an import, in its transaction: a row it brought and a copy of its event, both
/// live (not discarded) and not both replayed, so that the event could go out through
/// both. Two rows are copies of one event when
///
/// - their `revision_of` chains meet ([`chain`]): a revision and an original it descends
///   from, or two revisions of one original however far down, the rows between here or
///   not (the only link of a revision made with `--new-event-id`); or
/// - (the event rule) one of them is a revision whose chain is broken here (it reaches an
///   ID with no row here: a middle never exported, or pruned), and they share the
///   effective event ID and the dead-lettered time, compared as instants (an edit copies
///   both into the revision; an export keeps the time to the microsecond): a row's own,
///   or those of an ancestor here in any state (a revision made with `--new-event-id`
///   keeps its original's time, and its original here says the event). This finds
///   the copies no chain here links, in either order, at any height of the break,
///   replayed or not. A plain duplicate (the same event dead-lettered again) or the
///   come-back of a replayed message has a time of its own: no copy; nor are two
///   revisions whose chains are whole here and apart, even at one time (their originals
///   are two dead letters).
///
/// Not caught: a revision made with `--new-event-id` whose chain is broken here below
/// every row of its original's event ID (nothing here links it to its original); a revision with no event ID (`eff_event_id` NULL); a
/// revision whose original's `dead_lettered_at` could not be read when it was edited (a
/// worker's text in a form dlq does not read: the revision got the edit's time), or a
/// row whose time cannot be read here (it equals no time). Refused wrongly (loudly,
/// nothing imported): a plain duplicate dead-lettered at the very time of an edited row
/// of its event whose chain is broken here (rows a worker inserted in one PostgreSQL
/// transaction; SQLite rows stamped in one second by a worker, or in one millisecond by
/// dlq's clock).
pub(crate) async fn live_pair<D: Dialect>(
    conn: &mut D::Connection,
    arriving: Arriving<'_>,
) -> Decoded<Option<LiveCopy>> {
    if let Arriving::Imported([]) = arriving {
        return Ok(None);
    }
    let mut qb = QueryBuilder::new("");
    push_pairs(&mut qb, arriving);
    qb.push("SELECT id, other, event FROM pairs LIMIT 1");
    Ok(read_copies::<D>(conn, qb).await?.into_iter().next())
}

async fn read_copies<D: Dialect>(
    conn: &mut D::Connection,
    mut qb: QueryBuilder<'static, D>,
) -> Decoded<Vec<LiveCopy>> {
    let rows = D::fetch(conn, qb.build()).try_collect::<Vec<_>>().await?;
    rows.iter().map(copy_of::<D>).collect()
}

/// A row of `pairs`.
pub(crate) fn copy_of<D: Dialect>(row: &D::Row) -> Decoded<LiveCopy> {
    let text = |col| D::text(row, col, NotUtf8::Escape);
    Ok(LiveCopy {
        id: text("id")?.unwrap_or_default(),
        other: text("other")?.unwrap_or_default(),
        event: text("event")?,
    })
}

/// A restore's guard on the rows `ids`: the row (`id` of `dead_letters`) has no live copy
/// of its event, the other rows of `ids` counted live (they would be restored with it).
/// The same pairs as an import's, so that nothing else makes a set-aside row live again
/// beside a copy (see [`live_pair`]).
pub(crate) fn push_no_live_copy<D: Dialect>(qb: &mut QueryBuilder<'static, D>, ids: &[String]) {
    qb.push("id NOT IN (");
    push_pairs(qb, Arriving::Restored(ids));
    qb.push("SELECT id FROM pairs)");
}

/// Each of the rows `ids` that [`push_no_live_copy`] keeps discarded, with a live copy of
/// its event (or another of `ids`): what a restore says of it.
pub(crate) fn restored_copies<D: Dialect>(ids: &[String]) -> QueryBuilder<'static, D> {
    let mut qb = QueryBuilder::new("");
    push_pairs(&mut qb, Arriving::Restored(ids));
    qb.push("SELECT id, other, event FROM pairs");
    qb
}

/// Why an import with a [`live_pair`] imported nothing.
pub(crate) fn live_pair_refused(pair: LiveCopy) -> DlqError {
    let (id, other, why) = (&pair.id, &pair.other, pair.why());
    let first = format!(
        "dead letters {id:?} and {other:?} are copies of one event ({why}), and neither is set aside: both could be replayed, one event twice (nothing was imported); "
    );
    match pair.event {
        None => DlqError::usage(
            words(format!("{first}import the original as "))
                .cmd(Cmd::Export)
                .text(" writes it after the edit (discarded), or leave one of them out"),
        ),
        Some(_) => DlqError::usage(format!(
            "{first}leave one of them out, or set the one already here aside (discard it) first"
        )),
    }
}
