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
//!
//! This file is the batching: the run of one mode, the two ways to deliver, the consumer with
//! its retry, and the producers. Beside it: `client.rs` (the HTTP client), `server.rs` (the
//! customers' endpoints and what they saw), `options.rs` (the command line), `report.rs`
//! (the table, the JSON and the progress bar) and `support.rs` (the Ctrl-C flag, the clock,
//! the seeded generator).

mod client;
mod options;
mod report;
mod server;
mod support;

use std::io::IsTerminal as _;
use std::time::Duration;

use axum::body::Bytes;
use clap::Parser as _;
use futures::future::join_all;
use keyed_batch::error::SendError;
use keyed_batch::timed;
use serde::Serialize;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::{sleep, Instant};

use client::Client;
use options::Mode;
pub use options::Options;
pub use report::Report;
use report::{CpuTime, Percentiles, Progress};
use server::Server;
use support::{now_us, Random, Stop};

#[tokio::main]
async fn main() {
    let mut options = Options::parse();
    // The bar redraws its line; into a file or a pipe that would only be noise.
    options.progress = std::io::stdout().is_terminal() && std::io::stderr().is_terminal();
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

    let produced = match mode {
        Mode::Direct => run_direct(options, &client, stop).await,
        Mode::Batched => run_batched(options, &client, stop).await,
    };

    let run_seconds = started.elapsed().as_secs_f64();
    let cpu_seconds = cpu.seconds();
    progress.finish();
    let max_event_failures = client.max_failures();
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
    let rate = options.producer_rate();
    let total = options.events_per_producer();
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
