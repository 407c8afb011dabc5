-- Per-group counts kept as rows are written (issue 24), so that `aggregate` over a whole
-- table of millions reads thousands of small rows instead of every dead letter.
--
-- Writers only append: each INSERT, UPDATE or DELETE statement on dead_letters appends
-- its deltas (one row per bucket and state it changed; one per row for a single-row
-- INSERT, whose grouping would cost more than the row) to dead_letter_rollup_delta, in
-- its own transaction. No writer updates a shared row, so concurrent inserts never
-- queue behind one. Now and then (one insert statement in a thousand, and every
-- `dlq aggregate`) the deltas are folded into dead_letter_rollup, one row per bucket and
-- state; a fold never waits for another.
--
-- A bucket is (reason, producer, schema version, source queue, error class, UTC hour).
-- `state` is a row's state without the clock: 'leased' (a claim is recorded, no attempt
-- yet) is told apart into claimed and pending by reading those few rows when asked.
-- The first and last time of a bucket a row left (a DELETE, or an UPDATE of its keys or
-- time) cannot be known from deltas: `stale` marks it, and it is read again from
-- dead_letters (by the fold, or by the read until a fold has run).
--
-- The functions that write the counts run with the rights of the role that ran
-- `dlq migrate` (SECURITY DEFINER, search path fixed below): a worker's role that may
-- only INSERT into dead_letters needs no right on these tables. Only that role folds
-- from `dlq aggregate`; another reads the deltas unfolded (GRANT EXECUTE ON FUNCTION
-- dlq_rollup_fold() to let it fold).
CREATE TABLE IF NOT EXISTS dead_letter_rollup (
    reason             TEXT,
    eff_producer       TEXT,
    eff_schema_version TEXT,
    source_queue       TEXT,
    eff_error_class    TEXT,
    hour               TIMESTAMPTZ,
    state              TEXT NOT NULL,
    n                  BIGINT NOT NULL,
    first_seen         TIMESTAMPTZ,
    last_seen          TIMESTAMPTZ,
    stale              BOOLEAN NOT NULL DEFAULT false,
    -- The bucket's key texts hashed: a key may be longer than an index entry can be.
    bucket             TEXT NOT NULL,
    UNIQUE (bucket, state)
);
-- The buckets whose times must be read again, and the counts down to zero, each found
-- without reading every count.
CREATE INDEX IF NOT EXISTS dead_letter_rollup_stale_idx ON dead_letter_rollup (bucket)
    WHERE stale;
CREATE INDEX IF NOT EXISTS dead_letter_rollup_zero_idx ON dead_letter_rollup (bucket)
    WHERE n = 0;

CREATE TABLE IF NOT EXISTS dead_letter_rollup_delta (
    reason             TEXT,
    eff_producer       TEXT,
    eff_schema_version TEXT,
    source_queue       TEXT,
    eff_error_class    TEXT,
    hour               TIMESTAMPTZ,
    state              TEXT NOT NULL,
    n                  BIGINT NOT NULL,
    first_seen         TIMESTAMPTZ,
    last_seen          TIMESTAMPTZ,
    stale              BOOLEAN NOT NULL DEFAULT false
);

ALTER TABLE dead_letter_rollup_delta SET (vacuum_truncate = false);

-- A NULL and an empty text hash apart (quote_nullable), and the hour by its epoch.
CREATE OR REPLACE FUNCTION dlq_rollup_bucket(reason TEXT, producer TEXT, schema_version TEXT,
    source_queue TEXT, error_class TEXT, hour TIMESTAMPTZ) RETURNS TEXT
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT md5(concat_ws(',', quote_nullable(reason), quote_nullable(producer),
        quote_nullable(schema_version), quote_nullable(source_queue),
        quote_nullable(error_class), quote_nullable(extract(epoch FROM hour)::text)))
$$;

