#!/usr/bin/env python3
"""Writes examples/dead-letters.jsonl: the bundled, deterministic example dead letters.

All three reasons, several producers and schema versions, a non-UTF-8 poison body, one
large body, and one customer's dead letters from several services. Run it again after changing it; the output is committed (about 200 KB).
"""
import base64, hashlib, json, os, uuid

NS = uuid.UUID("6f1c1d1e-0000-4000-8000-000000000000")
rows = []


def add(n, reason, body, producer=None, schema=None, queue="orders.created", error=None,
        attempts=1, headers=None, at="2026-11-28T22:00:00Z", explicit=True):
    body_bytes = body if isinstance(body, bytes) else json.dumps(body, separators=(",", ":")).encode()
    h = {"x-death": [{"count": attempts, "queue": queue, "reason": "rejected"}],
         "x-first-death-queue": queue, "x-delivery-count": attempts}
    h.update(headers or {})
    row = {
        "id": str(uuid.uuid5(NS, str(n))),
        "reason": reason,
        "attempts": attempts,
        "headers": h,
        "error": error,
        "source_queue": queue,
        "dead_lettered_at": at,
        "body_base64": base64.b64encode(body_bytes).decode(),
        "sha256": hashlib.sha256(body_bytes).hexdigest(),
    }
    if explicit:
        row.update({"producer": producer, "schema_version": schema})
    rows.append(row)


n = 0
# A flood of poison messages from billing v3 (a bad deploy): producer and schema only in the body.
for i in range(12):
    n += 1
    add(n, "poison_message",
        {"event_id": f"evt-bill-{i:04d}", "producer": "billing", "schema_version": "3",
         "amount": "12,50"},
        error="ValueError: could not convert string to float: '12,50'", attempts=1,
        at=f"2026-11-28T22:{10 + i:02d}:00Z", explicit=False)
# Unparseable bodies, one not UTF-8 at all.
n += 1
add(n, "poison_message", b"\xff\xfe\x00garbage\x80\x81", producer="legacy-gateway", schema="1",
    error="UnicodeDecodeError: invalid start byte", at="2026-11-28T21:05:00Z")
n += 1
add(n, "poison_message", b"{\"event_id\": \"evt-trunc\", \"producer\": \"checkout\"",
    producer="checkout", schema="2", error="JSONDecodeError: Expecting ',' delimiter",
    at="2026-11-28T21:06:00Z")
# Business rule rejections from checkout v2.
for i in range(5):
    n += 1
    add(n, "permanent_failure",
        {"event_id": f"evt-chk-{i:04d}", "producer": "checkout", "schema_version": "2",
         "order_id": f"ord-{i}", "country": "XX"},
        producer="checkout", schema="2", error="RuleViolation: unsupported country XX",
        at=f"2026-11-28T20:{i:02d}:00Z", headers={"x-event-id": f"evt-chk-{i:04d}"})
# Inventory was down: retries exhausted, replayable once it is back.
for i in range(8):
    n += 1
    add(n, "retries_exhausted",
        {"event_id": f"evt-inv-{i:04d}", "producer": "inventory", "schema_version": "5",
         "sku": f"sku-{i}", "delta": -1},
        producer="inventory", schema="5", queue="inventory.adjust",
        error="ConnectionError: inventory-db timed out after 5 attempts", attempts=5,
        at=f"2026-11-28T23:{i:02d}:00Z", headers={"x-producer": "inventory"})
# One large body (about 128 KiB of JSON).
n += 1
add(n, "retries_exhausted",
    {"event_id": "evt-inv-bulk", "producer": "inventory", "schema_version": "5",
     "lines": [{"sku": f"sku-{i:05d}", "delta": -1, "note": "x" * 40} for i in range(2000)]},
    producer="inventory", schema="5", queue="inventory.adjust",
    error="PayloadTooLarge: downstream rejected 131072 bytes", attempts=5,
    at="2026-11-28T23:30:00Z")
# A reason dlq does not know is kept as it is.
n += 1
add(n, "quarantined_by_ops", {"event_id": "evt-ops-1"}, producer=None, schema=None,
    queue="misc", error=None, at="2026-11-27T10:00:00Z")
# One customer's dead letters from several services (runbook 09): the customer is in the
# JSON body and, for some, in a header; one service sends plain text, not JSON.
n += 1
add(n, "permanent_failure",
    {"event_id": "evt-ord-0001", "producer": "orders", "schema_version": "4", "order_id": "ord-77",
     "customer": {"id": "c-1042", "tier": "gold"}, "coupon": "SPRING-24"},
    producer="orders", schema="4", error="RuleViolation: coupon SPRING-24 expired",
    at="2026-11-28T20:10:00Z", headers={"x-customer-id": "c-1042"})
n += 1
add(n, "permanent_failure",
    {"event_id": "evt-ord-0002", "producer": "orders", "schema_version": "4", "order_id": "ord-78",
     "customer": {"id": "c-2001", "tier": "basic"}, "coupon": "SPRING-24"},
    producer="orders", schema="4", error="RuleViolation: coupon SPRING-24 expired",
    at="2026-11-28T20:11:00Z", headers={"x-customer-id": "c-2001"})
n += 1
add(n, "permanent_failure",
    {"event_id": "evt-pay-0001", "producer": "payments", "schema_version": "1", "order_id": "ord-77",
     "customer": {"id": "c-1042"}, "amount": 99.90},
    producer="payments", schema="1", error="CardDeclined: insufficient funds",
    at="2026-11-28T20:12:00Z", headers={"x-customer-id": "c-1042"})
n += 1
add(n, "permanent_failure", b"crm-sync: update address of customer c-1042 (order ord-77)",
    producer="crm-sync", schema="1", error="SchemaError: body is not JSON",
    at="2026-11-28T20:13:00Z")

out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dead-letters.jsonl")
with open(out, "w") as f:
    for r in rows:
        f.write(json.dumps(r, separators=(",", ":")) + "\n")
print(f"wrote {len(rows)} dead letters to {out}")
