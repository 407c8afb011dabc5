//! Findings of the adversarial review of protocol v2 (commit 8b01791), each a test that
//! failed before its fix: old v1 tokens and imported owners could clear an uncertain
//! row, a v1 binary could claim one after the upgrade, a lost mark reply was reported as
//! doubt, and a publish that did not complete could still go out after its row was
//! resolved. Run: cargo test --test review_findings

mod common;
use common::*;
use std::io::BufRead;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A PostgreSQL database at the v1 schema (the migrations before protocol v2).
fn v1_postgres() -> TestDb {
    let db = TestDb::new(Backend::Postgres);
    let dir = tempfile::tempdir().unwrap();
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations/postgres");
    for f in std::fs::read_dir(&src).unwrap() {
        let f = f.unwrap();
        if f.file_name().to_string_lossy().starts_with("20261129") {
            std::fs::copy(f.path(), dir.path().join(f.file_name())).unwrap();
        }
    }
    rt().block_on(async {
        let m = sqlx::migrate::Migrator::new(dir.path()).await.unwrap();
        let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
        m.run(&pool).await.unwrap();
        pool.close().await;
    });
    db
}

fn v1_row(db: &TestDb, id: &str, queue: &str, owner: &str, expires: &str) {
    db.sql(&[&format!(
        "INSERT INTO dead_letters (id, body, reason, attempts, headers_json, replayed_at, \
         replay_claim_owner, replay_claim_expires_at, source_queue) \
         VALUES ('{id}', '\\x7b7d'::bytea, 'retries_exhausted', 3, '{{}}', NULL, '{owner}', {expires}, '{queue}')"
    )]);
}

fn state(db: &TestDb, id: &str) -> String {
    db.show(id)["state"].as_str().unwrap().to_string()
}

/// Finding 1a. A v1 row whose claim was held at upgrade time becomes `uncertain` (a v1
/// run may have published it). The v1 token (v1 printed it in `claim`, in `list -o json`
/// and in history) still owns the row, and `release` accepts any row with an open
/// attempt, lease or no lease: the uncertain row goes back to `pending`, and the next
/// replay publishes it again. Contract: "uncertain ... stays uncertain, whatever its
/// lease does, until an operator resolves it"; "a stale token can neither mark nor
/// release".
#[test]
fn review_v1_token_releases_an_upgraded_uncertain_row() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("rv_v1_rel");
    let db = v1_postgres();
    v1_row(
        &db,
        "v-lapsed",
        &q,
        "carol:cccc",
        "now() - interval '1 hour'",
    );
    let r = db.dlq(&["migrate"]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(state(&db, "v-lapsed"), "uncertain");

    let r = db.dlq(&["release", "v-lapsed", "--token", "carol:cccc"]);
    let after = state(&db, "v-lapsed");
    // Show what a rerun then does (for the report), before asserting.
    let replay = db.dlq(&["replay", "v-lapsed", "--yes"]);
    let published = rabbit.drain(&q).len();
    assert!(
        r.code == 3 && after == "uncertain",
        "release with the v1 token: exit {} (want 3), state now {after:?} (want uncertain); \
         a following `replay` exited {} and published {published} message(s)\n{}",
        r.code,
        replay.code,
        r.all()
    );
}

/// Finding 1b. Same root cause through `replay --token`: `held()` does not exclude rows
/// with an attempt, the attempt step then refuses, and the "not attempted" path releases
/// the row with the v1 token: an upgraded (possibly published) row becomes `pending`.
#[test]
fn review_v1_token_replay_turns_an_upgraded_row_pending() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("rv_v1_tok");
    let db = v1_postgres();
    v1_row(&db, "v-live", &q, "bob:bbbb", "now() + interval '1 hour'");
    let r = db.dlq(&["migrate"]);
    assert_eq!(r.code, 0, "{}", r.all());
    let r = db.dlq(&["replay", "v-live", "--token", "bob:bbbb", "--yes"]);
    assert_eq!(rabbit.drain(&q).len(), 0);
    // Time passes: the v1 lease ends.
    db.sql(&["UPDATE dead_letters SET replay_claim_expires_at = now() - interval '1 second' WHERE replay_claim_expires_at IS NOT NULL"]);
    let after = state(&db, "v-live");
    assert_eq!(
        after,
        "uncertain",
        "replay --token <v1 token> exited {} and left the upgraded row {after:?}: {}",
        r.code,
        r.all()
    );
}

