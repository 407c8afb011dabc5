"""A Python worker inserting beside dlq: the stdlib sqlite3 module with Python's default
5 s busy timeout, one row per transaction every 10 ms, until the file STOP exists. After
each insert it reads, in one statement (one snapshot), whether an import is staging rows
(not yet released)
and how many rows with an id starting with PREFIX are held by no claim. Prints one JSON
object: inserted, failed (with the errors), inserted_during_import, and the snapshots
that saw a staging import beside free imported rows (a half-import; must be none).
Usage: python3 python_inserter.py FILE STOP PREFIX"""
import json
import os
import sqlite3
import sys
import time
import uuid

path, stop, prefix = sys.argv[1:4]
db = sqlite3.connect(path, timeout=5)
out = {"inserted": 0, "failed": 0, "errors": [], "inserted_during_import": 0,
       "half_imports": []}
while not os.path.exists(stop):
    try:
        db.execute("INSERT INTO dead_letters (id, body, reason, attempts, headers_json) "
                   "VALUES (?, ?, 'poison_message', 1, '{}')", (f"w-{uuid.uuid4()}", b"{}"))
        db.commit()
        out["inserted"] += 1
        staging, free = db.execute(
            "SELECT (SELECT count(*) FROM dlq_imports WHERE state = 'live'), "
            "(SELECT count(*) FROM dead_letters "
            "WHERE id >= ? AND id < ? AND replay_claim_owner IS NULL)",
            (prefix, prefix + "\uffff")).fetchone()
        if staging:
            out["inserted_during_import"] += 1
            if free:
                out["half_imports"].append([staging, free])
    except sqlite3.OperationalError as e:
        db.rollback()
        out["failed"] += 1
        out["errors"].append(str(e))
    time.sleep(0.01)
db.close()
print(json.dumps(out))
