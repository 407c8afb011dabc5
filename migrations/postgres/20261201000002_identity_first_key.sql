-- A key given twice in a header map or a body (`{"event_id":"a","event_id":"b"}`): the
-- first counts, as on SQLite (its JSON functions take the first) and in dlq's own
-- import. `json -> key` took the last, so the two stores gave a different event ID, and a
-- replay a different message ID, for the same body. `json_each` keeps every pair in
-- order; it is used only when the key's text occurs more than once (one occurrence: `->`
-- gives the same value without listing the whole object).
CREATE OR REPLACE FUNCTION dlq_json_first(j JSON, k TEXT)
RETURNS JSON LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT e.value FROM json_each(j) WITH ORDINALITY AS e(key, value, n)
    WHERE e.key = k ORDER BY e.n LIMIT 1
$$;

CREATE OR REPLACE FUNCTION dlq_identity(col TEXT, headers_json TEXT, body BYTEA, field TEXT)
RETURNS TEXT LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    header TEXT := 'x-' || replace(field, '_', '-');
    pattern BYTEA := convert_to('"' || field || '"', 'UTF8');
    at INT;
    v JSON;
BEGIN
    IF col IS NOT NULL THEN
        RETURN col;
    END IF;
    IF position(header IN headers_json) > 0 THEN
        BEGIN
            v := dlq_json_first(headers_json::json, header);
            IF json_typeof(v) IN ('string', 'number', 'boolean') THEN
                RETURN v #>> '{}';
            END IF;
        EXCEPTION WHEN others THEN
            NULL;
        END;
    END IF;
    at := CASE WHEN body IS NULL THEN 0 ELSE position(pattern IN body) END;
    IF at = 0 THEN
        RETURN NULL;
    END IF;
    BEGIN
        IF position(pattern IN substring(body FROM at + 1)) = 0 THEN
            v := convert_from(body, 'UTF8')::json -> field;
        ELSE
            v := dlq_json_first(convert_from(body, 'UTF8')::json, field);
        END IF;
        IF json_typeof(v) IN ('string', 'number', 'boolean') THEN
            RETURN v #>> '{}';
        END IF;
        RETURN NULL;
    EXCEPTION WHEN others THEN
        RETURN NULL;
    END;
END;
$$;

-- Rows whose derived values change: only where a key occurs twice (the others keep
-- theirs and are not rewritten).
UPDATE dead_letters SET
    eff_producer = dlq_identity(producer, headers_json, body, 'producer'),
    eff_schema_version = dlq_identity(schema_version, headers_json, body, 'schema_version'),
    eff_event_id = dlq_identity(event_id, headers_json, body, 'event_id')
WHERE (producer IS NULL OR schema_version IS NULL OR event_id IS NULL)
  AND (eff_producer IS DISTINCT FROM dlq_identity(producer, headers_json, body, 'producer')
    OR eff_schema_version IS DISTINCT FROM dlq_identity(schema_version, headers_json, body, 'schema_version')
    OR eff_event_id IS DISTINCT FROM dlq_identity(event_id, headers_json, body, 'event_id'));
