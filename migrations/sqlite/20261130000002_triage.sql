-- Triage beyond replay (contract v2): the error class, and history that survives export
-- and import.
--
-- error_class is the worker's error text up to its first ':', trimmed of spaces, tabs and
-- line breaks; NULL (shown as "(unknown)") when there is none. SQLite cannot add a STORED
-- column without rebuilding the table (and copying every row), so it is a VIRTUAL
-- generated column: computed as a row is read, from a value already in hand, for less
-- than reading the row costs (grouping a million rows by it takes no longer than by
-- reason; see docs/performance.md). Workers' inserts pay nothing for it.
ALTER TABLE dead_letters ADD COLUMN eff_error_class TEXT GENERATED ALWAYS AS (
    NULLIF(trim(CASE WHEN instr(error, ':') > 0 THEN substr(error, 1, instr(error, ':') - 1)
                     ELSE error END,
                ' ' || char(9, 10, 13)), '')) VIRTUAL;

-- History restored by `dlq import` keeps the token fingerprint it was exported with (the
-- token itself, a bearer secret, is never exported).
ALTER TABLE dead_letter_history ADD COLUMN token_ref TEXT NULL;
