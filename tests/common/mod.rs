//! Test harness: real PostgreSQL, real SQLite files, real RabbitMQ, the real binary.
//! Every test makes its own database and queues and removes them afterwards.
#![allow(dead_code)]

use lapin::options::*;
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

pub const PG_ADMIN: &str = "postgres://postgres@127.0.0.1:5432/postgres";
pub const AMQP: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

pub fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

pub const BACKENDS: [Backend; 2] = [Backend::Postgres, Backend::Sqlite];

/// Runs `$body` with `$pool` connected to the test database, whichever backend it is.
macro_rules! with_pool {
    ($db:expr, $pool:ident, $body:block) => {{
        let db: &TestDb = $db;
        rt().block_on(async move {
            match db.backend {
                Backend::Postgres => {
                    let $pool = sqlx::PgPool::connect(&db.url).await.unwrap();
                    let out = $body;
                    $pool.close().await;
                    out
                }
                Backend::Sqlite => {
                    let $pool = sqlx::SqlitePool::connect(&format!("{}?mode=rwc", db.url))
                        .await
                        .unwrap();
                    let out = $body;
                    $pool.close().await;
                    out
                }
            }
        })
    }};
}

/// A fresh database: a new PostgreSQL database or a SQLite file in a temp dir.
pub struct TestDb {
    pub backend: Backend,
    pub url: String,
    pg_name: Option<String>,
    _dir: Option<tempfile::TempDir>,
}

impl TestDb {
    pub fn new(backend: Backend) -> TestDb {
        match backend {
            Backend::Postgres => {
                let name = unique("dlq_t");
                rt().block_on(async {
                    let pool = sqlx::PgPool::connect(PG_ADMIN)
                        .await
                        .expect("PostgreSQL at 127.0.0.1:5432");
                    sqlx::query(&format!("CREATE DATABASE {name}"))
                        .execute(&pool)
                        .await
                        .unwrap();
                    pool.close().await;
                });
                TestDb {
                    backend,
                    url: format!("postgres://postgres@127.0.0.1:5432/{name}"),
                    pg_name: Some(name),
                    _dir: None,
                }
            }
            Backend::Sqlite => {
                let dir = tempfile::tempdir().unwrap();
                let url = format!("sqlite://{}", dir.path().join("dlq.db").display());
                TestDb {
                    backend,
                    url,
                    pg_name: None,
                    _dir: Some(dir),
                }
            }
        }
    }

    /// A fresh, migrated database.
    pub fn migrated(backend: Backend) -> TestDb {
        let db = TestDb::new(backend);
        let r = db.dlq(&["migrate"]);
        assert_eq!(r.code, 0, "migrate: {}", r.all());
        db
    }

    pub fn cmd(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_dlq"));
        for (k, _) in std::env::vars() {
            if k.starts_with("DLQ_") {
                c.env_remove(k);
            }
        }
        c.env("DLQ_DATABASE_URL", &self.url)
            .env("DLQ_AMQP_URL", AMQP)
            .env("DLQ_OPERATOR", "tester")
            .env("DLQ_OUTPUT", "json")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null());
        c
    }

    pub fn dlq(&self, args: &[&str]) -> Run {
        Run::from(self.cmd().args(args).output().unwrap())
    }

    pub fn dlq_env(&self, args: &[&str], env: &[(&str, &str)]) -> Run {
        let mut c = self.cmd();
        for (k, v) in env {
            c.env(k, v);
        }
        Run::from(c.args(args).output().unwrap())
    }

    pub fn dlq_stdin(&self, args: &[&str], input: &[u8]) -> Run {
        let mut child = self
            .cmd()
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(input).unwrap();
        Run::from(child.wait_with_output().unwrap())
    }

    /// Runs SQL statements directly (as a worker or an operator with psql would).
    pub fn sql(&self, statements: &[&str]) {
        with_pool!(self, pool, {
            for s in statements {
                sqlx::query(s)
                    .execute(&pool)
                    .await
                    .unwrap_or_else(|e| panic!("{s}: {e}"));
            }
        })
    }

    /// One integer from a query.
    pub fn scalar(&self, q: &str) -> i64 {
        with_pool!(self, pool, {
            sqlx::query_scalar::<_, i64>(q)
                .fetch_one(&pool)
                .await
                .unwrap()
        })
    }

    pub fn import_examples(&self) {
        let r = self.dlq(&["import", &examples_file()]);
        assert_eq!(r.code, 0, "{}", r.stderr);
    }

    /// Imports one dead letter with the given JSON fields.
    pub fn add(&self, row: serde_json::Value) {
        let r = self.dlq_stdin(&["import", "-"], format!("{row}\n").as_bytes());
        assert_eq!(r.code, 0, "import failed: {}", r.stderr);
    }

    /// `dlq plan ARGS` written to a file, for `dlq replay --plan`.
    pub fn plan_file(&self, args: &[&str]) -> tempfile::NamedTempFile {
        let mut a = vec!["plan"];
        a.extend_from_slice(args);
        let r = self.dlq(&a);
        assert_eq!(r.code, 0, "{}", r.all());
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), &r.stdout).unwrap();
        f
    }

    /// The IDs a `dlq list ...` prints, in its order.
    pub fn ids(&self, list_args: &[&str]) -> Vec<String> {
        let mut args = vec!["list"];
        args.extend_from_slice(list_args);
        self.dlq(&args).ids()
    }

    pub fn show(&self, id: &str) -> serde_json::Value {
        let r = self.dlq(&["show", id]);
        assert_eq!(r.code, 0, "show {id}: {}", r.stderr);
        r.json()
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Some(name) = &self.pg_name {
            let name = name.clone();
            rt().block_on(async move {
                if let Ok(pool) = sqlx::PgPool::connect(PG_ADMIN).await {
                    let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                        .execute(&pool)
                        .await;
                    pool.close().await;
                }
            });
        }
    }
}

