-- Claims and marks become HOT updates (no index entry written, a fraction of the WAL):
-- without the partial index on replayed_at neither changes an indexed column, and half
-- of each page is left free for the new row versions. The fill factor applies to pages
-- written from now on. "Not yet replayed" lists use dead_letters_at_idx instead.
DROP INDEX IF EXISTS dead_letters_pending_idx;
ALTER TABLE dead_letters SET (fillfactor = 50);
