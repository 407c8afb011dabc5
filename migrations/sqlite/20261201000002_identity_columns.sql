-- eff_producer, eff_schema_version and eff_event_id become ordinary columns kept by
-- triggers. As STORED generated columns, SQLite computed them again on every UPDATE of
-- the row, whichever columns it changed: each claim, attempt, mark and release of a
-- 50 MiB JSON body copied and parsed the body (a replay peaked at 7.4x the body). The
-- rule is unchanged (20261201000001): the column, else the header, else the body's
-- top-level field; a JSON string is its value, a number, true or false its JSON text.
-- It stays in the database because workers insert rows with their own SQL.
--
-- The triggers cast the body to text once (the generated columns did it up to five
-- times per column), skip it when its first non-blank byte is not `{` (such a body is no
-- JSON object: a binary body costs no copy), and write the row only when a value
-- changes. The table is rebuilt (SQLite cannot alter a generated column), the values
-- the generated columns computed copied as they are.
CREATE TABLE dead_letters_v4 (
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
    eff_producer             TEXT NULL,
    eff_schema_version       TEXT NULL,
    eff_event_id             TEXT NULL,
    eff_error_class TEXT GENERATED ALWAYS AS (
        NULLIF(trim(CASE WHEN instr(error, ':') > 0 THEN substr(error, 1, instr(error, ':') - 1)
                         ELSE error END,
                    ' ' || char(9, 10, 13)), '')) VIRTUAL
);

INSERT INTO dead_letters_v4 (id, body, reason, attempts, headers_json, replayed_at, replay_claim_owner, replay_claim_expires_at, last_replay_error, event_id, error, producer, schema_version, source_queue, exchange, routing_key, dead_lettered_at, replay_attempt_at, discarded_at, discard_note, capture_key, eff_producer, eff_schema_version, eff_event_id)
SELECT id, body, reason, attempts, headers_json, replayed_at, replay_claim_owner, replay_claim_expires_at, last_replay_error, event_id, error, producer, schema_version, source_queue, exchange, routing_key, dead_lettered_at, replay_attempt_at, discarded_at, discard_note, capture_key, eff_producer, eff_schema_version, eff_event_id FROM dead_letters;

DROP TABLE dead_letters;
ALTER TABLE dead_letters_v4 RENAME TO dead_letters;

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

CREATE TRIGGER dead_letters_identity_insert
AFTER INSERT ON dead_letters
BEGIN
    UPDATE dead_letters SET eff_producer = v.p, eff_schema_version = v.s, eff_event_id = v.e
    FROM (SELECT
            COALESCE(
                NEW.producer,
                CASE WHEN json_valid(NEW.headers_json) THEN
                    CASE json_type(NEW.headers_json, '$."x-producer"') WHEN 'text' THEN json_extract(NEW.headers_json, '$."x-producer"')
                         WHEN 'integer' THEN NEW.headers_json -> '$."x-producer"' WHEN 'real' THEN NEW.headers_json -> '$."x-producer"'
                         WHEN 'true' THEN 'true' WHEN 'false' THEN 'false' END END,
                CASE WHEN json_valid(b.t) AND json_type(b.t) = 'object' THEN
                    CASE json_type(b.t, '$.producer') WHEN 'text' THEN json_extract(b.t, '$.producer')
                         WHEN 'integer' THEN b.t -> '$.producer' WHEN 'real' THEN b.t -> '$.producer'
                         WHEN 'true' THEN 'true' WHEN 'false' THEN 'false' END END) AS p,
            COALESCE(
                NEW.schema_version,
                CASE WHEN json_valid(NEW.headers_json) THEN
                    CASE json_type(NEW.headers_json, '$."x-schema-version"') WHEN 'text' THEN json_extract(NEW.headers_json, '$."x-schema-version"')
                         WHEN 'integer' THEN NEW.headers_json -> '$."x-schema-version"' WHEN 'real' THEN NEW.headers_json -> '$."x-schema-version"'
                         WHEN 'true' THEN 'true' WHEN 'false' THEN 'false' END END,
                CASE WHEN json_valid(b.t) AND json_type(b.t) = 'object' THEN
                    CASE json_type(b.t, '$.schema_version') WHEN 'text' THEN json_extract(b.t, '$.schema_version')
                         WHEN 'integer' THEN b.t -> '$.schema_version' WHEN 'real' THEN b.t -> '$.schema_version'
                         WHEN 'true' THEN 'true' WHEN 'false' THEN 'false' END END) AS s,
            COALESCE(
                NEW.event_id,
                CASE WHEN json_valid(NEW.headers_json) THEN
                    CASE json_type(NEW.headers_json, '$."x-event-id"') WHEN 'text' THEN json_extract(NEW.headers_json, '$."x-event-id"')
                         WHEN 'integer' THEN NEW.headers_json -> '$."x-event-id"' WHEN 'real' THEN NEW.headers_json -> '$."x-event-id"'
                         WHEN 'true' THEN 'true' WHEN 'false' THEN 'false' END END,
                CASE WHEN json_valid(b.t) AND json_type(b.t) = 'object' THEN
                    CASE json_type(b.t, '$.event_id') WHEN 'text' THEN json_extract(b.t, '$.event_id')
                         WHEN 'integer' THEN b.t -> '$.event_id' WHEN 'real' THEN b.t -> '$.event_id'
                         WHEN 'true' THEN 'true' WHEN 'false' THEN 'false' END END) AS e
          FROM (SELECT CASE WHEN substr(ltrim(CAST(substr(NEW.body, 1, 64) AS TEXT), ' ' || char(9, 10, 13)), 1, 1) IN ('', '{')
                            THEN CAST(NEW.body AS TEXT) END AS t) AS b) AS v
    WHERE dead_letters.rowid = NEW.rowid
      AND (dead_letters.eff_producer IS NOT v.p
           OR dead_letters.eff_schema_version IS NOT v.s
           OR dead_letters.eff_event_id IS NOT v.e);