/// Finding 2. The migration does not fence v1 binaries. A v1 `dlq` (still installed on
/// an operator's laptop or in a cron job) claims with this exact statement (v1
/// src/store/postgres.rs, commit 14660fb), which knows nothing of replay_attempt_at or
/// discarded_at: it claims `uncertain` rows and then publishes them again.
#[test]
fn review_v1_binary_claims_uncertain_rows_after_the_upgrade() {
    let db = v1_postgres();
    v1_row(
        &db,
        "v-crashed",
        "q",
        "carol:cccc",
        "now() - interval '1 hour'",
    );
    let r = db.dlq(&["migrate"]);
    assert_eq!(r.code, 0, "{}", r.all());
    assert_eq!(state(&db, "v-crashed"), "uncertain");
    let claimed = rt().block_on(async {
        let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
        // v1's claim, minus its history CTE.
        let n = sqlx::query(
            "UPDATE dead_letters SET replay_claim_owner = $2, \
                 replay_claim_expires_at = now() + make_interval(secs => $3::float8 / 1000.0) \
             WHERE id = ANY($1) AND replayed_at IS NULL \
               AND (replay_claim_expires_at IS NULL OR replay_claim_expires_at <= now())",
        )
        .bind(vec!["v-crashed".to_string()])
        .bind("old-laptop:1111")
        .bind(300_000i64)
        .execute(&pool)
        .await;
        pool.close().await;
        n
    });
    // The database refuses: the v1 binary fails with an error instead of publishing.
    let err = claimed.expect_err(
        "a v1 binary claimed an uncertain row after `dlq migrate`; its replay would publish it again",
    );
    assert!(err.to_string().contains("uncertain or discarded"), "{err}");
    assert_eq!(state(&db, "v-crashed"), "uncertain");
}

/// Finding 1c. `import` takes replay_claim_owner / replay_attempt_at as given, and
/// `show -o json` prints the owner as its operator part. A row imported in the shape
/// `show` prints is owned by the token "alice" (guessable), and `release --token alice`
/// turns an uncertain row pending.
#[test]
fn review_imported_uncertain_row_is_released_by_the_operator_name() {
    let db = TestDb::migrated(Backend::Sqlite);
    let row = serde_json::json!({
        "id": "imp1", "reason": "retries_exhausted", "attempts": 1, "headers": {},
        "body_base64": "e30=", "source_queue": "q",
        "replay_claim_owner": "alice",
        "replay_claim_expires_at": "2026-01-01T00:00:00Z",
        "replay_attempt_at": "2026-01-01T00:00:00Z",
        "last_replay_error": "no publisher confirm within 10s"
    });
    db.add(row);
    assert_eq!(state(&db, "imp1"), "uncertain");
    assert_eq!(db.show("imp1")["replay_claim_owner"], "alice");
    let r = db.dlq(&["release", "imp1", "--token", "alice"]);
    let after = state(&db, "imp1");
    assert!(
        r.code == 3 && after == "uncertain",
        "release --token alice: exit {}, state {after:?}: {}",
        r.code,
        r.all()
    );
}

