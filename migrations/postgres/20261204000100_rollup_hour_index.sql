-- Two reads of every count that a large table made slow (issue 24; at 10,000,000 dead
-- letters the counts are 43,000 rows, and `aggregate --since 2h` spent 15 of its 30 ms
-- on them):
-- - a time window's counts were found by reading them all: an index on the hour;
-- - the fold's test for a stale bucket read them all whenever the planner's statistics
--   of the counts were old (after a fold that changed many, before autovacuum's next
--   ANALYZE): EXISTS keeps no ORDER BY, so the test now takes the first stale bucket
--   in the order of its partial index, which the planner takes whatever it guesses.
CREATE INDEX IF NOT EXISTS dead_letter_rollup_hour_idx ON dead_letter_rollup (hour);

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
    PERFORM 1 FROM (SELECT bucket FROM dead_letter_rollup WHERE stale
                    ORDER BY bucket LIMIT 1) AS first_stale;
    IF NOT FOUND THEN
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

-- CREATE OR REPLACE set the function's settings anew: search dlq's schema, then pg_temp,
-- and only the migrating role runs it (20261203000300).
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION dlq_rollup_fold() SET search_path = %I, pg_temp',
                   current_schema());
    REVOKE EXECUTE ON FUNCTION dlq_rollup_fold() FROM PUBLIC;
END;
$$;
