-- One rule for non-string identity values on both stores (docs/json-output.md): where
-- producer, schema_version or event_id come from a header or the body, a JSON string is
-- its value; a number, true or false is its JSON text as written (`2`, `1e2`, `true`);
-- null, an array or an object is no value, and the next source is looked at. `json`
-- (not `jsonb`, which gave `100` for 1e2) keeps a number's text as written.
CREATE OR REPLACE FUNCTION dlq_identity(col TEXT, headers_json TEXT, body BYTEA, field TEXT)
RETURNS TEXT LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    header TEXT := 'x-' || replace(field, '_', '-');
    v JSON;
BEGIN
    IF col IS NOT NULL THEN
        RETURN col;
    END IF;
    IF position(header IN headers_json) > 0 THEN
        BEGIN
            v := headers_json::json -> header;
            IF json_typeof(v) IN ('string', 'number', 'boolean') THEN
                RETURN v #>> '{}';
            END IF;
        EXCEPTION WHEN others THEN
            NULL;
        END;
    END IF;
    IF body IS NULL OR position(convert_to('"' || field || '"', 'UTF8') IN body) = 0 THEN
        RETURN NULL;
    END IF;
    BEGIN
        v := convert_from(body, 'UTF8')::json -> field;
        IF json_typeof(v) IN ('string', 'number', 'boolean') THEN
            RETURN v #>> '{}';
        END IF;
        RETURN NULL;
    EXCEPTION WHEN others THEN
        RETURN NULL;
    END;
END;
$$;

-- Rows whose derived values change under the rule; the others are not rewritten.
UPDATE dead_letters SET
    eff_producer = dlq_identity(producer, headers_json, body, 'producer'),
    eff_schema_version = dlq_identity(schema_version, headers_json, body, 'schema_version'),
    eff_event_id = dlq_identity(event_id, headers_json, body, 'event_id')
WHERE (producer IS NULL OR schema_version IS NULL OR event_id IS NULL)
  AND (eff_producer IS DISTINCT FROM dlq_identity(producer, headers_json, body, 'producer')
    OR eff_schema_version IS DISTINCT FROM dlq_identity(schema_version, headers_json, body, 'schema_version')
    OR eff_event_id IS DISTINCT FROM dlq_identity(event_id, headers_json, body, 'event_id'));
