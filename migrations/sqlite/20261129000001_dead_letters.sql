-- The table the Python workers already write (nine columns). Kept when present.
CREATE TABLE IF NOT EXISTS dead_letters (
    id                       TEXT PRIMARY KEY,
    body                     BLOB NOT NULL,
    reason                   TEXT NOT NULL,
    attempts                 INTEGER NOT NULL,
    headers_json             TEXT NOT NULL,
    replayed_at              TIMESTAMP NULL,
    replay_claim_owner       TEXT NULL,
    replay_claim_expires_at  TIMESTAMP NULL,
    last_replay_error        TEXT NULL
);

-- SQLite cannot ADD COLUMN with a non-constant default or a stored generated column,
-- so the table is rebuilt once: every row is copied, timestamps converted to one format.
-- A text timestamp SQLite cannot read becomes 0 (1970), never NULL: a row that was
-- replayed stays replayed, and an unreadable lease counts as lapsed.
--
-- Times are INTEGER milliseconds since the Unix epoch (UTC), always: comparisons are
-- then numeric and never depend on how a text timestamp was spelled.
--
-- The fallback rule (column, then header x-<name>, then top-level body field) lives in
-- the generated columns eff_*, so every row, whoever inserts it, carries its effective
-- identity and the filters stay index-backed. The cost is paid once per INSERT.
CREATE TABLE dead_letters_v1 (
    id                       TEXT PRIMARY KEY NOT NULL CHECK (length(id) > 0),
    body                     BLOB NOT NULL,
    reason                   TEXT NOT NULL,
    attempts                 INTEGER NOT NULL,
    headers_json             TEXT NOT NULL,
    replayed_at              INTEGER NULL,
    replay_claim_owner       TEXT NULL,
    replay_claim_expires_at  INTEGER NULL,
    last_replay_error        TEXT NULL,
    event_id                 TEXT NULL,
    error                    TEXT NULL,
    producer                 TEXT NULL,
    schema_version           TEXT NULL,
    source_queue             TEXT NULL,
    exchange                 TEXT NULL,
    routing_key              TEXT NULL,
    dead_lettered_at         INTEGER NOT NULL
        DEFAULT (CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)),
    eff_producer TEXT GENERATED ALWAYS AS (COALESCE(
        producer,
        CASE WHEN json_valid(headers_json) THEN CAST(json_extract(headers_json, '$."x-producer"') AS TEXT) END,
        CASE WHEN json_valid(CAST(body AS TEXT)) AND json_type(CAST(body AS TEXT)) = 'object'
             THEN CAST(json_extract(CAST(body AS TEXT), '$.producer') AS TEXT) END)) STORED,
    eff_schema_version TEXT GENERATED ALWAYS AS (COALESCE(
        schema_version,
        CASE WHEN json_valid(headers_json) THEN CAST(json_extract(headers_json, '$."x-schema-version"') AS TEXT) END,
        CASE WHEN json_valid(CAST(body AS TEXT)) AND json_type(CAST(body AS TEXT)) = 'object'
             THEN CAST(json_extract(CAST(body AS TEXT), '$.schema_version') AS TEXT) END)) STORED,
    eff_event_id TEXT GENERATED ALWAYS AS (COALESCE(
        event_id,
        CASE WHEN json_valid(headers_json) THEN CAST(json_extract(headers_json, '$."x-event-id"') AS TEXT) END,
        CASE WHEN json_valid(CAST(body AS TEXT)) AND json_type(CAST(body AS TEXT)) = 'object'
             THEN CAST(json_extract(CAST(body AS TEXT), '$.event_id') AS TEXT) END)) STORED
);

INSERT INTO dead_letters_v1 (id, body, reason, attempts, headers_json, replayed_at,
                             replay_claim_owner, replay_claim_expires_at, last_replay_error)
SELECT id, body, reason, attempts, headers_json,
       CASE typeof(replayed_at)
            WHEN 'text' THEN COALESCE(CAST(ROUND((julianday(replayed_at) - 2440587.5) * 86400000.0) AS INTEGER), 0)
            WHEN 'real' THEN CAST(replayed_at * 1000 AS INTEGER)
            ELSE replayed_at END,
       replay_claim_owner,
       CASE typeof(replay_claim_expires_at)
            WHEN 'text' THEN COALESCE(CAST(ROUND((julianday(replay_claim_expires_at) - 2440587.5) * 86400000.0) AS INTEGER), 0)
            WHEN 'real' THEN CAST(replay_claim_expires_at * 1000 AS INTEGER)
            ELSE replay_claim_expires_at END,
       last_replay_error
FROM dead_letters;

DROP TABLE dead_letters;
ALTER TABLE dead_letters_v1 RENAME TO dead_letters;

CREATE INDEX dead_letters_at_idx ON dead_letters (dead_lettered_at DESC);
CREATE INDEX dead_letters_reason_idx ON dead_letters (reason, dead_lettered_at DESC);
CREATE INDEX dead_letters_producer_idx ON dead_letters (eff_producer, dead_lettered_at DESC);
CREATE INDEX dead_letters_schema_idx ON dead_letters (eff_schema_version, dead_lettered_at DESC);
CREATE INDEX dead_letters_reason_producer_idx ON dead_letters (reason, eff_producer, dead_lettered_at DESC);
CREATE INDEX dead_letters_event_idx ON dead_letters (eff_event_id);
CREATE INDEX dead_letters_pending_idx ON dead_letters (dead_lettered_at DESC) WHERE replayed_at IS NULL;

CREATE TABLE dead_letter_history (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    dead_letter_id TEXT NOT NULL,
    at             INTEGER NOT NULL DEFAULT (CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)),
    operator       TEXT NOT NULL,
    action         TEXT NOT NULL,
    outcome        TEXT NOT NULL,
    detail         TEXT NULL,
    token          TEXT NULL,
    target         TEXT NULL,
    plan_id        TEXT NULL
);
CREATE INDEX dead_letter_history_id_idx ON dead_letter_history (dead_letter_id, seq);
