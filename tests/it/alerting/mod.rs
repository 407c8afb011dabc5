//! `dlq metrics` (printed and served) and `dlq check`, on PostgreSQL and SQLite: the
//! exposition parsed by real Prometheus parsers, counts checked against SQL. On
//! PostgreSQL they answer from the kept counts: `kept_counts`.

mod kept_counts;

use crate::common::*;
use serde_json::json;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::Stdio;

/// An RFC 3339 time this long before now.
fn ago(secs: i64) -> String {
    (chrono::Utc::now() - chrono::Duration::seconds(secs)).to_rfc3339()
}

/// A row of `reason`/`producer` in `state`, as `dlq import` takes it.
fn row(id: &str, reason: &str, producer: &str, state: &str) -> serde_json::Value {
    let mut r = json!({
        "id": id, "reason": reason, "attempts": 1, "headers": {}, "producer": producer,
        "body_base64": "e30=", "dead_lettered_at": ago(600),
    });
    let o = r.as_object_mut().unwrap();
    match state {
        "pending" => {}
        "replayed" => {
            o.insert("replayed_at".into(), ago(60).into());
        }
        "discarded" => {
            o.insert("discarded_at".into(), ago(60).into());
        }
        "claimed" => {
            o.insert("replay_claim_owner".into(), "op:tok".into());
            o.insert("replay_claim_expires_at".into(), ago(-3600).into());
        }
        "uncertain" => {
            o.insert("replay_claim_owner".into(), "op:tok".into());
            o.insert("replay_claim_expires_at".into(), ago(30).into());
            o.insert("replay_attempt_at".into(), ago(40).into());
        }
        other => panic!("no state {other}"),
    }
    r
}

fn import(db: &TestDb, rows: &[serde_json::Value]) {
    let text: String = rows.iter().map(|r| format!("{r}\n")).collect();
    let r = db.dlq_stdin(&["import", "-"], text.as_bytes());
    assert_eq!(r.code, 0, "import: {}", r.all());
}

/// A replay outcome in the history, as the protocol records it (with where it went).
fn history(db: &TestDb, id: &str, action: &str, outcome: &str) {
    db.sql(&[&format!(
        "INSERT INTO dead_letter_history (dead_letter_id, operator, action, outcome, target) \
         VALUES ('{id}', 'tester', '{action}', '{outcome}', 'exchange \"\" key q')"
    )]);
}

/// One sample of an exposition: its metric, labels (unescaped) and value.
struct Sample {
    metric: String,
    labels: std::collections::HashMap<String, String>,
    value: f64,
}

/// The samples of an exposition, parsed by the `openmetrics-parser` crate's Prometheus
/// 0.0.4 grammar (which resolves the escapes of label values).
fn parse(text: &str) -> Vec<Sample> {
    use openmetrics_parser::PrometheusValue as V;
    let exposition = openmetrics_parser::prometheus::parse_prometheus(text)
        .unwrap_or_else(|e| panic!("unparseable exposition ({e}):\n{text}"));
    let mut out = Vec::new();
    for (name, family) in &exposition.families {
        for s in family.iter_samples() {
            let labels = s.get_labelset().unwrap();
            let value = match &s.value {
                V::Gauge(n) | V::Unknown(n) => n.as_f64(),
                V::Counter(c) => c.value.as_f64(),
                other => panic!("{name}: unexpected {other:?}"),
            };
            out.push(Sample {
                metric: name.clone(),
                labels: labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
                value,
            });
        }
    }
    out
}

/// The value of the sample `name` whose labels include all of `labels`.
fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    let found: Vec<f64> = samples
        .iter()
        .filter(|s| s.metric == name)
        .filter(|s| labels.iter().all(|(k, v)| label(s, k) == Some(*v)))
        .map(|s| s.value)
        .collect();
    assert_eq!(found.len(), 1, "{name}{labels:?}: {} samples", found.len());
    found[0]
}

fn label<'s>(s: &'s Sample, name: &str) -> Option<&'s str> {
    s.labels.get(name).map(String::as_str)
}

