-- `dlq metrics` counts the replay outcomes of the history at every scrape. This partial
-- index holds only those entries (about a third of the history), so the count is an
-- index-only scan instead of a pass over the whole table; the other entries (claims,
-- attempts, notes) cost nothing more to append. The outcomes are written as literals in
-- the query so that the planner can match the index.
CREATE INDEX IF NOT EXISTS dead_letter_history_outcome_idx ON dead_letter_history (outcome)
    WHERE outcome IN ('replayed', 'publish_failed', 'uncertain');