pub fn examples_file() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("examples/dead-letters.jsonl")
        .display()
        .to_string()
}

pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl From<Output> for Run {
    fn from(o: Output) -> Run {
        Run {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

impl Run {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e}): {}\nstderr: {}",
                self.stdout, self.stderr
            )
        })
    }
    pub fn lines(&self) -> Vec<serde_json::Value> {
        self.stdout
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }
    /// The IDs of a `list` run that must have succeeded.
    pub fn ids(&self) -> Vec<String> {
        assert_eq!(self.code, 0, "{}", self.all());
        self.json()
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["id"].as_str().unwrap().to_string())
            .collect()
    }

    pub fn all(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

/// A message as a consumer received it.
#[derive(Debug)]
pub struct Received {
    pub body: Vec<u8>,
    pub headers: serde_json::Map<String, serde_json::Value>,
    pub message_id: Option<String>,
    pub delivery_mode: Option<u8>,
    pub timestamp: Option<u64>,
}

/// RabbitMQ helper for tests: unique queues, deleted on drop.
pub struct Rabbit {
    rt: tokio::runtime::Runtime,
    conn: Connection,
    channel: lapin::Channel,
    queues: Vec<String>,
    exchanges: Vec<String>,
}

impl Rabbit {
    pub fn new() -> Rabbit {
        Rabbit::on(AMQP)
    }

    /// Connected to `url` (another vhost, say).
    pub fn on(url: &str) -> Rabbit {
        let rt = rt();
        let (conn, channel) = rt.block_on(async {
            let conn = Connection::connect(url, ConnectionProperties::default())
                .await
                .expect("RabbitMQ at 127.0.0.1:5672");
            let channel = conn.create_channel().await.unwrap();
            (conn, channel)
        });
        Rabbit {
            rt,
            conn,
            channel,
            queues: vec![],
            exchanges: vec![],
        }
    }

    /// The helper's channel, for tests that drive the broker themselves.
    pub fn channel(&self) -> &lapin::Channel {
        &self.channel
    }

    /// Runs a future on the helper's runtime.
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    pub fn queue_with(&mut self, prefix: &str, args: FieldTable) -> String {
        let name = unique(prefix);
        self.rt
            .block_on(self.channel.queue_declare(
                name.as_str().into(),
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                args,
            ))
            .unwrap();
        self.queues.push(name.clone());
        name
    }

    pub fn queue(&mut self, prefix: &str) -> String {
        self.queue_with(prefix, FieldTable::default())
    }

    pub fn exchange(&mut self, prefix: &str) -> String {
        self.exchange_of(prefix, lapin::ExchangeKind::Direct)
    }

    pub fn exchange_of(&mut self, prefix: &str, kind: lapin::ExchangeKind) -> String {
        let name = unique(prefix);
        self.rt
            .block_on(self.channel.exchange_declare(
                name.as_str().into(),
                kind,
                ExchangeDeclareOptions::default(),
                FieldTable::default(),
            ))
            .unwrap();
        self.exchanges.push(name.clone());
        name
    }

    pub fn bind(&self, queue: &str, exchange: &str, key: &str) {
        self.rt
            .block_on(self.channel.queue_bind(
                queue.into(),
                exchange.into(),
                key.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            ))
            .unwrap();
    }

    /// Everything in the queue now (acked).
    pub fn drain(&self, queue: &str) -> Vec<Received> {
        let mut out = Vec::new();
        self.rt.block_on(async {
            loop {
                let got = self
                    .channel
                    .basic_get(queue.into(), BasicGetOptions { no_ack: true })
                    .await
                    .unwrap();
                let Some(msg) = got else { break };
                let props = msg.delivery.properties.clone();
                let headers = props
                    .headers()
                    .as_ref()
                    .map(field_table_json)
                    .unwrap_or_default();
                out.push(Received {
                    body: msg.delivery.data.clone(),
                    headers,
                    message_id: props.message_id().as_ref().map(|s| s.as_str().to_string()),
                    delivery_mode: *props.delivery_mode(),
                    timestamp: *props.timestamp(),
                });
            }
        });
        out
    }

    pub fn count(&self, queue: &str) -> u32 {
        self.rt
            .block_on(self.channel.queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            ))
            .unwrap()
            .message_count()
    }

    /// Declares a durable queue with a fixed name, or empties it if it exists.
    pub fn purge_or_declare(&self, name: &str) {
        self.rt.block_on(async {
            self.channel
                .queue_declare(
                    name.into(),
                    QueueDeclareOptions {
                        durable: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                )
                .await
                .unwrap();
            self.channel
                .queue_purge(name.into(), QueuePurgeOptions::default())
                .await
                .unwrap();
        });
    }

    pub fn delete(&self, name: &str) {
        let _ = self.rt.block_on(
            self.channel
                .queue_delete(name.into(), QueueDeleteOptions::default()),
        );
    }

    pub fn publish_raw(&self, queue: &str, body: &[u8]) {
        self.rt
            .block_on(async {
                self.channel
                    .basic_publish(
                        "".into(),
                        queue.into(),
                        BasicPublishOptions::default(),
                        body,
                        BasicProperties::default(),
                    )
                    .await
            })
            .unwrap();
    }
}

impl Drop for Rabbit {
    fn drop(&mut self) {
        let ch = self.channel.clone();
        let qs = std::mem::take(&mut self.queues);
        let xs = std::mem::take(&mut self.exchanges);
        // Bounded: lapin can wait for ever on a connection whose node went away.
        let bounded = std::time::Duration::from_secs(5);
        self.rt.block_on(async move {
            for q in qs {
                let _ = tokio::time::timeout(
                    bounded,
                    ch.queue_delete(q.as_str().into(), QueueDeleteOptions::default()),
                )
                .await;
            }
            for x in xs {
                let _ = tokio::time::timeout(
                    bounded,
                    ch.exchange_delete(x.as_str().into(), ExchangeDeleteOptions::default()),
                )
                .await;
            }
        });
        let conn = &self.conn;
        let _ = self.rt.block_on(async move {
            tokio::time::timeout(bounded, conn.close(200, "bye".into())).await
        });
    }
}

fn field_table_json(t: &FieldTable) -> serde_json::Map<String, serde_json::Value> {
    t.inner()
        .iter()
        .map(|(k, v)| (k.as_str().to_string(), amqp_json(v)))
        .collect()
}

fn amqp_json(v: &lapin::types::AMQPValue) -> serde_json::Value {
    use lapin::types::AMQPValue::*;
    match v {
        LongString(s) => {
            serde_json::Value::String(String::from_utf8_lossy(s.as_bytes()).into_owned())
        }
        ShortString(s) => serde_json::Value::String(s.as_str().to_string()),
        Boolean(b) => (*b).into(),
        LongLongInt(i) => (*i).into(),
        LongInt(i) => (*i).into(),
        ShortInt(i) => (*i).into(),
        Double(d) => (*d).into(),
        FieldTable(t) => serde_json::Value::Object(field_table_json(t)),
        FieldArray(a) => a.as_slice().iter().map(amqp_json).collect(),
        Void => serde_json::Value::Null,
        other => serde_json::Value::String(format!("{other:?}")),
    }
}

/// A TCP proxy of the tests' own between `dlq` and a service, which a test cuts at the
/// moment that matters.
pub struct Proxy {
    pub port: u16,
    /// When set, existing connections are dropped and new ones refused (closed at once).
    pub cut: Arc<AtomicBool>,
    pub connections: Arc<AtomicUsize>,
    _thread: std::thread::JoinHandle<()>,
}

/// What the proxy does when the server sends `pattern` to the client.
#[derive(Clone)]
pub enum OnServerBytes {
    Nothing,
    /// Drop the connection instead of forwarding (the client never sees it).
    Cut(Vec<u8>),
    /// The same, the first time only (the flag records that it happened): later
    /// connections, once the test clears `cut`, are forwarded untouched.
    CutOnce(Vec<u8>, Arc<AtomicBool>),
    /// Cut another proxy first, then forward.
    CutOther(Vec<u8>, Arc<AtomicBool>),
    /// Stop forwarding and hold the connection open, sending nothing (a black hole).
    Stall(Vec<u8>),
    /// Forward, then send these bytes to the client as if from the server.
    Inject(Vec<u8>, Vec<u8>),
    /// Accept connections and never answer (no RST): a black-holed service.
    Blackhole,
    /// Forward, but only after holding each new connection this long (a slow handshake).
    Delay(std::time::Duration),
}

impl Proxy {
    pub fn start(upstream: &str, hook: OnServerBytes) -> Proxy {
        let upstream = upstream.to_string();
        let cut = Arc::new(AtomicBool::new(false));
        let connections = Arc::new(AtomicUsize::new(0));
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = std_listener.local_addr().unwrap().port();
        std_listener.set_nonblocking(true).unwrap();
        let (c2, n2) = (cut.clone(), connections.clone());
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
                loop {
                    let Ok((client, _)) = listener.accept().await else {
                        continue;
                    };
                    n2.fetch_add(1, Ordering::SeqCst);
                    if c2.load(Ordering::SeqCst) {
                        drop(client);
                        continue;
                    }
                    let (up, cut, hook) = (upstream.clone(), c2.clone(), hook.clone());
                    if matches!(hook, OnServerBytes::Blackhole) {
                        tokio::spawn(async move {
                            use tokio::io::AsyncReadExt;
                            let mut client = client;
                            let mut buf = [0u8; 4096];
                            while let Ok(n) = client.read(&mut buf).await {
                                if n == 0 {
                                    break;
                                }
                            }
                        });
                        continue;
                    }
                    tokio::spawn(async move {
                        if let OnServerBytes::Delay(d) = hook {
                            tokio::time::sleep(d).await;
                        }
                        let Ok(server) = tokio::net::TcpStream::connect(&up).await else {
                            return;
                        };
                        pipe(client, server, cut, hook).await;
                    });
                }
            });
        });
        Proxy {
            port,
            cut,
            connections,
            _thread: thread,
        }
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