/// Finding 5. A mark whose COMMIT succeeded but whose reply was lost is retried; the retry
/// finds the row already replayed and returns no ID. It was reported `uncertain`
/// although the row is `replayed`; now the row is read back.
#[test]
fn review_lost_mark_reply_reports_a_replayed_row_as_uncertain() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("rv_lostmark");
    let db = TestDb::migrated(Backend::Postgres);
    db.add(letter("m1", &q, br#"{"event_id":"evt-m1"}"#));
    let report = replay_through(&db, "m1", Fault::LoseMarkReply);
    assert_eq!(rabbit.drain(&q).len(), 1);
    assert_eq!(state(&db, "m1"), "replayed");
    assert_eq!(
        report.outcome,
        dlq::Outcome::Replayed,
        "row is replayed but the run reported {:?}: {}",
        report.outcome,
        report.detail
    );
}

/// What the wrapper store of [`lost_reply`] does once.
#[derive(PartialEq)]
enum Fault {
    LoseMarkReply,
    RivalAttempt,
}

/// `dlq replay ID --yes` through the wrapper store of [`lost_reply`], as the library runs it.
fn replay_through(db: &TestDb, id: &str, fault: Fault) -> dlq::replay::ItemReport {
    use dlq::store::Store;
    rt().block_on(async {
        let inner = dlq::store::open(
            &dlq::secret::SecretUrl::new(db.url.clone()),
            &dlq::store::StoreOptions::default(),
        )
        .await
        .unwrap();
        let store = lost_reply::LoseFirstMarkReply {
            inner,
            armed: AtomicBool::new(fault == Fault::LoseMarkReply),
            rival: AtomicBool::new(fault == Fault::RivalAttempt),
        };
        let mut broker = dlq::publisher::Broker::new(
            vec![dlq::secret::SecretUrl::new(AMQP)],
            dlq::publisher::PublisherOptions {
                connect_timeout: Duration::from_secs(5),
                confirm_timeout: Duration::from_secs(5),
                connection_name: "review".into(),
                tls: Default::default(),
                topology: Default::default(),
            },
            None,
        );
        let opts = dlq::replay::ReplayOptions {
            operator: "tester".into(),
            lease: Duration::from_secs(60),
            ..Default::default()
        };
        let items = [dlq::replay::Item {
            id: id.into(),
            expected_sha256: None,
        }];
        let stop = AtomicBool::new(false);
        let r = dlq::replay::replay(&store, &mut broker, &items, &opts, &stop)
            .await
            .unwrap();
        broker.close().await;
        store.close().await;
        r.into_iter().next().unwrap()
    })
}

/// Two holders of one hand-taken token both pass the claim; the one whose attempt finds
/// the row already attempted publishes nothing. Once broke: it reported `not_replayed`
/// (exit 3) although the rival's attempt left the row `uncertain` (review of issue 20).
#[test]
fn a_replay_beaten_to_the_attempt_reports_the_open_attempt_uncertain() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("rv_rival");
    let db = TestDb::migrated(Backend::Postgres);
    db.add(letter("r1", &q, br#"{"event_id":"evt-r1"}"#));
    let report = replay_through(&db, "r1", Fault::RivalAttempt);
    assert!(rabbit.drain(&q).is_empty(), "this run published nothing");
    assert_eq!(state(&db, "r1"), "uncertain");
    assert_eq!(report.outcome, dlq::Outcome::Uncertain, "{}", report.detail);
}

mod lost_reply {
    use async_trait::async_trait;
    use chrono::{DateTime, Utc};
    use dlq::model::*;
    use dlq::store::*;
    use dlq::{DlqError, Result};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    /// The real store, except that the first mark commits and then "loses its reply"
    /// (`armed`), and that the first attempt is beaten by a rival holding the same token
    /// (`rival`: two holders of one hand-taken token that both passed the claim).
    pub struct LoseFirstMarkReply {
        pub inner: Box<dyn Store>,
        pub armed: AtomicBool,
        pub rival: AtomicBool,
    }

    #[async_trait]
    impl Reads for LoseFirstMarkReply {
        async fn check_schema(&self) -> Result<()> {
            self.inner.check_schema().await
        }
        async fn now(&self) -> Result<DateTime<Utc>> {
            self.inner.now().await
        }
        async fn aggregate(&self, d: &[Dimension], f: &Filter) -> Result<Vec<Group>> {
            self.inner.aggregate(d, f).await
        }
        async fn load(&self, ids: &[String]) -> Result<Vec<DeadLetter>> {
            self.inner.load(ids).await
        }
        async fn summaries(&self, ids: &[String]) -> Result<Vec<Summary>> {
            self.inner.summaries(ids).await
        }
        async fn history(&self, id: &str) -> Result<Vec<HistoryEntry>> {
            self.inner.history(id).await
        }
        async fn revised_as(&self, id: &str) -> Result<Vec<String>> {
            self.inner.revised_as(id).await
        }
        async fn plan_candidates(&self, f: &Filter, limit: i64) -> Result<Vec<PlanCandidate>> {
            self.inner.plan_candidates(f, limit).await
        }
        async fn held(&self, ids: &[String], token: &str) -> Result<Vec<DeadLetter>> {
            self.inner.held(ids, token).await
        }
        async fn dead_lettered_since(
            &self,
            after: &(DateTime<Utc>, String),
            limit: i64,
        ) -> Result<Vec<(String, String, DateTime<Utc>)>> {
            self.inner.dead_lettered_since(after, limit).await
        }
        async fn ids_starting_with(&self, prefix: &str, limit: i64) -> dlq::Result<Vec<String>> {
            self.inner.ids_starting_with(prefix, limit).await
        }
        async fn database_id(&self) -> dlq::Result<String> {
            self.inner.database_id().await
        }
        async fn count(&self, filter: &dlq::model::Filter) -> dlq::Result<i64> {
            self.inner.count(filter).await
        }
        async fn export(
            &self,
            filter: &dlq::model::Filter,
            sink: &mut (dyn FnMut(dlq::store::NewDeadLetter) -> dlq::Result<()> + Send),
        ) -> dlq::Result<u64> {
            self.inner.export(filter, sink).await
        }

        async fn list_each(
            &self,
            f: &Filter,
            limit: i64,
            sink: &mut (dyn FnMut(Summary) -> Result<()> + Send),
        ) -> Result<u64> {
            self.inner.list_each(f, limit, sink).await
        }
        async fn count_at_most(&self, f: &Filter, cap: i64) -> Result<i64> {
            self.inner.count_at_most(f, cap).await
        }
    }

    #[async_trait]
    impl AlertReads for LoseFirstMarkReply {
        async fn gauges(&self, f: &Filter) -> Result<dlq::store::alerting::Gauges> {
            self.inner.gauges(f).await
        }
    }

    #[async_trait]
    impl dlq::store::Revise for LoseFirstMarkReply {
        async fn revise(&self, r: &dlq::store::NewRevision) -> Result<dlq::store::RevisionWrite> {
            self.inner.revise(r).await
        }
    }

    #[async_trait]
    impl Store for LoseFirstMarkReply {
        async fn migrate(&self) -> Result<Vec<String>> {
            self.inner.migrate().await
        }
        async fn import(&self, rows: Vec<NewDeadLetter>, skip: bool) -> Result<ImportReport> {
            self.inner.import(rows, skip).await
        }
        async fn claim(
            &self,
            ids: &[String],
            token: &str,
            lease: Duration,
            h: &[NewHistory],
        ) -> Result<Vec<dlq::store::Claimed>> {
            self.inner.claim(ids, token, lease, h).await
        }
        async fn attempt(
            &self,
            ids: &[String],
            token: &str,
            new_token: &str,
            outlive: Duration,
            h: &[NewHistory],
        ) -> Result<Vec<String>> {
            if self.rival.swap(false, Ordering::SeqCst) {
                let rival = format!("rival:{}", uuid::Uuid::new_v4());
                self.inner.attempt(ids, token, &rival, outlive, &[]).await?;
            }
            self.inner.attempt(ids, token, new_token, outlive, h).await
        }
        async fn mark_replayed(
            &self,
            ids: &[String],
            token: &str,
            h: &[NewHistory],
        ) -> Result<Vec<String>> {
            let r = self.inner.mark_replayed(ids, token, h).await;
            if r.is_ok() && self.armed.swap(false, Ordering::SeqCst) {
                return Err(DlqError::Unavailable {
                    what: "connection reset (simulated after COMMIT)".into(),
                    source: None,
                });
            }
            r
        }
        async fn release(
            &self,
            ids: &[String],
            token: &str,
            e: Option<&str>,
            h: &[NewHistory],
        ) -> Result<Vec<String>> {
            self.inner.release(ids, token, e, h).await
        }
        async fn settle_uncertain(
            &self,
            ids: &[String],
            token: &str,
            e: &str,
            end: dlq::store::LeaseAfter,
            h: &[NewHistory],
        ) -> Result<Vec<String>> {
            self.inner.settle_uncertain(ids, token, e, end, h).await
        }
        async fn resolve(
            &self,
            ids: &[String],
            resolution: dlq::store::Resolution,
            h: &[NewHistory],
        ) -> Result<Vec<String>> {
            self.inner.resolve(ids, resolution, h).await
        }
        async fn append_history(&self, e: &[NewHistory]) -> Result<()> {
            self.inner.append_history(e).await
        }
        async fn close(&self) {
            self.inner.close().await
        }
        async fn capture(
            &self,
            rows: &[dlq::store::CapturedLetter],
        ) -> dlq::Result<Vec<dlq::store::CaptureOutcome>> {
            self.inner.capture(rows).await
        }
        async fn discard(
            &self,
            ids: &[String],
            note: &str,
            h: &[NewHistory],
        ) -> dlq::Result<Vec<String>> {
            self.inner.discard(ids, note, h).await
        }
        async fn restore(&self, ids: &[String], h: &[NewHistory]) -> dlq::Result<Vec<String>> {
            self.inner.restore(ids, h).await
        }
        async fn prune_batch(
            &self,
            filter: &dlq::model::Filter,
            after: Option<&str>,
            window: i64,
        ) -> dlq::Result<(Option<String>, u64)> {
            self.inner.prune_batch(filter, after, window).await
        }
    }
}

/// A proxy to RabbitMQ that, once the server has answered confirm.select, stops reading
/// what the client sends until `paused` is cleared: the client's socket fills up and a
/// large publish cannot be written (what a congested or throttled link does).
struct StallingProxy {
    port: u16,
    paused: Arc<AtomicBool>,
}

const CONFIRM_SELECT_OK: [u8; 4] = [0x00, 0x55, 0x00, 0x0B];

impl StallingProxy {
    fn start(upstream: &str) -> StallingProxy {
        let upstream = upstream.to_string();
        let paused = Arc::new(AtomicBool::new(false));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let p = paused.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let armed = Arc::new(AtomicBool::new(true));
                loop {
                    let Ok((client, _)) = listener.accept().await else {
                        continue;
                    };
                    let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
                        continue;
                    };
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let (p1, p2, armed) = (p.clone(), p.clone(), armed.clone());
                    tokio::spawn(async move {
                        let mut buf = vec![0u8; 65536];
                        loop {
                            if p1.load(Ordering::SeqCst) {
                                tokio::time::sleep(Duration::from_millis(20)).await;
                                continue;
                            }
                            match cr.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => {
                                    if sw.write_all(&buf[..n]).await.is_err() {
                                        return;
                                    }
                                }
                            }
                        }
                    });
                    tokio::spawn(async move {
                        let mut buf = vec![0u8; 65536];
                        loop {
                            match sr.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => {
                                    if buf[..n].windows(4).any(|w| w == CONFIRM_SELECT_OK)
                                        && armed.swap(false, Ordering::SeqCst)
                                    {
                                        p2.store(true, Ordering::SeqCst);
                                    }
                                    if cw.write_all(&buf[..n]).await.is_err() {
                                        return;
                                    }
                                }
                            }
                        }
                    });
                }
            });
        });
        StallingProxy { port, paused }
    }
}

