-- Replay protocol v2 (contract v2): the attempt step, and the states uncertain and
-- discarded. Times are INTEGER milliseconds since the epoch, as everywhere here.
--
-- replay_attempt_at is set, guarded by the claim token, right before a publish starts,
-- and cleared only by a release after a certain failure or by `dlq resolve`. A row with
-- an attempt and no mark is `uncertain` whatever its lease does.
ALTER TABLE dead_letters ADD COLUMN replay_attempt_at INTEGER NULL;
ALTER TABLE dead_letters ADD COLUMN discarded_at INTEGER NULL;
ALTER TABLE dead_letters ADD COLUMN discard_note TEXT NULL;

-- A v1 row that still carries a claim token and no mark may have been published by a v1
-- run that crashed, lost its confirm or failed its mark: v1 kept no record of the
-- publish. It becomes uncertain, for an operator to resolve.
-- Its v1 token (which v1 printed everywhere) is replaced by one nobody holds, keeping the
-- operator's name, so no old token can release, mark or replay it.
UPDATE dead_letters
SET replay_attempt_at = COALESCE(replay_claim_expires_at,
        CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)),
    replay_claim_owner = CASE WHEN instr(replay_claim_owner, ':') > 0
            THEN substr(replay_claim_owner, 1, instr(replay_claim_owner, ':') - 1)
            ELSE replay_claim_owner END || ':v1-' || lower(hex(randomblob(16))),
    last_replay_error = COALESCE(last_replay_error || ' / ', '')
        || 'upgraded from protocol v1 with a claim held: a replay may have been published; check the consumers, then dlq resolve'
WHERE replayed_at IS NULL AND replay_claim_owner IS NOT NULL;

-- The database itself refuses to hand an uncertain or discarded row to a new owner: a
-- dlq v1 binary still installed somewhere claims by `replayed_at IS NULL` and a lapsed
-- lease alone, and would publish such a row again. dlq v2 never changes the owner of a
-- row with an open attempt or a discard (resolve and release clear it to NULL).
CREATE TRIGGER IF NOT EXISTS dead_letters_guard_owner
BEFORE UPDATE OF replay_claim_owner ON dead_letters
WHEN (OLD.replay_attempt_at IS NOT NULL OR OLD.discarded_at IS NOT NULL)
     AND NEW.replay_claim_owner IS NOT NULL
     AND NEW.replay_claim_owner IS NOT OLD.replay_claim_owner
BEGIN
    SELECT RAISE(ABORT, 'dead letter is uncertain or discarded: it cannot be claimed (dlq resolve / dlq restore first; is an old dlq still in use?)');
END;

-- One row per database: the identity a plan is bound to.
CREATE TABLE IF NOT EXISTS dlq_meta (
    key   TEXT PRIMARY KEY NOT NULL,
    value TEXT NOT NULL
);
INSERT OR IGNORE INTO dlq_meta (key, value) VALUES ('database_id', lower(hex(randomblob(16))));
