//! The keep-alive HTTP client both modes POST with: at most `--in-flight` requests out at
//! once, the retry policy (delays and `--max-attempts`), and its tally of failures and of
//! events given up.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::sync::Semaphore;

use super::Options;

/// A keep-alive HTTP client, shared by every task of a mode.
///
/// Both modes have at most `--in-flight` requests out at once (64 by default). That also
/// bounds the connections to about as many: the pool opens a new one when none is idle
/// (and a few extra while a finished one is on its way back to the pool). Without the bound,
/// direct mode would open a socket for every event whose request overlaps another's:
/// thousands at 20,000 events/s.
#[derive(Clone)]
pub struct Client {
    http: hyper_util::client::legacy::Client<HttpConnector, Full<Bytes>>,
    base: Arc<str>,
    in_flight: Arc<Semaphore>,
    backoff: Duration,
    max_attempts: u32,
    max_failures: Arc<AtomicU32>,
    dead_letters: Arc<AtomicU64>,
}

impl Client {
    pub fn new(server: SocketAddr, options: &Options) -> Client {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let http =
            hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(connector);
        Client {
            http,
            base: format!("http://{server}/customers").into(),
            in_flight: Arc::new(Semaphore::new(options.in_flight)),
            backoff: options.backoff,
            max_attempts: options.max_attempts,
            max_failures: Arc::new(AtomicU32::new(0)),
            dead_letters: Arc::new(AtomicU64::new(0)),
        }
    }

    /// POSTs a JSON body to a customer; true if it got in (a 2xx answer).
    pub async fn post(&self, customer: u32, body: Bytes) -> bool {
        let _slot = self.in_flight.acquire().await.expect("never closed");
        let request = hyper::Request::post(format!("{}/{customer}/events", self.base))
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))
            .expect("valid request");
        match self.http.request(request).await {
            // Read the (empty) answer to the end, so the connection goes back to the pool.
            Ok(response) => {
                let ok = response.status().is_success();
                ok && response.into_body().collect().await.is_ok()
            }
            Err(_) => false,
        }
    }

    /// How long to wait after an event's `failures`-th failed POST: `--backoff`, doubled for
    /// each failure before, capped at 2 s.
    pub fn retry_delay(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(16);
        (self.backoff * (1 << doublings)).min(Duration::from_secs(2))
    }

    /// Whether an event is given up after `failures` failed POSTs: `--max-attempts` of
    /// them, where it is not 0.
    pub fn gives_up(&self, failures: u32) -> bool {
        self.max_attempts != 0 && failures >= self.max_attempts
    }

    /// Notes events that got in after `failures` failed POSTs, for the most failures any
    /// event went through.
    pub fn delivered(&self, failures: u32) {
        self.max_failures.fetch_max(failures, Ordering::Relaxed);
    }

    /// Notes `events` given up after `--max-attempts` failed POSTs: dead letters.
    pub fn dead(&self, events: usize) {
        self.dead_letters
            .fetch_add(events as u64, Ordering::Relaxed);
    }

    /// The most failed POSTs any one event went through before it got in.
    pub fn max_failures(&self) -> u32 {
        self.max_failures.load(Ordering::Relaxed)
    }

    /// The events given up so far.
    pub fn dead_letters(&self) -> u64 {
        self.dead_letters.load(Ordering::Relaxed)
    }
}
