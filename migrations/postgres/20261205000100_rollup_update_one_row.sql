-- A statement that changed one row (a single replay's claim, attempt and mark, a discard
-- or a resolve of one ID) writes its deltas by a simpler statement: the first UPDATE of a
-- new session plans the trigger's statement, and the grouped one took 1.2 ms of the
-- single replay's 15 ms there (issue 24); this one about 0.6 ms. Grouping matters only
-- for many rows (a batch's claim: one delta per bucket, not one per row).
--
-- Its deltas are tagged with the row's writer whether or not the counts hold it yet:
-- readers and folds take a delta whose writer is counted (dlq_rollup_counted), so a tag
-- of a counted writer reads as no tag, and the sweep deletes only deltas of writers it
-- newly counts. Its -1 and +1 may be of the same state: they add up to nothing.
CREATE OR REPLACE FUNCTION dlq_rollup_update() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET jit = off AS $$
BEGIN
    IF (SELECT count(*) FROM new_rows) = 1 THEN
        INSERT INTO dead_letter_rollup_delta (reason, eff_producer, eff_schema_version,
            source_queue, eff_error_class, hour, state, n, first_seen, last_seen, stale,
            row_xid)
        SELECT reason, eff_producer, eff_schema_version, source_queue, eff_error_class,
               dlq_rollup_hour(dead_lettered_at),
               dlq_rollup_state(replayed_at, discarded_at, replay_attempt_at,
                                replay_claim_owner, replay_claim_expires_at),
               -1, NULL, NULL, false, written_xid
        FROM old_rows
        UNION ALL
        SELECT reason, eff_producer, eff_schema_version, source_queue, eff_error_class,
               dlq_rollup_hour(dead_lettered_at),
               dlq_rollup_state(replayed_at, discarded_at, replay_attempt_at,
                                replay_claim_owner, replay_claim_expires_at),
               1, dead_lettered_at, dead_lettered_at, false, written_xid
        FROM new_rows
        UNION ALL
        -- The bucket it left holds its time no more: read again (untagged, as 20261204000200).
        SELECT o.reason, o.eff_producer, o.eff_schema_version, o.source_queue,
               o.eff_error_class, dlq_rollup_hour(o.dead_lettered_at), 'open', 0, NULL, NULL,
               true, NULL
        FROM old_rows o, new_rows n
        WHERE (o.reason, o.eff_producer, o.eff_schema_version, o.source_queue,
               o.eff_error_class, o.dead_lettered_at)
              IS DISTINCT FROM (n.reason, n.eff_producer, n.eff_schema_version,
                                n.source_queue, n.eff_error_class, n.dead_lettered_at);
        RETURN NULL;
    END IF;
    -- Many rows: one delta per bucket and state, as 20261204000200 (the counted snapshot
    -- read in the same statement: one statement to plan).
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

-- CREATE OR REPLACE set the function's settings anew: search dlq's schema, then pg_temp,
-- and only the migrating role runs it (20261203000300).
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION dlq_rollup_update() SET search_path = %I, pg_temp',
                   current_schema());
    REVOKE EXECUTE ON FUNCTION dlq_rollup_update() FROM PUBLIC;
END;
$$;
