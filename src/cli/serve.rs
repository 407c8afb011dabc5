//! `dlq metrics --listen ADDR`: `/metrics` over HTTP/1 (hyper), fresh per scrape.
//!
//! One scrape at a time queries the store: a scrape that arrives while another is
//! querying waits for it and, when that query ended after it arrived, answers with the
//! same text (it is as fresh as a query of its own would be). A store that does not
//! answer (within `--connect-timeout` to connect, `--statement-timeout` for the reads)
//! gives `dlq_up 0` and nothing else; its connection is dropped and the next scrape
//! connects again. The server keeps serving until Ctrl-C or SIGTERM, then exits 0.

use super::filters::FilterArgs;
use super::metrics::{render, render_down};
use super::{say, Ctx, Result};
use anyhow::Context as _;
use dlq::secret::SecretUrl;
use dlq::store::alerting::bounded;
use dlq::store::{self, Store, StoreOptions};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What every scrape needs, shared by the connections.
struct Scraper {
    url: SecretUrl,
    opts: StoreOptions,
    filters: FilterArgs,
    max_series: usize,
    statement_timeout: Duration,
    state: tokio::sync::Mutex<Cache>,
}

#[derive(Default)]
struct Cache {
    /// Kept between scrapes; dropped when it failed.
    store: Option<Box<dyn Store>>,
    /// The last exposition and when its query ended.
    last: Option<(Instant, Bytes)>,
}

impl Scraper {
    async fn scrape(&self) -> Bytes {
        let arrived = Instant::now();
        let mut cache = self.state.lock().await;
        if let Some((done, text)) = &cache.last {
            if *done >= arrived {
                return text.clone();
            }
        }
        let text = match self.query(&mut cache.store).await {
            Ok(text) => text,
            Err(e) => {
                say(&format!(
                    "dlq: warning: metrics: the store did not answer: {}",
                    dlq::error::one_line(&e, &super::spell::Commands)
                ));
                cache.store = None;
                render_down().unwrap_or_default()
            }
        };
        let text = Bytes::from(text);
        cache.last = Some((Instant::now(), text.clone()));
        text
    }

    async fn query(&self, slot: &mut Option<Box<dyn Store>>) -> dlq::error::Result<String> {
        if slot.is_none() {
            *slot = Some(store::open(&self.url, &self.opts).await?);
        }
        let Some(store) = slot.as_deref() else {
            return Err(dlq::error::DlqError::other("no store"));
        };
        let gauges = bounded(self.statement_timeout, async {
            let filter = self.filters.resolve(store).await?;
            store.gauges(&filter).await
        })
        .await?;
        render(&gauges, self.max_series)
    }

    async fn answer(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let (status, body) = match (req.method(), req.uri().path()) {
            (&Method::GET, "/metrics") => (StatusCode::OK, self.scrape().await),
            (_, "/metrics") => (
                StatusCode::METHOD_NOT_ALLOWED,
                Bytes::from_static(b"GET only\n"),
            ),
            _ => (
                StatusCode::NOT_FOUND,
                Bytes::from_static(b"not found: the metrics are at /metrics\n"),
            ),
        };
        let mut resp = Response::new(Full::new(body));
        *resp.status_mut() = status;
        if status == StatusCode::OK {
            resp.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(CONTENT_TYPE),
            );
        }
        resp
    }
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}

pub async fn run(
    ctx: &Ctx,
    addr: std::net::SocketAddr,
    filters: FilterArgs,
    max_series: usize,
) -> Result<u8> {
    // Bad filters are a usage error now, not a `dlq_up 0` at every scrape.
    filters.to_filter(chrono::Utc::now())?;
    let scraper = Arc::new(Scraper {
        url: ctx.database_url()?,
        opts: StoreOptions {
            long_running: true,
            ..ctx.store_options()
        },
        filters,
        max_series,
        statement_timeout: ctx.global.statement_timeout,
        state: tokio::sync::Mutex::new(Cache::default()),
    });
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let local = listener.local_addr().unwrap_or(addr);
    say(&format!("dlq metrics: serving http://{local}/metrics"));
    let mut stop = std::pin::pin!(shutdown());
    loop {
        let (stream, _) = tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                // Out of file descriptors and the like: wait, then accept again.
                Err(e) => {
                    say(&format!("dlq: warning: metrics: accept failed: {e}"));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let scraper = scraper.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let scraper = scraper.clone();
                async move { Ok::<_, std::convert::Infallible>(scraper.answer(req).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
    say("dlq metrics: stopped");
    let left = scraper
        .state
        .try_lock()
        .ok()
        .and_then(|mut c| c.store.take());
    if let Some(store) = left {
        store.close().await;
    }
    Ok(dlq::exit::OK)
}