END;

-- Not OF eff_*: the insert trigger's own UPDATE would fire this one, parsing again.
CREATE TRIGGER dead_letters_identity_update
AFTER UPDATE OF producer, schema_version, event_id, headers_json, body ON dead_letters
BEGIN
    UPDATE dead_letters SET eff_producer = v.p, eff_schema_version = v.s, eff_event_id = v.e
    FROM (SELECT
            COALESCE(
                NEW.producer,
                CASE WHEN json_valid(NEW.headers_json) THEN
                    CASE json_type(NEW.headers_json, '$."x-producer"') WHEN 'text' THEN json_extract(NEW.headers_json, '$."x-producer"')
                         WHEN 'integer' THEN NEW.headers_json -> '$."x-producer"' WHEN 'real' THEN NEW.headers_json -> '$."x-producer"'
                         WHEN 'true' THEN 'true' WHEN 'false' THEN 'false' END END,
                CASE WHEN json_valid(b.t) AND json_type(b.t) = 'object' THEN
                    CASE json_type(b.t, '$.producer') WHEN 'text' THEN json_extract(b.t, '$.producer')
                         WHEN 'integer' THEN b.t -> '$.producer' WHEN 'real' THEN b.t -> '$.producer'
                         WHEN 'true' THEN 'true' WHEN 'false' THEN 'false' END END) AS p,
            COALESCE(
                NEW.schema_version,
                CASE WHEN json_valid(NEW.headers_json) THEN
                    CASE json_type(NEW.headers_json, '$."x-schema-version"') WHEN 'text' THEN json_extract(NEW.headers_json, '$."x-schema-version"')
                         WHEN 'integer' THEN NEW.headers_json -> '$."x-schema-version"' WHEN 'real' THEN NEW.headers_json -> '$."x-schema-version"'
                         WHEN 'true' THEN 'true' WHEN 'false' THEN 'false' END END,
                CASE WHEN json_valid(b.t) AND json_type(b.t) = 'object' THEN
                    CASE json_type(b.t, '$.schema_version') WHEN 'text' THEN json_extract(b.t, '$.schema_version')
                         WHEN 'integer' THEN b.t -> '$.schema_version' WHEN 'real' THEN b.t -> '$.schema_version'
                         WHEN 'true' THEN 'true' WHEN 'false' THEN 'false' END END) AS s,
            COALESCE(
                NEW.event_id,
                CASE WHEN json_valid(NEW.headers_json) THEN
                    CASE json_type(NEW.headers_json, '$."x-event-id"') WHEN 'text' THEN json_extract(NEW.headers_json, '$."x-event-id"')
                         WHEN 'integer' THEN NEW.headers_json -> '$."x-event-id"' WHEN 'real' THEN NEW.headers_json -> '$."x-event-id"'
                         WHEN 'true' THEN 'true' WHEN 'false' THEN 'false' END END,
                CASE WHEN json_valid(b.t) AND json_type(b.t) = 'object' THEN
                    CASE json_type(b.t, '$.event_id') WHEN 'text' THEN json_extract(b.t, '$.event_id')
                         WHEN 'integer' THEN b.t -> '$.event_id' WHEN 'real' THEN b.t -> '$.event_id'
                         WHEN 'true' THEN 'true' WHEN 'false' THEN 'false' END END) AS e
          FROM (SELECT CASE WHEN substr(ltrim(CAST(substr(NEW.body, 1, 64) AS TEXT), ' ' || char(9, 10, 13)), 1, 1) IN ('', '{')
                            THEN CAST(NEW.body AS TEXT) END AS t) AS b) AS v
    WHERE dead_letters.rowid = NEW.rowid
      AND (dead_letters.eff_producer IS NOT v.p
           OR dead_letters.eff_schema_version IS NOT v.s
           OR dead_letters.eff_event_id IS NOT v.e);
END;
