-- Triage beyond replay (contract v2): the error class, what the content filters need,
-- and history that survives export and import.
--
-- error_class is the worker's error text up to its first ':', trimmed of spaces, tabs
-- and line breaks; NULL (shown as "(unknown)") when there is none. Like eff_producer it
-- is derived when a row is written, so grouping by it reads a plain column.
CREATE OR REPLACE FUNCTION dlq_error_class(error TEXT) RETURNS TEXT
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT NULLIF(btrim(split_part(error, ':', 1), E' \t\r\n'), '')
$$;

-- Whether a text holds a JSON object. PostgreSQL 15 has no IS JSON, and a cast that fails
-- raises; the exception is caught here, once per written row, so that the filters never
-- need an exception block per row read (a subtransaction each, and no parallel scan).
CREATE OR REPLACE FUNCTION dlq_is_json_object(doc TEXT) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF doc IS NULL OR position('{' IN doc) = 0 THEN
        RETURN false;
    END IF;
    RETURN json_typeof(doc::json) = 'object';
EXCEPTION WHEN others THEN
    RETURN false;
END;
$$;

-- The same for a body: UTF-8 text holding a JSON object.
CREATE OR REPLACE FUNCTION dlq_body_is_json_object(body BYTEA) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF body IS NULL OR position('\x7b'::bytea IN body) = 0 THEN
        RETURN false;
    END IF;
    RETURN dlq_is_json_object(convert_from(body, 'UTF8'));
EXCEPTION WHEN others THEN
    RETURN false;
END;
$$;

-- --header KEY=VALUE and --field PATH=VALUE: whether the value at `path` (object keys
-- only, from the top) of the JSON object `doc` compares equal to `want`. A string
-- compares as its value, a number, true, false or null as its JSON text as written; an
-- array or object compares as JSON with `want_json` (the filter's value when that parses
-- as an array or object, else NULL: no match). The caller has checked that `doc` holds a
-- JSON object (the columns below), so nothing here raises.
CREATE OR REPLACE FUNCTION dlq_json_match(doc TEXT, path TEXT[], want TEXT, want_json TEXT)
RETURNS boolean LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    j json := doc::json;
    k TEXT;
BEGIN
    FOREACH k IN ARRAY path LOOP
        IF json_typeof(j) <> 'object' THEN
            RETURN false;
        END IF;
        j := j -> k;
        IF j IS NULL THEN
            RETURN false;
        END IF;
    END LOOP;
    CASE json_typeof(j)
        WHEN 'string' THEN
            RETURN (j #>> '{}') = want;
        WHEN 'array', 'object' THEN
            RETURN want_json IS NOT NULL AND j::jsonb = want_json::jsonb;
        ELSE
            RETURN j::text = want;
    END CASE;
END;
$$;

ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS eff_error_class TEXT;
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS body_is_json BOOLEAN;
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS headers_are_json BOOLEAN;

CREATE OR REPLACE FUNCTION dlq_fill_triage() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.eff_error_class := dlq_error_class(NEW.error);
    NEW.body_is_json := dlq_body_is_json_object(NEW.body);
    NEW.headers_are_json := dlq_is_json_object(NEW.headers_json);
    RETURN NEW;
END;
$$;

DROP TRIGGER IF EXISTS dead_letters_triage ON dead_letters;
CREATE TRIGGER dead_letters_triage
    BEFORE INSERT OR UPDATE OF error, body, headers_json
    ON dead_letters FOR EACH ROW EXECUTE FUNCTION dlq_fill_triage();

-- Rows already there. Neither trigger fires: only the new columns are set.
UPDATE dead_letters SET
    eff_error_class = dlq_error_class(error),
    body_is_json = dlq_body_is_json_object(body),
    headers_are_json = dlq_is_json_object(headers_json);

-- History restored by `dlq import` keeps the token fingerprint it was exported with (the
-- token itself, a bearer secret, is never exported).
ALTER TABLE dead_letter_history ADD COLUMN IF NOT EXISTS token_ref TEXT NULL;
