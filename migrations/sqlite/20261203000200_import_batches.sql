-- `dlq import` commits in short write transactions (issue 26: one transaction made the
-- workers' inserts wait for the whole import). Until its last transaction, its rows are
-- held by the import's own claim (owner 'dlq-import:UUID', a lease to the year 4000), and
-- their own claim and times wait in dlq_import_rows. A dead import (its process gone, or
-- its lease here ended) is undone by the next dlq that opens the file.
CREATE TABLE IF NOT EXISTS dlq_imports (
    token TEXT PRIMARY KEY,          -- the owner its rows are held by
    state TEXT NOT NULL,             -- 'live'; 'released' (rows being given back); 'dead' (undone)
    pid INTEGER NOT NULL,
    host TEXT,                       -- boot and PID namespace: where pid means that process
    started TEXT,                    -- the process's start time (as /proc gives it)
    lease_end INTEGER NOT NULL       -- microseconds, database clock; renewed by each batch
);

CREATE TABLE IF NOT EXISTS dlq_import_rows (
    token TEXT NOT NULL,
    id TEXT NOT NULL,
    replay_claim_owner TEXT,
    replay_claim_expires_at INTEGER,
    replayed_at INTEGER,
    replay_attempt_at INTEGER,
    discarded_at INTEGER,
    PRIMARY KEY (token, id)
) WITHOUT ROWID;