CREATE OR REPLACE FUNCTION dlq_rollup_hour(at TIMESTAMPTZ) RETURNS TIMESTAMPTZ
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT date_trunc('hour', at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
$$;

-- The state without the clock (store::state_predicate_at is the one with it).
CREATE OR REPLACE FUNCTION dlq_rollup_state(replayed_at TIMESTAMPTZ, discarded_at TIMESTAMPTZ,
    attempt_at TIMESTAMPTZ, owner TEXT, expires_at TIMESTAMPTZ) RETURNS TEXT
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN replayed_at IS NOT NULL THEN 'replayed'
                WHEN discarded_at IS NOT NULL THEN 'discarded'
                WHEN attempt_at IS NOT NULL THEN 'uncertain'
                WHEN owner IS NOT NULL AND expires_at IS NOT NULL THEN 'leased'
                ELSE 'open' END
$$;

-- Moves the deltas (at most `at_most`, or all) into the counts. Returns at once when
-- another fold holds the lock
-- (its transaction may be a worker's, still open): the deltas wait for the next one.
-- Concurrent deletes of a delta and upserts of a count are safe in any case; the lock
-- keeps folds from queueing behind each other's rows.
CREATE OR REPLACE FUNCTION dlq_rollup_compact(at_most BIGINT DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET jit = off AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtextextended('dlq_rollup_fold', 0)) THEN
        RETURN false;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM dead_letter_rollup_delta) THEN
        RETURN true;
    END IF;
    WITH gone AS (
        DELETE FROM dead_letter_rollup_delta
        WHERE ctid IN (SELECT ctid FROM dead_letter_rollup_delta LIMIT at_most)
        RETURNING *
    )
    INSERT INTO dead_letter_rollup AS r (reason, eff_producer, eff_schema_version,
        source_queue, eff_error_class, hour, state, n, first_seen, last_seen, stale, bucket)
    SELECT reason, eff_producer, eff_schema_version, source_queue, eff_error_class, hour,
           state, sum(n), min(first_seen), max(last_seen), bool_or(stale),
           dlq_rollup_bucket(reason, eff_producer, eff_schema_version, source_queue,
                             eff_error_class, hour)
    FROM gone GROUP BY 1, 2, 3, 4, 5, 6, 7
    ON CONFLICT (bucket, state)
    DO UPDATE SET n = r.n + EXCLUDED.n,
                  first_seen = LEAST(r.first_seen, EXCLUDED.first_seen),
                  last_seen = GREATEST(r.last_seen, EXCLUDED.last_seen),
                  stale = r.stale OR EXCLUDED.stale;
    DELETE FROM dead_letter_rollup WHERE n = 0 AND NOT stale;
    RETURN true;
END;
$$;

-- What `dlq aggregate` runs first: a compaction, then the times of stale buckets read
-- again. The rows are read in a later snapshot than the deltas were folded in; a write
-- committed in between is in both, and its delta carries its own time or stale mark, so
-- reading it twice changes nothing.
CREATE OR REPLACE FUNCTION dlq_rollup_fold() RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET jit = off AS $$
BEGIN
    IF NOT dlq_rollup_compact() THEN
        RETURN;
    END IF;
    -- Its own statement: a snapshot that sees what the compaction just folded.
    IF NOT EXISTS (SELECT 1 FROM dead_letter_rollup WHERE stale) THEN
        RETURN;
    END IF;
    WITH buckets AS (
        SELECT DISTINCT reason, eff_producer, eff_schema_version, source_queue,
               eff_error_class, hour
        FROM dead_letter_rollup WHERE stale
    ), fresh AS (
        -- One index range (reason, time) per bucket, whatever the planner guesses.
        SELECT b.*, t.f, t.l
        FROM buckets b CROSS JOIN LATERAL (
            SELECT min(d.dead_lettered_at) AS f, max(d.dead_lettered_at) AS l
            FROM dead_letters d
            WHERE d.reason = b.reason AND d.dead_lettered_at >= b.hour
              AND d.dead_lettered_at <= b.hour + interval '1 hour'
              AND dlq_rollup_hour(d.dead_lettered_at) = b.hour
              AND (d.eff_producer, d.eff_schema_version, d.source_queue, d.eff_error_class)
                  IS NOT DISTINCT FROM
                  (b.eff_producer, b.eff_schema_version, b.source_queue, b.eff_error_class)
        ) AS t
    )
    UPDATE dead_letter_rollup r
    SET first_seen = fresh.f, last_seen = fresh.l, stale = false
    FROM fresh
    WHERE r.reason = fresh.reason AND r.hour = fresh.hour
      AND (r.eff_producer, r.eff_schema_version, r.source_queue, r.eff_error_class)
          IS NOT DISTINCT FROM
          (fresh.eff_producer, fresh.eff_schema_version, fresh.source_queue,
           fresh.eff_error_class);
    DELETE FROM dead_letter_rollup WHERE n = 0;
END;
$$;

CREATE OR REPLACE FUNCTION dlq_rollup_insert() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET jit = off AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM new_rows OFFSET 1) THEN
        INSERT INTO dead_letter_rollup_delta (reason, eff_producer, eff_schema_version,
            source_queue, eff_error_class, hour, state, n, first_seen, last_seen)
        SELECT reason, eff_producer, eff_schema_version, source_queue, eff_error_class,
               dlq_rollup_hour(dead_lettered_at),
               dlq_rollup_state(replayed_at, discarded_at, replay_attempt_at,
                                replay_claim_owner, replay_claim_expires_at),
               count(*), min(dead_lettered_at), max(dead_lettered_at)
        FROM new_rows GROUP BY 1, 2, 3, 4, 5, 6, 7;
    ELSE
        INSERT INTO dead_letter_rollup_delta (reason, eff_producer, eff_schema_version,
            source_queue, eff_error_class, hour, state, n, first_seen, last_seen)
        SELECT reason, eff_producer, eff_schema_version, source_queue, eff_error_class,
               dlq_rollup_hour(dead_lettered_at),
               dlq_rollup_state(replayed_at, discarded_at, replay_attempt_at,
                                replay_claim_owner, replay_claim_expires_at),
               1, dead_lettered_at, dead_lettered_at
        FROM new_rows;
    END IF;
    -- Now and then the writer folds too, so that a flood of single-row inserts leaves
    -- few deltas: at most 2,000 (a few milliseconds, whatever the backlog, so that a
    -- writer's statement timeout is never reached; `WHEN others` cannot catch that),
    -- only under READ COMMITTED (an older snapshot would fail on a fold committed
    -- since), and never failing the insert: the deltas wait for the next fold.
    IF random() < 0.001 AND current_setting('transaction_isolation') = 'read committed' THEN
        BEGIN
            PERFORM dlq_rollup_compact(2000);
        EXCEPTION WHEN others THEN
            NULL;
        END;
    END IF;
    RETURN NULL;
END;
$$;

-- A row that changes state moves -1/+1 between two states of its bucket (a claim, an
-- attempt, a mark); an UPDATE that changes neither state nor bucket appends nothing. A
-- bucket is stale when fewer of its rows hold some time after the statement than before
-- (a row left it, or its time changed). No join of old and new rows by id: planned
-- against a transition table's unknown size, it ran as a nested loop (44 ms for a claim
-- of 1,000 rows).
CREATE OR REPLACE FUNCTION dlq_rollup_update() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET jit = off AS $$
BEGIN
    INSERT INTO dead_letter_rollup_delta (reason, eff_producer, eff_schema_version,
        source_queue, eff_error_class, hour, state, n, first_seen, last_seen, stale)
    SELECT reason, eff_producer, eff_schema_version, source_queue, eff_error_class, hour,
           state, sum(n), min(at), max(at), bool_or(left_at)
    FROM (
        SELECT d.*,
               sum(d.n) OVER (PARTITION BY reason, eff_producer, eff_schema_version,
                   source_queue, eff_error_class, hour, t) < 0 AS left_at
        FROM (
            SELECT reason, eff_producer, eff_schema_version, source_queue, eff_error_class,
                   dlq_rollup_hour(dead_lettered_at) AS hour,
                   dlq_rollup_state(replayed_at, discarded_at, replay_attempt_at,
                                    replay_claim_owner, replay_claim_expires_at) AS state,
                   -1 AS n, dead_lettered_at AS t, NULL::timestamptz AS at
            FROM old_rows
            UNION ALL
            SELECT reason, eff_producer, eff_schema_version, source_queue, eff_error_class,
                   dlq_rollup_hour(dead_lettered_at),
                   dlq_rollup_state(replayed_at, discarded_at, replay_attempt_at,
                                    replay_claim_owner, replay_claim_expires_at),
                   1, dead_lettered_at, dead_lettered_at
            FROM new_rows
        ) AS d
    ) AS x
    GROUP BY 1, 2, 3, 4, 5, 6, 7
    HAVING sum(n) <> 0 OR bool_or(left_at);
    RETURN NULL;
