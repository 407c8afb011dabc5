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
-- written once here and kept in generated columns so that every row, whoever inserts it,
-- carries its effective identity and the filters stay index-backed. The cost is paid once
-- per INSERT (one JSON parse of headers and, when needed, of the body).
CREATE OR REPLACE FUNCTION dlq_identity(col TEXT, headers_json TEXT, body BYTEA, field TEXT)
RETURNS TEXT LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    v TEXT;
BEGIN
    IF col IS NOT NULL THEN
        RETURN col;
    END IF;
    BEGIN
        v := headers_json::jsonb ->> ('x-' || replace(field, '_', '-'));
        IF v IS NOT NULL THEN
            RETURN v;
        END IF;
    EXCEPTION WHEN others THEN
        NULL;
    END;
    IF body IS NULL OR length(body) = 0 OR position('\x7b'::bytea IN body) = 0 THEN
        RETURN NULL;
    END IF;
    BEGIN
        v := convert_from(body, 'UTF8')::jsonb ->> field;
        RETURN v;
    EXCEPTION WHEN others THEN
        RETURN NULL;
    END;
END;
$$;

ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS eff_producer TEXT
    GENERATED ALWAYS AS (dlq_identity(producer, headers_json, body, 'producer')) STORED;
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS eff_schema_version TEXT
    GENERATED ALWAYS AS (dlq_identity(schema_version, headers_json, body, 'schema_version')) STORED;
ALTER TABLE dead_letters ADD COLUMN IF NOT EXISTS eff_event_id TEXT
    GENERATED ALWAYS AS (dlq_identity(event_id, headers_json, body, 'event_id')) STORED;

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
