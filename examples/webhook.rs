//! Pushing events to customers over real HTTP: one request per event, against one request per
//! customer per window through `keyed_batch::timed`.
//!
//! ```text
//! cargo run --release --example webhook
//! ```
//!
//! The program starts an HTTP server on 127.0.0.1 that stands in for the customers' endpoints
//! (`POST /customers/{id}/events`, a JSON array of events). Producer tasks make events for
//! 1,000 customers at 20,000 events/s for 10 s, and the program delivers them twice, on the
//! same workload:
//!
//! - **direct**, the usual way: one POST per event, as soon as it is made;
//! - **batched**: events go into a `timed` channel keyed by customer, and consumer tasks POST
//!   each customer's events together, at most one window (1 s) after the first of them.
//!
//! Then it prints one table row per mode: events produced and received, HTTP requests, TCP
//! connections, bytes on the wire, the delay from an event's creation to its receipt, and the
//! CPU time of the whole process (producers, client and server alike: both ends of the wire
//! live in this one program).
//!
//! Both modes use the same keep-alive client (hyper-util's), with at most `--in-flight` (64)
//! requests out at once, which also keeps its connections to about as many. The server counts
//! the TCP connections it accepts and the bytes it reads and writes on them.
//!
//! The server deduplicates events by id, so "received" counts each event once, and it can fail
//! a share of the requests with 503 (`--fail-rate 0.1`). Failed POSTs are retried with a
//! backoff; in batched mode the retry goes back through the channel with `requeue`, so it
//! picks up the customer's newer events on the way. Ctrl-C (or the end of `--seconds`) stops
//! the producers, closes the channel, delivers everything still pending and prints the table;
//! a second Ctrl-C quits at once.
//!
//! Run with `--help` for the options. Linux only for the CPU column (it reads `/proc`).

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use futures::future::join_all;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use keyed_batch::error::SendError;
use keyed_batch::timed;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::{sleep, Instant};

const USAGE: &str = "\
usage: cargo run --release --example webhook -- [options]

  --mode direct|batched|compare  which way to deliver; compare runs both  [compare]
  --compare                      same as --mode compare
  --seconds S                    how long the producers run              [10]
  --rate R                       events per second, all producers        [20000]
  --customers N                  customers (HTTP endpoints)              [1000]
  --producers P                  producer tasks                          [4]
  --window D                     batched: longest wait for a customer    [1s]
  --max-batch N                  batched: Builder::max_batch             [off]
  --capacity N                   batched: Builder::capacity              [off]
  --consumers N                  batched: consumer tasks                 [4]
  --in-flight N                  most requests in flight at once         [64]
  --fail-rate F                  share of requests answered with 503     [0]
  --backoff D                    first retry delay; doubles, up to 2 s   [100ms]
  --seed N                       seed for customers and failures         [1]
  --json PATH                    also write the figures as JSON
  -h, --help                     print this

Durations take a unit: 1s, 500ms, 2.5s.";

#[tokio::main]
async fn main() {
    let options = match Options::parse(std::env::args().skip(1)) {
        Ok(Some(options)) => options,
        Ok(None) => {
            println!("{USAGE}");
            return;
        }
        Err(message) => {
            eprintln!("error: {message}\n\n{USAGE}");
            std::process::exit(2);
        }
    };
    let reports = run(&options).await;
    println!("{}", table(&options, &reports));
    if let Some(path) = &options.json {
        let json = serde_json::to_string_pretty(&json(&options, &reports)).expect("plain data");
        if let Err(err) = std::fs::write(path, json + "\n") {
            eprintln!("error: cannot write {}: {err}", path.display());
            std::process::exit(1);
        }
    }
}

/// Runs the chosen modes one after the other, each against a fresh server, and returns one
/// report per mode that ran. A Ctrl-C ends the current mode early and skips the rest.
pub async fn run(options: &Options) -> Vec<Report> {
    let stop = Stop::on_ctrl_c();
    let mut reports = Vec::new();
    for &mode in options.mode.modes() {
        if stop.is_set() {
            break;
        }
        reports.push(run_mode(mode, options, &stop).await);
    }
    reports
}

// ===== one run =====