END;
$$;

CREATE OR REPLACE FUNCTION dlq_rollup_delete() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET jit = off AS $$
BEGIN
    INSERT INTO dead_letter_rollup_delta (reason, eff_producer, eff_schema_version,
        source_queue, eff_error_class, hour, state, n, stale)
    SELECT reason, eff_producer, eff_schema_version, source_queue, eff_error_class,
           dlq_rollup_hour(dead_lettered_at),
           dlq_rollup_state(replayed_at, discarded_at, replay_attempt_at, replay_claim_owner,
                            replay_claim_expires_at),
           -count(*), true
    FROM old_rows GROUP BY 1, 2, 3, 4, 5, 6, 7;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE FUNCTION dlq_rollup_truncate() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET jit = off AS $$
BEGIN
    -- TRUNCATE, not DELETE: a REPEATABLE READ snapshot older than the lock would leave
    -- the deltas of rows committed while it waited.
    TRUNCATE dead_letter_rollup_delta, dead_letter_rollup;
    RETURN NULL;
END;
$$;

DROP TRIGGER IF EXISTS dead_letters_rollup_insert ON dead_letters;
CREATE TRIGGER dead_letters_rollup_insert AFTER INSERT ON dead_letters
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION dlq_rollup_insert();
DROP TRIGGER IF EXISTS dead_letters_rollup_update ON dead_letters;
CREATE TRIGGER dead_letters_rollup_update AFTER UPDATE ON dead_letters
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION dlq_rollup_update();
DROP TRIGGER IF EXISTS dead_letters_rollup_delete ON dead_letters;
CREATE TRIGGER dead_letters_rollup_delete AFTER DELETE ON dead_letters
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION dlq_rollup_delete();
DROP TRIGGER IF EXISTS dead_letters_rollup_truncate ON dead_letters;
CREATE TRIGGER dead_letters_rollup_truncate AFTER TRUNCATE ON dead_letters
    FOR EACH STATEMENT EXECUTE FUNCTION dlq_rollup_truncate();

