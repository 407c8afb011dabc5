//! How the shared reads ([`super::read`]) spell SQLite: its clock and times (through
//! [`super::sqlite_time`]), ID sets as one JSON array, the JSON and byte functions of the
//! content filters, and text that a worker stored as bytes.

use super::read::{Bind, Bucket, Dialect, Doc, NotUtf8, Sql, TimeCol};
use super::sqlite_time::{
    from_int, to_us, us, ATTEMPT_AT, DEAD_LETTERED_AT, DISCARDED_AT, HISTORY_AT, LEASE_END, NOW_US,
    REPLAYED_AT, SHOWN_ATTEMPT_AT, SHOWN_DEAD_LETTERED_AT, SHOWN_DISCARDED_AT, SHOWN_LEASE_END,
    SHOWN_REPLAYED_AT, UNREADABLE,
};
use crate::model::shown_id::{escaped, unescape};
use crate::model::ContentMatch;
use chrono::{DateTime, Utc};
use futures_util::stream::BoxStream;
use sqlx::query::Query;
use sqlx::sqlite::{SqliteConnection, SqliteRow};
use sqlx::{QueryBuilder, Row, Sqlite};

/// A set of IDs as one JSON array for [`in_ids!`] (reads only): each ID, and for one
/// that [`escaped`] shows bytes as (not UTF-8) also those bytes, as hex after a `\u{1}`
/// (no ID typed or stored by dlq holds a control character).
pub(crate) fn ids_json(ids: &[String]) -> String {
    let mut all: Vec<String> = ids.to_vec();
    all.extend(
        ids.iter()
            .filter_map(|id| unescape(id))
            .map(|b| format!("\u{1}{}", hex(&b))),
    );
    serde_json::to_string(&all).unwrap_or_else(|_| "[]".into())
}

/// The IDs as one JSON array for [`EXACT_IDS`]: as they are.
pub(crate) fn exact_ids_json(ids: &[String]) -> String {
    serde_json::to_string(ids).unwrap_or_else(|_| "[]".into())
}

/// Every write by ID: `id` is, as TEXT, exactly one of the IDs of the JSON array `?`
/// ([`exact_ids_json`]): no escape decoding, never a BLOB (a TEXT value never equals a
/// BLOB), so each ID names at most one row (the primary key). A worker's BLOB id is
/// only read ([`in_ids!`]); [`crate::model::IdStorage`] says how to fix it.
pub(crate) const EXACT_IDS: [&str; 2] = [
    "typeof(id) = 'text' AND id IN (SELECT value FROM json_each(",
    "))",
];

/// How the row's id is stored, as [`crate::model::IdStorage::from_code`] reads it: 0
/// TEXT, 1 a BLOB, 2 a BLOB whose bytes a TEXT row also has as its id.
pub(crate) const ID_STORAGE: &str = "(CASE WHEN typeof(id) <> 'blob' THEN 0 \
     WHEN EXISTS (SELECT 1 FROM dead_letters t WHERE t.id = CAST(dead_letters.id AS TEXT) \
       AND typeof(t.id) = 'text') THEN 2 ELSE 1 END)";

/// Reads only (`list`, `show`; writes use [`EXACT_IDS`]): `id` is one of the IDs of the
/// JSON array `$p` (see [`ids_json`]), each as TEXT or as a BLOB (a worker may bind
/// bytes), and escaped bytes as those bytes: `show` finds any row `list` prints. `$p`
/// appears four times: with `?`, bind the array four times.
macro_rules! in_ids {
    ($p:literal) => {
        concat!(
            "id IN (SELECT value FROM json_each(",
            $p,
            ") ",
            "UNION ALL SELECT CAST(value AS BLOB) FROM json_each(",
            $p,
            ") ",
            "UNION ALL SELECT unhex(substr(value, 2)) FROM json_each(",
            $p,
            ") ",
            "WHERE substr(value, 1, 1) = char(1) ",
            "UNION ALL SELECT CAST(unhex(substr(value, 2)) AS TEXT) FROM json_each(",
            $p,
            ") ",
            "WHERE substr(value, 1, 1) = char(1))"
        )
    };
}

