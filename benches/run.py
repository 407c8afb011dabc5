#!/usr/bin/env python3
"""dlq benchmarks, one run, real services; results go to docs/performance.md.

Generates its own data (nothing large is committed) in a fresh PostgreSQL database and a
temporary SQLite file, uses uniquely named queues, and removes all of it afterwards.

  python3 benches/run.py                 # everything, 1,000,000 rows
  python3 benches/run.py --rows 100000   # a quicker look
  python3 benches/run.py --only replay   # one part: triage | flood | export | scale | inserts | replay | plan
                                         # | capture | bigcapture | bigbody | import_lock | import
                                         # (triage includes content filters, export, flood)
  python3 benches/run.py --only scale --rows 10000000   # aggregate and list at 10M rows (PostgreSQL)
  python3 benches/run.py --only scale --rows 10000000 --keep-db dlq_scale   # generated once, kept
  python3 benches/run.py --only flood --baseline OLD_DLQ   # and an older binary, before/after (also plan, capture, import_lock)

Each timing runs the whole command as a separate process, the way an operator runs it,
and compares it with the equivalent statement run directly by psql / sqlite3 (also a
process that connects and runs one statement). Medians of --runs runs are reported.
"""
import argparse
import base64
import contextlib
import json
import os
import platform
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PG_ADMIN = ["psql", "-X", "-q", "-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-v", "ON_ERROR_STOP=1"]
DLQ = os.path.join(ROOT, "target", "release", "dlq")
QUEUE_TOOL = os.path.join(ROOT, "target", "release", "examples", "queue")
BARE = os.path.join(ROOT, "target", "release", "examples", "bare_publisher")
BARE_CONSUMER = os.path.join(ROOT, "target", "release", "examples", "bare_consumer")


def run(cmd, env=None, stdin=None, check=True):
    r = subprocess.run(cmd, env=env, input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if check and r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr.decode()}")
    return r


def timed(cmd, runs, env=None, code=0):
    """Median-ready times of `runs` runs of cmd, each exiting with `code`."""
    out = []
    for n in range(runs + 1):  # the first: a warm-up
        t = time.perf_counter()
        r = run(cmd, env=env, check=False)
        if r.returncode != code:
            sys.exit(f"failed ({r.returncode}, expected {code}): {' '.join(cmd)}\n{r.stderr.decode()}")
        if n == 0:
            continue
        out.append(time.perf_counter() - t)
    return out


def ms(xs):
    return f"{statistics.median(xs) * 1000:.1f} ms"


def dlq_env(url, amqp=None):
    env = dict(os.environ, DLQ_DATABASE_URL=url, DLQ_OPERATOR="bench", DLQ_OUTPUT="json")
    if amqp:
        env["DLQ_AMQP_URL"] = amqp
    return env


PG_ROWS = """
INSERT INTO dead_letters (id, body, reason, attempts, headers_json, producer, schema_version,
                          source_queue, dead_lettered_at, error)
SELECT 'bench-' || g,
       convert_to('{{"event_id":"evt-' || g || '","customer":{{"id":"c-' || (g % 50000) || '"}},"amount":' || (g % 1000) || ',"pad":"' || repeat('x', 150) || '"}}', 'UTF8'),
       (ARRAY['poison_message','permanent_failure','retries_exhausted'])[1 + (g % 3)],
       1 + g % 5,
       CASE WHEN g % 2 = 0 THEN '{{"x-producer":"svc-' || (g % 20) || '","x-schema-version":"' || (g % 5) || '"}}' ELSE '{{}}' END,
       CASE WHEN g % 2 = 1 THEN 'svc-' || (g % 20) END,
       CASE WHEN g % 2 = 1 THEN (g % 5)::text END,
       'queue-' || (g % 10),
       now() - (g % 2592000) * interval '1 second',
       'Error' || (g % 20) || ': error text ' || (g % 100)
FROM generate_series(1, {n}) g
"""

SQLITE_ROWS = """
WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < {n})
INSERT INTO dead_letters (id, body, reason, attempts, headers_json, producer, schema_version,
                          source_queue, dead_lettered_at, error)
SELECT 'bench-' || n,
       CAST('{{"event_id":"evt-' || n || '","customer":{{"id":"c-' || (n % 50000) || '"}},"amount":' || (n % 1000) || ',"pad":"' || printf('%.150c', 'x') || '"}}' AS BLOB),
       CASE n % 3 WHEN 0 THEN 'poison_message' WHEN 1 THEN 'permanent_failure' ELSE 'retries_exhausted' END,
       1 + n % 5,
       CASE WHEN n % 2 = 0 THEN '{{"x-producer":"svc-' || (n % 20) || '","x-schema-version":"' || (n % 5) || '"}}' ELSE '{{}}' END,
       CASE WHEN n % 2 = 1 THEN 'svc-' || (n % 20) END,
       CASE WHEN n % 2 = 1 THEN CAST(n % 5 AS TEXT) END,
       'queue-' || (n % 10),
       (CAST(strftime('%s', 'now') AS INTEGER) - n % 2592000) * 1000,
       'Error' || (n % 20) || ': error text ' || (n % 100)
FROM g;
ANALYZE;
"""

# The statements dlq runs, written out as an operator would type them.
PG_AGG = """SELECT reason, eff_producer, eff_schema_version, count(*),
 count(*) FILTER (WHERE replayed_at IS NULL AND (replay_claim_expires_at IS NULL OR replay_claim_expires_at <= now())),
 count(*) FILTER (WHERE replayed_at IS NULL AND replay_claim_expires_at > now()),
 count(*) FILTER (WHERE replayed_at IS NOT NULL), min(dead_lettered_at), max(dead_lettered_at)
 FROM dead_letters GROUP BY 1, 2, 3 ORDER BY 4 DESC"""
# dlq list prints the page and "50 of N shown": the page and the count.
PG_LIST = """SELECT id, reason, attempts, replayed_at, replay_claim_owner, replay_claim_expires_at,
 last_replay_error, eff_event_id, error, eff_producer, eff_schema_version, source_queue, exchange,
 routing_key, dead_lettered_at FROM dead_letters WHERE reason = 'retries_exhausted' AND eff_producer = 'svc-5'
 ORDER BY dead_lettered_at DESC, id LIMIT 50;
 SELECT count(*) FROM dead_letters WHERE reason = 'retries_exhausted' AND eff_producer = 'svc-5'"""
SQLITE_AGG = """SELECT reason, eff_producer, eff_schema_version, count(*),
 sum(replayed_at IS NULL AND (replay_claim_expires_at IS NULL OR replay_claim_expires_at <= CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER))),
 sum(replayed_at IS NULL AND replay_claim_expires_at > CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)),
 sum(replayed_at IS NOT NULL), min(dead_lettered_at), max(dead_lettered_at)
 FROM dead_letters GROUP BY 1, 2, 3 ORDER BY 4 DESC"""
SQLITE_LIST = PG_LIST

# `dlq list --grep '"c-4242"'` and `dlq list --field customer.id=c-4242` (20 rows each: the
# page is not full, so no count follows), as dlq sends them. The customer is a JSON field
# in every body; the byte tests (the key in quotes, the value, or a backslash) rule out
# the rows that cannot match before any JSON is parsed.
LIST_COLUMNS = """id, reason, attempts, replayed_at, replay_claim_owner, replay_claim_expires_at,
 last_replay_error, eff_event_id, error, eff_producer, eff_schema_version, source_queue, exchange,
 routing_key, dead_lettered_at, replay_attempt_at, discarded_at, discard_note"""
GREP = '"c-4242"'
FIELD = ("customer.id", "c-4242")


def hexb(text):
    return text.encode().hex()


PG_GREP = f"""SELECT {LIST_COLUMNS} FROM dead_letters WHERE 1=1
 AND position('\\x{hexb(GREP)}'::bytea IN body) > 0 ORDER BY dead_lettered_at DESC, id LIMIT 50"""
