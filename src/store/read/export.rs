//! The export's one read: every matching row whole, its history aggregated in the
//! same statement, streamed in constant memory from one snapshot.

use super::columns::time_columns;
use super::decode::Of;
use super::rows::exported;
use super::{each, where_sql, Backend, Dialect, Sql, TimeCol};
use crate::error::Result;
use crate::model::Filter;
use crate::store::NewDeadLetter;
use futures_util::TryStreamExt;
use sqlx::QueryBuilder;

pub(super) async fn export<B: Backend>(
    b: &B,
    filter: &Filter,
    sink: &mut (dyn FnMut(NewDeadLetter) -> Result<()> + Send),
) -> Result<u64> {
    let mut sql = Sql::new(format!(
        "SELECT id, body, reason, CAST(attempts AS BIGINT) AS attempts, headers_json, \
         replay_claim_owner, last_replay_error, event_id, error, producer, \
         schema_version, source_queue, exchange, routing_key, discard_note, revision_of, \
         {}, {} AS history FROM dead_letters",
        time_columns::<B::Db>(),
        B::Db::HISTORY_JSON
    ));
    sql.append(where_sql::<B::Db>(filter));
    sql.push(format!(
        " ORDER BY {}, {}",
        B::Db::at(TimeCol::DeadLetteredAt),
        B::Db::ID_ORDER
    ));
    if let Some(bulk) = b.bulk_export() {
        return bulk.export(sql, sink).await;
    }
    let mut qb = sql.into_builder::<B::Db>();
    let err = |e| b.db_err(e);
    let Some(setup) = B::Db::UNBOUNDED else {
        // One statement, so one snapshot.
        return each(b, &mut qb, |row| sink(exported(&Of::<B::Db>(row))?)).await;
    };
    // Not bound by --statement-timeout, which is meant for statements that hold locks
    // (this one takes none that writers wait on).
    let mut tx = b.pool().begin().await.map_err(err)?;
    B::Db::fetch(&mut tx, QueryBuilder::new(setup).build())
        .try_collect::<Vec<_>>()
        .await
        .map_err(err)?;
    let mut n = 0;
    {
        let mut rows = B::Db::fetch(&mut tx, qb.build());
        while let Some(row) = rows.try_next().await.map_err(err)? {
            sink(exported(&Of::<B::Db>(&row))?)?;
            n += 1;
        }
    }
    tx.rollback().await.map_err(err)?;
    Ok(n)
}