/// The figures for one mode: a row of the table.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub mode: &'static str,
    pub events_produced: u64,
    /// Distinct event ids the server accepted.
    pub events_received: u64,
    /// Events the server accepted more than once (0 when delivery is exactly once).
    pub duplicate_events: u64,
    /// Every request the server answered, the failed ones included.
    pub http_requests: u64,
    /// Requests answered with 503 (`--fail-rate`).
    pub failed_requests: u64,
    pub tcp_connections: u64,
    /// Bytes read from the server's sockets: the requests, headers included.
    pub bytes_in: u64,
    /// Bytes written to the server's sockets: the responses.
    pub bytes_out: u64,
    /// The JSON bodies alone, over all customers.
    pub body_bytes: u64,
    /// Requests to the customer that got the most.
    pub busiest_customer_requests: u64,
    pub requests_per_1000_events: f64,
    pub delay_p50_ms: f64,
    pub delay_p99_ms: f64,
    pub delay_max_ms: f64,
    /// CPU seconds of the whole process during this mode; `None` where `/proc` is missing.
    pub cpu_seconds: Option<f64>,
    /// From the producers' start to their last event.
    pub produce_seconds: f64,
    /// From the producers' start until the last event was delivered.
    pub run_seconds: f64,
    /// The most failed POSTs any one event went through before it got in.
    pub max_event_failures: u32,
}

async fn run_mode(mode: Mode, options: &Options, stop: &Stop) -> Report {
    let server = Server::start(options).await;
    let client = Client::new(server.addr, options);
    let cpu_before = cpu_ticks();
    let started = Instant::now();
    let progress = tokio::spawn(show_progress(mode, server.state.clone()));

    let produced = match mode {
        Mode::Direct => run_direct(options, &client, stop).await,
        Mode::Batched => run_batched(options, &client, stop).await,
    };

    let run_seconds = started.elapsed().as_secs_f64();
    let cpu_seconds = cpu_ticks()
        .zip(cpu_before)
        .map(|(after, before)| (after - before) as f64 / TICKS_PER_SECOND);
    progress.abort();
    eprintln!();
    let max_event_failures = client.max_failures.load(Ordering::Relaxed);
    drop(client); // closes the pooled keep-alive connections, so the server can stop
    let seen = server.stop().await;

    let delays = Percentiles::new(seen.delays_us);
    Report {
        mode: mode.name(),
        events_produced: produced.events,
        events_received: seen.events,
        duplicate_events: seen.duplicates,
        http_requests: seen.requests,
        failed_requests: seen.failed,
        tcp_connections: seen.connections,
        bytes_in: seen.bytes_in,
        bytes_out: seen.bytes_out,
        body_bytes: seen.body_bytes,
        busiest_customer_requests: seen.busiest_customer_requests,
        requests_per_1000_events: 1000.0 * seen.requests as f64 / produced.events.max(1) as f64,
        delay_p50_ms: delays.ms(0.50),
        delay_p99_ms: delays.ms(0.99),
        delay_max_ms: delays.ms(1.0),
        cpu_seconds,
        produce_seconds: produced.seconds,
        run_seconds,
        max_event_failures,
    }
}

/// Prints a progress line to stderr every second, until aborted.
async fn show_progress(mode: Mode, state: Arc<ServerState>) {
    let started = Instant::now();
    loop {
        sleep(Duration::from_secs(1)).await;
        let (requests, events) = {
            let log = state.lock();
            (log.requests, log.events)
        };
        eprint!(
            "\r{:>7} {:>5.1} s: {} events received in {} requests   ",
            mode.name(),
            started.elapsed().as_secs_f64(),
            thousands(events),
            thousands(requests),
        );
    }
}

// ===== the two ways to deliver =====

/// The old way: every event gets its own POST, retried until it gets in.
async fn run_direct(options: &Options, client: &Client, stop: &Stop) -> Produced {
    produce(options, stop, |_| Sink::Direct {
        client: client.clone(),
        deliveries: JoinSet::new(),
    })
    .await
}

async fn deliver_one(client: Client, customer: u32, mut event: Event) {
    let body = body(std::slice::from_ref(&event));
    while !client.post(customer, body.clone()).await {
        event.failures += 1;
        sleep(client.retry_delay(event.failures)).await;
    }
    client.delivered(&[event]);
}

