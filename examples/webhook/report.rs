//! What a run measured and how it is shown: the report of one mode, the table, the JSON, the
//! progress bar, and the number formatting.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;

use super::options::{Mode, Options};

/// The figures for one mode: a row of the table.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub mode: &'static str,
    pub events_produced: u64,
    /// Events an earlier run left in the `--durable` log, delivered by this one.
    pub events_recovered: u64,
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
    /// Events given up after `--max-attempts` failed POSTs: in batched mode, the values
    /// taken from the channel's dead letters.
    pub dead_letters: u64,
    /// Events the server received after a later event from the same producer for the same
    /// customer (0 when each customer gets its events in order).
    pub out_of_order_events: u64,
    /// Requests that reached a customer while another request to it was in flight (0 when a
    /// customer has at most one at a time).
    pub overlapping_requests: u64,
    /// In a `--redis` run, what each of its two processes did, the parent first.
    pub processes: Option<[ProcessFigures; 2]>,
}

/// What one process of a `--redis` run did.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub struct ProcessFigures {
    /// Events its producers made.
    pub events_produced: u64,
    /// POSTs of its consumers that got in (a 2xx answer).
    pub requests_delivered: u64,
    /// The events in those POSTs.
    pub events_delivered: u64,
    /// Its CPU seconds while the mode ran; `None` where `/proc` is missing.
    pub cpu_seconds: Option<f64>,
}

// ===== measuring =====

/// Delay percentiles over the delivered events.
pub struct Percentiles(Vec<u64>);

impl Percentiles {
    pub fn new(mut delays_us: Vec<u64>) -> Percentiles {
        delays_us.sort_unstable();
        Percentiles(delays_us)
    }

    /// The `q` quantile in milliseconds (nearest rank), 0 with no events.
    pub fn ms(&self, q: f64) -> f64 {
        let rank = (q * self.0.len() as f64).ceil() as usize;
        let us = self.0.get(rank.saturating_sub(1)).copied().unwrap_or(0);
        us as f64 / 1000.0
    }
}

/// The process's CPU time from a start, user and system, read from `/proc/self/stat`.
pub struct CpuTime(Option<u64>);

impl CpuTime {
    pub fn start() -> CpuTime {
        CpuTime(cpu_ticks())
    }

    /// CPU seconds since the start; `None` where there is no `/proc`.
    pub fn seconds(&self) -> Option<f64> {
        cpu_ticks()
            .zip(self.0)
            .map(|(after, before)| (after - before) as f64 / TICKS_PER_SECOND)
    }
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

// ===== progress =====

/// A progress bar on stderr while a mode runs: events received out of those the producers
/// will make, their rate, and the time left.
pub struct Progress(Option<Shown>);

struct Shown {
    bar: ProgressBar,
    counts: Counts,
    task: JoinHandle<()>,
}

/// Reads the events received and the requests answered so far.
type Counts = Arc<dyn Fn() -> (u64, u64) + Send + Sync>;

impl Progress {
    /// Starts the bar, if `options.progress` asks for one; `counts` reads the events received
    /// and the requests answered so far.
    pub fn start(
        mode: Mode,
        options: &Options,
        counts: impl Fn() -> (u64, u64) + Send + Sync + 'static,
    ) -> Progress {
        if !options.progress {
            return Progress(None);
        }
        let events = options.events_per_producer() * u64::from(options.producers);
        let style = ProgressStyle::with_template(
            "{prefix:>7} {wide_bar} {human_pos}/{human_len} events in {msg}, {per_sec:0}, \
             {eta} left",
        )
        .expect("a valid template");
        let bar = ProgressBar::new(events)
            .with_style(style)
            .with_prefix(mode.name());
        let counts: Counts = Arc::new(counts);
        let task = tokio::spawn({
            let (bar, counts) = (bar.clone(), counts.clone());
            async move {
                let mut tick = tokio::time::interval(Duration::from_millis(250));
                loop {
                    tick.tick().await;
                    show(&bar, &counts);
                }
            }
        });
        Progress(Some(Shown { bar, counts, task }))
    }

