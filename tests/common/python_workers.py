"""Writes dead letters into a migrated dlq SQLite file the way the seed's Python
workers do: the stdlib sqlite3 module, times in the storage classes SQLAlchemy's
DateTime(timezone=True) and the sqlite3 adapters write (TEXT with microseconds, with
or without an offset), REAL and INTEGER epochs, and text columns bound as bytes.
Then marks rows replayed the way the seed's replayer does (replayed_at as text, the
claim cleared). Usage: python3 python_workers.py FILE QUEUE"""
import json
import sqlite3
import sys

db = sqlite3.connect(sys.argv[1], timeout=5)
queue = sys.argv[2]
# (id, dead_lettered_at, extra columns)
rows = [
    ("py-naive", "2026-11-28 22:10:00.123456", {}),  # sqlite3 adapter / naive UTC
    ("py-tz", "2026-11-29 08:00:00.250000+00:00", {}),  # DateTime(timezone=True)
    ("py-offset", "2026-11-29T10:00:00.5+02:00", {}),  # ISO 8601 with T and an offset
    ("py-real", 1764547200.75, {}),  # time.time(): REAL epoch seconds
    ("py-julian", 2461010.5, {}),  # julianday(): REAL Julian day
    ("py-seconds", 1764633600, {}),  # INTEGER epoch seconds
    ("py-millis", 1764720000123, {}),  # INTEGER milliseconds (dlq before)
    ("py-unreadable-dla", "last tuesday", {}),
    ("py-lease-live", "2026-11-30 12:00:00", {
        "replay_claim_owner": "worker-7",
        "replay_claim_expires_at": "2099-01-01 00:00:00.000001+00:00"}),
    ("py-lease-lapsed", "2026-11-30 12:00:01", {
        "replay_claim_owner": "worker-7",
        "replay_claim_expires_at": "2026-11-30 12:05:00.000000"}),
    ("py-attempt", "2026-11-30 12:00:02", {
        "replay_claim_owner": "worker-7:tok",
        "replay_claim_expires_at": "2026-11-30T12:05:00Z",
        "replay_attempt_at": "2026-11-30 12:04:00.654321"}),
    ("py-discarded", "2026-11-30 12:00:03", {
        "discarded_at": "2026-11-30 13:00:00.000007", "discard_note": "dup"}),
    ("py-replayed-garbage", "2026-11-30 12:00:04", {"replayed_at": "yesterday"}),
]
for i, (rid, at, extra) in enumerate(rows):
    cols = {"id": rid, "body": json.dumps({"n": i}).encode(), "reason": "poison_message",
            "attempts": 1, "headers_json": "{}", "source_queue": queue,
            "dead_lettered_at": at}
    cols.update(extra)
    names = ", ".join(cols)
    marks = ", ".join("?" for _ in cols)
    db.execute(f"INSERT INTO dead_letters ({names}) VALUES ({marks})", list(cols.values()))

# Text columns bound as bytes (a worker passing bytes straight through).
db.execute(
    "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, error, producer, "
    "source_queue, dead_lettered_at) VALUES (?, ?, ?, 1, ?, ?, ?, ?, ?)",
    (b"py-blob-id", b"{}", b"retries_exhausted", b'{"x-producer": "billing"}',
     b"KeyError: 'sku'", b"billing", queue, "2026-11-30 12:00:05"))
db.execute(
    "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, error, "
    "source_queue, dead_lettered_at) VALUES (?, ?, 'poison_message', 1, '{}', ?, ?, ?)",
    (b"py-bytes-\xff\xfe", b"\x00\x01", b"bad \xff byte", queue, "2026-11-30 12:00:06"))

# The seed's replayer: a replay it confirmed (replayed_at as SQLAlchemy writes it, the
# claim cleared).
db.execute("INSERT INTO dead_letters (id, body, reason, attempts, headers_json, "
           "source_queue, dead_lettered_at) VALUES ('py-replayed', X'7b7d', "
           "'poison_message', 1, '{}', ?, '2026-11-30 12:00:07')", (queue,))
db.execute("UPDATE dead_letters SET replay_claim_owner = 'replayer:1', "
           "replay_claim_expires_at = '2026-12-01 13:46:34.334875+00:00' WHERE id = 'py-replayed'")
db.execute("UPDATE dead_letters SET replayed_at = '2026-12-01 13:41:34.334875+00:00', "
           "replay_claim_owner = NULL, replay_claim_expires_at = NULL WHERE id = 'py-replayed'")
db.commit()
db.close()