/// The batched way: events go into a `timed` channel keyed by customer; consumers POST each
/// customer's events together.
async fn run_batched(options: &Options, client: &Client, stop: &Stop) -> Produced {
    let mut builder = timed::Builder::new(options.window);
    if let Some(n) = options.max_batch {
        builder = builder.max_batch(n);
    }
    if let Some(n) = options.capacity {
        builder = builder.capacity(n);
    }
    let (tx, rx) = builder.build::<u32, Event>();

    let consumers: Vec<JoinHandle<()>> = (0..options.consumers)
        .map(|_| tokio::spawn(consume(rx.clone(), client.clone())))
        .collect();
    let produced = produce(options, stop, |_| Sink::Batched(tx.clone())).await;

    // The producers are done. Closing the channel makes everything pending due at once; the
    // consumers deliver it, wait for their retries, and return when the stream ends.
    rx.close();
    for consumer in consumers {
        consumer.await.expect("consumer panicked");
    }
    produced
}

/// One consumer: takes batches and POSTs each customer's events in one request.
async fn consume(mut rx: timed::Receiver<u32, Event>, client: Client) {
    let mut retries = JoinSet::new();
    while let Some(batch) = rx.recv().await {
        // A batch holds every customer that is due; POST them side by side.
        let posts = batch.into_iter().map(|(customer, events)| {
            let client = &client;
            async move {
                let ok = client.post(customer, body(&events)).await;
                (customer, events, ok)
            }
        });
        for (customer, mut events, ok) in join_all(posts).await {
            if ok {
                client.delivered(&events);
            } else {
                for event in &mut events {
                    event.failures += 1;
                }
                retries.spawn(retry(rx.clone(), client.clone(), customer, events));
            }
        }
        while retries.try_join_next().is_some() {}
    }
    // The stream has ended, but a retry may still be waiting out its backoff.
    while retries.join_next().await.is_some() {}
}

/// Waits out the backoff, then puts a customer's failed events back into the channel: they
/// go in front of the customer's newer events, and the customer is due at once.
///
/// Once the stream has ended (some consumer's `recv` returned `None`), `requeue` refuses, as
/// nobody will receive again: then this task POSTs the events itself until they get in.
async fn retry(
    rx: timed::Receiver<u32, Event>,
    client: Client,
    customer: u32,
    mut events: Vec<Event>,
) {
    loop {
        let failures = events.iter().map(|event| event.failures).max().unwrap_or(1);
        sleep(client.retry_delay(failures)).await;
        match rx.requeue(customer, events) {
            Ok(()) => return,
            Err(SendError((_, back))) => events = back,
        }
        if client.post(customer, body(&events)).await {
            client.delivered(&events);
            return;
        }
        for event in &mut events {
            event.failures += 1;
        }
    }
}

// ===== producers =====

/// An event as the producers make it.
#[derive(Debug, Serialize)]
struct Event {
    id: u64,
    /// Microseconds since the program started ([`now_us`]).
    created_us: u64,
    kind: &'static str,
    /// Failed POSTs so far: the client's own bookkeeping, not sent.
    #[serde(skip)]
    failures: u32,
}

/// Where a producer puts its events.
enum Sink {
    Direct {
        client: Client,
        /// One task per event still being delivered.
        deliveries: JoinSet<()>,
    },
    Batched(timed::Sender<u32, Event>),
}

impl Sink {
    async fn put(&mut self, customer: u32, event: Event) {
        match self {
            Sink::Direct { client, deliveries } => {
                // A task per event, so that a slow server delays events rather than slowing
                // the producer: the workload is the same in both modes.
                deliveries.spawn(deliver_one(client.clone(), customer, event));
                while deliveries.try_join_next().is_some() {}
            }
            Sink::Batched(tx) => {
                // Waits only if `--capacity` is set and the channel is full.
                tx.send(customer, event)
                    .await
                    .unwrap_or_else(|_| unreachable!("the channel closes after the producers"));
            }
        }
    }

    async fn finish(self) {
        if let Sink::Direct { mut deliveries, .. } = self {
            while deliveries.join_next().await.is_some() {}
        }
    }
}

