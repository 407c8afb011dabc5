//! A [`Filter`] as SQL: the WHERE clause every filtered read and write appends, and the
//! condition of each state, so that a list, a count, a plan and a prune select alike.

use super::{Bind, Dialect, Doc, Sql, TimeCol};
use crate::model::{Filter, MatchOn, State, UNKNOWN};
use crate::store::state_predicate_at;
use sqlx::QueryBuilder;

/// Appends the filter's WHERE clause (see [`where_sql`]).
pub(crate) fn push_where<D: Dialect>(qb: &mut QueryBuilder<'static, D>, f: &Filter) {
    where_sql::<D>(f).push_into(qb);
}

/// The filter's WHERE clause. Every value is a bound parameter; `--header` and
/// `--field` first look for their texts in the raw bytes (a cheap test that never rules
/// out a match, see [`crate::model::ContentMatch::needles`]; SQLite evaluates AND from the left), and
/// parse the JSON only where the dialect's guard says it parses.
pub(crate) fn where_sql<D: Dialect>(f: &Filter) -> Sql {
    let mut sql = Sql::new(" WHERE 1=1");
    for (col, val) in [
        ("reason", &f.reason),
        ("eff_producer", &f.producer),
        ("eff_schema_version", &f.schema_version),
        ("source_queue", &f.source_queue),
        ("eff_event_id", &f.event_id),
    ] {
        match val.as_deref() {
            None => {}
            Some(UNKNOWN) if col != "reason" => {
                sql.push(format!(" AND {col} IS NULL"));
            }
            Some(v) => {
                sql.push(format!(" AND {col} = "));
                sql.bind(Bind::Text(v.to_string()));
            }
        }
    }
    let settled = format!(
        "COALESCE({}, {})",
        D::at(TimeCol::ReplayedAt),
        D::at(TimeCol::DiscardedAt)
    );
    for (col, cmp, t) in [
        (D::at(TimeCol::DeadLetteredAt), ">=", f.since),
        (D::at(TimeCol::DeadLetteredAt), "<", f.until),
        (settled.as_str(), "<", f.settled_before),
    ] {
        if let Some(t) = t {
            sql.push(format!(" AND {col} {cmp} "));
            sql.bind(Bind::Time(t));
        }
    }
    if f.settled_before.is_some() {
        sql.push(prune_keeps::<D>());
    }
    if !f.states.is_empty() {
        let any: Vec<String> = f.states.iter().map(|st| state_of::<D>(*st)).collect();
        sql.push(format!(" AND (({}))", any.join(") OR (")));
    }
    if f.revisions {
        sql.push(" AND revision_of IS NOT NULL");
    }
    if let Some(g) = &f.grep {
        sql.push(" AND ");
        D::push_contains(&mut sql, Doc::Body, Bind::Bytes(g.as_bytes().to_vec()));
    }
    if let Some(e) = &f.error_contains {
        sql.push(" AND ");
        D::push_contains(&mut sql, Doc::Error, Bind::Text(e.clone()));
    }
    let headers = f
        .headers
        .iter()
        .map(|m| (Doc::Headers, m, vec![m.key.as_str()]));
    let fields = f.fields.iter().map(|m| (Doc::Body, m, m.path()));
    for (doc, m, path) in headers.chain(fields) {
        let (before, after) = D::json_guard(doc);
        sql.push(format!(" AND CASE WHEN {before}"));
        let on = match doc {
            Doc::Body => MatchOn::Field,
            _ => MatchOn::Header,
        };
        for n in m.needles(on) {
            sql.push(" AND (");
            let n = match doc {
                Doc::Body => Bind::Bytes(n.into_bytes()),
                _ => Bind::Text(n),
            };
            D::push_contains(&mut sql, doc, n);
            sql.push(format!(" OR {})", D::backslash_in(doc)));
        }
        sql.push(format!("{after} THEN "));
        D::push_json_match(&mut sql, doc, &path, m);
        sql.push(" ELSE false END");
    }
    sql
}

/// The condition of one state in the dialect (see [`state_predicate_at`]).
pub(crate) fn state_of<D: Dialect>(state: State) -> String {
    state_predicate_at(state, D::NOW, D::at(TimeCol::LeaseEnd))
}

/// What `prune` never selects: a row no write can name ([`Dialect::WRITABLE_ID`]: a
/// worker's BLOB id on SQLite), and the rows of revision chains it keeps.
fn prune_keeps<D: Dialect>() -> String {
    format!(" AND {}{}", D::WRITABLE_ID, keeps_revisions::<D>())
}

/// `prune` keeps a revision while its original is here, so a chain is pruned from its
/// first row down: a replayed revision is what tells that the original's event went out
/// (else `restore` or an `import` of another revision could send it again), and a middle
/// revision is what links it to the original. It keeps an original while a revision of
/// it with another event ID (`edit --new-event-id`) is here: the original is what says
/// that revision's event is its own (`copies`); such a pair stays until deleted by hand.
fn keeps_revisions<D: Dialect>() -> String {
    format!(
        " AND NOT (revision_of IS NOT NULL \
         AND EXISTS (SELECT 1 FROM dead_letters o WHERE {})) \
         AND NOT EXISTS (SELECT 1 FROM dead_letters r WHERE {} \
         AND r.eff_event_id IS DISTINCT FROM dead_letters.eff_event_id)",
        D::id_named("o.id", "dead_letters.revision_of"),
        D::id_named("dead_letters.id", "r.revision_of"),
    )
}