PG_FIELD = f"""SELECT {LIST_COLUMNS} FROM dead_letters WHERE 1=1
 AND CASE WHEN body_is_json
   AND (position('\\x{hexb('"id"')}'::bytea IN body) > 0 OR position('\\x5c'::bytea IN body) > 0)
   AND (position('\\x{hexb(FIELD[1])}'::bytea IN body) > 0 OR position('\\x5c'::bytea IN body) > 0)
 THEN dlq_json_match(convert_from(body, 'UTF8'), '{{customer,id}}', '{FIELD[1]}', NULL) ELSE false END
 ORDER BY dead_lettered_at DESC, id LIMIT 50"""
SQLITE_GREP = f"""SELECT {LIST_COLUMNS} FROM dead_letters WHERE 1=1
 AND instr(body, X'{hexb(GREP)}') > 0 ORDER BY dead_lettered_at DESC, id LIMIT 50"""
_DOC = "CAST(body AS TEXT)"
_PATH = "'$.\"customer\".\"id\"'"
SQLITE_FIELD = f"""SELECT {LIST_COLUMNS} FROM dead_letters WHERE 1=1
 AND CASE WHEN 1
   AND (instr(body, X'{hexb('"id"')}') > 0 OR instr(body, X'5c') > 0)
   AND (instr(body, X'{hexb(FIELD[1])}') > 0 OR instr(body, X'5c') > 0)
   AND json_valid({_DOC}) AND json_type({_DOC}) = 'object'
 THEN CASE json_type({_DOC}, {_PATH}) WHEN 'text' THEN json_extract({_DOC}, {_PATH}) = '{FIELD[1]}'
   WHEN 'array' THEN json({_DOC} -> {_PATH}) = json(NULL)
   WHEN 'object' THEN json({_DOC} -> {_PATH}) = json(NULL)
   ELSE ({_DOC} -> {_PATH}) = '{FIELD[1]}' END ELSE false END
 ORDER BY dead_lettered_at DESC, id LIMIT 50"""


def machine():
    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    pg = run(["psql", "--version"]).stdout.decode().strip()
    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores ({cpu}), {mem:.0f} GiB RAM; {pg}; SQLite {run(['sqlite3', '--version']).stdout.decode().split()[0]}"


def generate(args, report, db, tmp):
    """--rows dead letters in the PostgreSQL database db and in a SQLite file in tmp;
    returns (PostgreSQL URL, SQLite path)."""
    n = args.rows
    pg_url = f"postgres://postgres@127.0.0.1:5432/{db}"
    sq_path = os.path.join(tmp, "bench.db")
    for url in (pg_url, f"sqlite://{sq_path}"):
        run([DLQ, "migrate"], env=dlq_env(url))
    t = time.perf_counter()
    # VACUUM ANALYZE: what autovacuum leaves behind on a table in use (statistics and
    # a visibility map); it cannot share a transaction with the INSERT.
    run(["psql", "-X", "-q", "-h", "127.0.0.1", "-U", "postgres", "-d", db, "-c", PG_ROWS.format(n=n),
         "-c", "VACUUM ANALYZE dead_letters"])
    report.append(f"- generated {n:,} rows in PostgreSQL in {time.perf_counter() - t:.0f} s")
    t = time.perf_counter()
    run(["sqlite3", sq_path], stdin=SQLITE_ROWS.format(n=n).encode())
    report.append(f"- generated {n:,} rows in SQLite in {time.perf_counter() - t:.0f} s")
    return pg_url, sq_path


def export_only(args, report):
    """`--only export`: the export part of triage alone, on freshly generated rows."""
    with scratch(with_queue=False) as (_, db, tmp):
        pg_url, sq_path = generate(args, report, db, tmp)
        export(args, report, pg_url, f"sqlite://{sq_path}")


def triage(args, report):
    n = args.rows
    with scratch(with_queue=False) as (_, db, tmp):
        pg_url, sq_path = generate(args, report, db, tmp)
        sq_url = f"sqlite://{sq_path}"
        psql = ["psql", "-X", "-q", "-h", "127.0.0.1", "-U", "postgres", "-d", db, "-o", "/dev/null", "-c"]
        rows = []
        content = []
        for name, url, direct_agg, direct_list, direct_grep, direct_field in (
            ("PostgreSQL", pg_url, psql + [PG_AGG], psql + [PG_LIST], psql + [PG_GREP], psql + [PG_FIELD]),
            ("SQLite", sq_url, ["sqlite3", sq_path, SQLITE_AGG], ["sqlite3", sq_path, SQLITE_LIST],
             ["sqlite3", sq_path, SQLITE_GREP], ["sqlite3", sq_path, SQLITE_FIELD]),
        ):
            env = dlq_env(url)
            a = timed([DLQ, "aggregate", "--by", "reason,producer,schema_version"], args.runs, env)
            ad = timed(direct_agg, args.runs)
            l = timed([DLQ, "list", "--reason", "retries_exhausted", "--producer", "svc-5", "--limit", "50"], args.runs, env)
            ld = timed(direct_list, args.runs)
            rows.append(f"| {name} | aggregate --by reason,producer,schema_version | {ms(a)} | {ms(ad)} | {statistics.median(a) / statistics.median(ad):.2f}x | 1.3x |")
            rows.append(f"| {name} | list --reason R --producer P --limit 50 | {ms(l)} | {ms(ld)} | {statistics.median(l) / statistics.median(ld):.2f}x | 1.5x, < 50 ms |")
            content.append((name, url, direct_grep, direct_field))
        report.append("")
        report.append(f"Triage on {n:,} dead letters (median of {args.runs} runs, each a new process):")
        report.append("")
        report.append("| store | command | dlq | direct SQL | ratio | target |")
        report.append("|---|---|---|---|---|---|")
        report.extend(rows)
        content_filters(args, report, content)
        export(args, report, pg_url, sq_url)
    flood(args, report)




def flood(args, report):
    """`dlq list` on a table during a flood: the rows just bulk-inserted, never vacuumed nor
    analyzed (autovacuum is off for this table, so it stays that way for the whole run): no
    visibility map, so a count visits the heap for every match. The page and the count
    capped at 10,000, against `--count` (the exact count); and the peak RSS of a listing of
    200,000 rows. With --baseline, the same runs of an older binary."""
    n = args.rows
    with scratch(with_queue=False) as (_, db, _tmp):
        # Without TLS: a handshake with this server costs every command the same ~90 ms,
        # whatever it then reads (the replay part measures both).
        url = f"postgres://postgres@127.0.0.1:5432/{db}?sslmode=disable"
        env = dlq_env(url)
        run([DLQ, "migrate"], env=env)
        psql = ["psql", "-X", "-q", "-h", "127.0.0.1", "-U", "postgres", "-d", db]
        t = time.perf_counter()
        run(psql + ["-c", "ALTER TABLE dead_letters SET (autovacuum_enabled = false)", "-c", PG_ROWS.format(n=n)])
        report.append("")
        report.append(f"- flood: generated {n:,} rows in PostgreSQL in {time.perf_counter() - t:.0f} s, not vacuumed nor analyzed")
        binaries = [("dlq", DLQ)] + ([("before", args.baseline)] if args.baseline else [])
        # Row g is g seconds old: the newest twelfth (83,333 of 1,000,000) match.
        cmd = ["list", "--since", f"{n // 12}s"]
        # The first list after the insert also sets the hint bits of the pages it reads.
        first = {}
        for label, exe in binaries:
            t = time.perf_counter()
            run([exe] + cmd, env=env)
            first[label] = time.perf_counter() - t
        rows = []
        for label, exe in binaries:
            for c in [cmd] + ([cmd + ["--count"]] if label == "dlq" else []):
                xs = timed([exe] + c, args.runs, env)
                shown = run([exe] + c, env=env).stderr.decode().strip()
                once = f"{first[label] * 1000:.1f} ms" if c == cmd else ""
                rows.append(f"| {label} | {' '.join(c)} | {once} | {ms(xs)} | {shown} |")
        stats = run(psql + ["-At", "-c", "SELECT coalesce(last_vacuum, last_autovacuum, last_analyze, last_autoanalyze) IS NULL "
                            "FROM pg_stat_user_tables WHERE relname = 'dead_letters'"]).stdout.decode().strip()
        report.append("")
        report.append(f"`dlq {' '.join(cmd)}` ({n // 12:,} matches) on {n:,} rows never vacuumed "
                      f"(still never vacuumed nor analyzed at the end: {'yes' if stats == 't' else 'NO'}); "
                      f"first run after the insert, then the median of {args.runs} runs, each a new process:")
        report.append("")
        report.append("| binary | command | first run | median | stderr |")
        report.append("|---|---|---|---|---|")
        report.extend(rows)
        rss = []
        for label, exe in binaries:
            for fmt in ("json", "table"):
                runs = [measured([exe, "-o", fmt, "list", "--limit", "200000"], env) for _ in range(args.export_runs)]
                rss.append(f"| {label} | list --limit 200000 -o {fmt} | {statistics.median(r[0] for r in runs):.1f} s "
                           f"| {max(r[1] for r in runs):.0f} MiB |")
        report.append("")
        report.append(f"Peak RSS of `dlq list --limit 200000` to /dev/null (median time, largest RSS of {args.export_runs} runs):")
        report.append("")
        report.append("| binary | command | time | peak RSS |")
        report.append("|---|---|---|---|")
        report.extend(rss)


