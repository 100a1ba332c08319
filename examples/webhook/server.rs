//! The customers' endpoints: an axum server on 127.0.0.1, the listener and streams that count
//! connections and bytes, and the log of what arrived, with its checks: each event once, each
//! customer's events in order, one request at a time per customer.

use std::collections::{HashMap, HashSet};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::sleep;

use super::support::{mix, now_us};
use super::Options;

/// The customers' endpoints, on 127.0.0.1 and a free port.
pub struct Server {
    pub addr: SocketAddr,
    state: Arc<ServerState>,
    shutdown: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

struct ServerState {
    fail_rate: f64,
    seed: u64,
    /// Customers below this one answer 503 to everything until `down_until_us`.
    down_customers: u32,
    down_until_us: u64,
    /// `--producers`: an event's producer is its id modulo this.
    producers: u64,
    log: Mutex<Log>,
    wire: Arc<Wire>,
}

/// What the server saw.
#[derive(Default)]
struct Log {
    customers: HashMap<u32, CustomerLog>,
    /// Creation to receipt, for each event the first time it got in.
    delays_us: Vec<u64>,
    events: u64,
    duplicates: u64,
    requests: u64,
    failed: u64,
    /// Events received (the first time) after a later event of the same producer for the
    /// same customer.
    out_of_order: u64,
    /// Requests that came while the same customer had another one in flight.
    overlapping: u64,
}

#[derive(Default)]
struct CustomerLog {
    seen: HashSet<u64>,
    requests: u64,
    body_bytes: u64,
    /// The latest event id received from each producer, by producer.
    latest: HashMap<u64, u64>,
    /// Requests being handled now.
    in_flight: u32,
}

/// Counts on the server's sockets.
#[derive(Default)]
struct Wire {
    connections: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
}

/// The server's figures at the end of a mode.
pub struct Seen {
    pub events: u64,
    pub duplicates: u64,
    pub requests: u64,
    pub failed: u64,
    pub connections: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub body_bytes: u64,
    pub busiest_customer_requests: u64,
    pub out_of_order: u64,
    pub overlapping: u64,
    pub delays_us: Vec<u64>,
}

/// An event as the server reads it: only the fields it needs.
#[derive(Deserialize)]
struct Received {
    /// The producers number their events so that the id modulo `--producers` is the
    /// producer, and each producer's ids grow.
    id: u64,
    created_us: u64,
}

impl Server {
    pub async fn start(options: &Options) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1");
        let addr = listener.local_addr().expect("bound");
        let wire = Arc::new(Wire::default());
        let state = Arc::new(ServerState {
            fail_rate: options.fail_rate,
            seed: options.seed,
            down_customers: options.down_customers,
            down_until_us: now_us() + options.down_for().as_micros() as u64,
            producers: u64::from(options.producers),
            log: Mutex::new(Log::default()),
            wire: wire.clone(),
        });
        let app = Router::new()
            .route("/customers/{id}/events", post(receive))
            .with_state(state.clone());
        let (shutdown, stopped) = oneshot::channel();
        let listener = CountingListener {
            inner: listener,
            wire,
        };
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await
                .expect("serve");
        });
        Server {
            addr,
            state,
            shutdown,
            task,
        }
    }

    /// Reads the events received and the requests answered so far, for the progress bar.
    pub fn counts(&self) -> impl Fn() -> (u64, u64) + Send + Sync + 'static {
        let state = self.state.clone();
        move || {
            let log = state.lock();
            (log.events, log.requests)
        }
    }

    /// Stops the server, once the client has gone, and returns what it saw.
    pub async fn stop(self) -> Seen {
        let _ = self.shutdown.send(());
        // The client is gone, so its connections are closing; don't wait forever on one.
        let _ = tokio::time::timeout(Duration::from_secs(5), self.task).await;
        let wire = &self.state.wire;
        let mut log = self.state.lock();
        Seen {
            events: log.events,
            duplicates: log.duplicates,
            requests: log.requests,
            failed: log.failed,
            connections: wire.connections.load(Ordering::Relaxed),
            bytes_in: wire.bytes_in.load(Ordering::Relaxed),
            bytes_out: wire.bytes_out.load(Ordering::Relaxed),
            body_bytes: log.customers.values().map(|c| c.body_bytes).sum(),
            busiest_customer_requests: log
                .customers
                .values()
                .map(|c| c.requests)
                .max()
                .unwrap_or(0),
            out_of_order: log.out_of_order,
            overlapping: log.overlapping,
            delays_us: std::mem::take(&mut log.delays_us),
        }
    }
}

