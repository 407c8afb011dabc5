//! A gate on PostgreSQL's reads of a large body in slices: a test acts while `dlq` is in
//! the middle of reading one.

use super::*;

/// Replaces `substr` of a body (dlq's slice reads) in `db` by `sql` (a PL/pgSQL body
/// over `b`, `f`, `n`): PostgreSQL looks in `public` first from the next session on.
pub fn replace_substr(db: &TestDb, sql: &str) {
    let name = db.url.rsplit('/').next().unwrap().to_string();
    db.sql(&[
        &format!(
            "CREATE FUNCTION public.substr(b bytea, f integer, n integer) RETURNS bytea \
             LANGUAGE plpgsql AS $$ BEGIN {sql} END $$"
        ),
        &format!("ALTER DATABASE {name} SET search_path = public, pg_catalog"),
    ]);
}

/// Makes every slice read of `db` wait on advisory lock 4343, in the first session that
/// gets there (`only_first`) or in all, and holds that lock until [`SliceGate::open`]:
/// a test can act while `dlq` is in the middle of reading a large body.
pub struct SliceGate {
    rt: tokio::runtime::Runtime,
    conn: sqlx::PgConnection,
}

impl SliceGate {
    pub fn close(db: &TestDb, only_first: bool) -> SliceGate {
        let wait = if only_first {
            "IF pg_try_advisory_lock(777) THEN PERFORM pg_advisory_xact_lock_shared(4343); END IF;"
        } else {
            "PERFORM pg_advisory_xact_lock_shared(4343);"
        };
        replace_substr(db, &format!("{wait} RETURN pg_catalog.substr(b, f, n);"));
        let rt = rt();
        let conn = rt.block_on(async {
            use sqlx::Connection;
            let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
            sqlx::query("SELECT pg_advisory_lock(4343)")
                .execute(&mut conn)
                .await
                .unwrap();
            conn
        });
        SliceGate { rt, conn }
    }

    /// The backends of the gate's database waiting at it (other tests run beside this
    /// one, each in its own database), once there is one (at most a minute).
    pub fn waiting(&mut self, what: &str) -> Vec<i32> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let pids: Vec<i32> = self
                .rt
                .block_on(
                    sqlx::query_scalar(
                        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() \
                         AND wait_event_type = 'Lock' AND wait_event = 'advisory'",
                    )
                    .fetch_all(&mut self.conn),
                )
                .unwrap();
            if !pids.is_empty() {
                return pids;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{what} never reached the gate"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Ends the session of a backend waiting at the gate (its connection is lost).
    pub fn terminate(&mut self, pid: i32) {
        let q = sqlx::query("SELECT pg_terminate_backend($1)").bind(pid);
        self.rt.block_on(q.execute(&mut self.conn)).unwrap();
    }

    /// Rewrites a row's body while the gate is held.
    pub fn set_body(&mut self, id: &str, body: &[u8]) {
        let q = sqlx::query("UPDATE dead_letters SET body = $1 WHERE id = $2")
            .bind(body)
            .bind(id);
        self.rt.block_on(q.execute(&mut self.conn)).unwrap();
    }

    /// Lets the slice reads go on.
    pub fn open(mut self) {
        let q = sqlx::query("SELECT pg_advisory_unlock(4343)");
        self.rt.block_on(q.execute(&mut self.conn)).unwrap();
    }
}
