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
//! a share of the requests with 503 (`--fail-rate 0.1`), or every request to some customers
//! for the first half of the run (`--down-customers 50`; `--down-for` sets how long). It also
//! checks that each customer gets its events in order and never two requests at once, and
//! counts what breaks either.
//!
//! Failed POSTs are retried with a backoff, up to `--max-attempts` POSTs an event (no limit by
//! default); an event given up is a dead letter. Batched mode uses the channel's acknowledged
//! mode (`acked`): a consumer acks a customer's delivery once the POST got in, or retries it
//! after the backoff. The retry goes back in front of the customer's newer events and picks
//! them up on the way, and while a delivery is undecided the customer's newer events wait, so
//! a customer has one request at a time, in order. Ctrl-C (or the end of `--seconds`) stops
//! the producers, closes the channel, delivers everything still pending, retries included,
//! and prints the table; a second Ctrl-C quits at once.
//!
//! With `--durable DIR` (and `--features durable`), batched mode keeps its channel in a log in
//! `DIR`: each event is written there, and synced, before its producer goes on, and a run killed with
//! events pending leaves them there for the next run with the same `DIR` to deliver, ahead of
//! its own.
//!
//! With `--redis URL` (and `--features redis`), batched mode keeps its queue in Redis
//! (`keyed_batch::redis`) and runs as two processes: this one starts a second, its worker,
//! and each runs half the producers and `--consumers` consumers of its own, all sharing the
//! one queue and POSTing to this process's server. The server's checks hold across both: each
//! event once, each customer's in order, one request at a time. A second table shows what
//! each process made and delivered.
//!
//! Run with `--help` for the options. Linux only for the CPU column (it reads `/proc`).
//!
//! This file is the batching: the run of one mode, the two ways to deliver, the consumer that
//! acks or retries, and the producers. Beside it: `client.rs` (the HTTP client and the retry
//! policy), `server.rs` (the customers' endpoints, what they saw and its checks),
//! `options.rs` (the command line), `report.rs` (the table, the JSON and the progress bar),
//! `support.rs` (the Ctrl-C flag, the clock, the seeded generator) and `redis_mode.rs`
//! (batched mode through Redis, in two processes).

mod client;
mod options;
#[cfg(feature = "redis")]
mod redis_mode;
mod report;
mod server;
mod support;

use std::io::IsTerminal as _;
use std::time::Duration;

use axum::body::Bytes;
use clap::Parser as _;
use futures::future::join_all;
use keyed_batch::ack::{DeadLetters, Delivery};
use keyed_batch::error::DeliveryError;
use keyed_batch::timed;
use serde::{Deserialize, Serialize};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::{sleep, Instant};

use client::Client;
use options::Mode;
pub use options::Options;
#[cfg(feature = "redis")]
pub use redis_mode::run_worker;
pub use report::Report;
use report::{thousands, CpuTime, Percentiles, ProcessFigures, Progress};
use server::Server;
use support::{now_us, Random, Stop};

