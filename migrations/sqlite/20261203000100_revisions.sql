-- Revisions (contract v3, "Revisions: edit, then replay"): `dlq edit` never changes a
-- stored body; it inserts a new row whose `revision_of` names the original, in the same
-- transaction that sets the original aside. Added in place (no table rebuild): existing
-- rows keep NULL, workers never write it.
ALTER TABLE dead_letters ADD COLUMN revision_of TEXT NULL;

-- `show` of an original finds its revision (`revised_as`), `restore` refuses an
-- original that has one, `list --revisions` selects them: all by this column.
CREATE INDEX dead_letters_revision_of_idx ON dead_letters (revision_of)
    WHERE revision_of IS NOT NULL;