    /// Stops the updates and leaves the final counts on screen.
    pub fn finish(self) {
        if let Some(Shown { bar, counts, task }) = self.0 {
            task.abort();
            show(&bar, &counts);
            bar.abandon(); // `finish` would fill the bar, even after a Ctrl-C
        }
    }
}

/// Brings the bar up to the server's counts.
fn show(bar: &ProgressBar, counts: &Counts) {
    let (events, requests) = counts();
    bar.set_position(events);
    bar.set_message(format!("{} requests", thousands(requests)));
}

// ===== output =====

/// The side-by-side table, in markdown.
pub fn table(options: &Options, reports: &[Report]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n{} customers, {} events/s for {} s from {} producers; window {:?}, \
         {} consumers, at most {} requests in flight, {}% of requests fail{}\n",
        thousands(u64::from(options.customers)),
        thousands(options.rate as u64),
        options.seconds.as_secs_f64(),
        options.producers,
        options.window,
        options.consumers,
        options.in_flight,
        options.fail_rate * 100.0,
        conditions(options),
    );
    out.push_str(
        "| mode | events produced | received once | HTTP requests | requests / 1000 events \
         | TCP connections | MB on the wire | delay p50 | delay p99 | delay max | CPU s \
         | dead letters | out of order | overlapping requests |\n",
    );
    out.push_str("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n");
    for r in reports {
        let mut produced = thousands(r.events_produced);
        if r.events_recovered > 0 {
            let _ = write!(produced, " + {} recovered", thousands(r.events_recovered));
        }
        let mut received = thousands(r.events_received);
        if r.duplicate_events > 0 {
            let _ = write!(received, " (+{} twice)", thousands(r.duplicate_events));
        }
        let mut mode = r.mode.to_string();
        let seconds = options.seconds.as_secs_f64();
        if r.produce_seconds + 0.1 < seconds {
            let _ = write!(mode, " (Ctrl-C after {:.1} s)", r.produce_seconds);
        } else if r.produce_seconds > seconds * 1.1 + 0.1 {
            // Sends that wait, for `--capacity` or for a `--durable` log's syncs, slow them.
            let _ = write!(mode, " (producers took {:.1} s)", r.produce_seconds);
        }
        let cpu = r.cpu_seconds.map_or("n/a".into(), |s| format!("{s:.1}"));
        let _ = writeln!(
            out,
            "| {mode} | {produced} | {received} | {} | {:.1} | {} | {:.1} | {} | {} | {} \
             | {cpu} | {} | {} | {} |",
            thousands(r.http_requests),
            r.requests_per_1000_events,
            thousands(r.tcp_connections),
            (r.bytes_in + r.bytes_out) as f64 / 1e6,
            milliseconds(r.delay_p50_ms),
            milliseconds(r.delay_p99_ms),
            milliseconds(r.delay_max_ms),
            thousands(r.dead_letters),
            thousands(r.out_of_order_events),
            thousands(r.overlapping_requests),
        );
    }
    let cpu = if options.redis.is_some() {
        "the whole process, client and server; batched through Redis, both processes, not \
         the Redis server"
    } else {
        "the whole process, client and server"
    };
    let _ = write!(
        out,
        "\nMB on the wire: HTTP bytes read and written on the server's sockets, headers \
         included, TCP/IP overhead not. Delay: from an event's creation to the server's \
         first receipt of it. CPU: {cpu}. Out of order: \
         events received after a later one from the same producer to the same customer. \
         Overlapping requests: requests that reached a customer while another to it was in \
         flight.",
    );
    for r in reports {
        if let Some(processes) = &r.processes {
            processes_table(&mut out, options, r, processes);
        }
    }
    out
}

/// The table of a `--redis` run's two processes, and the server's tally of what it got.
fn processes_table(out: &mut String, options: &Options, r: &Report, processes: &[ProcessFigures]) {
    let url = options.redis.as_deref().unwrap_or_default();
    let _ = writeln!(
        out,
        "\n\n{} mode across two processes, one queue in Redis at {url}:\n",
        r.mode
    );
    out.push_str(
        "| process | producers | events produced | requests delivered | events delivered \
         | CPU s |\n",
    );
    out.push_str("|---|--:|--:|--:|--:|--:|\n");
    let names = ["parent, with the server", "worker"];
    for (index, (name, p)) in names.iter().zip(processes).enumerate() {
        // The producers whose index modulo 2 is the process's.
        let producers = (options.producers + 1 - index as u32) / 2;
        let cpu = p.cpu_seconds.map_or("n/a".into(), |s| format!("{s:.1}"));
        let _ = writeln!(
            out,
            "| {name} | {producers} | {} | {} | {} | {cpu} |",
            thousands(p.events_produced),
            thousands(p.requests_delivered),
            thousands(p.events_delivered),
        );
    }
    let _ = write!(
        out,
        "\nThe customers' server received {} events once, {} twice, {} out of order, with {} \
         overlapping requests. Requests delivered: the POSTs of the process's consumers that \
         got in, and the events in them.",
        thousands(r.events_received),
        thousands(r.duplicate_events),
        thousands(r.out_of_order_events),
        thousands(r.overlapping_requests),
    );
}

/// The table's note on `--down-customers`, `--max-attempts` and `--durable`, where they are
/// set.
fn conditions(options: &Options) -> String {
    let mut out = String::new();
    if options.down_customers > 0 {
        let _ = write!(
            out,
            ", {} customers down for the first {} s",
            thousands(u64::from(options.down_customers)),
            options.down_for().as_secs_f64(),
        );
    }
    if options.max_attempts > 0 {
        let _ = write!(
            out,
            ", an event given up after {} POSTs",
            options.max_attempts
        );
    }
    if let Some(dir) = &options.durable {
        let _ = write!(out, ", durable in {}", dir.display());
    }
    if options.redis.is_some() {
        out.push_str(", batched through Redis in two processes");
    }
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
            "max_attempts": options.max_attempts,
            "down_customers": options.down_customers,
            "down_for_s": options.down_for().as_secs_f64(),
            "durable": options.durable,
            "redis": options.redis,
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
pub fn thousands(n: u64) -> String {
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
