//! A publish that cannot be written within `--confirm-timeout` stays uncertain while its
//! frames may still go out.

use crate::common::*;
use std::io::BufRead;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// Once broke (review of protocol v2): a timed-out publish ended its lease, `resolve
/// --not-delivered` was accepted, and its queued frames went out later: two copies.
/// A publish that cannot be written within --confirm-timeout is judged
/// `uncertain` (Known(Uncertain) in settle) WITHOUT poisoning the channel and without
/// closing the connection: its frames stay queued inside lapin. settle_uncertain ends
/// the lease at once, so `dlq resolve --not-delivered` is accepted ("no replay can still
/// be publishing one") while this very process still holds the message; the operator
/// checked the consumers (nothing arrived: true), resolves, replays; then the link
/// recovers and the queued frames go out: two copies.
#[test]
fn a_timed_out_publish_cannot_be_resolved_while_its_frames_may_still_go_out() {
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