#[tokio::main]
async fn main() {
    let mut options = Options::parse();
    #[cfg(feature = "redis")]
    if options.worker {
        redis_mode::run_worker(&options).await;
        return;
    }
    // The bar redraws its line; into a file or a pipe that would only be noise.
    options.progress = std::io::stdout().is_terminal() && std::io::stderr().is_terminal();
    if options.durable.is_some() {
        support::clock_from_epoch();
    }
    let reports = run(&options).await;
    println!("{}", report::table(&options, &reports));
    if let Some(path) = &options.json {
        let json =
            serde_json::to_string_pretty(&report::json(&options, &reports)).expect("plain data");
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
    for &mode in options.modes() {
        if stop.is_set() {
            break;
        }
        reports.push(run_mode(mode, options, &stop).await);
    }
    reports
}

// ===== one run =====

async fn run_mode(mode: Mode, options: &Options, stop: &Stop) -> Report {
    let server = Server::start(options).await;
    let client = Client::new(server.addr, options);
    let cpu = CpuTime::start();
    let started = Instant::now();
    let progress = Progress::start(mode, options, server.counts());

    let mut produced = match mode {
        Mode::Direct => run_direct(options, &client, stop).await,
        Mode::Batched => match &options.redis {
            None => run_batched(options, &client, stop).await,
            #[cfg(feature = "redis")]
            Some(url) => {
                let port = server.addr.port();
                redis_mode::run_batched(options, url, &client, port, stop).await
            }
            #[cfg(not(feature = "redis"))]
            Some(_) => unreachable!("--redis is refused without the redis feature"),
        },
    };

    let run_seconds = started.elapsed().as_secs_f64();
    let mut cpu_seconds = cpu.seconds();
    if let Some([parent, worker]) = &mut produced.processes {
        // Across two processes: the CPU time of both.
        parent.cpu_seconds = cpu_seconds;
        cpu_seconds = cpu_seconds.zip(worker.cpu_seconds).map(|(a, b)| a + b);
    }
    progress.finish();
    let max_event_failures = client.max_failures();
    let dead_letters = client.dead_letters();
    drop(client); // closes the pooled keep-alive connections, so the server can stop
    let seen = server.stop().await;

    let delays = Percentiles::new(seen.delays_us);
    Report {
        mode: mode.name(),
        events_produced: produced.events,
        events_recovered: produced.recovered,
        events_received: seen.events,
        duplicate_events: seen.duplicates,
        http_requests: seen.requests,
        failed_requests: seen.failed,
        tcp_connections: seen.connections,
        bytes_in: seen.bytes_in,
        bytes_out: seen.bytes_out,
        body_bytes: seen.body_bytes,
        busiest_customer_requests: seen.busiest_customer_requests,
        requests_per_1000_events: 1000.0 * seen.requests as f64
            / (produced.events + produced.recovered).max(1) as f64,
        delay_p50_ms: delays.ms(0.50),
        delay_p99_ms: delays.ms(0.99),
        delay_max_ms: delays.ms(1.0),
        cpu_seconds,
        produce_seconds: produced.seconds,
        run_seconds,
        max_event_failures,
        dead_letters,
        out_of_order_events: seen.out_of_order,
        overlapping_requests: seen.overlapping,
        processes: produced.processes,
    }
}

// ===== the two ways to deliver =====

/// The old way: every event gets its own POST, retried until it gets in or `--max-attempts`
/// POSTs have failed.
async fn run_direct(options: &Options, client: &Client, stop: &Stop) -> Produced {
    produce(options, stop, Share::ALL, |_| Sink::Direct {
        client: client.clone(),
        deliveries: JoinSet::new(),
    })
    .await
}

async fn deliver_one(client: Client, customer: u32, event: Event) {
    let body = body(std::slice::from_ref(&event));
    let mut failures = 0;
    while !client.post(customer, body.clone()).await {
        failures += 1;
        if client.gives_up(failures) {
            client.dead(1);
            return;
        }
        sleep(client.retry_delay(failures)).await;
    }
    client.delivered(failures);
}

/// The batched way: events go into an acknowledging `timed` channel keyed by customer;
/// consumers POST each customer's events together, and ack or retry them.
async fn run_batched(options: &Options, client: &Client, stop: &Stop) -> Produced {
    let mut builder = timed::Builder::new(options.window);
    if let Some(n) = options.max_batch {
        builder = builder.max_batch(n);
    }
    if let Some(n) = options.capacity {
        builder = builder.capacity(n);
    }
    if options.max_attempts > 0 {
        builder = builder.max_attempts(options.max_attempts);
    }
    let (tx, rx) = match options.durable.as_deref() {
        None => builder.acked(),
        #[cfg(feature = "durable")]
        Some(dir) => builder.durable(dir).open().await.unwrap_or_else(|err| {
            eprintln!("error: cannot open the log in {}: {err}", dir.display());
            std::process::exit(1)
        }),
        #[cfg(not(feature = "durable"))]
        Some(_) => unreachable!("--durable is refused without the durable feature"),
    };
    // Events an earlier run left in the log, each due a window after it was first sent.
    let recovered = rx.stats().log_recovered;
    if let Some(dir) = &options.durable {
        let (n, dir) = (thousands(recovered), dir.display());
        eprintln!("batched: {n} events recovered from {dir}");
    }

    // Dead letters not yet taken count toward `--capacity`: take them as they come.
    let dead = tokio::spawn(count_dead(rx.dead_letters(), client.clone()));
    let consumers: Vec<JoinHandle<()>> = (0..options.consumers)
        .map(|_| tokio::spawn(consume(rx.clone(), client.clone())))
        .collect();
    let mut produced = produce(options, stop, Share::ALL, |_| Sink::Batched(tx.clone())).await;
    produced.recovered = recovered;
    if options.abandon {
        // What a crash leaves: deliveries dropped undecided, a channel never closed.
        for task in consumers.into_iter().chain([dead]) {
            task.abort();
            let _ = task.await;
        }
        return produced;
    }

    // The producers are done. Closing the channel makes everything pending due at once, the
    // retries held for their backoff included. The stream ends once every delivery has been
    // acked or dead-lettered, and so do the consumers.
    rx.close();
    for consumer in consumers {
        consumer.await.expect("consumer panicked");
    }
    dead.await.expect("dead-letter counter panicked");
    produced
}

/// One consumer: takes batches and POSTs each customer's events in one request.
async fn consume(mut rx: timed::AckReceiver<u32, Event>, client: Client) {
    while let Some(batch) = rx.recv().await {
        // A batch holds every customer that is due; POST them side by side.
        let delivered = join_all(batch.into_iter().map(|delivery| deliver(&client, delivery)));
        for (_, decided) in delivered.await {
            decided.expect("an in-memory channel decides at once");
        }
    }
}

/// POSTs one customer's events, then acks them, or retries them after the backoff: they go
/// out again in front of whatever the customer got meanwhile. Beyond `--max-attempts` the
/// retry makes them dead letters. Returns how many events got in (0 if the POST failed) and
/// whether the decision was recorded.
async fn deliver(
    client: &Client,
    delivery: Delivery<u32, Event>,
) -> (usize, Result<(), DeliveryError>) {
    let attempt = delivery.attempt();
    let events = delivery.values().len();
    if client.post(*delivery.key(), body(delivery.values())).await {
        client.delivered(attempt - 1);
        (events, delivery.ack().await)
    } else {
        (0, delivery.retry_after(client.retry_delay(attempt)).await)
    }
}

/// Counts the events given up after `--max-attempts` POSTs, until the channel is done.
async fn count_dead(mut dead: DeadLetters<u32, Event>, client: Client) {
    while let Some(letter) = dead.recv().await {
        client.dead(letter.values.len());
    }
}

// ===== producers =====

/// An event as the producers make it.
#[derive(Debug, Serialize, Deserialize)]
struct Event {
    /// `(first + made) * producers + producer`: the server reads each producer's order from
    /// it. `first` is 0, or with `--durable` the clock at the start (see [`produce`]).
    id: u64,
    /// When it was made, on the events' clock ([`now_us`]).
    created_us: u64,
    kind: Kind,
}

/// What happened to the customer's data: one kind in this example.
#[derive(Debug, Serialize, Deserialize)]
enum Kind {
    #[serde(rename = "order.updated")]
    OrderUpdated,
}

/// Where a producer puts its events.
enum Sink {
    Direct {
        client: Client,
        /// One task per event still being delivered.
        deliveries: JoinSet<()>,
    },
    Batched(timed::Sender<u32, Event>),
    #[cfg(feature = "redis")]
    Redis(keyed_batch::redis::Sender<u32, Event>),
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
            #[cfg(feature = "redis")]
            Sink::Redis(tx) => redis_mode::send(tx, customer, event).await,
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
    /// Events a durable channel's log gave back when it opened: made by an earlier run.
    recovered: u64,
    /// A `--redis` run's figures for each of its two processes, the parent first.
    processes: Option<[ProcessFigures; 2]>,
}

/// Which of the `--producers` a process runs: those whose index is `index` modulo `of`.
#[derive(Clone, Copy)]
struct Share {
    index: u32,
    of: u32,
}

impl Share {
    /// Every producer: the run is one process.
    const ALL: Share = Share { index: 0, of: 1 };
}

/// Runs `--producers` tasks (those of this process's `share`) that make events at `--rate`
/// in all for `--seconds` (or until Ctrl-C), each for a customer drawn from a seeded
/// generator: both modes get the same events, with the same ids, for the same customers,
/// however the producers are shared between processes.
async fn produce(
    options: &Options,
    stop: &Stop,
    share: Share,
    sink: impl Fn(u32) -> Sink,
) -> Produced {
    let started = Instant::now();
    let rate = options.producer_rate();
    let total = options.events_per_producer();
    // A durable run's ids start from the clock, above those of any earlier run whose events
    // the log gives back: a producer makes less than one event a microsecond.
    let first = if options.durable.is_some() {
        now_us()
    } else {
        0
    };
    let mut producers = JoinSet::new();
    for index in (share.index..options.producers).step_by(share.of as usize) {
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
                        id: (first + made) * producers_count + u64::from(index),
                        created_us: now_us(),
                        kind: Kind::OrderUpdated,
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
        recovered: 0,
        processes: None,
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