impl ServerState {
    fn lock(&self) -> std::sync::MutexGuard<'_, Log> {
        self.log
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether a customer's `nth` request, received at `now_us`, fails: every one while the
    /// customer is down, else by a hash of the seed, the customer and `n`, so the failures
    /// don't depend on timing and a retry is a new draw.
    fn fails(&self, customer: u32, nth: u64, now_us: u64) -> bool {
        if customer < self.down_customers && now_us < self.down_until_us {
            return true;
        }
        let draw = mix(self.seed ^ mix(u64::from(customer) ^ mix(nth)));
        let unit = (draw >> 11) as f64 / (1u64 << 53) as f64; // uniform in [0, 1)
        unit < self.fail_rate
    }
}

/// `POST /customers/{id}/events`: records the events, or answers 503 for `--fail-rate` of
/// the requests and to the `--down-customers` while they are down.
async fn receive(
    State(state): State<Arc<ServerState>>,
    Path(customer): Path<u32>,
    body: Body,
) -> StatusCode {
    let _in_flight = InFlight::enter(&state, customer);
    let Ok(body) = axum::body::to_bytes(body, usize::MAX).await else {
        return StatusCode::BAD_REQUEST;
    };
    let received_us = now_us();
    let events: Result<Vec<Received>, _> = serde_json::from_slice(&body);
    let mut log = state.lock();
    log.requests += 1;
    let this = log.customers.entry(customer).or_default();
    this.requests += 1;
    this.body_bytes += body.len() as u64;
    if state.fails(customer, this.requests, received_us) {
        log.failed += 1;
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    let Ok(events) = events else {
        return StatusCode::BAD_REQUEST;
    };
    let Log {
        customers,
        delays_us,
        events: received,
        duplicates,
        out_of_order,
        ..
    } = &mut *log;
    let this = customers.get_mut(&customer).expect("entered above");
    for event in events {
        if !this.seen.insert(event.id) {
            *duplicates += 1;
            continue;
        }
        *received += 1;
        delays_us.push(received_us.saturating_sub(event.created_us));
        let latest = this
            .latest
            .entry(event.id % state.producers)
            .or_insert(event.id);
        if event.id < *latest {
            *out_of_order += 1;
        } else {
            *latest = event.id;
        }
    }
    StatusCode::OK
}

/// A request to a customer from the moment its headers are in until its answer is made:
/// while one lives, a second for the same customer is an overlap. The client sends a request
/// before this starts and gets the answer after it ends, so an overlap seen here is a real
/// one; overlaps shorter than reading a body may go unseen.
struct InFlight {
    state: Arc<ServerState>,
    customer: u32,
}

impl InFlight {
    fn enter(state: &Arc<ServerState>, customer: u32) -> InFlight {
        let mut log = state.lock();
        let this = log.customers.entry(customer).or_default();
        this.in_flight += 1;
        if this.in_flight > 1 {
            log.overlapping += 1;
        }
        InFlight {
            state: state.clone(),
            customer,
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut log = self.state.lock();
        if let Some(this) = log.customers.get_mut(&self.customer) {
            this.in_flight -= 1;
        }
    }
}

/// A TCP listener that counts the connections it accepts and the bytes on each.
struct CountingListener {
    inner: TcpListener,
    wire: Arc<Wire>,
}

impl axum::serve::Listener for CountingListener {
    type Io = CountingStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (CountingStream, SocketAddr) {
        loop {
            match self.inner.accept().await {
                Ok((stream, addr)) => {
                    let _ = stream.set_nodelay(true);
                    self.wire.connections.fetch_add(1, Ordering::Relaxed);
                    let wire = self.wire.clone();
                    return (CountingStream { stream, wire }, addr);
                }
                // Out of file descriptors, say: wait a little, as axum's own listener does.
                Err(_) => sleep(Duration::from_millis(10)).await,
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// A TCP stream that adds the bytes read and written to the server's counts.
struct CountingStream {
    stream: TcpStream,
    wire: Arc<Wire>,
}

impl AsyncRead for CountingStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let read = Pin::new(&mut this.stream).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        this.wire.bytes_in.fetch_add(n as u64, Ordering::Relaxed);
        read
    }
}

impl AsyncWrite for CountingStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.stream).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = written {
            this.wire.bytes_out.fetch_add(n as u64, Ordering::Relaxed);
        }
        written
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = written {
            this.wire.bytes_out.fetch_add(n as u64, Ordering::Relaxed);
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}