struct Produced {
    events: u64,
    seconds: f64,
}

/// Runs `--producers` tasks that make events at `--rate` in all for `--seconds` (or until
/// Ctrl-C), each for a customer drawn from a seeded generator: both modes get the same
/// events, with the same ids, for the same customers.
async fn produce(options: &Options, stop: &Stop, sink: impl Fn(u32) -> Sink) -> Produced {
    let started = Instant::now();
    let rate = options.rate / f64::from(options.producers);
    // Each producer makes a fixed number of events, the last of them due at `--seconds`.
    let total = (rate * options.seconds.as_secs_f64()).round() as u64;
    let mut producers = JoinSet::new();
    for index in 0..options.producers {
        let (stop, mut sink) = (stop.clone(), sink(index));
        let (customers, producers_count) = (options.customers, u64::from(options.producers));
        let mut random = Random::new(options.seed ^ (u64::from(index) << 32));
        producers.spawn(async move {
            let mut made = 0u64;
            while made < total && !stop.is_set() {
                // Catch up with the schedule, then sleep a tick (tokio's timer ticks in ms).
                let due = ((started.elapsed().as_secs_f64() * rate) as u64).min(total);
                while made < due {
                    let event = Event {
                        id: made * producers_count + u64::from(index),
                        created_us: now_us(),
                        kind: "order.updated",
                        failures: 0,
                    };
                    sink.put(random.below(customers), event).await;
                    made += 1;
                }
                if made < total {
                    sleep(Duration::from_millis(1)).await;
                }
            }
            let seconds = started.elapsed().as_secs_f64();
            sink.finish().await;
            (made, seconds)
        });
    }
    let mut produced = Produced {
        events: 0,
        seconds: 0.0,
    };
    while let Some(done) = producers.join_next().await {
        let (events, seconds) = done.expect("producer panicked");
        produced.events += events;
        produced.seconds = produced.seconds.max(seconds);
    }
    produced
}

/// The JSON body of a POST: an array of events.
fn body(events: &[Event]) -> Bytes {
    Bytes::from(serde_json::to_vec(events).expect("plain data"))
}

// ===== HTTP client =====

/// A keep-alive HTTP client, shared by every task of a mode.
///
/// Both modes have at most `--in-flight` requests out at once (64 by default). That also
/// bounds the connections to about as many: the pool opens a new one when none is idle
/// (and a few extra while a finished one is on its way back to the pool). Without the bound,
/// direct mode would open a socket for every event whose request overlaps another's:
/// thousands at 20,000 events/s.
#[derive(Clone)]
struct Client {
    http: hyper_util::client::legacy::Client<HttpConnector, Full<Bytes>>,
    base: Arc<str>,
    in_flight: Arc<Semaphore>,
    backoff: Duration,
    max_failures: Arc<AtomicU32>,
}

impl Client {
    fn new(server: SocketAddr, options: &Options) -> Client {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let http =
            hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(connector);
        Client {
            http,
            base: format!("http://{server}/customers").into(),
            in_flight: Arc::new(Semaphore::new(options.in_flight)),
            backoff: options.backoff,
            max_failures: Arc::new(AtomicU32::new(0)),
        }
    }

