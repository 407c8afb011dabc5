-- The table the Python workers already write (nine columns). Kept as is when present.
CREATE TABLE IF NOT EXISTS dead_letters (
    id                       TEXT PRIMARY KEY,
    body                     BYTEA NOT NULL,
    reason                   TEXT NOT NULL,
    attempts                 INTEGER NOT NULL,
    headers_json             TEXT NOT NULL,
    replayed_at              TIMESTAMPTZ NULL,
    replay_claim_owner       TEXT NULL,
    replay_claim_expires_at  TIMESTAMPTZ NULL,
    last_replay_error        TEXT NULL
);

ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS event_id         TEXT NULL;
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS error            TEXT NULL;
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS producer         TEXT NULL;
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS schema_version   TEXT NULL;
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS source_queue     TEXT NULL;
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS exchange         TEXT NULL;
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS routing_key      TEXT NULL;
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS dead_lettered_at TIMESTAMPTZ NOT NULL DEFAULT now();

-- The fallback rule (contract: column, then header x-<name>, then top-level body field),
-- written once here. Its results are kept in eff_producer / eff_schema_version /
-- eff_event_id, filled by a trigger on every INSERT and on every UPDATE of the columns
-- they derive from, whoever writes the row; so every read agrees and the filters stay
-- index-backed. The cost is paid once per written row (the JSON is parsed only when the
-- key's name appears in it); the claim and mark UPDATEs do not pay it.
CREATE OR REPLACE FUNCTION dlq_identity(col TEXT, headers_json TEXT, body BYTEA, field TEXT)
RETURNS TEXT LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    header TEXT := 'x-' || replace(field, '_', '-');
    v TEXT;
BEGIN
    IF col IS NOT NULL THEN
        RETURN col;
    END IF;
    IF position(header IN headers_json) > 0 THEN
        BEGIN
            v := headers_json::jsonb ->> header;
            IF v IS NOT NULL THEN
                RETURN v;
            END IF;
        EXCEPTION WHEN others THEN
            NULL;
        END;
    END IF;
    IF body IS NULL OR position(convert_to('"' || field || '"', 'UTF8') IN body) = 0 THEN
        RETURN NULL;
    END IF;
    BEGIN
        RETURN convert_from(body, 'UTF8')::jsonb ->> field;
    EXCEPTION WHEN others THEN
        RETURN NULL;
    END;
END;
$$;

ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS eff_producer TEXT;
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS eff_schema_version TEXT;
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS eff_event_id TEXT;

CREATE OR REPLACE FUNCTION dlq_fill_identity() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.eff_producer := dlq_identity(NEW.producer, NEW.headers_json, NEW.body, 'producer');
    NEW.eff_schema_version := dlq_identity(NEW.schema_version, NEW.headers_json, NEW.body, 'schema_version');
    NEW.eff_event_id := dlq_identity(NEW.event_id, NEW.headers_json, NEW.body, 'event_id');
    RETURN NEW;
END;
$$;

DROP TRIGGER IF EXISTS dead_letters_identity ON dead_letters;
CREATE TRIGGER dead_letters_identity
    BEFORE INSERT OR UPDATE OF producer, schema_version, event_id, headers_json, body
    ON dead_letters FOR EACH ROW EXECUTE FUNCTION dlq_fill_identity();

-- Rows already there (the workers' table before this migration).
UPDATE dead_letters SET
    eff_producer = dlq_identity(producer, headers_json, body, 'producer'),
    eff_schema_version = dlq_identity(schema_version, headers_json, body, 'schema_version'),
    eff_event_id = dlq_identity(event_id, headers_json, body, 'event_id');

-- Room on each page for the claim UPDATE's new row version, so that it stays a HOT update
-- (no index touched) instead of writing to every index.
ALTER TABLE dead_letters SET (fillfactor = 80);

CREATE INDEX IF NOT EXISTS dead_letters_at_idx ON dead_letters (dead_lettered_at DESC);
CREATE INDEX IF NOT EXISTS dead_letters_reason_idx ON dead_letters (reason, dead_lettered_at DESC);
CREATE INDEX IF NOT EXISTS dead_letters_producer_idx ON dead_letters (eff_producer, dead_lettered_at DESC);
CREATE INDEX IF NOT EXISTS dead_letters_schema_idx ON dead_letters (eff_schema_version, dead_lettered_at DESC);
CREATE INDEX IF NOT EXISTS dead_letters_reason_producer_idx
    ON dead_letters (reason, eff_producer, dead_lettered_at DESC);
CREATE INDEX IF NOT EXISTS dead_letters_event_idx ON dead_letters (eff_event_id);
CREATE INDEX IF NOT EXISTS dead_letters_pending_idx
    ON dead_letters (dead_lettered_at DESC) WHERE replayed_at IS NULL;

-- Every claim, release and replay attempt, appended, never updated.
CREATE TABLE IF NOT EXISTS dead_letter_history (
    seq            BIGSERIAL PRIMARY KEY,
    dead_letter_id TEXT NOT NULL,
    at             TIMESTAMPTZ NOT NULL DEFAULT now(),
    operator       TEXT NOT NULL,
    action         TEXT NOT NULL,
    outcome        TEXT NOT NULL,
    detail         TEXT NULL,
    token          TEXT NULL,
    target         TEXT NULL,
    plan_id        TEXT NULL
);
CREATE INDEX IF NOT EXISTS dead_letter_history_id_idx ON dead_letter_history (dead_letter_id, seq);
