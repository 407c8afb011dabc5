-- Replay protocol v2 (contract v2): the attempt step, and the states uncertain and
-- discarded.
--
-- replay_attempt_at is set, guarded by the claim token, right before a publish starts,
-- and cleared only by a release after a certain failure or by `dlq resolve`. A row with
-- an attempt and no mark is `uncertain` whatever its lease does: it is never claimed
-- again until an operator decides. No index on it: claims, attempts and marks stay HOT
-- updates (see 20261129000002).
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS replay_attempt_at TIMESTAMPTZ NULL;
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS discarded_at TIMESTAMPTZ NULL;
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS discard_note TEXT NULL;

-- A v1 row that still carries a claim token and no mark may have been published by a
-- v1 run that crashed, lost its confirm or failed its mark: v1 kept no record of the
-- publish. It becomes uncertain, for an operator to resolve, rather than look pending
-- once its lease lapses. (Released and unclaimed rows carry no token.)
-- Its v1 token (which v1 printed everywhere) is replaced by one nobody holds, keeping the
-- operator's name, so no old token can release, mark or replay it.
UPDATE dead_letters
SET replay_attempt_at = COALESCE(replay_claim_expires_at, now()),
    replay_claim_owner = split_part(replay_claim_owner, ':', 1) || ':v1-' || gen_random_uuid()::text,
    last_replay_error = COALESCE(last_replay_error || ' / ', '')
        || 'upgraded from protocol v1 with a claim held: a replay may have been published; check the consumers, then dlq resolve'
WHERE replayed_at IS NULL AND replay_claim_owner IS NOT NULL;

-- The database itself refuses to hand an uncertain or discarded row to a new owner: a
-- dlq v1 binary still installed somewhere claims by `replayed_at IS NULL` and a lapsed
-- lease alone, and would publish such a row again. dlq v2 never changes the owner of a
-- row with an open attempt or a discard (resolve and release clear it to NULL).
CREATE OR REPLACE FUNCTION dlq_guard_owner() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF (OLD.replay_attempt_at IS NOT NULL OR OLD.discarded_at IS NOT NULL)
       AND NEW.replay_claim_owner IS NOT NULL
       AND NEW.replay_claim_owner IS DISTINCT FROM OLD.replay_claim_owner THEN
        RAISE EXCEPTION 'dead letter % is uncertain or discarded: it cannot be claimed (dlq resolve / dlq restore first; is an old dlq still in use?)', OLD.id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END;
$$;
DROP TRIGGER IF EXISTS dead_letters_guard_owner ON dead_letters;
CREATE TRIGGER dead_letters_guard_owner
    BEFORE UPDATE OF replay_claim_owner ON dead_letters
    FOR EACH ROW EXECUTE FUNCTION dlq_guard_owner();

-- One row per database: the identity a plan is bound to.
CREATE TABLE IF NOT EXISTS dlq_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
INSERT INTO dlq_meta (key, value) VALUES ('database_id', gen_random_uuid()::text)
ON CONFLICT (key) DO NOTHING;