async fn pipe(
    client: tokio::net::TcpStream,
    server: tokio::net::TcpStream,
    cut: Arc<AtomicBool>,
    hook: OnServerBytes,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let cut1 = cut.clone();
    let up = tokio::spawn(async move {
        let mut buf = vec![0u8; 65536];
        loop {
            if cut1.load(Ordering::SeqCst) {
                return;
            }
            match tokio::time::timeout(std::time::Duration::from_millis(50), cr.read(&mut buf))
                .await
            {
                Err(_) => continue,
                Ok(Ok(0)) | Ok(Err(_)) => return,
                Ok(Ok(n)) => {
                    if sw.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    let mut buf = vec![0u8; 65536];
    loop {
        if cut.load(Ordering::SeqCst) {
            break;
        }
        let n = match tokio::time::timeout(std::time::Duration::from_millis(50), sr.read(&mut buf))
            .await
        {
            Err(_) => continue,
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => n,
        };
        let seen = |p: &[u8]| buf[..n].windows(p.len()).any(|w| w == p);
        match &hook {
            OnServerBytes::Cut(p) if seen(p) => {
                cut.store(true, Ordering::SeqCst);
                break;
            }
            OnServerBytes::CutOnce(p, done) if seen(p) && !done.swap(true, Ordering::SeqCst) => {
                cut.store(true, Ordering::SeqCst);
                break;
            }
            OnServerBytes::CutOther(p, other) if seen(p) => {
                other.store(true, Ordering::SeqCst);
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            OnServerBytes::Stall(p) if seen(p) => {
                tokio::time::sleep(std::time::Duration::from_secs(30)).await;
                break;
            }
            OnServerBytes::Inject(p, extra) if seen(p) => {
                if cw.write_all(&buf[..n]).await.is_err() || cw.write_all(extra).await.is_err() {
                    break;
                }
                continue;
            }
            _ => {}
        }
        if cw.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    up.abort();
}

/// The method frame payload start of basic.ack (class 60, method 80).
pub const BASIC_ACK: [u8; 4] = [0x00, 0x3C, 0x00, 0x50];
/// connection.open-ok (class 10, method 41): where a broker under an alarm says blocked.
pub const CONNECTION_OPEN_OK: [u8; 4] = [0x00, 0x0A, 0x00, 0x29];

/// A vhost of the test's own on the local broker, deleted on drop: for a test that must
/// use fixed queue names (the runbooks show the examples' real queues). Made with
/// `rabbitmqctl`; where that cannot run, the test falls back to the default vhost.
pub struct Vhost {
    name: Option<String>,
    pub url: String,
}

impl Vhost {
    pub fn new() -> Vhost {
        let name = unique("dlq-test");
        let ctl = |args: &[&str]| {
            std::process::Command::new("rabbitmqctl")
                .args(args)
                .output()
                .is_ok_and(|o| o.status.success())
        };
        if ctl(&["add_vhost", &name])
            && ctl(&["set_permissions", "-p", &name, "guest", ".*", ".*", ".*"])
        {
            let url = format!("amqp://guest:guest@127.0.0.1:5672/{name}");
            return Vhost {
                name: Some(name),
                url,
            };
        }
        eprintln!("note: rabbitmqctl could not make a vhost; using the default one");
        Vhost {
            name: None,
            url: AMQP.to_string(),
        }
    }

    /// Whether this is a vhost of the test's own (else the shared default one).
    pub fn is_own(&self) -> bool {
        self.name.is_some()
    }
}

impl Drop for Vhost {
    fn drop(&mut self) {
        if let Some(name) = &self.name {
            let _ = std::process::Command::new("rabbitmqctl")
                .args(["delete_vhost", name])
                .output();
        }
    }
}

/// A connection.blocked frame (class 10, method 60), as a broker under an alarm sends it.
pub fn connection_blocked_frame() -> Vec<u8> {
    let reason = b"low on memory";
    let mut payload = vec![0x00, 0x0A, 0x00, 0x3C, reason.len() as u8];
    payload.extend_from_slice(reason);
    let mut frame = vec![0x01, 0x00, 0x00];
    frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    frame.extend_from_slice(&payload);
    frame.push(0xCE);
    frame
}

/// Sends a signal to a child process.
pub fn signal(child: &std::process::Child, sig: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{sig}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
}

/// A dead letter as JSON for `import`.
pub fn letter(id: &str, queue: &str, body: &[u8]) -> serde_json::Value {
    use base64::Engine;
    serde_json::json!({
        "id": id,
        "reason": "retries_exhausted",
        "attempts": 5,
        "headers": {"x-death": [{"count": 5}], "x-delivery-count": 5, "x-first-death-queue": queue, "tenant": "acme"},
        "producer": "inventory",
        "schema_version": "5",
        "event_id": format!("evt-{id}"),
        "source_queue": queue,
        "error": "timeout",
        "body_base64": base64::engine::general_purpose::STANDARD.encode(body),
    })
}

/// How many times each dead letter arrived, by the `x-dead-letter-id` a replay sets.
pub fn per_id(msgs: &[Received]) -> std::collections::HashMap<String, usize> {
    let mut m = std::collections::HashMap::new();
    for x in msgs {
        *m.entry(x.headers["x-dead-letter-id"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    m
}

/// Arguments of a queue that refuses every publish (max length 0, reject-publish): the
/// broker nacks what is routed to it.
pub fn refusing_queue_args() -> FieldTable {
    let mut args = FieldTable::default();
    args.insert(
        "x-max-length".into(),
        lapin::types::AMQPValue::LongLongInt(0),
    );
    args.insert(
        "x-overflow".into(),
        lapin::types::AMQPValue::LongString("reject-publish".into()),
    );
    args
}

/// Writes `body` as the dlq config file under the XDG config home `dir`.
pub fn write_config(dir: &std::path::Path, body: &str) -> std::path::PathBuf {
    let p = dir.join("dlq").join("config.toml");
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, body).unwrap();
    p
}

// Bodies, and a gate on PostgreSQL's reads of a large body in slices.

pub const MIB: usize = 1024 * 1024;

/// `len` incompressible bytes, different for every seed (so a mixed-up body shows).
pub fn noise(seed: u32, len: usize) -> Vec<u8> {
    let mut x: u32 = 0x9e37_79b9 ^ seed.wrapping_mul(0x85eb_ca6b);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 24) as u8
        })
        .collect()
}

pub fn b64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The bytes of a `body_base64` value.
pub fn unb64(v: &serde_json::Value) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(v.as_str().expect("body_base64 is a string"))
        .unwrap()
}

/// Replaces `substr` of a body (dlq's slice reads) in `db` by `sql` (a PL/pgSQL body
/// over `b`, `f`, `n`): PostgreSQL looks in `public` first from the next session on.
pub fn replace_substr(db: &TestDb, sql: &str) {
    let name = db.url.rsplit('/').next().unwrap().to_string();
    db.sql(&[
        &format!(
            "CREATE FUNCTION public.substr(b bytea, f integer, n integer) RETURNS bytea \
             LANGUAGE plpgsql AS $$ BEGIN {sql} END $$"
        ),
        &format!("ALTER DATABASE {name} SET search_path = public, pg_catalog"),
    ]);
}

/// Makes every slice read of `db` wait on advisory lock 4343, in the first session that
/// gets there (`only_first`) or in all, and holds that lock until [`SliceGate::open`]:
/// a test can act while `dlq` is in the middle of reading a large body.
pub struct SliceGate {
    rt: tokio::runtime::Runtime,
    conn: sqlx::PgConnection,
}

impl SliceGate {
    pub fn close(db: &TestDb, only_first: bool) -> SliceGate {
        let wait = if only_first {
            "IF pg_try_advisory_lock(777) THEN PERFORM pg_advisory_xact_lock_shared(4343); END IF;"
        } else {
            "PERFORM pg_advisory_xact_lock_shared(4343);"
        };
        replace_substr(db, &format!("{wait} RETURN pg_catalog.substr(b, f, n);"));
        let rt = rt();
        let conn = rt.block_on(async {
            use sqlx::Connection;
            let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
            sqlx::query("SELECT pg_advisory_lock(4343)")
                .execute(&mut conn)
                .await
                .unwrap();
            conn
        });
        SliceGate { rt, conn }
    }

    /// The backends of the gate's database waiting at it (other tests run beside this
    /// one, each in its own database), once there is one (at most a minute).
    pub fn waiting(&mut self, what: &str) -> Vec<i32> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let pids: Vec<i32> = self
                .rt
                .block_on(
                    sqlx::query_scalar(
                        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() \
                         AND wait_event_type = 'Lock' AND wait_event = 'advisory'",
                    )
                    .fetch_all(&mut self.conn),
                )
                .unwrap();
            if !pids.is_empty() {
                return pids;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{what} never reached the gate"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Ends the session of a backend waiting at the gate (its connection is lost).
    pub fn terminate(&mut self, pid: i32) {
        let q = sqlx::query("SELECT pg_terminate_backend($1)").bind(pid);
        self.rt.block_on(q.execute(&mut self.conn)).unwrap();
    }

    /// Rewrites a row's body while the gate is held.
    pub fn set_body(&mut self, id: &str, body: &[u8]) {
        let q = sqlx::query("UPDATE dead_letters SET body = $1 WHERE id = $2")
            .bind(body)
            .bind(id);
        self.rt.block_on(q.execute(&mut self.conn)).unwrap();
    }

    /// Lets the slice reads go on.
    pub fn open(mut self) {
        let q = sqlx::query("SELECT pg_advisory_unlock(4343)");
        self.rt.block_on(q.execute(&mut self.conn)).unwrap();
    }
}

/// The exit code of an outcome, as docs/exit-codes.md gives it.
pub fn exit_of(outcome: &serde_json::Value) -> i32 {
    match outcome.as_str().unwrap_or("") {
        "replayed" => 0,
        "not_replayed" => 3,
        "not_found" => 4,
        "publish_failed" => 5,
        "uncertain" => 6,
        "interrupted" => 130,
        other => panic!("not an outcome: {other:?}"),
    }
}

/// The summary line of a plan run (its last line of JSON).
pub fn summary_of(r: &Run) -> serde_json::Value {
    let lines = r.lines();
    let last = lines
        .last()
        .unwrap_or_else(|| panic!("no summary: {}", r.all()));
    let s = last["summary"].clone();
    assert!(s.is_object(), "no summary: {}", r.all());
    assert_eq!(exit_of(&s["worst"]), r.code, "worst is the exit code: {s}");
    s
}