def content_filters(args, report, stores):
    """Content filters against the same SQL, and grouping by error_class against reason."""
    rows = []
    for name, url, direct_grep, direct_field in stores:
        env = dlq_env(url)
        g = timed([DLQ, "list", "--grep", GREP, "--limit", "50"], args.runs, env)
        gd = timed(direct_grep, args.runs)
        f = timed([DLQ, "list", "--field", "=".join(FIELD), "--limit", "50"], args.runs, env)
        fd = timed(direct_field, args.runs)
        by_class = timed([DLQ, "aggregate", "--by", "error_class"], args.runs, env)
        by_reason = timed([DLQ, "aggregate", "--by", "reason"], args.runs, env)
        ratio = lambda x, y: statistics.median(x) / statistics.median(y)
        rows.append(f"| {name} | list --grep '{GREP}' | {ms(g)} | {ms(gd)} (same SQL) | {ratio(g, gd):.2f}x | 1.5x |")
        rows.append(f"| {name} | list --field {'='.join(FIELD)} | {ms(f)} | {ms(fd)} (same SQL) | {ratio(f, fd):.2f}x | 1.5x |")
        rows.append(f"| {name} | aggregate --by error_class | {ms(by_class)} | {ms(by_reason)} (dlq aggregate --by reason) | {ratio(by_class, by_reason):.2f}x | 1.2x |")
    report.append("")
    report.append(f"Content filters and error classes on {args.rows:,} dead letters (median of {args.runs} runs, each a new process):")
    report.append("")
    report.append("| store | command | dlq | baseline | ratio | target |")
    report.append("|---|---|---|---|---|---|")
    report.extend(rows)


def measured(cmd, env):
    """Runs `cmd` with stdout to /dev/null; (seconds, peak RSS in MiB) of that process."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(p.pid, 0)
    took = time.perf_counter() - t
    if status != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stderr.read().decode()}")
    return took, usage.ru_maxrss / 1024


def export(args, report, pg_url, sq_url):
    """Export of every row, and of a third of them: time, rows/s, and peak RSS (flat: the
    rows stream from the database to stdout one at a time)."""
    rows = []
    for name, url in (("PostgreSQL", pg_url), ("SQLite", sq_url)):
        env = dlq_env(url)
        for label, extra, n in (("all rows", [], args.rows),
                                ("a third (--reason poison_message)", ["--reason", "poison_message"], args.rows // 3)):
            runs = [measured([DLQ, "export"] + extra, env) for _ in range(args.export_runs)]
            took = statistics.median(r[0] for r in runs)
            rss = max(r[1] for r in runs)
            rows.append(f"| {name} | export, {label} | {n:,} | {took:.1f} s | {n / took:,.0f} rows/s | {rss:.0f} MiB |")
    report.append("")
    report.append(f"`dlq export` to /dev/null (median of {args.export_runs} runs; peak RSS is the largest of them):")
    report.append("")
    report.append("| store | what | rows | time | throughput | peak RSS |")
    report.append("|---|---|---|---|---|---|")
    report.extend(rows)


@contextlib.contextmanager
def scratch(with_queue=True):
    """A uniquely named queue, PostgreSQL database and temp dir, removed afterwards."""
    queue = "dlq-bench-" + uuid.uuid4().hex[:8]
    db = "dlq_bench_" + uuid.uuid4().hex[:8]
    if with_queue:
        run([QUEUE_TOOL, "declare", queue])
    run(PG_ADMIN + ["-c", f"CREATE DATABASE {db}"])
    tmp = tempfile.mkdtemp()
    try:
        yield queue, db, tmp
    finally:
        if with_queue:
            run([QUEUE_TOOL, "delete", queue], check=False)
        run(PG_ADMIN + ["-c", f"DROP DATABASE IF EXISTS {db} WITH (FORCE)"], check=False)
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def kept_db(db):
    """scale --keep-db NAME: a database made once and left in place (drop it by hand), so
    that a table of 10,000,000 rows is generated once and measured again when the machine
    is quiet."""
    exists = run(PG_ADMIN + ["-tA", "-c", f"SELECT 1 FROM pg_database WHERE datname = '{db}'"]).stdout.strip()
    if not exists:
        run(PG_ADMIN + ["-c", f"CREATE DATABASE {db}"])
    tmp = tempfile.mkdtemp()
    try:
        yield None, db, tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def letters(queue, n, prefix):
    out = []
    for i in range(n):
        body = json.dumps({"event_id": f"evt-{prefix}{i}", "pad": "x" * 150})
        out.append(json.dumps({"id": f"{prefix}{i:06d}", "reason": "retries_exhausted", "attempts": 5,
                               "headers": {"x-producer": "bench"}, "producer": "bench", "schema_version": "1",
                               "source_queue": queue, "body_text": body}))
    return ("\n".join(out) + "\n").encode()


def replay(args, report):
    with scratch() as (queue, db, tmp):
        rows, connects = [], []
        pg = f"postgres://postgres@127.0.0.1:5432/{db}"
        run(PG_ADMIN + ["-c", f"CREATE DATABASE {db}_off"])
        for n, (name, url) in enumerate((("PostgreSQL (sslmode=prefer: TLS on this server)", pg),
                                         ("PostgreSQL (sslmode=prefer), " + KEPT_OFF, pg + "_off"),
                                         ("PostgreSQL (sslmode=disable)", pg + "?sslmode=disable"),
                                         ("SQLite", f"sqlite://{os.path.join(tmp, 'r.db')}"))):
            env = dlq_env(url)
            prefix = f"r{n}-"
            run([DLQ, "migrate"], env=env)
            if name.endswith(KEPT_OFF):
                kept_counts(db + "_off", "DISABLE")
            run([DLQ, "import", "-"], env=env, stdin=letters(queue, args.replays + 1, prefix))
            # The cost of a connection (and its TLS handshake) alone: sqlx 0.9.0 added ~90 ms.
            connects.append(f"| {name} | {ms(timed([DLQ, 'list', '--limit', '1'], args.runs, env=env))} |")
            times = []
            for i in range(args.replays + 1):
                t = time.perf_counter()
                r = run([DLQ, "replay", f"{prefix}{i:06d}", "--yes"], env=env)
                times.append(time.perf_counter() - t)
                assert json.loads(r.stdout)["outcome"] == "replayed"
            times = sorted(times[1:])
            p90 = times[int(len(times) * 0.9) - 1]
            rows.append(f"| {name} | {ms(times)} | {p90 * 1000:.1f} ms | 15 ms |")
        run(PG_ADMIN + ["-c", f"DROP DATABASE {db}_off WITH (FORCE)"])
        report.append("")
        report.append(f"`dlq replay ID --yes`, end to end as a process ({args.replays} replays of distinct IDs):")
        report.append("")
        report.append("| store | p50 | p90 | target p50 |")
        report.append("|---|---|---|---|")
        report.extend(rows)
        report.append("")
        report.append(f"`dlq list --limit 1` as a process (connect, one query; median of {args.runs}):")
        report.append("")
        report.append("| store | median |")
        report.append("|---|---|")
        report.extend(connects)


def service_cpu():
    """CPU seconds used so far by PostgreSQL (live processes, and the backends the
    postmaster has reaped) and by RabbitMQ's Erlang VM, read from /proc."""
    hz = os.sysconf("SC_CLK_TCK")
    pg = beam = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
            with open(f"/proc/{pid}/stat") as f:
                st = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                postmaster = b"-D\0" in f.read()
        except OSError:
            continue
        own = int(st[11]) + int(st[12])
        if comm.startswith("postgres"):
            pg += own + (int(st[13]) + int(st[14]) if postmaster else 0)
        elif comm.startswith("beam"):
            beam += own
    return pg / hz, beam / hz