/// Finding 5. A publish that cannot be written within --confirm-timeout is judged
/// `uncertain` (Known(Uncertain) in settle) WITHOUT poisoning the channel and without
/// closing the connection: its frames stay queued inside lapin. settle_uncertain ends
/// the lease at once, so `dlq resolve --not-delivered` is accepted ("no replay can still
/// be publishing one") while this very process still holds the message; the operator
/// checked the consumers (nothing arrived: true), resolves, replays; then the link
/// recovers and the queued frames go out: two copies.
#[test]
fn review_publish_timeout_keeps_the_message_queued_after_the_lease_is_ended() {
    let mut rabbit = Rabbit::new();
    let q = rabbit.queue("rv_stall");
    let db = TestDb::migrated(Backend::Postgres);
    let big = vec![b'x'; 24 * 1024 * 1024];
    let mut lines = String::new();
    let mut a = letter("a-big", &q, &big);
    a["dead_lettered_at"] = "2026-01-01T00:00:00Z".into();
    lines.push_str(&format!("{a}\n"));
    for i in 0..15 {
        let mut r = letter(&format!("b-{i:02}"), &q, b"{}");
        r["dead_lettered_at"] = "2026-01-01T00:00:01Z".into();
        lines.push_str(&format!("{r}\n"));
    }
    let r = db.dlq_stdin(&["import", "-"], lines.as_bytes());
    assert_eq!(r.code, 0, "{}", r.all());
    let plan = db.dlq(&["plan", "--limit", "100"]);
    assert_eq!(plan.code, 0, "{}", plan.all());
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), &plan.stdout).unwrap();

    let proxy = StallingProxy::start("127.0.0.1:5672");
    let url = format!("amqp://guest:guest@127.0.0.1:{}/%2f", proxy.port);
    let mut child = db
        .cmd()
        .env("DLQ_AMQP_URL", &url)
        .args([
            "replay",
            "--plan",
            f.path().to_str().unwrap(),
            "--yes",
            "--batch-size",
            "1",
            "--workers",
            "1",
            "--confirm-timeout",
            "2s",
            "--lease",
            "30s",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(|l| l.ok())
        {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut first = None;
    while Instant::now() < deadline {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) {
            let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
            if v["id"] == "a-big" {
                first = Some(v);
                break;
            }
        }
    }
    let first = first.expect("the plan reported a-big");
    assert_eq!(first["outcome"], "uncertain", "{first}");
    assert_eq!(rabbit.count(&q), 0, "nothing reached the queue yet");
    // The operator does what the report and the runbook say: the consumers never saw it.
    let resolved = db.dlq(&[
        "resolve",
        "a-big",
        "--not-delivered",
        "--note",
        "consumers have no receipt of evt-a-big",
    ]);
    let replayed = db.dlq(&["replay", "a-big", "--yes"]);
    // The link recovers while the plan run is still going.
    proxy.paused.store(false, Ordering::SeqCst);
    let out = child.wait_with_output().unwrap();
    std::thread::sleep(Duration::from_secs(1));
    let copies = rabbit
        .drain(&q)
        .iter()
        .filter(|m| m.headers["x-dead-letter-id"] == "a-big")
        .count();
    assert!(
        copies <= 1,
        "a-big delivered {copies} times. first report: {first}\nresolve: exit {} {}\nreplay: exit {} {}\nplan exit {:?}: {}",
        resolved.code,
        resolved.all(),
        replayed.code,
        replayed.all(),
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
}
/// Finding 4 (d). Contract: errors "never contain a password: not in a URL that failed to
/// parse, not in a `password=` query parameter, not with a `/`, `@`, `#` or `?` inside it".
#[test]
fn review_passwords_with_a_slash_or_in_the_query_are_printed() {
    const PW: &str = "Canary9x";
    let db = TestDb::migrated(Backend::Sqlite);
    let cases: Vec<(&str, String)> = vec![
        (
            "database",
            format!("postgres://postgres:pw/{PW}@127.0.0.1:5432/x"),
        ),
        (
            "database",
            format!("postgres://postgres@127.0.0.1:5432/x?sslmode=bogus&password={PW}"),
        ),
        ("amqp", format!("amqp://guest:pw/{PW}@127.0.0.1:5672/%2f")),
        (
            "amqp",
            format!("amqp://guest@127.0.0.1:5672/%2f?password={PW}"),
        ),
    ];
    let mut leaks = Vec::new();
    for (kind, url) in &cases {
        let r = match *kind {
            "database" => db.dlq_env(&["list"], &[("DLQ_DATABASE_URL", url)]),
            _ => db.dlq_env(&["replay", "x", "--yes"], &[("DLQ_AMQP_URL", url)]),
        };
        if r.all().contains(PW) {
            leaks.push(format!("{kind} {url}: {}", r.all().trim()));
        }
    }
    assert!(leaks.is_empty(), "password printed:\n{}", leaks.join("\n"));
}
