//! TCP proxies of the tests' own between `dlq` and a service, cut (or stalled, or fed
//! extra bytes) when the server sends a given frame.

use super::*;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

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
    /// From the client: hold the AMQP frame whose method is `pattern` (and what follows
    /// it) this long before forwarding it; what came before it goes at once.
    HoldClientMethod([u8; 4], std::time::Duration),
    /// From the client: hold the bytes from `pattern` on (a PostgreSQL COMMIT, say) this
    /// long before forwarding them; what came before them goes at once.
    HoldClientBytes(Vec<u8>, std::time::Duration),
    /// From the client: the first time it sends the AMQP method `pattern`, drop every
    /// connection instead of forwarding it (the flag records that it happened); later
    /// connections, once the test clears `cut`, are forwarded untouched.
    CutOnClientMethod([u8; 4], Arc<AtomicBool>),
    /// The same for any bytes the client sends (a PostgreSQL statement's text, say).
    CutOnClientBytes(Vec<u8>, Arc<AtomicBool>),
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

    /// `db`'s URL through this proxy of PostgreSQL, in plain text so a hook can read it.
    pub fn db_url(&self, db: &TestDb) -> String {
        format!(
            "{}?sslmode=disable",
            db.url.replace("127.0.0.1:5432", &self.addr())
        )
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
    let cut_on = match &hook {
        OnServerBytes::CutOnClientMethod(m, done) => Some((m.to_vec(), done.clone())),
        OnServerBytes::CutOnClientBytes(p, done) => Some((p.clone(), done.clone())),
        _ => None,
    };
    // What to hold: a pattern, how far before it the held bytes start, and how long.
    let hold = match &hook {
        // A method frame: type, channel (2), size (4), then class and method.
        OnServerBytes::HoldClientMethod(m, d) => Some((m.to_vec(), 7, *d)),
        OnServerBytes::HoldClientBytes(p, d) => Some((p.clone(), 0, *d)),
        _ => None,
    };
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
                    if let Some((m, done)) = &cut_on {
                        let sent = buf[..n].windows(m.len()).any(|w| w == m.as_slice());
                        if sent && !done.swap(true, Ordering::SeqCst) {
                            cut1.store(true, Ordering::SeqCst);
                            return;
                        }
                    }
                    let at = hold.as_ref().and_then(|(p, back, d)| {
                        let i = buf[..n].windows(p.len()).position(|w| w == p.as_slice())?;
                        Some((i.checked_sub(*back)?, *d))
                    });
                    let (now, later) = buf[..n].split_at(at.map_or(n, |(i, _)| i));
                    if sw.write_all(now).await.is_err() {
                        return;
                    }
                    if let Some((_, d)) = at {
                        tokio::time::sleep(d).await;
                    }
                    if sw.write_all(later).await.is_err() {
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

/// The method frame payload start of queue.declare (class 50, method 10).
pub const QUEUE_DECLARE: [u8; 4] = [0x00, 0x32, 0x00, 0x0A];

/// The method frame payload start of basic.ack (class 60, method 80).
pub const BASIC_ACK: [u8; 4] = [0x00, 0x3C, 0x00, 0x50];

/// connection.open-ok (class 10, method 41): where a broker under an alarm says blocked.
pub const CONNECTION_OPEN_OK: [u8; 4] = [0x00, 0x0A, 0x00, 0x29];

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

/// `dlq` with its database and broker behind proxies of the test's own, the database cut
/// for good the moment the broker's confirm (basic.ack) passes: a replay or plan run
/// that loses its database right after a publish was confirmed. A test may clear
/// `pg.cut` to bring the database back.
pub struct DbCutAtConfirm {
    pub pg: Proxy,
    pub amqp: Proxy,
}

impl DbCutAtConfirm {
    pub fn start() -> DbCutAtConfirm {
        let pg = Proxy::start("127.0.0.1:5432", OnServerBytes::Nothing);
        let amqp = Proxy::start(
            "127.0.0.1:5672",
            OnServerBytes::CutOther(BASIC_ACK.to_vec(), pg.cut.clone()),
        );
        DbCutAtConfirm { pg, amqp }
    }

    /// `DLQ_DATABASE_URL` and `DLQ_AMQP_URL` for `db` through the proxies.
    pub fn env(&self, db: &TestDb) -> [(&'static str, String); 2] {
        [
            (
                "DLQ_DATABASE_URL",
                db.url.replace("127.0.0.1:5432", &self.pg.addr()),
            ),
            (
                "DLQ_AMQP_URL",
                format!("amqp://guest:guest@{}/%2f", self.amqp.addr()),
            ),
        ]
    }

    /// `db.cmd()` through the proxies.
    pub fn cmd(&self, db: &TestDb) -> Command {
        let mut c = db.cmd();
        c.envs(self.env(db));
        c
    }

    /// `dlq ARGS` on `db` through the proxies, to its end.
    pub fn run(&self, db: &TestDb, args: &[&str]) -> Run {
        Run::from(self.cmd(db).args(args).output().unwrap())
    }

    /// `dlq ARGS` on `db` through the proxies, started with stdout and stderr piped.
    pub fn spawn(&self, db: &TestDb, args: &[&str]) -> std::process::Child {
        self.cmd(db)
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    }
}