    /// POSTs a JSON body to a customer; true if it got in (a 2xx answer).
    async fn post(&self, customer: u32, body: Bytes) -> bool {
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
    fn retry_delay(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(16);
        (self.backoff * (1 << doublings)).min(Duration::from_secs(2))
    }

    /// Notes events that got in, for the most failures any event went through.
    fn delivered(&self, events: &[Event]) {
        let failures = events.iter().map(|event| event.failures).max().unwrap_or(0);
        self.max_failures.fetch_max(failures, Ordering::Relaxed);
    }
}

// ===== HTTP server =====

/// The customers' endpoints, on 127.0.0.1 and a free port.
struct Server {
    addr: SocketAddr,
    state: Arc<ServerState>,
    shutdown: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

struct ServerState {
    fail_rate: f64,
    seed: u64,
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
}

#[derive(Default)]
struct CustomerLog {
    seen: HashSet<u64>,
    requests: u64,
    body_bytes: u64,
}

/// Counts on the server's sockets.
#[derive(Default)]
struct Wire {
    connections: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
}

/// The server's figures at the end of a mode.
struct Seen {
    events: u64,
    duplicates: u64,
    requests: u64,
    failed: u64,
    connections: u64,
    bytes_in: u64,
    bytes_out: u64,
    body_bytes: u64,
    busiest_customer_requests: u64,
    delays_us: Vec<u64>,
}

/// An event as the server reads it: only the fields it needs.
#[derive(Deserialize)]
struct Received {
    id: u64,
    created_us: u64,
}

impl Server {
    async fn start(options: &Options) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1");
        let addr = listener.local_addr().expect("bound");
        let wire = Arc::new(Wire::default());
        let state = Arc::new(ServerState {
            fail_rate: options.fail_rate,
            seed: options.seed,
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

    async fn stop(self) -> Seen {
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

    /// Whether a customer's `nth` request fails: a hash of the seed, the customer and `n`, so
    /// the failures don't depend on timing and a retry is a new draw.
    fn fails(&self, customer: u32, nth: u64) -> bool {
        let draw = mix(self.seed ^ mix(u64::from(customer) ^ mix(nth)));
        let unit = (draw >> 11) as f64 / (1u64 << 53) as f64; // uniform in [0, 1)
        unit < self.fail_rate
    }
}

/// `POST /customers/{id}/events`: records the events, or answers 503 for `--fail-rate` of
/// the requests.
async fn receive(
    State(state): State<Arc<ServerState>>,
    Path(customer): Path<u32>,
    body: Bytes,
) -> StatusCode {
    let received_us = now_us();
    let events: Result<Vec<Received>, _> = serde_json::from_slice(&body);
    let mut log = state.lock();
    log.requests += 1;
    let this = log.customers.entry(customer).or_default();
    this.requests += 1;
    this.body_bytes += body.len() as u64;
    if state.fails(customer, this.requests) {
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
        ..
    } = &mut *log;
    let seen = &mut customers.get_mut(&customer).expect("entered above").seen;
    for event in events {
        if seen.insert(event.id) {
            *received += 1;
            delays_us.push(received_us.saturating_sub(event.created_us));
        } else {
            *duplicates += 1;
        }
    }
    StatusCode::OK
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

// ===== options =====

/// The command line.
#[derive(Clone, Debug)]
pub struct Options {
    pub mode: ModeChoice,
    pub seconds: Duration,
    pub rate: f64,
    pub customers: u32,
    pub producers: u32,
    pub window: Duration,
    pub max_batch: Option<usize>,
    pub capacity: Option<usize>,
    pub consumers: usize,
    pub in_flight: usize,
    pub fail_rate: f64,
    pub backoff: Duration,
    pub seed: u64,
    pub json: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModeChoice {
    Direct,
    Batched,
    Compare,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Direct,
    Batched,
}

impl ModeChoice {
    fn modes(self) -> &'static [Mode] {
        match self {
            ModeChoice::Direct => &[Mode::Direct],
            ModeChoice::Batched => &[Mode::Batched],
            ModeChoice::Compare => &[Mode::Direct, Mode::Batched],
        }
    }
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Direct => "direct",
            Mode::Batched => "batched",
        }
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            mode: ModeChoice::Compare,
            seconds: Duration::from_secs(10),
            rate: 20_000.0,
            customers: 1_000,
            producers: 4,
            window: Duration::from_secs(1),
            max_batch: None,
            capacity: None,
            consumers: 4,
            in_flight: 64,
            fail_rate: 0.0,
            backoff: Duration::from_millis(100),
            seed: 1,
            json: None,
        }
    }
}

impl Options {
    /// Parses the arguments after the program name; `Ok(None)` asks for the usage text.
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Option<Options>, String> {
        let mut options = Options::default();
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            // Both `--name value` and `--name=value`.
            let (name, inline) = match arg.split_once('=') {
                Some((name, value)) => (name.to_string(), Some(value.to_string())),
                None => (arg, None),
            };
            let mut value = || {
                inline
                    .clone()
                    .or_else(|| args.next())
                    .ok_or_else(|| format!("{name} needs a value"))
            };
            match name.as_str() {
                "-h" | "--help" => return Ok(None),
                "--compare" => options.mode = ModeChoice::Compare,
                "--mode" => {
                    options.mode = match value()?.as_str() {
                        "direct" => ModeChoice::Direct,
                        "batched" => ModeChoice::Batched,
                        "compare" => ModeChoice::Compare,
                        other => return Err(format!("unknown mode {other:?}")),
                    }
                }
                "--seconds" => {
                    let seconds: f64 = number(&name, &value()?)?;
                    options.seconds = Duration::try_from_secs_f64(seconds)
                        .map_err(|_| format!("--seconds: {seconds} is not a duration"))?;
                }
                "--rate" => options.rate = number(&name, &value()?)?,
                "--customers" => options.customers = number(&name, &value()?)?,
                "--producers" => options.producers = number(&name, &value()?)?,
                "--window" => options.window = duration(&name, &value()?)?,
                "--max-batch" => options.max_batch = Some(number(&name, &value()?)?),
                "--capacity" => options.capacity = Some(number(&name, &value()?)?),
                "--consumers" => options.consumers = number(&name, &value()?)?,
                "--in-flight" => options.in_flight = number(&name, &value()?)?,
                "--fail-rate" => options.fail_rate = number(&name, &value()?)?,
                "--backoff" => options.backoff = duration(&name, &value()?)?,
                "--seed" => options.seed = number(&name, &value()?)?,
                "--json" => options.json = Some(PathBuf::from(value()?)),
                other => return Err(format!("unknown option {other:?}")),
            }
        }
        options.check()?;
        Ok(Some(options))
    }