-- Whether the counts are kept: set only by dlq_rollup_enable() / disable(), so that
-- triggers enabled any other way (pg_restore --disable-triggers, ENABLE TRIGGER ALL)
-- never make counts that missed writes look kept.
CREATE TABLE IF NOT EXISTS dead_letter_rollup_kept (
    one  BOOLEAN PRIMARY KEY DEFAULT true CHECK (one),
    kept BOOLEAN NOT NULL
);

-- Whether the counts can be read as kept: turned on, and the four triggers firing for
-- every writer (not 'D'isabled, nor only for replicas). Anyone may ask.
CREATE OR REPLACE FUNCTION dlq_rollup_is_kept() RETURNS boolean LANGUAGE sql STABLE
SECURITY DEFINER AS $$
    SELECT COALESCE((SELECT kept FROM dead_letter_rollup_kept), false)
       AND (SELECT count(*) FROM pg_trigger
            WHERE tgrelid = 'dead_letters'::regclass
              AND tgname IN ('dead_letters_rollup_insert', 'dead_letters_rollup_update',
                             'dead_letters_rollup_delete', 'dead_letters_rollup_truncate')
              AND tgenabled IN ('O', 'A')) = 4
$$;

-- The counts cost each write to dead_letters (docs/performance.md): an owner may turn
-- them off, `SELECT dlq_rollup_disable()` (aggregate then reads the rows), and on again,
-- `SELECT dlq_rollup_enable()`, which counts the rows anew while it holds writers back.
CREATE OR REPLACE FUNCTION dlq_rollup_disable() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO dead_letter_rollup_kept (kept) VALUES (false)
        ON CONFLICT (one) DO UPDATE SET kept = false;
    ALTER TABLE dead_letters DISABLE TRIGGER dead_letters_rollup_insert;
    ALTER TABLE dead_letters DISABLE TRIGGER dead_letters_rollup_update;
    ALTER TABLE dead_letters DISABLE TRIGGER dead_letters_rollup_delete;
    ALTER TABLE dead_letters DISABLE TRIGGER dead_letters_rollup_truncate;
