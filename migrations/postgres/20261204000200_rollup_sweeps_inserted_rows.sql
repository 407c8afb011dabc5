-- A single-row insert no longer writes a row of its own for the counts (issue 24: its
-- delta cost the workers 1.14-1.2x; the target is 1.1x).
--
-- Each row now carries the transaction that wrote it (`written_xid`, set on INSERT and
-- never changed), and the counts remember which transactions they have counted: a
-- snapshot (`dead_letter_rollup_swept`). A row whose transaction that snapshot sees is in
-- the counts; any other row is read where it is, by the readers, until a sweep (part of
-- every fold) counts it and moves the snapshot on. Rows, counts and snapshot are read in
-- one statement, so no row is counted twice or missed, whenever its transaction commits.
--
-- UPDATE and DELETE still append deltas, but only for rows already counted; for a row not
-- yet counted (the snapshot does not see its writer), the delta is tagged with that
-- writer (`row_xid`): readers skip it, as the row is read where it is, and the sweep that
-- counts the row deletes it (the row it counts already holds the change).
--
-- Writers still fold now and then (one insert statement in 2,000, tested in the trigger's
-- WHEN, before any function runs; a fold's fixed cost is about that of 2,000 rows), so
-- that a flood leaves few rows to read. A bulk INSERT's rows share one writer, so a
-- writer's bounded fold leaves them to the next `dlq aggregate` (or `SELECT
-- dlq_rollup_fold()` after the load).
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS written_xid xid8;
-- For the rows written from now on only: existing rows (NULL) are in the counts.
ALTER TABLE dead_letters ALTER COLUMN written_xid SET DEFAULT pg_current_xact_id();
CREATE INDEX IF NOT EXISTS dead_letters_written_xid_idx ON dead_letters (written_xid)
    WHERE written_xid IS NOT NULL;

ALTER TABLE dead_letter_rollup_delta ADD COLUMN IF NOT EXISTS row_xid xid8;

CREATE TABLE IF NOT EXISTS dead_letter_rollup_swept (
    one  BOOLEAN PRIMARY KEY DEFAULT true CHECK (one),
    snap pg_snapshot NOT NULL
);
-- Every row there now is in the counts (the ALTER above holds writers back until this
-- commits; a transaction still running writes its rows with its own, unseen, ID).
INSERT INTO dead_letter_rollup_swept (snap) VALUES (pg_current_snapshot())
    ON CONFLICT (one) DO UPDATE SET snap = EXCLUDED.snap;
-- One row: the readers' plans join it to an index range, whatever autovacuum has seen.
ANALYZE dead_letter_rollup_swept;

-- Whether the counts hold the rows written by transaction `x` (NULL: written before
-- `written_xid`, counted then).
CREATE OR REPLACE FUNCTION dlq_rollup_counted(x xid8, swept pg_snapshot) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT x IS NULL OR pg_visible_in_snapshot(x, swept)
$$;

-- `s` with the caller's own transaction (`own`, if it has an ID) as still running: a
-- snapshot never lists its own transaction, so a fold inside a writer's transaction
-- would take the rows it writes after the fold for counted.
CREATE OR REPLACE FUNCTION dlq_rollup_running(s pg_snapshot, own xid8) RETURNS pg_snapshot
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN own IS NULL OR NOT pg_visible_in_snapshot(own, s) THEN s ELSE
        (least(pg_snapshot_xmin(s), own)::text || ':' || pg_snapshot_xmax(s)::text || ':'
         || (SELECT string_agg(x::text, ',' ORDER BY x)
             FROM (SELECT pg_snapshot_xip(s) UNION SELECT own) AS u (x)))::pg_snapshot END
$$;

-- The snapshot that sees what `prev` saw and what `now` sees below `upto` (NULL: all that
-- `now` sees): a sweep of a bounded number of rows moves the counted snapshot only as far.
-- Exact for `upto` up to `now`'s xmax (an ID above it may belong to a transaction no
-- snapshot lists yet), so it is held there.
CREATE OR REPLACE FUNCTION dlq_rollup_reach(prev pg_snapshot, now pg_snapshot, upto_asked xid8)
RETURNS pg_snapshot LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    WITH b AS (
        SELECT least(upto_asked, pg_snapshot_xmax(now)) AS upto
    ), r AS (
        SELECT greatest(pg_snapshot_xmax(prev), b.upto) AS xmax, b.upto FROM b
    ), unseen AS (
        SELECT x FROM (SELECT pg_snapshot_xip(prev) UNION SELECT pg_snapshot_xip(now)) AS c (x),
                      r
        WHERE x < r.xmax AND NOT (pg_visible_in_snapshot(x, prev)
                                  OR (pg_visible_in_snapshot(x, now) AND x < r.upto))
    )
    SELECT CASE WHEN upto_asked IS NULL THEN now ELSE (
        SELECT (least((SELECT min(x) FROM unseen), r.xmax)::text || ':' || r.xmax::text || ':'
                || coalesce((SELECT string_agg(x::text, ',' ORDER BY x) FROM unseen), ''))
               ::pg_snapshot
        FROM r) END
$$;

-- The ranges [lo, hi) of writers' IDs that `prev` does not see and `now` does: between
-- the IDs `now` lists as running, from `prev`'s xmax to `now`'s, and each ID `prev` listed
-- as running that `now` sees. Only rows of these IDs are read: a transaction running
-- elsewhere (a large import's, say) is stepped over, not walked through row by row.
CREATE OR REPLACE FUNCTION dlq_rollup_gaps(prev pg_snapshot, now pg_snapshot)
RETURNS TABLE (lo xid8, hi xid8) LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    WITH cut AS (
        SELECT x FROM pg_snapshot_xip(now) AS c (x)
        WHERE x >= pg_snapshot_xmax(prev) AND x < pg_snapshot_xmax(now)
    ), edges AS (
        SELECT pg_snapshot_xmax(prev) AS lo, coalesce(min(x), pg_snapshot_xmax(now)) AS hi
        FROM cut
        UNION ALL
        SELECT (c.x::text::bigint + 1)::text::xid8,
               coalesce((SELECT min(n.x) FROM cut n WHERE n.x > c.x), pg_snapshot_xmax(now))
        FROM cut c
    )
    SELECT lo, hi FROM edges WHERE lo < hi
    UNION ALL
    SELECT x, (x::text::bigint + 1)::text::xid8 FROM pg_snapshot_xip(prev) AS p (x)
    WHERE pg_visible_in_snapshot(x, now)
$$;

-- Counts the rows not yet counted (at most about `at_most`: the rows of whole
-- transactions, in the order they were given IDs), as deltas for the compaction that
-- follows, and moves the counted snapshot on. The caller holds the fold's lock. Through
-- the index whatever the planner's statistics (dlq_rollup_unswept).
CREATE OR REPLACE FUNCTION dlq_rollup_sweep(at_most BIGINT) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET jit = off SET plan_cache_mode = force_custom_plan
SET enable_seqscan = off AS $$
DECLARE
    prev pg_snapshot := (SELECT snap FROM dead_letter_rollup_swept);
    first xid8;
    upto xid8;
BEGIN
    IF at_most IS NOT NULL THEN
        SELECT min(x), max(x) FILTER (WHERE o = at_most + 1) INTO first, upto FROM (
            SELECT x, row_number() OVER (ORDER BY x) AS o FROM (
                SELECT c.x FROM dlq_rollup_gaps(prev, dlq_rollup_running(pg_current_snapshot(),
                                                pg_current_xact_id_if_assigned())) AS g
                CROSS JOIN LATERAL (
                    SELECT written_xid AS x FROM dead_letters
                    WHERE written_xid >= g.lo AND written_xid < g.hi
                    ORDER BY written_xid LIMIT at_most + 1) AS c
                ORDER BY c.x LIMIT at_most + 1
            ) AS c
        ) AS n;
        IF first IS NULL OR first = upto THEN
            -- Nothing to count, or one transaction wrote more: left to `dlq aggregate`.
            RETURN;
        END IF;
    END IF;
    WITH n AS (
        SELECT dlq_rollup_running(pg_current_snapshot(), pg_current_xact_id_if_assigned())
            AS now
    ), s AS (
        SELECT dlq_rollup_reach(prev, n.now, upto) AS snap FROM n
    ), counted AS (
        INSERT INTO dead_letter_rollup_delta (reason, eff_producer, eff_schema_version,
            source_queue, eff_error_class, hour, state, n, first_seen, last_seen)
        SELECT reason, eff_producer, eff_schema_version, source_queue, eff_error_class,
               dlq_rollup_hour(dead_lettered_at),
               dlq_rollup_state(replayed_at, discarded_at, replay_attempt_at,
                                replay_claim_owner, replay_claim_expires_at),
               count(*), min(dead_lettered_at), max(dead_lettered_at)
        FROM n CROSS JOIN LATERAL dlq_rollup_gaps(prev, n.now) AS g
        CROSS JOIN LATERAL (
            SELECT * FROM dead_letters
            WHERE written_xid >= g.lo AND written_xid < g.hi
              AND (upto IS NULL OR written_xid < upto)
            OFFSET 0) AS d, s  -- a fence: one index range per gap, never one pass of all
        WHERE dlq_rollup_counted(d.written_xid, s.snap)
        GROUP BY 1, 2, 3, 4, 5, 6, 7
    ), held AS (
        DELETE FROM dead_letter_rollup_delta t USING s
        WHERE t.row_xid IS NOT NULL AND NOT dlq_rollup_counted(t.row_xid, prev)
          AND dlq_rollup_counted(t.row_xid, s.snap)
    )
    UPDATE dead_letter_rollup_swept SET snap = s.snap FROM s;
END;
$$;

-- Sweeps, then moves the deltas of counted rows (at most `at_most`, or all) into the
-- counts. Returns at once when another fold holds the lock (its transaction may be a
-- worker's, still open): the rows and deltas wait for the next one.
CREATE OR REPLACE FUNCTION dlq_rollup_compact(at_most BIGINT DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET jit = off AS $$
DECLARE
    swept pg_snapshot;
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtextextended('dlq_rollup_fold', 0)) THEN
        RETURN false;
    END IF;
    swept := (SELECT snap FROM dead_letter_rollup_swept);
    -- A snapshot ahead of this server's transaction IDs (a restore into another cluster):
    -- it would take new rows for counted ones. Turned off until counted anew.
    IF pg_snapshot_xmax(swept) > pg_snapshot_xmax(pg_current_snapshot()) THEN
        UPDATE dead_letter_rollup_kept SET kept = false;
        RETURN true;
    END IF;
    IF NOT dlq_rollup_is_kept() THEN
        -- Not read, and counted anew when turned on: nothing to keep up.
        RETURN true;
    END IF;
    PERFORM dlq_rollup_sweep(at_most);
    swept := (SELECT snap FROM dead_letter_rollup_swept);
    IF NOT EXISTS (SELECT 1 FROM dead_letter_rollup_delta) THEN
        RETURN true;
    END IF;
    WITH gone AS (
        DELETE FROM dead_letter_rollup_delta
        WHERE ctid IN (SELECT ctid FROM dead_letter_rollup_delta
                       WHERE dlq_rollup_counted(row_xid, swept) LIMIT at_most)
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

-- The rows not yet counted, shaped as deltas, read by their writer's ID (the index above;
-- dlq_rollup_gaps) in the caller's snapshot (STABLE).
-- Always through the index: planned for a parameter, or on a table not analyzed since a
-- load, the range of IDs looked like a third of the table, and a scan of every row won.
CREATE OR REPLACE FUNCTION dlq_rollup_unswept() RETURNS TABLE (reason TEXT,
    eff_producer TEXT, eff_schema_version TEXT, source_queue TEXT, eff_error_class TEXT,
    hour TIMESTAMPTZ, state TEXT, n BIGINT, first_seen TIMESTAMPTZ, last_seen TIMESTAMPTZ,
    stale BOOLEAN)
LANGUAGE plpgsql STABLE ROWS 1000 SET plan_cache_mode = force_custom_plan
SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
    swept pg_snapshot := (SELECT s.snap FROM dead_letter_rollup_swept s);
BEGIN
    -- The caller's snapshot (STABLE: the statement's), and the caller's own rows, which
    -- it sees though it lists itself nowhere.
    RETURN QUERY
    SELECT d.reason, d.eff_producer, d.eff_schema_version, d.source_queue, d.eff_error_class,
           dlq_rollup_hour(d.dead_lettered_at),
           dlq_rollup_state(d.replayed_at, d.discarded_at, d.replay_attempt_at,
                            d.replay_claim_owner, d.replay_claim_expires_at),
           CAST(1 AS BIGINT), d.dead_lettered_at, d.dead_lettered_at, false
    FROM (SELECT g.lo, g.hi FROM dlq_rollup_gaps(swept, dlq_rollup_running(
              pg_current_snapshot(), pg_current_xact_id_if_assigned())) AS g
          UNION ALL
          SELECT x, (x::text::bigint + 1)::text::xid8 FROM pg_current_xact_id_if_assigned() AS o (x)
          WHERE x IS NOT NULL AND NOT dlq_rollup_counted(x, swept)) AS g
    CROSS JOIN LATERAL (
        SELECT * FROM dead_letters WHERE written_xid >= g.lo AND written_xid < g.hi
        OFFSET 0) AS d;  -- a fence: one index range per gap, never one pass of all
END;
$$;

-- What readers add to the counts: the deltas of counted rows, and the rows not yet
-- counted. Read in the same statement as the counts, it sees the snapshot their last
-- sweep left. A reader needs SELECT on dead_letters and dead_letter_rollup_swept too.
CREATE OR REPLACE VIEW dead_letter_rollup_unfolded AS
SELECT t.reason, t.eff_producer, t.eff_schema_version, t.source_queue, t.eff_error_class,
       t.hour, t.state, t.n, t.first_seen, t.last_seen, t.stale
FROM dead_letter_rollup_delta t, dead_letter_rollup_swept s
WHERE dlq_rollup_counted(t.row_xid, s.snap)
UNION ALL
SELECT * FROM dlq_rollup_unswept();

-- The writer's ID, given on INSERT whatever the statement says (a copied row keeps no
-- other transaction's), and never changed after.
CREATE OR REPLACE FUNCTION dlq_fill_triage() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.eff_error_class := dlq_error_class(NEW.error);
    NEW.body_is_json := dlq_body_is_json_object(NEW.body);
    NEW.headers_are_json := dlq_is_json_object(NEW.headers_json);
    IF TG_OP = 'INSERT' THEN
        NEW.written_xid := pg_current_xact_id();
    END IF;
    RETURN NEW;
END;
$$;

CREATE OR REPLACE FUNCTION dlq_keep_written_xid() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'dead_letters.written_xid is kept by dlq and cannot be changed';
END;
$$;
DROP TRIGGER IF EXISTS dead_letters_written_xid ON dead_letters;
CREATE TRIGGER dead_letters_written_xid BEFORE UPDATE OF written_xid ON dead_letters
    FOR EACH ROW WHEN (NEW.written_xid IS DISTINCT FROM OLD.written_xid)
    EXECUTE FUNCTION dlq_keep_written_xid();

-- The insert trigger only folds now and then; its one-in-2,000 test is the WHEN, so
-- the other statements run no function and capture no transition table.
CREATE OR REPLACE FUNCTION dlq_rollup_insert() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET jit = off AS $$
BEGIN
    -- At most about 4,000 rows and deltas (a writer's statement timeout must never be
    -- reached; `WHEN others` cannot catch it), only under READ COMMITTED (an older
    -- snapshot would fail on a fold committed since), never failing the insert.
    IF current_setting('transaction_isolation') = 'read committed' THEN
        BEGIN
            PERFORM dlq_rollup_compact(4000);
        EXCEPTION WHEN others THEN
            NULL;
        END;
    END IF;
    RETURN NULL;
END;
$$;
DROP TRIGGER IF EXISTS dead_letters_rollup_insert ON dead_letters;
CREATE TRIGGER dead_letters_rollup_insert AFTER INSERT ON dead_letters
    FOR EACH STATEMENT WHEN (random() < 0.0005) EXECUTE FUNCTION dlq_rollup_insert();

-- As 20261203000400, with each row's delta tagged by its writer when the counts do not
-- hold it yet. The stale marks stay untagged: a needless one only reads times again.
CREATE OR REPLACE FUNCTION dlq_rollup_update() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET jit = off AS $$
BEGIN
    -- The counted snapshot read in the same statement: one statement to plan in a new
    -- session (a single replay's three UPDATEs each pay it).
    WITH sw AS (SELECT snap AS swept FROM dead_letter_rollup_swept), d AS MATERIALIZED (
        SELECT reason, eff_producer, eff_schema_version, source_queue, eff_error_class,
               dlq_rollup_hour(dead_lettered_at) AS hour,
               dlq_rollup_state(replayed_at, discarded_at, replay_attempt_at,
                                replay_claim_owner, replay_claim_expires_at) AS state,
               -1 AS n, dead_lettered_at AS t, NULL::timestamptz AS at,
               CASE WHEN NOT dlq_rollup_counted(written_xid, swept) THEN written_xid END
                   AS row_xid
        FROM old_rows, sw
        UNION ALL
        SELECT reason, eff_producer, eff_schema_version, source_queue, eff_error_class,
               dlq_rollup_hour(dead_lettered_at),
               dlq_rollup_state(replayed_at, discarded_at, replay_attempt_at,
                                replay_claim_owner, replay_claim_expires_at),
               1, dead_lettered_at, dead_lettered_at,
               CASE WHEN NOT dlq_rollup_counted(written_xid, swept) THEN written_xid END
        FROM new_rows, sw
    ), left_at AS (
        -- Fewer of the bucket's rows hold some time after the statement than before.
        SELECT DISTINCT reason, eff_producer, eff_schema_version, source_queue,
               eff_error_class, hour
        FROM d GROUP BY reason, eff_producer, eff_schema_version, source_queue,
                        eff_error_class, hour, t
        HAVING sum(n) < 0
    )
    INSERT INTO dead_letter_rollup_delta (reason, eff_producer, eff_schema_version,
        source_queue, eff_error_class, hour, state, n, first_seen, last_seen, stale, row_xid)
    SELECT reason, eff_producer, eff_schema_version, source_queue, eff_error_class, hour,
           state, sum(n), min(at), max(at), false, row_xid
    FROM d GROUP BY 1, 2, 3, 4, 5, 6, 7, row_xid
    HAVING sum(n) <> 0
    UNION ALL
    SELECT reason, eff_producer, eff_schema_version, source_queue, eff_error_class, hour,
           'open', 0, NULL, NULL, true, NULL
    FROM left_at;
    RETURN NULL;
END;
$$;

CREATE OR REPLACE FUNCTION dlq_rollup_delete() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET jit = off AS $$
BEGIN
    WITH sw AS (SELECT snap AS swept FROM dead_letter_rollup_swept)
    INSERT INTO dead_letter_rollup_delta (reason, eff_producer, eff_schema_version,
        source_queue, eff_error_class, hour, state, n, stale, row_xid)
    SELECT reason, eff_producer, eff_schema_version, source_queue, eff_error_class,
           dlq_rollup_hour(dead_lettered_at),
           dlq_rollup_state(replayed_at, discarded_at, replay_attempt_at, replay_claim_owner,
                            replay_claim_expires_at),
           -count(*), true,
           CASE WHEN NOT dlq_rollup_counted(written_xid, swept) THEN written_xid END
    FROM old_rows, sw
    GROUP BY 1, 2, 3, 4, 5, 6, 7, 10
    -- A bucket's times may hold a row not yet counted (a fold reads times from the rows),
    -- so its stale mark is never tagged: a tagged one is skipped, then deleted.
    UNION ALL
    SELECT DISTINCT reason, eff_producer, eff_schema_version, source_queue, eff_error_class,
           dlq_rollup_hour(dead_lettered_at), 'open', 0, true, NULL::xid8
    FROM old_rows, sw
    WHERE NOT dlq_rollup_counted(written_xid, sw.swept);
    RETURN NULL;
END;
$$;

-- Counts every row anew while writers are held back; the snapshot taken then sees every
-- row there (a row whose writer it does not see, copied from another server, is read
-- where it is instead).
CREATE OR REPLACE FUNCTION dlq_rollup_enable() RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    swept pg_snapshot;
BEGIN
    -- An older snapshot would miss rows committed while it waited for the lock.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'dlq_rollup_enable() counts the rows: run it under READ COMMITTED';
    END IF;
    LOCK TABLE dead_letters IN SHARE ROW EXCLUSIVE MODE;
    -- A fold under way (`dlq aggregate`'s) would write counts this one replaces.
    PERFORM pg_advisory_xact_lock(hashtextextended('dlq_rollup_fold', 0));
    CREATE INDEX IF NOT EXISTS dead_letters_written_xid_idx ON dead_letters (written_xid)
        WHERE written_xid IS NOT NULL;
    swept := dlq_rollup_running(pg_current_snapshot(), pg_current_xact_id_if_assigned());
    DELETE FROM dead_letter_rollup_delta;
    DELETE FROM dead_letter_rollup;
    INSERT INTO dead_letter_rollup_swept (snap) VALUES (swept)
        ON CONFLICT (one) DO UPDATE SET snap = EXCLUDED.snap;
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
        FROM dead_letters WHERE dlq_rollup_counted(written_xid, swept)
        GROUP BY 1, 2, 3, 4, 5, 6, 7
    ) AS counted;
    ALTER TABLE dead_letters ENABLE TRIGGER dead_letters_rollup_insert;
    ALTER TABLE dead_letters ENABLE TRIGGER dead_letters_rollup_update;
    ALTER TABLE dead_letters ENABLE TRIGGER dead_letters_rollup_delete;
    ALTER TABLE dead_letters ENABLE TRIGGER dead_letters_rollup_truncate;
    INSERT INTO dead_letter_rollup_kept (kept) VALUES (true)
        ON CONFLICT (one) DO UPDATE SET kept = true;
END;
$$;

-- Off, the counts cost the writers nothing: their index goes too (enable builds it again).
CREATE OR REPLACE FUNCTION dlq_rollup_disable() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    -- The strongest lock first (DROP INDEX's): taken after the triggers' weaker one, it
    -- deadlocked with a writer that had read the table first.
    LOCK TABLE dead_letters IN ACCESS EXCLUSIVE MODE;
    DROP INDEX IF EXISTS dead_letters_written_xid_idx;
    INSERT INTO dead_letter_rollup_kept (kept) VALUES (false)
        ON CONFLICT (one) DO UPDATE SET kept = false;
    ALTER TABLE dead_letters DISABLE TRIGGER dead_letters_rollup_insert;
    ALTER TABLE dead_letters DISABLE TRIGGER dead_letters_rollup_update;
    ALTER TABLE dead_letters DISABLE TRIGGER dead_letters_rollup_delete;
    ALTER TABLE dead_letters DISABLE TRIGGER dead_letters_rollup_truncate;
END;
$$;

-- Kept, as before, and the counted snapshot not ahead of this server (see the compaction).
CREATE OR REPLACE FUNCTION dlq_rollup_is_kept() RETURNS boolean LANGUAGE sql STABLE
SECURITY DEFINER AS $$
    SELECT COALESCE((SELECT kept FROM dead_letter_rollup_kept), false)
       AND (SELECT count(*) FROM pg_trigger
            WHERE tgrelid = 'dead_letters'::regclass
              AND tgname IN ('dead_letters_rollup_insert', 'dead_letters_rollup_update',
                             'dead_letters_rollup_delete', 'dead_letters_rollup_truncate')
              AND tgenabled IN ('O', 'A')) = 4
       AND COALESCE((SELECT pg_snapshot_xmax(snap) <= pg_snapshot_xmax(pg_current_snapshot())
                     FROM dead_letter_rollup_swept), false)
$$;

-- CREATE OR REPLACE set the functions' settings anew: search dlq's schema, then pg_temp,
-- and only the migrating role runs the folds and triggers (20261203000300).
DO $$
DECLARE
    f TEXT;
BEGIN
    FOREACH f IN ARRAY ARRAY['dlq_rollup_compact(bigint)', 'dlq_rollup_sweep(bigint)',
                             'dlq_rollup_insert()', 'dlq_rollup_update()', 'dlq_rollup_delete()']
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', f, current_schema());
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
    EXECUTE format('ALTER FUNCTION dlq_rollup_is_kept() SET search_path = %I, pg_temp',
                   current_schema());
    -- A reader's own: it reads with the reader's rights, but only dlq's tables.
    EXECUTE format('ALTER FUNCTION dlq_rollup_unswept() SET search_path = %I, pg_temp',
                   current_schema());
END;
$$;
