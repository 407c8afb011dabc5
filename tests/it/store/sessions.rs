//! What dlq's PostgreSQL sessions run with, whatever the server's defaults.

use crate::common::*;
use serde_json::json;

/// JIT is off in dlq's sessions. The copies check (import, restore) has a recursive CTE
/// the planner prices in billions, so the server compiled it: a restore of one ID took
/// 2.5 s and an import of one row 2 s on a table of 100,000 rows, nearly all of it JIT.
#[test]
fn postgres_sessions_run_without_jit() {
    let db = TestDb::migrated(Backend::Postgres);
    db.sql(&[
        "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET jit = on', current_database()); END $$",
        "CREATE TABLE jit_seen (op text, jit text)",
        "CREATE FUNCTION jit_seen() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
         INSERT INTO jit_seen VALUES (TG_OP, current_setting('jit')); RETURN NEW; END $$",
        "CREATE TRIGGER jit_seen BEFORE INSERT OR UPDATE ON dead_letters \
         FOR EACH ROW EXECUTE FUNCTION jit_seen()",
    ]);
    let line = json!({"id": "j1", "reason": "poison_message", "body_text": "{}"});
    let r = db.dlq_stdin(&["import", "-"], format!("{line}\n").as_bytes());
    assert_eq!(r.code, 0, "{}", r.all());
    for args in [
        ["discard", "j1", "--note", "aside"],
        ["restore", "j1", "--note", "back"],
    ] {
        let r = db.dlq(&[&args[..], &["--yes"]].concat());
        assert_eq!(r.code, 0, "{args:?}: {}", r.all());
    }
    assert_eq!(db.scalar("SELECT count(DISTINCT op) FROM jit_seen"), 2);
    assert_eq!(
        db.scalar("SELECT count(*) FROM jit_seen WHERE jit <> 'off'"),
        0,
        "a dlq session ran with JIT on"
    );
}