    fn check(&self) -> Result<(), String> {
        let positive = [
            ("--customers", self.customers as usize),
            ("--producers", self.producers as usize),
            ("--consumers", self.consumers),
            ("--in-flight", self.in_flight),
            ("--max-batch", self.max_batch.unwrap_or(1)),
            ("--capacity", self.capacity.unwrap_or(1)),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, n)| *n == 0) {
            return Err(format!("{name} must be at least 1"));
        }
        if !(self.rate > 0.0 && self.rate.is_finite()) {
            return Err("--rate must be a positive number".into());
        }
        // A rate of 1 would fail every retry too, and the program would never finish.
        if !(0.0..1.0).contains(&self.fail_rate) {
            return Err("--fail-rate must be at least 0 and below 1".into());
        }
        Ok(())
    }
}

fn number<T: std::str::FromStr>(name: &str, value: &str) -> Result<T, String> {
    value
        .parse()
        .map_err(|_| format!("{name}: {value:?} is not a valid number"))
}

fn duration(name: &str, value: &str) -> Result<Duration, String> {
    let (digits, unit) = if let Some(ms) = value.strip_suffix("ms") {
        (ms, 1e-3)
    } else if let Some(s) = value.strip_suffix('s') {
        (s, 1.0)
    } else {
        return Err(format!("{name}: {value:?} needs a unit (ms or s)"));
    };
    let seconds: f64 = number(name, digits)?;
    Duration::try_from_secs_f64(seconds * unit)
        .map_err(|_| format!("{name}: {value:?} is not a duration"))
}

// ===== small helpers =====

/// Set once Ctrl-C is pressed; a second Ctrl-C quits at once.
#[derive(Clone)]
struct Stop(Arc<AtomicBool>);

impl Stop {
    fn on_ctrl_c() -> Stop {
        let stop = Stop(Arc::new(AtomicBool::new(false)));
        let flag = stop.0.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!("\nCtrl-C: stopping the producers and delivering what is pending");
                flag.store(true, Ordering::Relaxed);
                if tokio::signal::ctrl_c().await.is_ok() {
                    std::process::exit(130);
                }
            }
        });
        stop
    }

    fn is_set(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Microseconds since the program first asked: the clock for creation and receipt times,
/// shared by producers and server since both live in this process.
fn now_us() -> u64 {
    static START: OnceLock<std::time::Instant> = OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_micros() as u64
}

/// Linux reports CPU times in USER_HZ, which is 100 on every platform it supports.
const TICKS_PER_SECOND: f64 = 100.0;

/// The process's CPU time so far, user and system, in ticks, from `/proc/self/stat`; `None`
/// where there is no `/proc`.
fn cpu_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// A small seeded generator (splitmix64): the same seed, the same customers.
struct Random(u64);

impl Random {
    fn new(seed: u64) -> Random {
        Random(seed)
    }

    fn below(&mut self, n: u32) -> u32 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        (((mix(self.0) >> 32) * u64::from(n)) >> 32) as u32
    }
}

