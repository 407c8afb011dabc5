-- One rule for non-string identity values on both stores (docs/json-output.md): where
-- producer, schema_version or event_id come from a header or the body, a JSON string is
-- its value; a number, true or false is its JSON text as written (`2`, `1e2`, `true`;
-- `->` keeps a number's text); null, an array or an object is no value, and the next
-- source is looked at. json_extract gave `1` for true and `100.0` for 1e2.
--
-- The columns are STORED (the filters on them are index-backed), and SQLite cannot alter
-- a generated column: the table is rebuilt once, every row copied (about as long as the
-- workers' first migrate took), then its indexes and trigger made again.
CREATE TABLE dead_letters_v3 (
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
    replay_attempt_at        INTEGER NULL,
    discarded_at             INTEGER NULL,
    discard_note             TEXT NULL,
    capture_key              TEXT NULL,
    eff_producer TEXT GENERATED ALWAYS AS (COALESCE(
        producer,
        CASE WHEN json_valid(headers_json) THEN
            CASE json_type(headers_json, '$."x-producer"') WHEN 'text' THEN json_extract(headers_json, '$."x-producer"')
                 WHEN 'integer' THEN headers_json -> '$."x-producer"' WHEN 'real' THEN headers_json -> '$."x-producer"'
                 WHEN 'true' THEN 'true' WHEN 'false' THEN 'false' END END,
        CASE WHEN json_valid(CAST(body AS TEXT)) AND json_type(CAST(body AS TEXT)) = 'object' THEN
            CASE json_type(CAST(body AS TEXT), '$.producer') WHEN 'text' THEN json_extract(CAST(body AS TEXT), '$.producer')
                 WHEN 'integer' THEN CAST(body AS TEXT) -> '$.producer' WHEN 'real' THEN CAST(body AS TEXT) -> '$.producer'
                 WHEN 'true' THEN 'true' WHEN 'false' THEN 'false' END END)) STORED,
    eff_schema_version TEXT GENERATED ALWAYS AS (COALESCE(
        schema_version,
        CASE WHEN json_valid(headers_json) THEN
            CASE json_type(headers_json, '$."x-schema-version"') WHEN 'text' THEN json_extract(headers_json, '$."x-schema-version"')
                 WHEN 'integer' THEN headers_json -> '$."x-schema-version"' WHEN 'real' THEN headers_json -> '$."x-schema-version"'
                 WHEN 'true' THEN 'true' WHEN 'false' THEN 'false' END END,
        CASE WHEN json_valid(CAST(body AS TEXT)) AND json_type(CAST(body AS TEXT)) = 'object' THEN
            CASE json_type(CAST(body AS TEXT), '$.schema_version') WHEN 'text' THEN json_extract(CAST(body AS TEXT), '$.schema_version')
                 WHEN 'integer' THEN CAST(body AS TEXT) -> '$.schema_version' WHEN 'real' THEN CAST(body AS TEXT) -> '$.schema_version'
                 WHEN 'true' THEN 'true' WHEN 'false' THEN 'false' END END)) STORED,
    eff_event_id TEXT GENERATED ALWAYS AS (COALESCE(
        event_id,
        CASE WHEN json_valid(headers_json) THEN
            CASE json_type(headers_json, '$."x-event-id"') WHEN 'text' THEN json_extract(headers_json, '$."x-event-id"')
                 WHEN 'integer' THEN headers_json -> '$."x-event-id"' WHEN 'real' THEN headers_json -> '$."x-event-id"'
                 WHEN 'true' THEN 'true' WHEN 'false' THEN 'false' END END,
        CASE WHEN json_valid(CAST(body AS TEXT)) AND json_type(CAST(body AS TEXT)) = 'object' THEN
            CASE json_type(CAST(body AS TEXT), '$.event_id') WHEN 'text' THEN json_extract(CAST(body AS TEXT), '$.event_id')
                 WHEN 'integer' THEN CAST(body AS TEXT) -> '$.event_id' WHEN 'real' THEN CAST(body AS TEXT) -> '$.event_id'
                 WHEN 'true' THEN 'true' WHEN 'false' THEN 'false' END END)) STORED,
    eff_error_class TEXT GENERATED ALWAYS AS (
        NULLIF(trim(CASE WHEN instr(error, ':') > 0 THEN substr(error, 1, instr(error, ':') - 1)
                         ELSE error END,
                    ' ' || char(9, 10, 13)), '')) VIRTUAL
);

INSERT INTO dead_letters_v3 (id, body, reason, attempts, headers_json, replayed_at, replay_claim_owner, replay_claim_expires_at, last_replay_error, event_id, error, producer, schema_version, source_queue, exchange, routing_key, dead_lettered_at, replay_attempt_at, discarded_at, discard_note, capture_key)
SELECT id, body, reason, attempts, headers_json, replayed_at, replay_claim_owner, replay_claim_expires_at, last_replay_error, event_id, error, producer, schema_version, source_queue, exchange, routing_key, dead_lettered_at, replay_attempt_at, discarded_at, discard_note, capture_key FROM dead_letters;

DROP TABLE dead_letters;
ALTER TABLE dead_letters_v3 RENAME TO dead_letters;

CREATE INDEX dead_letters_at_idx ON dead_letters (dead_lettered_at DESC);
CREATE INDEX dead_letters_reason_idx ON dead_letters (reason, dead_lettered_at DESC);
CREATE INDEX dead_letters_producer_idx ON dead_letters (eff_producer, dead_lettered_at DESC);
CREATE INDEX dead_letters_schema_idx ON dead_letters (eff_schema_version, dead_lettered_at DESC);
CREATE INDEX dead_letters_reason_producer_idx ON dead_letters (reason, eff_producer, dead_lettered_at DESC);
CREATE INDEX dead_letters_event_idx ON dead_letters (eff_event_id);
CREATE INDEX dead_letters_pending_idx ON dead_letters (dead_lettered_at DESC) WHERE replayed_at IS NULL;
CREATE INDEX dead_letters_capture_key_idx ON dead_letters (capture_key) WHERE capture_key IS NOT NULL;

CREATE TRIGGER dead_letters_guard_owner
BEFORE UPDATE OF replay_claim_owner ON dead_letters
WHEN (OLD.replay_attempt_at IS NOT NULL OR OLD.discarded_at IS NOT NULL)
     AND NEW.replay_claim_owner IS NOT NULL
     AND NEW.replay_claim_owner IS NOT OLD.replay_claim_owner
BEGIN
    SELECT RAISE(ABORT, 'dead letter is uncertain or discarded: it cannot be claimed (dlq resolve / dlq restore first; is an old dlq still in use?)');
END;