/// `promtool check metrics` accepts the exposition (promtool from the distribution's
/// `prometheus` package; see .ci/run).
fn promtool_accepts(text: &str) {
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (apt-get install prometheus)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool refused it: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn metrics(db: &TestDb, args: &[&str]) -> String {
    let mut a = vec!["metrics"];
    a.extend_from_slice(args);
    let r = db.dlq(&a);
    assert_eq!(r.code, 0, "metrics: {}", r.all());
    promtool_accepts(&r.stdout);
    r.stdout
}

const STATES: [&str; 5] = ["pending", "claimed", "uncertain", "replayed", "discarded"];

#[test]
fn metrics_count_every_state_per_pair_as_sql_does() {
    for backend in BACKENDS {
        let db = TestDb::migrated(backend);
        let mut rows = Vec::new();
        for (i, st) in ["pending", "pending", "claimed", "uncertain", "replayed"]
            .iter()
            .enumerate()
        {
            rows.push(row(&format!("a{i}"), "poison_message", "billing", st));
        }
        rows.push(row("b0", "retries_exhausted", "inventory", "discarded"));
        let mut old = row("b1", "retries_exhausted", "inventory", "pending");
        old["dead_lettered_at"] = ago(7200).into();
        rows.push(old);
        import(&db, &rows);
        history(&db, "a4", "replay", "replayed");
        history(&db, "a3", "replay", "uncertain");
        history(&db, "a0", "release", "publish_failed");
        history(&db, "a0", "release", "publish_failed");
        history(&db, "a0", "claim", "claimed");

        let s = parse(&metrics(&db, &[]));
        for (reason, producer) in [
            ("poison_message", "billing"),
            ("retries_exhausted", "inventory"),
        ] {
            let mut sum = 0.0;
            for st in STATES {
                sum += value(
                    &s,
                    "dlq_dead_letters",
                    &[("state", st), ("reason", reason), ("producer", producer)],
                );
            }
            let sql = db.scalar(&format!(
                "SELECT count(*) FROM dead_letters WHERE reason = '{reason}' AND eff_producer = '{producer}'"
            ));
            assert_eq!(sum as i64, sql, "{backend:?} {reason}/{producer}");
        }
        let n = |st, r, p| {
            value(
                &s,
                "dlq_dead_letters",
                &[("state", st), ("reason", r), ("producer", p)],
            )
        };
        assert_eq!(n("pending", "poison_message", "billing"), 2.0);
        assert_eq!(n("claimed", "poison_message", "billing"), 1.0);
        assert_eq!(n("uncertain", "poison_message", "billing"), 1.0);
        assert_eq!(
            n("replayed", "poison_message", "billing") as i64,
            db.scalar("SELECT count(*) FROM dead_letters WHERE replayed_at IS NOT NULL")
        );
        // Zeros included: every state of every pair seen.
        assert_eq!(n("discarded", "poison_message", "billing"), 0.0);
        assert_eq!(n("claimed", "retries_exhausted", "inventory"), 0.0);
        assert_eq!(n("discarded", "retries_exhausted", "inventory"), 1.0);
        assert_eq!(value(&s, "dlq_uncertain_dead_letters", &[]), 1.0);
        let age = value(
            &s,
            "dlq_oldest_pending_age_seconds",
            &[("reason", "retries_exhausted"), ("producer", "inventory")],
        );
        assert!((7150.0..7300.0).contains(&age), "{backend:?}: age {age}");
        let age = value(
            &s,
            "dlq_oldest_pending_age_seconds",
            &[("reason", "poison_message"), ("producer", "billing")],
        );
        assert!((550.0..700.0).contains(&age), "{backend:?}: age {age}");
        for (outcome, want) in [
            ("replayed", 1.0),
            ("uncertain", 1.0),
            ("publish_failed", 2.0),
        ] {
            assert_eq!(
                value(&s, "dlq_replay_outcomes_total", &[("outcome", outcome)]),
                want,
                "{backend:?} {outcome}"
            );
        }
        assert_eq!(value(&s, "dlq_up", &[]), 1.0);

        // The filters narrow every series, the history's too.
        let s = parse(&metrics(&db, &["--producer", "inventory"]));
        assert!(s
            .iter()
            .all(|x| label(x, "producer").is_none_or(|p| p == "inventory")));
        assert_eq!(value(&s, "dlq_uncertain_dead_letters", &[]), 0.0);
        assert_eq!(
            value(
                &s,
                "dlq_replay_outcomes_total",
                &[("outcome", "publish_failed")]
            ),
            0.0
        );
    }
}

#[test]
fn hostile_label_values_are_escaped_as_the_format_says() {
    let hostile = "we\"ird\\pro\nducer";
    for backend in BACKENDS {
        let db = TestDb::migrated(backend);
        import(&db, &[row("h0", "poison_message", hostile, "pending")]);
        let text = metrics(&db, &[]);
        assert!(
            text.contains(r#"producer="we\"ird\\pro\nducer""#),
            "{backend:?}: not escaped:\n{text}"
        );
        let s = parse(&text);
        let n = value(
            &s,
            "dlq_dead_letters",
            &[("state", "pending"), ("producer", hostile)],
        );
        assert_eq!(n, 1.0, "{backend:?}");
    }
}

#[test]
fn max_series_sums_the_smallest_pairs_under_other() {
    for backend in BACKENDS {
        let db = TestDb::migrated(backend);
        let mut rows = Vec::new();
        for (p, n) in [("big", 3), ("mid", 2), ("small", 1)] {
            for i in 0..n {
                rows.push(row(&format!("{p}{i}"), "poison_message", p, "pending"));
            }
        }
        import(&db, &rows);
        let s = parse(&metrics(&db, &["--max-series", "1"]));
        let pending = |p| {
            value(
                &s,
                "dlq_dead_letters",
                &[("state", "pending"), ("producer", p)],
            )
        };
        assert_eq!(pending("big"), 3.0, "{backend:?}");
        assert_eq!(pending("(other)"), 3.0, "{backend:?}");
        assert!(!s.iter().any(|x| label(x, "producer") == Some("mid")));
        let pairs: std::collections::HashSet<_> = s
            .iter()
            .filter(|x| x.metric == "dlq_dead_letters")
            .map(|x| label(x, "producer").unwrap().to_string())
            .collect();
        assert_eq!(pairs.len(), 2, "{backend:?}: {pairs:?}");
    }
}

/// A served `dlq metrics --listen`, killed when dropped.
struct Served {
    child: std::process::Child,
    addr: String,
}

impl Served {
    fn start(db: &TestDb, url: &str) -> Served {
        Served::start_with(db, url, "2s")
    }

    fn start_with(db: &TestDb, url: &str, statement_timeout: &str) -> Served {
        let mut child = db
            .cmd()
            .env("DLQ_DATABASE_URL", url)
            .args([
                "metrics",
                "--listen",
                "127.0.0.1:0",
                "--connect-timeout",
                "2s",
            ])
            .args(["--statement-timeout", statement_timeout])
            .stderr(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        err.read_line(&mut line).unwrap();
        let addr = line
            .trim()
            .strip_prefix("dlq metrics: serving http://")
            .and_then(|l| l.strip_suffix("/metrics"))
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .to_string();
        // Keep reading stderr so the server never blocks on a full pipe.
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut err, &mut std::io::sink());
        });
        Served { child, addr }
    }

    /// One GET: the status line and the body.
    fn get(&self, path: &str) -> (String, String) {
        let mut s = std::net::TcpStream::connect(&self.addr).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(20)))
            .unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        let (head, body) = resp.split_once("\r\n\r\n").unwrap();
        (head.lines().next().unwrap().to_string(), body.to_string())
    }

    fn scrape(&self) -> String {
        let (status, body) = self.get("/metrics");
        assert!(status.contains(" 200 "), "{status}: {body}");
        promtool_accepts(&body);
        body
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn pending_total(text: &str) -> f64 {
    parse(text)
        .iter()
        .filter(|x| x.metric == "dlq_dead_letters" && label(x, "state") == Some("pending"))
        .map(|x| x.value)
        .sum()
}

#[test]
fn listen_serves_a_fresh_count_per_scrape_and_stops_on_sigterm() {
    for backend in BACKENDS {
        let db = TestDb::migrated(backend);
        import(&db, &[row("l0", "poison_message", "billing", "pending")]);
        let mut served = Served::start(&db, &db.url);
        assert_eq!(pending_total(&served.scrape()), 1.0, "{backend:?}");
        import(&db, &[row("l1", "poison_message", "billing", "pending")]);
        assert_eq!(pending_total(&served.scrape()), 2.0, "{backend:?}");
        let (status, _) = served.get("/nothing");
        assert!(status.contains(" 404 "), "{status}");
        signal(&served.child, "TERM");
        let status = served.child.wait().unwrap();
        assert_eq!(status.code(), Some(0), "{backend:?}: SIGTERM");
    }
}

#[test]
fn listen_says_down_while_the_database_is_cut_and_keeps_serving() {
    let db = TestDb::migrated(Backend::Postgres);
    import(&db, &[row("c0", "poison_message", "billing", "pending")]);
    let proxy = Proxy::start("127.0.0.1:5432", OnServerBytes::Nothing);
    let url = db.url.replace("127.0.0.1:5432", &proxy.addr());
    let mut served = Served::start(&db, &url);
    let up = |text: &str| value(&parse(text), "dlq_up", &[]);
    assert_eq!(up(&served.scrape()), 1.0);

    proxy.cut.store(true, std::sync::atomic::Ordering::SeqCst);
    for _ in 0..2 {
        let text = served.scrape();
        let s = parse(&text);
        assert_eq!(up(&text), 0.0);
        assert_eq!(s.len(), 1, "dlq_up 0 and nothing else:\n{text}");
    }

    proxy.cut.store(false, std::sync::atomic::Ordering::SeqCst);
    let text = served.scrape();
    assert_eq!(up(&text), 1.0, "{text}");
    assert_eq!(pending_total(&text), 1.0);
    signal(&served.child, "INT");
    assert_eq!(served.child.wait().unwrap().code(), Some(0), "Ctrl-C");
}

#[test]
fn listen_queries_the_store_once_for_scrapes_that_wait_together() {
    let db = TestDb::migrated(Backend::Postgres);
    import(&db, &[row("w0", "poison_message", "billing", "pending")]);
    // The history's scans, a fixed number per query (one count per outcome); how often
    // dead_letters is read depends on what the kept counts' fold finds to do.
    let scans = || {
        db.scalar(
            "SELECT seq_scan + COALESCE(idx_scan, 0) FROM pg_stat_user_tables \
             WHERE relname = 'dead_letter_history'",
        )
    };
    let lone = scans();
    assert_eq!(db.dlq(&["metrics"]).code, 0);
    std::thread::sleep(std::time::Duration::from_millis(500));
    let one_query = scans() - lone;
    assert!(one_query > 0);
    // A writer holds the table for 2 s: the first scrape's query waits on it.
    let (locked_tx, locked) = std::sync::mpsc::channel();
    let url = db.url.clone();
    let holder = std::thread::spawn(move || {
        rt().block_on(async {
            use sqlx::Connection;
            let mut c = sqlx::PgConnection::connect(&url).await.unwrap();
            let mut tx = c.begin().await.unwrap();
            sqlx::query("LOCK TABLE dead_letters IN ACCESS EXCLUSIVE MODE")
                .execute(&mut *tx)
                .await
                .unwrap();
            locked_tx.send(()).unwrap();
            tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            tx.commit().await.unwrap();
        })
    });
    locked.recv().unwrap();
    let before = scans();
    let mut served = Served::start_with(&db, &db.url, "20s");
    let served_ref = &served;
    let bodies: Vec<String> = std::thread::scope(|s| {
        let first = s.spawn(|| served_ref.scrape());
        std::thread::sleep(std::time::Duration::from_millis(500));
        let rest: Vec<_> = (0..2).map(|_| s.spawn(|| served_ref.scrape())).collect();
        std::iter::once(first)
            .chain(rest)
            .map(|h| h.join().unwrap())
            .collect()
    });
    holder.join().unwrap();
    for b in &bodies {
        assert_eq!(value(&parse(b), "dlq_up", &[]), 1.0, "{b}");
        assert_eq!(b, &bodies[0], "the waiting scrapes get the same text");
    }
    // Its connection closed, the server's backend has reported its scans.
    signal(&served.child, "TERM");
    assert_eq!(served.child.wait().unwrap().code(), Some(0));
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert_eq!(scans() - before, one_query, "three scrapes, one query");
}

fn check(db: &TestDb, args: &[&str]) -> Run {
    let mut a = vec!["check"];
    a.extend_from_slice(args);
    db.dlq(&a)
}

#[test]
fn check_exits_7_for_each_breached_threshold_and_0_when_all_hold() {
    for backend in BACKENDS {
        let db = TestDb::migrated(backend);
        let mut old = row("k0", "poison_message", "billing", "pending");
        old["dead_lettered_at"] = ago(3 * 3600 + 12 * 60 + 30).into();
        import(
            &db,
            &[
                old,
                row("k1", "poison_message", "billing", "pending"),
                row("k2", "poison_message", "billing", "uncertain"),
            ],
        );
        for (args, code) in [
            (vec!["--max-pending", "2"], 0),
            (vec!["--max-pending", "1"], 7),
            (vec!["--max-age", "4h"], 0),
            (vec!["--max-age", "1h"], 7),
            (vec!["--max-uncertain", "1"], 0),
            (vec!["--max-uncertain", "0"], 7),
            (vec!["--max-uncertain", "0", "--producer", "nobody"], 0),
        ] {
            let r = check(&db, &args);
            assert_eq!(r.code, code, "{backend:?} {args:?}: {}", r.all());
        }

        let r = check(
            &db,
            &[
                "--max-pending",
                "1",
                "--max-age",
                "1h",
                "--max-uncertain",
                "5",
            ],
        );
        assert_eq!(r.code, 7);
        assert_eq!(
            r.json(),
            json!({
                "ok": false,
                "breaches": [
                    {"check": "pending", "value": 2, "max": 1},
                    {"check": "oldest_pending_age_seconds", "value": r.json()["oldest_pending_age_seconds"], "max": 3600},
                ],
                "pending": 2,
                "uncertain": 1,
                "oldest_pending_age_seconds": r.json()["oldest_pending_age_seconds"],
            }),
            "{backend:?}"
        );
        let age = r.json()["oldest_pending_age_seconds"].as_i64().unwrap();
        assert!((11_500..11_700).contains(&age), "{age}");

        let r = check(
            &db,
            &["-o", "table", "--max-pending", "1", "--max-age", "1h"],
        );
        assert_eq!(r.code, 7);
        assert_eq!(
            r.stdout, "dlq check: CRITICAL: 2 pending > 1; oldest pending 3h12m > 1h\n",
            "{backend:?}"
        );
        let r = check(&db, &["-o", "table", "--max-pending", "10"]);
        assert_eq!(r.code, 0);
        assert_eq!(
            r.stdout,
            "dlq check: OK: 2 pending, 1 uncertain, oldest pending 3h12m\n"
        );
        let r = check(&db, &["--max-pending", "10"]);
        assert_eq!(
            r.json(),
            json!({"ok": true, "breaches": [], "pending": 2, "uncertain": 1,
                   "oldest_pending_age_seconds": r.json()["oldest_pending_age_seconds"]})
        );
    }
}

#[test]
fn check_without_a_threshold_is_usage_and_an_unreadable_store_is_1() {
    let db = TestDb::migrated(Backend::Sqlite);
    let r = check(&db, &[]);
    assert_eq!(r.code, 2, "{}", r.all());

    // An empty store: nothing pending, no age.
    let r = check(&db, &["--max-age", "1h"]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(
        r.json()["oldest_pending_age_seconds"],
        serde_json::Value::Null
    );

    // A bad filter stops `--listen` at once (not a `dlq_up 0` at every scrape).
    let r = db.dlq(&["metrics", "--listen", "127.0.0.1:0", "--grep", ""]);
    assert_eq!(r.code, 2, "{}", r.all());
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let r = db.dlq(&["metrics", "--listen", &addr]);
    assert_eq!(r.code, 1, "{}", r.all());
    assert!(r.stderr.contains("cannot listen on"), "{}", r.stderr);

    let unmigrated = TestDb::new(Backend::Postgres);
    let r = check(&unmigrated, &["--max-pending", "1"]);
    assert_eq!(r.code, 1, "{}", r.all());
    let r = unmigrated.dlq_env(
        &["check", "--max-pending", "1", "--connect-timeout", "1s"],
        &[(
            "DLQ_DATABASE_URL",
            "postgres://postgres@127.0.0.1:1/nothing",
        )],
    );
    assert_eq!(r.code, 1, "{}", r.all());
    assert!(r.stdout.is_empty(), "{}", r.stdout);
}

/// A run that finds a row already `uncertain` says so (exit 6, and a history entry), but
/// sent nothing: of its reruns only the first record of that doubt counts (the run that
/// attempted it, a crash here, wrote none).
// Once broke: each rerun added one to `dlq_replay_outcomes_total{outcome="uncertain"}`.
#[test]
fn reruns_that_find_a_row_uncertain_count_it_once() {
    for backend in BACKENDS {
        let db = TestDb::migrated(backend);
        let mut u = row("u", "poison_message", "billing", "uncertain");
        u["source_queue"] = unique("dlq_rerun_uncertain").into();
        import(&db, &[u]);
        for _ in 0..2 {
            let r = db.dlq(&["replay", "u", "--yes"]);
            assert_eq!(r.code, 6, "{backend:?}: {}", r.all());
        }
        let said = db.show("u")["history"].as_array().unwrap().len();
        assert_eq!(said, 2, "{backend:?}: each rerun is recorded");
        let s = parse(&metrics(&db, &[]));
        for (outcome, want) in [
            ("uncertain", 1.0),
            ("replayed", 0.0),
            ("publish_failed", 0.0),
        ] {
            let n = value(&s, "dlq_replay_outcomes_total", &[("outcome", outcome)]);
            assert_eq!(n, want, "{backend:?} {outcome}");
        }
    }
}

/// A replay that was confirmed and then lost its database (so its own `uncertain` entry
/// was never written) counts as one uncertain outcome once a rerun records the row
/// `uncertain`, however many reruns do.
// Once broke (review 36): the counter took only entries with a target, and said nothing
// may be out while a message was.
#[test]
fn a_replay_that_lost_its_database_after_the_confirm_counts_as_uncertain() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("dlq_outcome_db_lost");
    let db = TestDb::migrated(Backend::Postgres);
    db.add(letter("d1", &q, br#"{"n":1}"#));
    let proxies = DbCutAtConfirm::start();
    let r = proxies.run(
        &db,
        &[
            "replay",
            "d1",
            "--yes",
            "--connect-timeout",
            "1s",
            "--lease",
            "5m",
            "--settle-timeout",
            "2s",
        ],
    );
    assert_eq!(r.code, 6, "{}", r.all());
    assert_eq!(rabbit.drain(&q).len(), 1, "published once");
    // The operator's rerun says uncertain, as the runbook does.
    let r = db.dlq(&["replay", "d1", "--yes"]);
    assert_eq!(r.code, 6, "{}", r.all());
    assert_eq!(db.ids(&["--state", "uncertain"]), vec!["d1"]);
    assert_eq!(db.dlq(&["replay", "d1", "--yes"]).code, 6);
    let s = parse(&metrics(&db, &[]));
    let n = value(&s, "dlq_replay_outcomes_total", &[("outcome", "uncertain")]);
    assert_eq!(n, 1.0, "a confirmed publish left uncertain counts once");
}