@contextlib.contextmanager
def cpu_of(into):
    """Appends to `into` the CPU seconds used inside the block by the processes it ran and
    reaped (`dlq` or the bare client), PostgreSQL and RabbitMQ."""
    pg0, beam0 = service_cpu()
    t0 = os.times()
    yield
    t1 = os.times()
    pg1, beam1 = service_cpu()
    own = t1.children_user + t1.children_system - t0.children_user - t0.children_system
    into.append((own, pg1 - pg0, beam1 - beam0))


def plan(args, report):
    """Rounds of: the bare publisher, then dlq on PostgreSQL, then dlq on SQLite, each on
    fresh data; medians over the rounds, since the broker's own speed varies run to run."""
    n = args.plan_items
    body_len = len(json.dumps({"event_id": "evt-p0000000", "pad": "x" * 150}))
    pg = "postgres://postgres@127.0.0.1:5432/"
    # (name, binary, database suffix or None for SQLite); --baseline adds an older binary
    # on PostgreSQL, migrated by itself, in the same rounds.
    stores = [("PostgreSQL", DLQ, ""), (KEPT_OFF, DLQ, "_off"), ("SQLite", DLQ, None)]
    if args.baseline:
        stores.append(("PostgreSQL, baseline binary", args.baseline, "_base"))
    times = {"bare": [], **{s[0]: [] for s in stores}}
    # CPU seconds per run: (the process, PostgreSQL, RabbitMQ), for where the time goes.
    cpu = {"bare": [], **{s[0]: [] for s in stores}}
    for _ in range(args.plan_rounds):
        with scratch() as (queue, db, tmp):
            with cpu_of(cpu["bare"]):
                r = run([BARE, queue, str(n), str(body_len)])
            times["bare"].append(float(r.stdout.decode().strip()))
            run([QUEUE_TOOL, "drain", queue])
            extra = [suffix for _, _, suffix in stores if suffix]
            for suffix in extra:
                run(PG_ADMIN + ["-c", f"CREATE DATABASE {db}{suffix}"])
            for name, dlq, suffix in stores:
                url = pg + db + suffix if suffix is not None else f"sqlite://{os.path.join(tmp, 'p.db')}"
                env = dlq_env(url)
                run([dlq, "migrate"], env=env)
                if name == KEPT_OFF:
                    kept_counts(db + suffix, "DISABLE")
                run([dlq, "import", "-"], env=env, stdin=letters(queue, n, "p"))
                plan_file = os.path.join(tmp, "plan.json")
                with open(plan_file, "wb") as f:
                    f.write(run([dlq, "plan", "--limit", str(n)], env=env).stdout)
                t = time.perf_counter()
                with cpu_of(cpu[name]):
                    run([dlq, "replay", "--plan", plan_file, "--yes", "--batch-size", str(args.batch)],
                        env=env)
                times[name].append(time.perf_counter() - t)
                run([QUEUE_TOOL, "drain", queue])
            for suffix in extra:
                run(PG_ADMIN + ["-c", f"DROP DATABASE {db}{suffix} WITH (FORCE)"])
    bare = statistics.median(times["bare"])
    rows = [f"| bare lapin publisher, pipelined confirms, no database | {bare:.2f} s | {n / bare:,.0f}/s | | |"]
    for name, _, _ in stores:
        took = statistics.median(times[name])
        per_round = [b / t for b, t in zip(times["bare"], times[name])]
        rows.append(f"| dlq replay --plan ({name}, batch {args.batch}) | {took:.2f} s | {n / took:,.0f}/s "
                    f"| {bare / took:.2f} of bare (target >= 0.7) | {min(per_round):.2f} to {max(per_round):.2f} |")
    report.append("")
    report.append(f"Group replay of a {n:,}-item plan, no rate cap, same bodies ({body_len} bytes); "
                  f"median of {args.plan_rounds} rounds, each round the bare publisher then dlq on each store:")
    report.append("")
    report.append("| what | time | throughput | ratio of medians | ratio per round |")
    report.append("|---|---|---|---|---|")
    report.extend(rows)
    cpu_table(report, cpu)


def cpu_table(report, cpu):
    """The CPU seconds of [`cpu_of`] per run, medians, against the machine's cores."""
    cores = os.cpu_count()
    report.append("")
    report.append(f"CPU seconds per run (median), on a machine with {cores} cores shared by all of them:")
    report.append("")
    report.append("| what | the process | PostgreSQL | RabbitMQ | all | all / cores |")
    report.append("|---|---|---|---|---|---|")
    for name in cpu:
        own, pg, beam = (statistics.median(c[i] for c in cpu[name]) for i in range(3))
        every = own + pg + beam
        report.append(f"| {name} | {own:.2f} s | {pg:.2f} s | {beam:.2f} s | {every:.2f} s "
                      f"| {every / cores:.2f} s |")


def run_rss(cmd, env=None):
    """Runs cmd; returns (seconds, peak RSS in MiB, stdout) of that one process."""
    t = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = p.stdout.read()
    err = p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    took = time.perf_counter() - t
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{err.decode()}")
    return took, usage.ru_maxrss / 1024, out


def fill_dead_letter_queue(work, dlq, n, size):
    """Publishes n bodies to a queue whose messages expire at once into dlq (a real x-death
    each), and waits until dlq holds them."""
    run([BARE, work, str(n), str(size)])
    deadline = time.time() + 120
    while int(run([QUEUE_TOOL, "count", dlq]).stdout.decode().strip()) < n:
        if time.time() > deadline:
            sys.exit(f"{dlq} did not fill up")
        time.sleep(0.1)