END;
$$;

CREATE OR REPLACE FUNCTION dlq_rollup_enable() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    -- An older snapshot would miss rows committed while it waited for the lock.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'dlq_rollup_enable() counts the rows: run it under READ COMMITTED';
    END IF;
    LOCK TABLE dead_letters IN SHARE ROW EXCLUSIVE MODE;
    DELETE FROM dead_letter_rollup_delta;
    DELETE FROM dead_letter_rollup;
    INSERT INTO dead_letter_rollup (reason, eff_producer, eff_schema_version, source_queue,
        eff_error_class, hour, state, n, first_seen, last_seen, bucket)
    SELECT *, dlq_rollup_bucket(reason, eff_producer, eff_schema_version, source_queue,
                                eff_error_class, hour)
    FROM (
        SELECT reason, eff_producer, eff_schema_version, source_queue, eff_error_class,
               dlq_rollup_hour(dead_lettered_at) AS hour,
               dlq_rollup_state(replayed_at, discarded_at, replay_attempt_at,
                                replay_claim_owner, replay_claim_expires_at),
               count(*), min(dead_lettered_at), max(dead_lettered_at)
        FROM dead_letters GROUP BY 1, 2, 3, 4, 5, 6, 7
    ) AS counted;
    ALTER TABLE dead_letters ENABLE TRIGGER dead_letters_rollup_insert;
    ALTER TABLE dead_letters ENABLE TRIGGER dead_letters_rollup_update;
    ALTER TABLE dead_letters ENABLE TRIGGER dead_letters_rollup_delete;
    ALTER TABLE dead_letters ENABLE TRIGGER dead_letters_rollup_truncate;
    INSERT INTO dead_letter_rollup_kept (kept) VALUES (true)
        ON CONFLICT (one) DO UPDATE SET kept = true;
END;
$$;

-- The functions run with the migrating role's rights, so they search only dlq's schema
-- and then pg_temp (last: a session's temporary table never stands in for a dlq table),
-- and only that role may call the folds (the triggers call them as that role).
DO $$
DECLARE
    f TEXT;
BEGIN
    FOREACH f IN ARRAY ARRAY['dlq_rollup_compact(bigint)', 'dlq_rollup_fold()', 'dlq_rollup_insert()',
                             'dlq_rollup_update()', 'dlq_rollup_delete()', 'dlq_rollup_truncate()']
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
    EXECUTE format('ALTER FUNCTION dlq_rollup_is_kept() SET search_path = %I, pg_temp',
                   current_schema());
END;
$$;

-- The rows already there, counted once: the triggers created above hold writers back
-- until this transaction commits, so no row is counted twice or missed.
SELECT dlq_rollup_enable();