/// A bound value as SQLite takes it, whichever driver binds it (sqlx, or the export's
/// own stepping in `store/sqlite_export.rs`): times as INTEGER µs, lists as JSON.
pub(crate) enum Stored {
    Text(Option<String>),
    Int(Option<i64>),
    Bytes(Vec<u8>),
}

pub(crate) fn stored(value: Bind) -> Stored {
    match value {
        Bind::Text(v) => Stored::Text(Some(v)),
        Bind::OptText(v) => Stored::Text(v),
        Bind::Int(v) => Stored::Int(Some(v)),
        Bind::Bytes(v) => Stored::Bytes(v),
        Bind::Time(v) => Stored::Int(Some(to_us(v))),
        Bind::OptTime(v) => Stored::Int(v.map(to_us)),
        Bind::Texts(v) => Stored::Text(Some(serde_json::to_string(&v).unwrap_or_default())),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The content filters check the JSON with `json_valid` (which never raises) before
/// reading it.
impl Dialect for Sqlite {
    const NOW: &'static str = NOW_US;
    const ID_ORDER: &'static str = "id";
    const HISTORY_JSON: &'static str = concat!(
        "(SELECT json_group_array(json_object('at', ",
        us!("h.at"),
        ", 'operator', h.operator, 'action', h.action, 'outcome', h.outcome, \
         'detail', h.detail, 'token', h.token, 'token_ref', h.token_ref, 'target', h.target, \
         'plan_id', h.plan_id)) \
         FROM (SELECT * FROM dead_letter_history \
               WHERE dead_letter_id = CAST(dead_letters.id AS TEXT) ORDER BY seq) h)"
    );
    // In WAL mode one statement never blocks a writer: no transaction needed.
    const UNBOUNDED: Option<&'static str> = None;
    const SNAPSHOT: Option<&'static str> = None;
    // substr() of a BLOB loads the whole value: slices would only cost more.
    const BODY_LEN: Option<&'static str> = None;
    const HISTORY_AT: &'static str = HISTORY_AT;
    const UNREADABLE: &'static str = UNREADABLE;
    const ID_STORAGE: &'static str = ID_STORAGE;
    const BEGIN_WRITE: &'static str = "BEGIN IMMEDIATE";
    const WRITABLE_ID: &'static str = "typeof(id) = 'text'";
    // Not asked: a worker's BLOB id sorts apart from the TEXT ones.
    const CODE_POINT_IDS: Option<&'static str> = None;

    fn at(col: TimeCol) -> &'static str {
        match col {
            TimeCol::DeadLetteredAt => DEAD_LETTERED_AT,
            TimeCol::ReplayedAt => REPLAYED_AT,
            TimeCol::LeaseEnd => LEASE_END,
            TimeCol::AttemptAt => ATTEMPT_AT,
            TimeCol::DiscardedAt => DISCARDED_AT,
        }
    }

    fn shown_at(col: TimeCol) -> &'static str {
        match col {
            TimeCol::DeadLetteredAt => SHOWN_DEAD_LETTERED_AT,
            TimeCol::ReplayedAt => SHOWN_REPLAYED_AT,
            TimeCol::LeaseEnd => SHOWN_LEASE_END,
            TimeCol::AttemptAt => SHOWN_ATTEMPT_AT,
            TimeCol::DiscardedAt => SHOWN_DISCARDED_AT,
        }
    }

    fn bind(qb: &mut QueryBuilder<'static, Self>, value: Bind) {
        match stored(value) {
            Stored::Text(v) => qb.push_bind(v),
            Stored::Int(v) => qb.push_bind(v),
            Stored::Bytes(v) => qb.push_bind(v),
        };
    }

    /// See [`in_ids!`].
    fn push_ids(qb: &mut QueryBuilder<'static, Self>, ids: &[String]) {
        let json = ids_json(ids);
        let mut parts = in_ids!("?").split('?').peekable();
        while let Some(part) = parts.next() {
            qb.push(part);
            if parts.peek().is_some() {
                qb.push_bind(json.clone());
            }
        }
    }

    fn push_exact_ids(qb: &mut QueryBuilder<'static, Self>, ids: &[String]) {
        qb.push(EXACT_IDS[0]);
        qb.push_bind(exact_ids_json(ids));
        qb.push(EXACT_IDS[1]);
    }

    fn id_named(col: &str, id: &str) -> String {
        format!("({col} = {id} OR {col} = CAST({id} AS BLOB))")
    }

    fn id_text(col: &str) -> String {
        format!("CAST({col} AS TEXT)")
    }

    fn bucket(unit: Bucket) -> String {
        let size = unit.micros();
        format!("({DEAD_LETTERED_AT} / {size}) * {size}")
    }

    fn push_contains(sql: &mut Sql, doc: Doc, needle: Bind) {
        sql.push(match doc {
            Doc::Body => "instr(body, ",
            Doc::Headers => "instr(headers_json, ",
            Doc::Error => "instr(error, ",
        });
        sql.bind(needle);
        sql.push(") > 0");
    }

    fn backslash_in(doc: Doc) -> &'static str {
        match doc {
            Doc::Body => "instr(body, X'5c') > 0",
            _ => "instr(headers_json, '\\') > 0",
        }
    }

    fn json_guard(doc: Doc) -> (&'static str, &'static str) {
        match doc {
            Doc::Body => (
                "1",
                " AND json_valid(CAST(body AS TEXT)) AND json_type(CAST(body AS TEXT)) = 'object'",
            ),
            _ => ("1", " AND json_valid(headers_json)"),
        }
    }

    /// A string as its value, an array or object as JSON, anything else as its JSON text
    /// as written (`->` keeps a number's text).
    fn push_json_match(sql: &mut Sql, doc: Doc, path: &[&str], m: &ContentMatch) {
        let doc = if doc == Doc::Body {
            "CAST(body AS TEXT)"
        } else {
            "headers_json"
        };
        let path: String = std::iter::once("$".to_string())
            .chain(path.iter().map(|k| format!(".\"{k}\"")))
            .collect();
        sql.push(format!("CASE json_type({doc}, "));
        sql.bind(Bind::Text(path.clone()));
        sql.push(format!(") WHEN 'text' THEN json_extract({doc}, "));
        sql.bind(Bind::Text(path.clone()));
        sql.push(") = ");
        sql.bind(Bind::Text(m.value.clone()));
        for kind in ["array", "object"] {
            sql.push(format!(" WHEN '{kind}' THEN json({doc} -> "));
            sql.bind(Bind::Text(path.clone()));
            sql.push(") = json(");
            sql.bind(Bind::OptText(m.value_json().map(str::to_string)));
            sql.push(")");
        }
        sql.push(format!(" ELSE ({doc} -> "));
        sql.bind(Bind::Text(path));
        sql.push(") = ");
        sql.bind(Bind::Text(m.value.clone()));
        sql.push(" END");
    }

    /// SQLite does not check that TEXT is UTF-8, and a worker may bind bytes (a BLOB) to a
    /// text column: with `lossy`, either is read as text, bytes that are not UTF-8
    /// escaped (see [`escaped`]).
    fn text(
        row: &SqliteRow,
        col: &str,
        bytes: NotUtf8,
    ) -> std::result::Result<Option<String>, sqlx::Error> {
        if bytes == NotUtf8::Refuse {
            return row.try_get(col);
        }
        Ok(row.try_get::<Option<&[u8]>, _>(col)?.map(escaped))
    }

    fn int(row: &SqliteRow, col: &str) -> std::result::Result<i64, sqlx::Error> {
        row.try_get(col)
    }

    fn time(row: &SqliteRow, col: &str) -> std::result::Result<Option<DateTime<Utc>>, sqlx::Error> {
        // Every time is read through `Dialect::at`, so an INTEGER (or NULL).
        Ok(row
            .try_get::<Option<i64>, _>(col)?
            .map(|v| from_int(v).unwrap_or_default()))
    }

    fn bytes<'r>(
        row: &'r SqliteRow,
        col: &str,
    ) -> std::result::Result<Option<&'r [u8]>, sqlx::Error> {
        row.try_get(col)
    }

    fn fetch<'e>(
        conn: &'e mut SqliteConnection,
        query: Query<'e, Self, <Self as sqlx::Database>::Arguments<'static>>,
    ) -> BoxStream<'e, std::result::Result<SqliteRow, sqlx::Error>> {
        query.fetch(conn)
    }
}