def capture(args, report):
    """Rounds of: fill a dead-letter queue and drain it with the bare consumer; fill it
    again and capture it into PostgreSQL; again into SQLite (and with --baseline, an older
    binary into PostgreSQL). Then one capture of a tenth as many and one of twice as many
    messages per store, for the peak RSS."""
    n, size, batch = args.capture_messages, 1024, args.capture_batch
    # (name, binary, database suffix or None for SQLite), as in plan()
    stores = [("PostgreSQL", DLQ, ""), (KEPT_OFF, DLQ, "_off"), ("SQLite", DLQ, None)]
    if args.baseline:
        stores.append(("PostgreSQL, baseline binary", args.baseline, "_base"))
    times = {"bare": [], **{s[0]: [] for s in stores}}
    cpu = {"bare": [], **{s[0]: [] for s in stores}}
    rss = {s[0]: {} for s in stores}
    with scratch() as (dlq, db, tmp):
        work = dlq + "-work"
        run([QUEUE_TOOL, "dead-letter-into", work, dlq])
        pg = f"postgres://postgres@127.0.0.1:5432/{db}"
        urls = [pg + suffix if suffix is not None else f"sqlite://{os.path.join(tmp, 'c.db')}"
                for _, _, suffix in stores]
        extra = [suffix for _, _, suffix in stores if suffix]
        for suffix in extra:
            run(PG_ADMIN + ["-c", f"CREATE DATABASE {db}{suffix}"])
        try:
            for (name, binary, suffix), url in zip(stores, urls):
                run([binary, "migrate"], env=dlq_env(url))
                if name == KEPT_OFF:
                    kept_counts(db + suffix, "DISABLE")
            for _ in range(args.capture_rounds):
                fill_dead_letter_queue(work, dlq, n, size)
                with cpu_of(cpu["bare"]):
                    r = run([BARE_CONSUMER, dlq, str(n), str(batch)])
                times["bare"].append(float(r.stdout.decode().strip()))
                for (name, binary, _), url in zip(stores, urls):
                    fill_dead_letter_queue(work, dlq, n, size)
                    with cpu_of(cpu[name]):
                        took, peak, out = run_rss([binary, "capture", "--queue", dlq, "--batch",
                                                   str(batch)], dlq_env(url))
                    assert json.loads(out)["captured"] == n, out
                    times[name].append(took)
                    rss[name].setdefault(n, []).append(peak)
            for k in (n // 10, n * 2):
                for (name, binary, _), url in zip(stores, urls):
                    fill_dead_letter_queue(work, dlq, k, size)
                    _, peak, out = run_rss([binary, "capture", "--queue", dlq, "--batch", str(batch)],
                                           dlq_env(url))
                    assert json.loads(out)["captured"] == k, out
                    rss[name].setdefault(k, []).append(peak)
        finally:
            run([QUEUE_TOOL, "delete", work], check=False)
            for suffix in extra:
                run(PG_ADMIN + ["-c", f"DROP DATABASE IF EXISTS {db}{suffix} WITH (FORCE)"], check=False)
    bare = statistics.median(times["bare"])
    rows = [f"| bare lapin consumer, prefetch {4 * batch} (as capture's), one multiple ack per {batch}, stores nothing | {bare:.2f} s | {n / bare:,.0f}/s | | |"]
    for name, _, _ in stores:
        took = statistics.median(times[name])
        per_round = [b / t for b, t in zip(times["bare"], times[name])]
        rows.append(f"| dlq capture into {name} (--batch {batch}) | {took:.2f} s | {n / took:,.0f}/s "
                    f"| {bare / took:.2f} of bare (target >= 0.7) | {min(per_round):.2f} to {max(per_round):.2f} |")
    report.append("")
    report.append(f"Capture of {n:,} dead letters of {size} bytes (each with a real x-death), a new process each; "
                  f"median of {args.capture_rounds} rounds, each round the bare consumer then dlq on each store:")
    report.append("")
    report.append("| what | time | throughput | ratio of medians | ratio per round |")
    report.append("|---|---|---|---|---|")
    report.extend(rows)
    cpu_table(report, cpu)
    report.append("")
    sizes = sorted(rss[stores[0][0]])
    report.append("Peak RSS of the `dlq capture` process by number of messages captured (median MiB):")
    report.append("")
    report.append("| store | " + " | ".join(f"{k:,}" for k in sizes) + " |")
    report.append("|---|" + "---|" * len(sizes))
    for name, _, _ in stores:
        report.append(f"| {name} | " + " | ".join(f"{statistics.median(rss[name][k]):.1f}" for k in sizes) + " |")


def bigcapture(args, report):
    """`--only bigcapture`: peak RSS of `dlq capture` (a new process, default options) of
    dead-letter queues of large messages into PostgreSQL, several runs each; with
    --baseline an older binary too, alternating with this one."""
    cases = [(100, 4_000_000), (12, 50_000_000)]
    binaries = [("this binary", DLQ)] + ([("baseline", args.baseline)] if args.baseline else [])
    peaks = {}
    with scratch() as (dlq, db, tmp):
        work = dlq + "-work"
        run([QUEUE_TOOL, "dead-letter-into", work, dlq])
        url = f"postgres://postgres@127.0.0.1:5432/{db}"
        run([DLQ, "migrate"], env=dlq_env(url))
        clear = PG_ADMIN[:-4] + ["-d", db, "-c", "TRUNCATE dead_letters CASCADE"]
        try:
            for n, size in cases:
                for _ in range(args.bigcapture_runs):
                    for name, binary in binaries:
                        fill_dead_letter_queue(work, dlq, n, size)
                        took, peak, out = run_rss([binary, "capture", "--queue", dlq], dlq_env(url))
                        assert json.loads(out)["captured"] == n, out
                        peaks.setdefault((n, size, name), []).append((peak, took))
                        run(clear)
        finally:
            run([QUEUE_TOOL, "delete", work], check=False)
    report.append("")
    report.append("Peak RSS of `dlq capture` of large messages into PostgreSQL (default options; "
                  "each run a new process; MiB, and seconds):")
    report.append("")
    report.append("| messages | binary | peak RSS per run | time per run |")
    report.append("|---|---|---|---|")
    for (n, size, name), runs in peaks.items():
        report.append(f"| {n} of {size / 1e6:.0f} MB ({n * size / 1e6:,.0f} MB) | {name} | "
                      + ", ".join(f"{p:.0f}" for p, _ in runs) + " | "
                      + ", ".join(f"{t:.1f}" for _, t in runs) + " |")


BIG = 50 * 2**20


def big_body_lines(tmp, queue):
    """Writes an import line for each of two 50 MiB bodies: random bytes (not UTF-8), and a
    JSON document (UTF-8 with characters JSON escapes, so `show -o json` prints body_text
    too). Written in chunks: a child's peak RSS counts this process's pages until its exec,
    so this process must stay small. Returns (kind, id, line file, body size)."""
    rnd = random.Random(14)
    chunk = 3 * 2**20  # a multiple of 3: base64 of the chunks is base64 of the whole
    text_path = os.path.join(tmp, "text.json")
    with open(text_path, "w", encoding="utf-8") as f:
        f.write('{"event_id": "evt-big", "items": [')
        n = 0
        while f.tell() < BIG - 200:
            note = f'caf\u00e9 "{rnd.random():.6f}"\n'
            f.write(("," if n else "") + json.dumps({"n": n, "note": note, "pad": "x" * 64}, ensure_ascii=False))
            n += 1
        f.write("]}")
    def binary():
        for k in range(0, BIG, chunk):
            yield rnd.randbytes(min(chunk, BIG - k))

    def text():
        with open(text_path, "rb") as f:
            yield from iter(lambda: f.read(chunk), b"")

    sources = {"binary": binary, "JSON text": text}
    out = []
    for kind, chunks in sources.items():
        ident = "big-" + kind.split()[0].lower()
        path = os.path.join(tmp, ident + ".jsonl")
        size = 0
        with open(path, "w") as f:
            head = json.dumps({"id": ident, "reason": "poison_message", "attempts": 1,
                               "headers": {"x-producer": "bench"}, "source_queue": queue})
            f.write(head[:-1] + ', "body_base64": "')
            for c in chunks():
                f.write(base64.b64encode(c).decode())
                size += len(c)
            f.write('"}\n')
        out.append((kind, ident, path, size))
    os.remove(text_path)
    return out


def measured_with_output(cmd, env, tmp):
    """Runs `cmd`; (seconds, peak RSS in MiB, stdout, stderr) of that process."""
    with tempfile.TemporaryFile(dir=tmp) as out, tempfile.TemporaryFile(dir=tmp) as err:
        t = time.perf_counter()
        p = subprocess.Popen(cmd, env=env, stdout=out, stderr=err)
        _, status, usage = os.wait4(p.pid, 0)
        took = time.perf_counter() - t
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{stderr.decode(errors='replace')[-2000:]}")
    return took, usage.ru_maxrss / 1024, stdout, stderr


def sqlx_times(stderr):
    """The claim, attempt and mark statements' own times from sqlx's statement log."""
    out = {}
    for line in stderr.decode(errors="replace").splitlines():
        m = re.search(r'UPDATE dead_letters\s+SET (replay_claim_owner = |replay_attempt_at = |replayed_at = ).*?elapsed_secs=([0-9.e-]+)', line)
        if m:
            step = {"replay_claim_owner = ": "claim", "replay_attempt_at = ": "attempt", "replayed_at = ": "mark"}[m.group(1)]
            out[step] = float(m.group(2))
    return out


def sqlite_body_position(path, runs):
    """What SQLite does on an UPDATE of small columns of a row holding a 50 MiB BLOB, with
    the BLOB second (as in dead_letters) or last: claim-like and mark-like updates (the
    record changes size) and one that keeps the record's size."""
    steps = [
        ("claim (NULL -> token, NULL -> time)", "UPDATE {t} SET owner = 'op:' || lower(hex(randomblob(16))), expires = 1764000000000 + {i} WHERE id = 'a' AND owner IS NULL"),
        ("same size (token -> token, time -> time)", "UPDATE {t} SET owner = 'op:' || lower(hex(randomblob(16))), expires = 1764000000000 + {i} WHERE id = 'a'"),
        ("mark (NULL -> time, time -> NULL)", "UPDATE {t} SET replayed = 1764000000000 + {i}, expires = NULL WHERE id = 'a'"),
        ("read a non-NULL column stored after the BLOB", "SELECT length(owner) FROM {t} WHERE id = 'a'"),
    ]
    times = {}
    for t, columns in (("body second", "id TEXT PRIMARY KEY, body BLOB, owner TEXT, expires INTEGER, replayed INTEGER"),
                       ("body last", "id TEXT PRIMARY KEY, owner TEXT, expires INTEGER, replayed INTEGER, body BLOB")):
        for i in range(runs):
            with contextlib.suppress(FileNotFoundError):
                for suffix in ("", "-wal", "-shm"):
                    os.remove(path + suffix)
            run(["sqlite3", path, f"PRAGMA journal_mode = WAL; CREATE TABLE x ({columns}); "
                 f"INSERT INTO x (id, body) VALUES ('a', randomblob({BIG})); PRAGMA wal_checkpoint(TRUNCATE);"])
            for name, sql in steps:
                # One statement per process, on a file as dlq opens it (WAL, synchronous FULL).
                r = run(["sqlite3", path], stdin=f"PRAGMA synchronous = FULL;\n.timer on\n{sql.format(t='x', i=i)};\n".encode())
                real = float(re.search(r"Run Time: real ([0-9.]+)", r.stdout.decode()).group(1))
                times.setdefault((name, t), []).append(real)
    return times


def bigbody(args, report):
    """A 50 MiB body through import, show and replay on each store: the peak RSS of each
    `dlq` process (wait4) and its ratio to the body; the claim, attempt and mark
    statements' own times (sqlx's statement log, DLQ_LOG=sqlx::query=debug)."""
    rows, steps = [], []
    with scratch() as (queue, db, tmp):
        lines = big_body_lines(tmp, queue)
        stores = (("PostgreSQL", f"postgres://postgres@127.0.0.1:5432/{db}"),
                  ("SQLite", f"sqlite://{os.path.join(tmp, 'big.db')}"))
        for name, url in stores:
            env = dlq_env(url, amqp=None)
            run([DLQ, "migrate"], env=env)
            for kind, ident, line, size in lines:
                peaks = {}
                took, peaks["import"] = measured([DLQ, "import", line], env)
                _, peaks["show (table)"] = measured([DLQ, "-o", "table", "show", ident], env)
                _, peaks["show -o json"] = measured([DLQ, "-o", "json", "show", ident], env)
                replay_took, peaks["replay ID --yes"], out, err = measured_with_output(
                    [DLQ, "replay", ident, "--yes"], dict(env, DLQ_LOG="sqlx::query=debug"), tmp)
                assert json.loads(out)["outcome"] == "replayed", out
                got = run([QUEUE_TOOL, "drain", queue]).stdout.decode()
                assert f"bytes={size}" in got, got
                mib = size / 2**20
                for what, peak in peaks.items():
                    rows.append(f"| {name} | {kind} | {what} | {peak:.0f} MiB | {peak / mib:.2f}x |")
                st = sqlx_times(err)
                steps.append(f"| {name} | {kind} | {took:.1f} s | {replay_took:.1f} s | "
                             + " | ".join(f"{st.get(k, float('nan')) * 1000:.0f} ms" for k in ("claim", "attempt", "mark")) + " |")
        position = sqlite_body_position(os.path.join(tmp, "position.db"), args.bigbody_runs)
    report.append("")
    report.append("A 50 MiB body (generated by the script), each command a new process with stdout to "
                  "/dev/null or a pipe; peak RSS is the process's own (`wait4`), the ratio is to the body:")
    report.append("")
    report.append("| store | body | command | peak RSS | ratio (target <= 3x) |")
    report.append("|---|---|---|---|---|")
    report.extend(rows)
    report.append("")
    report.append("Times: `dlq import` of the line (a process), `dlq replay ID --yes` (a process), and "
                  "the claim, attempt and mark statements as sqlx timed them inside that replay:")
    report.append("")
    report.append("| store | body | import | replay | claim | attempt | mark |")
    report.append("|---|---|---|---|---|---|---|")
    report.extend(steps)
    report.append("")
    report.append(f"SQLite alone (sqlite3, WAL, synchronous FULL, one statement per process), a row "
                  f"holding a 50 MiB BLOB; median of {args.bigbody_runs} runs:")
    report.append("")
    report.append("| statement | BLOB second (as dead_letters) | BLOB last |")
    report.append("|---|---|---|")
    for name in dict.fromkeys(n for n, _ in position):
        report.append(f"| {name} | " + " | ".join(
            f"{statistics.median(position[(name, t)]) * 1000:.0f} ms" for t in ("body second", "body last")) + " |")


def import_lock(args, report):
    """A worker inserting while `dlq import` loads 50,000 rows into the SQLite file they
    share: a Python sqlite3 writer (busy timeout 5 s, Python's default) inserts one row per
    transaction every 10 ms for as long as the import runs; its worst and 99th-percentile
    insert latency, and how many failed. With --baseline, the same with an older binary."""
    import sqlite3
    import threading

    n, size = args.import_rows, args.import_body
    binaries = [("dlq", DLQ)] + ([("before", args.baseline)] if args.baseline else [])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        lines = os.path.join(tmp, "import.jsonl")
        with open(lines, "w") as f:
            for i in range(n):
                body = json.dumps({"event_id": f"evt-{i}", "pad": "x" * size})
                f.write(json.dumps({"id": f"imp-{i:06d}", "reason": "retries_exhausted", "attempts": 1,
                                    "headers": {"x-producer": "bench"}, "source_queue": "q",
                                    "body_text": body}) + "\n")
        for label, exe in binaries:
            path = os.path.join(tmp, f"{label}.db")
            env = dlq_env(f"sqlite://{path}")
            run([exe, "migrate"], env=env)
            lat, failed, done = [], [0], threading.Event()

            def worker():
                db = sqlite3.connect(path, timeout=5)
                i = 0
                while not done.is_set():
                    t = time.perf_counter()
                    try:
                        db.execute("INSERT INTO dead_letters (id, body, reason, attempts, headers_json) "
                                   "VALUES (?, ?, 'poison_message', 1, '{}')", (f"w-{uuid.uuid4()}", b"{}"))
                        db.commit()
                        lat.append(time.perf_counter() - t)
                    except sqlite3.OperationalError:
                        failed[0] += 1
                    i += 1
                    time.sleep(0.01)
                db.close()

            th = threading.Thread(target=worker)
            th.start()
            time.sleep(0.5)
            t = time.perf_counter()
            r = run([exe, "-v", "import", lines], env=env)
            took = time.perf_counter() - t
            time.sleep(0.5)
            done.set()
            th.join()
            # This dlq logs its longest batch and its last transaction; an older one nothing.
            log = r.stderr.decode()
            held = re.search(r"held at most ([0-9.]+)(ms|s|µs) per batch, released in ([0-9.]+)(ms|s|µs)", log)
            held = (f"{held.group(1)} {held.group(2)} per batch, {held.group(3)} {held.group(4)} last"
                    if held else "(not logged)")
            lat.sort()
            p99 = lat[int(len(lat) * 0.99) - 1] if lat else 0
            rows.append(f"| {label} | {took:.1f} s | {held} | {len(lat)} | {failed[0]} "
                        f"| {p99 * 1000:.0f} ms | {lat[-1] * 1000:.0f} ms |")
    report.append("")
    report.append(f"- import into SQLite beside a worker: {n:,} rows of about {size:,} bytes; the worker "
                  "inserts one row per transaction every 10 ms (Python sqlite3, busy timeout 5 s):")
    report.append("")
    report.append("| binary | import took | write lock held (dlq -v) | worker inserts | failed | p99 | worst |")
    report.append("|---|---|---|---|---|---|---|")
    report.extend(rows)


KEPT_OFF = "kept counts off"


def kept_counts(db, how):
    """Turns the counts kept for aggregate (migrations 20261203000300 and
    20261204000200) on or off as an owner does, `dlq_rollup_enable()` / `disable()`:
    off, the four triggers are disabled and the index of each row's writer dropped, so
    writes cost what they cost before the counts."""
    fn = {"ENABLE": "dlq_rollup_enable", "DISABLE": "dlq_rollup_disable"}[how]
    run(["psql", "-X", "-q", "-h", "127.0.0.1", "-U", "postgres", "-d", db, "-v", "ON_ERROR_STOP=1",
         "-c", f"SELECT {fn}()"])


# PG_ROWS for rows first..last (ids bench-first..), so a large table is loaded in chunks.
def pg_rows_chunk(first, last):
    return PG_ROWS.format(n=last).replace("generate_series(1, ", f"generate_series({first}, ")


PG_PLAIN_GROUP_BY = "SELECT reason, eff_producer, eff_schema_version, count(*) FROM dead_letters GROUP BY 1, 2, 3"
PG_SINCE = """SELECT reason, eff_producer, count(*), min(dead_lettered_at), max(dead_lettered_at)
 FROM dead_letters WHERE dead_lettered_at >= now() - interval '2 hours' GROUP BY 1, 2 ORDER BY 3 DESC"""


def scale(args, report):
    """`--only scale --rows 10000000`: aggregate and list on a PostgreSQL table of --rows
    rows generated in the database (1,000,000 rows per INSERT ... SELECT), vacuumed, against
    the same questions asked through psql. The first aggregate after the load folds the
    deltas the load left; it is reported on its own."""
    n = args.rows
    with (kept_db(args.keep_db) if args.keep_db else scratch(with_queue=False)) as (_, db, tmp):
        url = f"postgres://postgres@127.0.0.1:5432/{db}"
        env = dlq_env(url)
        run([DLQ, "migrate"], env=env)
        psql = ["psql", "-X", "-q", "-h", "127.0.0.1", "-U", "postgres", "-d", db, "-o", "/dev/null", "-c"]
        have = int(run(["psql", "-X", "-tA", "-h", "127.0.0.1", "-U", "postgres", "-d", db, "-c",
                        "SELECT count(*) FROM dead_letters"]).stdout.decode().strip())
        if have == n:
            report.append(f"- scale: {n:,} rows generated by an earlier run kept in {db} (the windows moved since)")
        elif have:
            sys.exit(f"{db} holds {have:,} rows, not --rows {n:,}: drop it, or give its row count")
        else:
            t = time.perf_counter()
            for first in range(1, n + 1, 1_000_000):
                run(psql + [pg_rows_chunk(first, min(first + 999_999, n))])
                # A bulk statement's rows are counted by the next fold (a writer's bounded
                # fold leaves them): as the docs say to do after a load.
                run(psql + ["SELECT dlq_rollup_fold()"])
            run(psql + ["VACUUM ANALYZE dead_letters"])
            report.append(f"- scale: generated {n:,} rows in PostgreSQL in {time.perf_counter() - t:.0f} s "
                          "(each 1,000,000 folded into the counts), vacuumed")
        agg = [DLQ, "aggregate", "--by", "reason,producer,schema_version"]
        t = time.perf_counter()
        run(agg, env=env)
        first_run = time.perf_counter() - t
        # What autovacuum does within a minute of that fold (it emptied the deltas and
        # rewrote the counts); the bench's own server may run with autovacuum off.
        run(psql + ["VACUUM ANALYZE dead_letter_rollup, dead_letter_rollup_delta"])
        recent = int(run(["psql", "-X", "-tA", "-h", "127.0.0.1", "-U", "postgres", "-d", db, "-c",
                          "SELECT count(*) FROM dead_letters WHERE dead_lettered_at >= now() - interval '2 hours'"]
                         ).stdout.decode().strip())
        cases = (
            ("aggregate --by reason,producer,schema_version", agg, PG_PLAIN_GROUP_BY, "plain GROUP BY", "<= 0.6x"),
            ("aggregate --by reason,producer,schema_version", agg, PG_AGG, "the same answer in SQL", ""),
            ("list --reason R --producer P --limit 50",
             [DLQ, "list", "--reason", "retries_exhausted", "--producer", "svc-5", "--limit", "50"], PG_LIST, "", "< 50 ms"),
            # Not found as typed, then looked up as the start of an ID (see cli/ids.rs).
            ("show ID-that-matches-nothing", [DLQ, "show", "bench-missing-1"],
             "SELECT * FROM dead_letters WHERE id = 'bench-missing-1'", "exact lookup", "< 50 ms"),
            (f"aggregate --by reason,producer --since 2h ({recent:,} rows)",
             [DLQ, "aggregate", "--by", "reason,producer", "--since", "2h"], PG_SINCE, "", "< 50 ms"),
        )
        rows = []
        for name, cmd, sql, what, target in cases:
            a = timed(cmd, args.runs, env, code=4 if cmd[1] == "show" else 0)
            d = timed(psql + [sql], args.runs)
            rows.append(f"| {name} | {ms(a)} | {ms(d)} {what} | {statistics.median(a) / statistics.median(d):.2f}x | {target} |")
        report.append("")
        report.append(f"Scale: PostgreSQL, {n:,} dead letters (median of {args.runs} runs, each a new process; "
                      f"the first aggregate after the load, which folds its deltas: {first_run * 1000:.0f} ms):")
        report.append("")
        report.append("| command | dlq | psql | ratio | target |")
        report.append("|---|---|---|---|---|")
        report.extend(rows)


PGBENCH_INSERT = """\\set g random(1, 1000000000)
INSERT INTO dead_letters (id, body, reason, attempts, headers_json, event_id, error, producer, schema_version, source_queue)
VALUES ('w-' || :g || '-' || :client_id || '-' || random(), convert_to('{"event_id":"evt-' || :g || '","customer":{"id":"c-' || (:g % 50000) || '"},"pad":"' || repeat('x', 150) || '"}', 'UTF8'),
 (ARRAY['poison_message','permanent_failure','retries_exhausted'])[1 + (:g % 3)], 3, '{"x-producer":"svc-1"}',
 'evt-' || :g, 'ValueError: bad', 'svc-' || (:g % 20), (:g % 5)::text, 'queue-' || (:g % 10));
"""


def inserts(args, report):
    """The workers' inserts with and without the triggers that keep aggregate's counts, on
    one table (--rows rows already in it), alternating: 8 writers of single-row inserts
    (pgbench, one transaction each, as the seed's worker writes), and INSERT ... SELECT of
    100,000 rows. The counts' tables vacuumed and a checkpoint before each measurement;
    medians of --insert-rounds."""
    if not shutil.which("pgbench"):
        report.append("- inserts: skipped, pgbench is not installed (Debian: postgresql-contrib)")
        return
    with scratch(with_queue=False) as (_, db, tmp):
        env = dlq_env(f"postgres://postgres@127.0.0.1:5432/{db}")
        run([DLQ, "migrate"], env=env)
        psql = ["psql", "-X", "-q", "-h", "127.0.0.1", "-U", "postgres", "-d", db, "-v", "ON_ERROR_STOP=1", "-c"]
        run(psql + [PG_ROWS.format(n=args.rows)])
        run(psql + ["VACUUM ANALYZE dead_letters"])
        script = os.path.join(tmp, "insert.sql")
        with open(script, "w") as f:
            f.write(PGBENCH_INSERT)
        tps = {"ENABLE": [], "DISABLE": []}
        bulk = {"ENABLE": [], "DISABLE": []}
        # PostgreSQL's CPU per insert: what the counts cost the server, beside the rate
        # the writers saw (which also waits on commits and shares the cores with pgbench).
        cpu = {"ENABLE": [], "DISABLE": []}
        fold = []
        for r in range(args.insert_rounds):
            for how in ("ENABLE", "DISABLE") if r % 2 == 0 else ("DISABLE", "ENABLE"):
                kept_counts(db, how)
                # What autovacuum does within a minute (it is off on the bench's server):
                # the deltas an earlier round folded are dead, and a fold reads past them.
                run(psql + ["VACUUM dead_letter_rollup_delta, dead_letter_rollup"])
                run(psql + ["CHECKPOINT"])
                pg0, _ = service_cpu()
                out = run(["pgbench", "-h", "127.0.0.1", "-U", "postgres", "-n", "-c", "8", "-j", "2", "-T", "10",
                           "-f", script, db]).stdout.decode()
                pg1, _ = service_cpu()
                tps[how].append(float(re.search(r"tps = ([0-9.]+)", out).group(1)))
                done = int(re.search(r"number of transactions actually processed: ([0-9]+)", out).group(1))
                cpu[how].append((pg1 - pg0) / done * 1e6)
                run(psql + ["CHECKPOINT"])
                t = time.perf_counter()
                run(psql + [pg_rows_chunk(1, 100_000).replace("'bench-' || g", f"'bulk-{r}-{how}-' || g")])
                bulk[how].append(time.perf_counter() - t)
                if how == "ENABLE":
                    # The bulk rows are counted by the next fold (a writer's bounded fold
                    # leaves one statement's rows to it): its cost, reported beside.
                    t = time.perf_counter()
                    run(psql + ["SELECT dlq_rollup_fold()"])
                    fold.append(time.perf_counter() - t)
        on, off = statistics.median(tps["ENABLE"]), statistics.median(tps["DISABLE"])
        bon, boff = statistics.median(bulk["ENABLE"]), statistics.median(bulk["DISABLE"])
        report.append("")
        report.append(f"The workers' inserts with and without the kept counts, one table of {args.rows:,} rows, "
                      f"alternating, median of {args.insert_rounds} rounds:")
        report.append("")
        report.append("| insert | kept counts off (the schema before them) | on | cost on/off | target |")
        report.append("|---|---|---|---|---|")
        report.append(f"| 8 writers, single-row INSERT, one transaction each (pgbench, 10 s) | {off:,.0f}/s | {on:,.0f}/s "
                      f"| {off / on:.2f}x | <= 1.1x |")
        con, coff = statistics.median(cpu["ENABLE"]), statistics.median(cpu["DISABLE"])
        report.append(f"| the same writers, PostgreSQL's CPU per insert | {coff:.0f} µs | {con:.0f} µs | {con / coff:.2f}x | |")
        report.append(f"| INSERT ... SELECT of 100,000 rows | {boff:.2f} s | {bon:.2f} s | {bon / boff:.2f}x | <= 1.1x |")
        report.append(f"| the fold that counts them (`SELECT dlq_rollup_fold()`) | | {statistics.median(fold):.2f} s "
                      f"| {(bon + statistics.median(fold)) / boff:.2f}x with it | |")
        report.append(f"| (per round, writers tps off/on) | {' '.join(f'{x:,.0f}' for x in tps['DISABLE'])} "
                      f"| {' '.join(f'{x:,.0f}' for x in tps['ENABLE'])} | | |")


def import_speed(args, report):
    """`dlq import` of --import-rows export-style lines (one in ten with a history entry)
    into an empty PostgreSQL database and SQLite file, each a process; --baseline adds an
    older binary on PostgreSQL. Median of --export-runs runs, each into a fresh store."""
    n = args.import_rows
    lines = []
    for i in range(n):
        line = {"id": f"imp-{i:07d}", "reason": "retries_exhausted", "attempts": 5,
                "headers": {"x-producer": "bench"}, "producer": "bench", "schema_version": "1",
                "source_queue": "q", "body_text": json.dumps({"event_id": f"evt-imp-{i}", "pad": "x" * 150})}
        if i % 10 == 0:
            line["history"] = [{"at": "2026-01-01T00:00:00Z", "operator": "ops", "action": "note",
                                "outcome": "noted", "detail": f"line {i + 1}"}]
        lines.append(json.dumps(line))
    data = ("\n".join(lines) + "\n").encode()
    stores = [("PostgreSQL", DLQ, "")]
    if args.baseline:
        stores.append(("PostgreSQL, baseline binary", args.baseline, ""))
    stores.append(("SQLite", DLQ, None))
    times = {name: [] for name, _, _ in stores}
    for _ in range(args.export_runs):
        for name, dlq, suffix in stores:
            with scratch(with_queue=False) as (_, db, tmp):
                url = f"postgres://postgres@127.0.0.1:5432/{db}" if suffix is not None \
                    else f"sqlite://{os.path.join(tmp, 'i.db')}"
                env = dlq_env(url)
                run([dlq, "migrate"], env=env)
                t = time.perf_counter()
                run([dlq, "import", "-"], env=env, stdin=data)
                times[name].append(time.perf_counter() - t)
    report.append("")
    report.append(f"`dlq import` of {n:,} lines (bodies of about 190 bytes, one line in ten with a history "
                  f"entry) into an empty store, median of {args.export_runs} runs:")
    report.append("")
    report.append("| store | time | rows/s | runs |")
    report.append("|---|---|---|---|")
    for name, _, _ in stores:
        took = statistics.median(times[name])
        report.append(f"| {name} | {took:.2f} s | {n / took:,.0f} | {' '.join(f'{t:.2f}' for t in times[name])} |")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--runs", type=int, default=15)
    p.add_argument("--replays", type=int, default=100)
    p.add_argument("--plan-items", type=int, default=10_000)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--plan-rounds", type=int, default=5)
    p.add_argument("--capture-messages", type=int, default=20_000)
    p.add_argument("--capture-batch", type=int, default=500)
    p.add_argument("--capture-rounds", type=int, default=3)
    p.add_argument("--export-runs", type=int, default=3)
    p.add_argument("--bigbody-runs", type=int, default=5)
    p.add_argument("--bigcapture-runs", type=int, default=3)
    p.add_argument("--import-rows", type=int, default=50_000)
    p.add_argument("--import-body", type=int, default=2_000, help="import: bytes of padding per body")
    p.add_argument("--insert-rounds", type=int, default=6)
    p.add_argument("--only", choices=["triage", "flood", "export", "scale", "inserts", "replay", "plan", "capture", "bigcapture", "bigbody", "import_lock", "import"])
    p.add_argument("--keep-db", help="scale: generate into this PostgreSQL database once and keep it; "
                   "later runs measure its rows again (drop it by hand)")
    p.add_argument("--baseline", help="flood, import_lock, import, plan, capture, bigcapture: an older dlq binary to compare with (before/after)")
    args = p.parse_args()
    run(["cargo", "build", "--quiet", "--release", "--manifest-path", os.path.join(ROOT, "Cargo.toml"),
         "--bin", "dlq", "--example", "queue", "--example", "bare_publisher", "--example", "bare_consumer"])
    report = [f"Machine: {machine()}", f"Date: {time.strftime('%Y-%m-%d')}", ""]
    # flood and export are also parts of triage: alone only when asked for; scale is
    # meant for 10,000,000 rows and bigcapture moves gigabytes: only when asked for.
    parts = {"export": export_only, "import": import_speed}
    for part in ("triage", "flood", "export", "scale", "inserts", "replay", "plan", "capture", "bigcapture", "bigbody",
                 "import_lock", "import"):
        if args.only == part or (args.only is None and part not in ("flood", "export", "scale", "bigcapture")):
            parts.get(part, globals().get(part))(args, report)
    print("\n".join(report))


if __name__ == "__main__":
    main()