/// splitmix64's finaliser: scrambles the bits of a counter.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Delay percentiles over the delivered events.
struct Percentiles(Vec<u64>);

impl Percentiles {
    fn new(mut delays_us: Vec<u64>) -> Percentiles {
        delays_us.sort_unstable();
        Percentiles(delays_us)
    }

    /// The `q` quantile in milliseconds (nearest rank), 0 with no events.
    fn ms(&self, q: f64) -> f64 {
        let rank = (q * self.0.len() as f64).ceil() as usize;
        let us = self.0.get(rank.saturating_sub(1)).copied().unwrap_or(0);
        us as f64 / 1000.0
    }
}

// ===== output =====

/// The side-by-side table, in markdown.
pub fn table(options: &Options, reports: &[Report]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n{} customers, {} events/s for {} s from {} producers; window {:?}, \
         {} consumers, at most {} requests in flight, {}% of requests fail\n",
        thousands(u64::from(options.customers)),
        thousands(options.rate as u64),
        options.seconds.as_secs_f64(),
        options.producers,
        options.window,
        options.consumers,
        options.in_flight,
        options.fail_rate * 100.0,
    );
    out.push_str(
        "| mode | events produced | received once | HTTP requests | requests / 1000 events \
         | TCP connections | MB on the wire | delay p50 | delay p99 | delay max | CPU s |\n",
    );
    out.push_str("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n");
    for r in reports {
        let mut received = thousands(r.events_received);
        if r.duplicate_events > 0 {
            let _ = write!(received, " (+{} twice)", thousands(r.duplicate_events));
        }
        let mut mode = r.mode.to_string();
        if r.produce_seconds + 0.1 < options.seconds.as_secs_f64() {
            let _ = write!(mode, " (Ctrl-C after {:.1} s)", r.produce_seconds);
        }
        let cpu = r.cpu_seconds.map_or("n/a".into(), |s| format!("{s:.1}"));
        let _ = writeln!(
            out,
            "| {mode} | {} | {received} | {} | {:.1} | {} | {:.1} | {} | {} | {} | {cpu} |",
            thousands(r.events_produced),
            thousands(r.http_requests),
            r.requests_per_1000_events,
            thousands(r.tcp_connections),
            (r.bytes_in + r.bytes_out) as f64 / 1e6,
            milliseconds(r.delay_p50_ms),
            milliseconds(r.delay_p99_ms),
            milliseconds(r.delay_max_ms),
        );
    }
    out.push_str(
        "\nMB on the wire: HTTP bytes read and written on the server's sockets, headers \
         included, TCP/IP overhead not. Delay: from an event's creation to the server's \
         first receipt of it. CPU: the whole process, client and server.",
    );
    out
}

/// The same figures as JSON, with the options they came from.
pub fn json(options: &Options, reports: &[Report]) -> serde_json::Value {
    serde_json::json!({
        "options": {
            "seconds": options.seconds.as_secs_f64(),
            "rate": options.rate,
            "customers": options.customers,
            "producers": options.producers,
            "window_ms": options.window.as_secs_f64() * 1000.0,
            "max_batch": options.max_batch,
            "capacity": options.capacity,
            "consumers": options.consumers,
            "in_flight": options.in_flight,
            "fail_rate": options.fail_rate,
            "backoff_ms": options.backoff.as_secs_f64() * 1000.0,
            "seed": options.seed,
        },
        "bytes": "bytes_in and bytes_out are read and written on the server's sockets: \
                  HTTP with headers, without TCP/IP overhead",
        "modes": reports,
    })
}

/// A delay, with a decimal where it is small.
fn milliseconds(ms: f64) -> String {
    if ms < 10.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{ms:.0} ms")
    }
}

/// 1234567 as "1,234,567".
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    out
}
