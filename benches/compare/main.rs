//! `keyed_batch` side by side with what a user would pick instead.
//!
//! ```text
//! cargo bench --bench compare -- --quick   # 3 rounds, 400,000 values a run, about a minute
//! cargo bench --bench compare              # 5 rounds, 2,000,000 values a run
//! ```
//!
//! Run without `--bench` or `--quick` (as `cargo test --benches` does), the binary does a
//! smoke check instead: one short, verified run of every variant, and it writes no files.
//! `--rounds N`, `--values N`, `--only a,b` (variants) and `--scenario w0-p1` (names that
//! contain it) narrow a run down; a narrowed run writes no files. To profile one variant,
//! run a child directly: `compare-<hash> --child timed 0 1 1000 2000000` (variant, window
//! ms, producers, keys, values) or `--lateness-child timed 1000000 200000 2000 20`.
//!
//! # Variants
//!
//! | name | what |
//! |---|---|
//! | `mpsc` | `tokio::sync::mpsc::unbounded_channel`, the consumer only checks and counts: the floor |
//! | `diy_delayqueue` | mpsc into a consumer task holding `HashMap<K, Vec<V>>` and a `tokio_util::time::DelayQueue<K>` |
//! | `origin_port` | the origin's design: one `Mutex<(BTreeMap<Instant, Vec<K>>, HashMap<K, Vec<V>>)>`, pulled, 100 ms naps |
//! | `timed` | `keyed_batch::timed` |
//! | `ordered` | `keyed_batch::ordered` with random `u32` sort keys (window 0 scenarios only) |
//! | `diy_binaryheap` | mpsc into a consumer task holding `HashMap` + `BinaryHeap`: what `ordered` replaces |
//!
//! # How a run goes
//!
//! Each run is a child process (this binary, re-invoked with `--child`), so that peak RSS
//! (`VmHWM`) and the allocation count belong to one variant alone. In each round every
//! variant runs once per scenario, in an order rotated from round to round, and ratios are
//! taken within a round before their median is taken: the machine's noise hits both sides.
//!
//! - A multi-thread tokio runtime with one worker per core.
//! - `P` producer *tasks*. Producer `p` sends a contiguous range of value indices, so the
//!   value (its index) encodes the producer and its sequence number. The key is a hash of
//!   the index modulo `M`. A producer yields to the scheduler every 256 values, as a task that
//!   does some I/O would; otherwise four producers on two workers starve the consumer.
//! - One consumer task. A run ends when it has seen every value; nothing is closed early, so
//!   a windowed run includes waiting out the last window.
//! - Verification: every delivered value must be an index that was sent, under the key that
//!   index maps to, and not seen before (a bitmap); the run fails unless every index arrived,
//!   and the channel must be empty afterwards.
//! - mpsc-based consumers read with `recv_many(.., 128)`; `origin_port` pulls at most 100
//!   values at a time, as the origin's own demo does, and naps 100 ms when nothing is due.
//!
//! # Figures
//!
//! ns per value: wall time from the first send to the last value checked, less the time the
//! consumer sat suspended after the last send (waiting out the last windows, or the origin's
//! naps), over values; CPU ns per value (every thread, from `/proc/self/task/*/schedstat`);
//! values per delivery (how well values batch up per key; 1 for `mpsc`); peak RSS (`VmHWM`), RSS once everything drained (`VmRSS`, channel still alive), and
//! allocations per value (`alloc` plus `realloc` calls, whole process, counted by
//! `stats_alloc`). Lateness: one producer paces 200,000 values/s for 2 s into a 20 ms window;
//! for each delivered key, delivery time minus its deadline (the send time of the oldest value
//! in that delivery plus the window). A negative figure is an early delivery.
//!
//! Output: a markdown report on stdout, `target/compare.json` and `target/compare.svg`.

use std::alloc::System;
use std::cmp::Reverse;
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::env;
use std::error::Error;
use std::fmt::Write as _;
use std::future::{poll_fn, Future};
use std::path::PathBuf;
use std::pin::pin;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use keyed_batch::{ordered, timed, Batch};
use serde::{Deserialize, Serialize};
use stats_alloc::{StatsAlloc, INSTRUMENTED_SYSTEM};
use tokio::sync::mpsc;
use tokio_util::time::DelayQueue;

use common::mix;

#[path = "../common/mod.rs"]
mod common;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// A producer yields to the scheduler after this many values.
const YIELD_EVERY: u64 = 256;
/// mpsc-based consumers read up to this many messages at a time.
const RECV_CHUNK: usize = 128;
/// The origin's demo calls `Pull(100)`.
const ORIGIN_PULL: usize = 100;
/// The origin's consumer sleeps this long when nothing is due.
const ORIGIN_NAP: Duration = Duration::from_millis(100);
/// Lateness runs pack the send time above the value index.
const INDEX_BITS: u32 = 24;
const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;

const LATENESS_WINDOW_MS: u64 = 20;
const LATENESS_RATE: u64 = 200_000;

const WINDOWED: [&str; 4] = ["mpsc", "diy_delayqueue", "origin_port", "timed"];
const ALL: [&str; 6] = [
    "mpsc",
    "diy_delayqueue",
    "origin_port",
    "timed",
    "ordered",
    "diy_binaryheap",
];
const LATENESS: [&str; 3] = ["timed", "diy_delayqueue", "origin_port"];

fn main() {
    let args: Vec<String> = env::args().skip(1).collect();
    if let Some(at) = args.iter().position(|a| a == "--child") {
        let result = throughput_child(&args[at + 1..]);
        println!(
            "RESULT {}",
            serde_json::to_string(&result).expect("serializable")
        );
    } else if let Some(at) = args.iter().position(|a| a == "--lateness-child") {
        let result = lateness_child(&args[at + 1..]);
        println!(
            "RESULT {}",
            serde_json::to_string(&result).expect("serializable")
        );
    } else {
        parent(&args);
    }
}

// ===== workload =====

/// The key value `index` goes under.
fn key_of(index: u64, keys: u64) -> u64 {
    mix(index) % keys
}

/// The random sort key `ordered` and `diy_binaryheap` give value `index`.
fn sort_key_of(index: u64) -> u32 {
    (mix(index ^ 0x5555_5555_5555_5555) >> 32) as u32
}

/// Something a producer task sends through.
trait Produce: Clone + Send + Sync + 'static {
    fn put(&self, key: u64, value: u64) -> impl Future<Output = ()> + Send;
}

#[derive(Clone)]
struct MpscTx(mpsc::UnboundedSender<(u64, u64)>);

impl Produce for MpscTx {
    fn put(&self, key: u64, value: u64) -> impl Future<Output = ()> + Send {
        self.0.send((key, value)).expect("consumer is alive");
        std::future::ready(())
    }
}

#[derive(Clone)]
struct HeapTx(mpsc::UnboundedSender<(u32, u64, u64)>);

impl Produce for HeapTx {
    fn put(&self, key: u64, value: u64) -> impl Future<Output = ()> + Send {
        let sort = sort_key_of(value & INDEX_MASK);
        self.0.send((sort, key, value)).expect("consumer is alive");
        std::future::ready(())
    }
}

#[derive(Clone)]
struct TimedTx(timed::Sender<u64, u64>);

impl Produce for TimedTx {
    async fn put(&self, key: u64, value: u64) {
        self.0.send(key, value).await.expect("channel is open")
    }
}

#[derive(Clone)]
struct OrderedTx(ordered::Sender<u32, u64, u64>);

impl Produce for OrderedTx {
    async fn put(&self, key: u64, value: u64) {
        let sort = sort_key_of(value & INDEX_MASK);
        self.0
            .send(sort, key, value)
            .await
            .expect("channel is open")
    }
}

#[derive(Clone)]
struct OriginTx(Arc<OriginQueue>);

impl Produce for OriginTx {
    fn put(&self, key: u64, value: u64) -> impl Future<Output = ()> + Send {
        self.0.publish(key, value);
        std::future::ready(())
    }
}

/// Sends `values` values from `producers` tasks at full speed, and waits for them.
async fn produce_all<T: Produce>(tx: T, producers: u64, values: u64, keys: u64) {
    let per = values / producers;
    let tasks: Vec<_> = (0..producers)
        .map(|p| {
            let tx = tx.clone();
            let start = p * per;
            let end = if p + 1 == producers {
                values
            } else {
                start + per
            };
            tokio::spawn(async move {
                for (n, index) in (start..end).enumerate() {
                    tx.put(key_of(index, keys), index).await;
                    if n as u64 % YIELD_EVERY == YIELD_EVERY - 1 {
                        tokio::task::yield_now().await;
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("producer ran to the end");
    }
    SENT_ALL.set(Instant::now()).expect("one run per process");
}

/// When the last producer of this process's run finished sending.
static SENT_ALL: OnceLock<Instant> = OnceLock::new();
/// How long the consumer sat suspended after that, in ns.
static IDLE_AFTER_SENT_NS: AtomicU64 = AtomicU64::new(0);

/// Awaits `fut` for a consumer, adding the time it sits suspended after the last send to
/// [`IDLE_AFTER_SENT_NS`]. Time spent polling it (taking a batch) still counts as work.
async fn waiting<F: Future>(fut: F) -> F::Output {
    let mut fut = pin!(fut);
    let mut since: Option<Instant> = None;
    poll_fn(|cx| {
        if let (Some(since), Some(&sent)) = (since.take(), SENT_ALL.get()) {
            let idle = Instant::now().saturating_duration_since(since.max(sent));
            IDLE_AFTER_SENT_NS.fetch_add(idle.as_nanos() as u64, Relaxed);
        }
        let poll = fut.as_mut().poll(cx);
        if poll.is_pending() {
            since = Some(Instant::now());
        }
        poll
    })
    .await
}

/// Sends `total` values from one task at `rate` values per second, each value carrying its
/// send time (ns since `base`) above its index.
async fn produce_paced<T: Produce>(tx: T, total: u64, rate: u64, keys: u64, base: Instant) {
    let start = Instant::now();
    let mut index = 0;
    while index < total {
        let due = (start.elapsed().as_nanos() as u64 * rate / 1_000_000_000).min(total);
        while index < due {
            let sent = base.elapsed().as_nanos() as u64;
            tx.put(key_of(index, keys), (sent << INDEX_BITS) | index)
                .await;
            index += 1;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

// ===== checking what arrives =====

/// What a consumer hands every delivered key to.
trait Sink: Send + 'static {
    fn deliver(&mut self, key: u64, values: &[u64]);
    fn done(&self) -> bool;
}

/// Checks that every value arrives exactly once, under the right key.
struct Verifier {
    keys: u64,
    total: u64,
    seen: Vec<u64>,
    count: u64,
    /// Keys delivered: one per key in a batch, one per message for `mpsc`.
    deliveries: u64,
    /// `VmRSS` when the last value arrived, while the channel still exists.
    rss_end_kb: u64,
}

impl Verifier {
    fn new(keys: u64, total: u64) -> Self {
        Verifier {
            keys,
            total,
            seen: vec![0; total.div_ceil(64) as usize],
            count: 0,
            deliveries: 0,
            rss_end_kb: 0,
        }
    }

    fn check(&mut self, key: u64, index: u64) {
        assert!(index < self.total, "value {index} was never sent");
        assert_eq!(
            key,
            key_of(index, self.keys),
            "value {index} arrived under the wrong key"
        );
        let (word, bit) = ((index / 64) as usize, 1u64 << (index % 64));
        assert!(self.seen[word] & bit == 0, "value {index} arrived twice");
        self.seen[word] |= bit;
        self.count += 1;
        if self.count == self.total {
            self.rss_end_kb = proc_status_kb("VmRSS");
        }
    }

    fn finish(&self) {
        assert_eq!(self.count, self.total, "values were lost");
    }
}

impl Sink for Verifier {
    fn deliver(&mut self, key: u64, values: &[u64]) {
        self.deliveries += 1;
        for &value in values {
            self.check(key, value);
        }
    }

    fn done(&self) -> bool {
        self.count == self.total
    }
}

/// Checks every value like [`Verifier`], and records each delivery's lateness.
struct LatenessSink {
    verifier: Verifier,
    base: Instant,
    window_ns: i64,
    lateness_ns: Vec<i64>,
}

impl Sink for LatenessSink {
    fn deliver(&mut self, key: u64, values: &[u64]) {
        let now = self.base.elapsed().as_nanos() as i64;
        let mut first_sent = i64::MAX;
        for &value in values {
            self.verifier.check(key, value & INDEX_MASK);
            first_sent = first_sent.min((value >> INDEX_BITS) as i64);
        }
        self.lateness_ns.push(now - (first_sent + self.window_ns));
    }

    fn done(&self) -> bool {
        self.verifier.done()
    }
}

// ===== consumers =====

async fn consume_mpsc<S: Sink>(mut rx: mpsc::UnboundedReceiver<(u64, u64)>, mut sink: S) -> S {
    let mut buf = Vec::with_capacity(RECV_CHUNK);
    while !sink.done() {
        let n = waiting(rx.recv_many(&mut buf, RECV_CHUNK)).await;
        assert!(n > 0, "channel closed early");
        for (key, value) in buf.drain(..) {
            sink.deliver(key, &[value]);
        }
    }
    assert!(
        rx.try_recv().is_err(),
        "a value arrived after all were seen"
    );
    sink
}

/// The hand-written batcher: a map of pending values and a `DelayQueue` of keys.
async fn consume_delayqueue<S: Sink>(
    mut rx: mpsc::UnboundedReceiver<(u64, u64)>,
    window: Duration,
    mut sink: S,
) -> S {
    let mut pending: HashMap<u64, Vec<u64>> = HashMap::new();
    let mut timers: DelayQueue<u64> = DelayQueue::new();
    let mut buf = Vec::with_capacity(RECV_CHUNK);
    let mut closed = false;
    while !sink.done() {
        let expired = waiting(async {
            tokio::select! {
                // Expired keys first: read the channel first and tokio's coop budget is
                // spent on it, so the timer is starved while values keep coming.
                biased;
                Some(expired) = timers.next(), if !timers.is_empty() => Some(expired.into_inner()),
                n = rx.recv_many(&mut buf, RECV_CHUNK), if !closed => {
                    // Closed: the senders are done, and the timers hold the rest.
                    closed = n == 0;
                    None
                }
                else => panic!("channel closed with values missing"),
            }
        })
        .await;
        if let Some(key) = expired {
            let values = pending
                .remove(&key)
                .expect("a timer fires for a pending key");
            sink.deliver(key, &values);
        }
        for (key, value) in buf.drain(..) {
            match pending.entry(key) {
                Entry::Occupied(mut entry) => entry.get_mut().push(value),
                Entry::Vacant(entry) => {
                    timers.insert(key, window);
                    entry.insert(vec![value]);
                }
            }
        }
    }
    assert!(pending.is_empty() && timers.is_empty(), "values left over");
    assert!(
        rx.try_recv().is_err(),
        "a value arrived after all were seen"
    );
    sink
}

/// The hand-written priority batcher: after each read from the channel, every pending key
/// goes out in ascending order of its smallest sort key (ties: first arrival).
async fn consume_binaryheap<S: Sink>(
    mut rx: mpsc::UnboundedReceiver<(u32, u64, u64)>,
    mut sink: S,
) -> S {
    // key -> (rank, arrival, values); the heap holds (rank, arrival, key), stale entries
    // are skipped when they come out.
    let mut pending: HashMap<u64, (u32, u64, Vec<u64>)> = HashMap::new();
    let mut heap: BinaryHeap<Reverse<(u32, u64, u64)>> = BinaryHeap::new();
    let mut arrivals = 0;
    let mut buf = Vec::with_capacity(RECV_CHUNK);
    while !sink.done() {
        let n = waiting(rx.recv_many(&mut buf, RECV_CHUNK)).await;
        assert!(n > 0, "channel closed early");
        for (sort, key, value) in buf.drain(..) {
            match pending.entry(key) {
                Entry::Occupied(mut entry) => {
                    let slot = entry.get_mut();
                    slot.2.push(value);
                    if sort < slot.0 {
                        slot.0 = sort;
                        heap.push(Reverse((sort, slot.1, key)));
                    }
                }
                Entry::Vacant(entry) => {
                    arrivals += 1;
                    entry.insert((sort, arrivals, vec![value]));
                    heap.push(Reverse((sort, arrivals, key)));
                }
            }
        }
        let mut last = 0;
        while let Some(Reverse((sort, arrival, key))) = heap.pop() {
            let Entry::Occupied(entry) = pending.entry(key) else {
                continue;
            };
            if (entry.get().0, entry.get().1) != (sort, arrival) {
                continue;
            }
            assert!(sort >= last, "keys out of order");
            last = sort;
            let (_, _, values) = entry.remove();
            sink.deliver(key, &values);
        }
    }
    assert!(pending.is_empty(), "values left over");
    assert!(
        rx.try_recv().is_err(),
        "a value arrived after all were seen"
    );
    sink
}

/// Reads batches from a `timed` or `ordered` receiver.
async fn consume_batches<R, S>(mut rx: R, mut sink: S) -> (R, S)
where
    R: Stream<Item = Batch<u64, u64>> + Unpin,
    S: Sink,
{
    while !sink.done() {
        let batch = waiting(rx.next()).await.expect("channel is open");
        assert!(!batch.is_empty(), "an empty batch");
        for (key, values) in &batch {
            sink.deliver(*key, values);
        }
    }
    (rx, sink)
}

async fn consume_origin<S: Sink>(queue: Arc<OriginQueue>, mut sink: S) -> S {
    while !sink.done() {
        let batch = queue.pull(ORIGIN_PULL);
        if batch.is_empty() {
            waiting(tokio::time::sleep(ORIGIN_NAP)).await;
            continue;
        }
        for (key, values) in &batch {
            sink.deliver(*key, values);
        }
    }
    assert!(queue.is_drained(), "values left over");
    sink
}

// ===== the origin, ported =====

/// `SortedList<DateTime, List<TKey>> _queue` and `Dictionary<TKey, List<TValue>> _data`.
type OriginState = (BTreeMap<Instant, Vec<u64>>, HashMap<u64, Vec<u64>>);

/// The origin's `TimeSortedQueue<TKey, TValue>`, ported line by line: a sorted list of
/// publish times, each with the keys published then, and a dictionary of pending values,
/// both under one lock.
struct OriginQueue {
    state: Mutex<OriginState>,
    window: Duration,
}

impl OriginQueue {
    fn new(window: Duration) -> Self {
        OriginQueue {
            state: Mutex::new((BTreeMap::new(), HashMap::new())),
            window,
        }
    }

    /// `Publish`: one queue entry per publish time, then the value into the dictionary.
    fn publish(&self, key: u64, value: u64) {
        let now = Instant::now();
        let mut state = self.state.lock().expect("not poisoned");
        let (queue, data) = &mut *state;
        match queue.get_mut(&now) {
            Some(keys) => {
                if !keys.contains(&key) {
                    keys.push(key);
                }
            }
            None => {
                queue.insert(now, vec![key]);
            }
        }
        match data.get_mut(&key) {
            Some(values) => values.push(value),
            None => {
                data.insert(key, vec![value]);
            }
        }
    }

    /// `Pull`: takes whole queue entries while the first is at least a window old, each
    /// key with every value it holds, until `max` values are taken.
    fn pull(&self, max: usize) -> Vec<(u64, Vec<u64>)> {
        let mut result = Vec::new();
        let now = Instant::now();
        let mut state = self.state.lock().expect("not poisoned");
        let (queue, data) = &mut *state;
        let mut count = 0;
        while let Some(first) = queue.first_entry() {
            // `now.Subtract(first.Key).TotalMilliseconds < window`, negative included.
            if now < *first.key() + self.window {
                break;
            }
            for key in first.remove() {
                if let Some(values) = data.remove(&key) {
                    count += values.len();
                    result.push((key, values));
                }
            }
            if count >= max {
                break;
            }
        }
        result
    }

    fn is_drained(&self) -> bool {
        self.state.lock().expect("not poisoned").1.is_empty()
    }
}

// ===== child processes =====

#[derive(Serialize, Deserialize, Clone, Copy, Debug)]
struct RunResult {
    ns_per_value: f64,
    cpu_ns_per_value: f64,
    values_per_delivery: f64,
    peak_rss_mb: f64,
    rss_end_mb: f64,
    allocs_per_value: f64,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug)]
struct LatenessResult {
    p50_us: f64,
    p99_us: f64,
    max_us: f64,
    early: u64,
    deliveries: u64,
}

/// CPU time of every thread of this process so far, in ns (`/proc/self/task/*/schedstat`).
fn cpu_ns() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(|task| {
            let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
            stat.split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum()
}

fn proc_status_kb(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn arg<T: std::str::FromStr>(args: &[String], at: usize, what: &str) -> T {
    args.get(at)
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("child argument {at} ({what}) missing or bad: {args:?}"))
}

/// Waits for the consumer, failing the run if values stop arriving.
async fn finish<T>(consumer: tokio::task::JoinHandle<T>, limit: Duration) -> T {
    match tokio::time::timeout(limit, consumer).await {
        Ok(done) => done.expect("consumer ran to the end"),
        Err(_) => panic!("not every value arrived within {limit:?}"),
    }
}

/// Runs one variant through one throughput scenario.
/// Arguments: variant window_ms producers keys values.
fn throughput_child(args: &[String]) -> RunResult {
    let variant: String = arg(args, 0, "variant");
    let window = Duration::from_millis(arg(args, 1, "window_ms"));
    let producers: u64 = arg(args, 2, "producers");
    let keys: u64 = arg(args, 3, "keys");
    let values: u64 = arg(args, 4, "values");
    let limit = Duration::from_secs(60) + Duration::from_micros(20 * values);

    let rt = runtime();
    let sink = Verifier::new(keys, values);
    let before = GLOBAL.stats();
    let cpu_before = cpu_ns();
    let start = Instant::now();
    let sink = rt.block_on(async {
        match variant.as_str() {
            "mpsc" => {
                let (tx, rx) = mpsc::unbounded_channel();
                let consumer = tokio::spawn(consume_mpsc(rx, sink));
                produce_all(MpscTx(tx), producers, values, keys).await;
                finish(consumer, limit).await
            }
            "diy_delayqueue" => {
                let (tx, rx) = mpsc::unbounded_channel();
                let consumer = tokio::spawn(consume_delayqueue(rx, window, sink));
                produce_all(MpscTx(tx), producers, values, keys).await;
                finish(consumer, limit).await
            }
            "diy_binaryheap" => {
                let (tx, rx) = mpsc::unbounded_channel();
                let consumer = tokio::spawn(consume_binaryheap(rx, sink));
                produce_all(HeapTx(tx), producers, values, keys).await;
                finish(consumer, limit).await
            }
            "origin_port" => {
                let queue = Arc::new(OriginQueue::new(window));
                let consumer = tokio::spawn(consume_origin(Arc::clone(&queue), sink));
                produce_all(OriginTx(queue), producers, values, keys).await;
                finish(consumer, limit).await
            }
            "timed" => {
                let (tx, rx) = timed::channel(window);
                let consumer = tokio::spawn(consume_batches(rx, sink));
                // This sender stays until the end: the channel never closes, so keys come
                // out by their deadlines, not by a flush.
                produce_all(TimedTx(tx.clone()), producers, values, keys).await;
                let (rx, sink) = finish(consumer, limit).await;
                assert!(rx.is_empty(), "values left over");
                drop(tx);
                sink
            }
            "ordered" => {
                let (tx, rx) = ordered::channel();
                let consumer = tokio::spawn(consume_batches(rx, sink));
                produce_all(OrderedTx(tx.clone()), producers, values, keys).await;
                let (rx, sink) = finish(consumer, limit).await;
                assert!(rx.is_empty(), "values left over");
                drop(tx);
                sink
            }
            other => panic!("unknown variant {other}"),
        }
    });
    // Once everything is sent, a windowed consumer sits waiting for the last deadlines:
    // that wait is the workload's, not the channel's cost, and it would swamp short runs.
    let idle = Duration::from_nanos(IDLE_AFTER_SENT_NS.load(Relaxed));
    let elapsed = start.elapsed().saturating_sub(idle);
    let cpu = cpu_ns() - cpu_before;
    let after = GLOBAL.stats();
    sink.finish();
    let allocs =
        (after.allocations + after.reallocations) - (before.allocations + before.reallocations);
    RunResult {
        ns_per_value: elapsed.as_nanos() as f64 / values as f64,
        cpu_ns_per_value: cpu as f64 / values as f64,
        values_per_delivery: values as f64 / sink.deliveries as f64,
        peak_rss_mb: proc_status_kb("VmHWM") as f64 / 1024.0,
        rss_end_mb: sink.rss_end_kb as f64 / 1024.0,
        allocs_per_value: allocs as f64 / values as f64,
    }
}

/// Runs one variant through the lateness scenario.
/// Arguments: variant keys rate_per_s millis window_ms.
fn lateness_child(args: &[String]) -> LatenessResult {
    let variant: String = arg(args, 0, "variant");
    let keys: u64 = arg(args, 1, "keys");
    let rate: u64 = arg(args, 2, "rate");
    let millis: u64 = arg(args, 3, "millis");
    let window = Duration::from_millis(arg(args, 4, "window_ms"));
    let total = rate * millis / 1000;
    assert!(total < 1 << INDEX_BITS, "too many values for the encoding");
    let limit = Duration::from_millis(millis) + Duration::from_secs(30);

    let rt = runtime();
    let base = Instant::now();
    let sink = LatenessSink {
        verifier: Verifier::new(keys, total),
        base,
        window_ns: window.as_nanos() as i64,
        lateness_ns: Vec::with_capacity(total as usize),
    };
    let sink = rt.block_on(async move {
        match variant.as_str() {
            "diy_delayqueue" => {
                let (tx, rx) = mpsc::unbounded_channel();
                let consumer = tokio::spawn(consume_delayqueue(rx, window, sink));
                produce_paced(MpscTx(tx), total, rate, keys, base).await;
                finish(consumer, limit).await
            }
            "origin_port" => {
                let queue = Arc::new(OriginQueue::new(window));
                let consumer = tokio::spawn(consume_origin(Arc::clone(&queue), sink));
                produce_paced(OriginTx(queue), total, rate, keys, base).await;
                finish(consumer, limit).await
            }
            "timed" => {
                let (tx, rx) = timed::channel(window);
                let consumer = tokio::spawn(consume_batches(rx, sink));
                produce_paced(TimedTx(tx.clone()), total, rate, keys, base).await;
                let (rx, sink) = finish(consumer, limit).await;
                assert!(rx.is_empty(), "values left over");
                drop(tx);
                sink
            }
            other => panic!("unknown lateness variant {other}"),
        }
    });
    sink.verifier.finish();
    let mut lateness = sink.lateness_ns;
    lateness.sort_unstable();
    let pick = |q: f64| {
        let at = ((lateness.len() as f64 * q).ceil() as usize).clamp(1, lateness.len()) - 1;
        lateness[at] as f64 / 1000.0
    };
    LatenessResult {
        p50_us: pick(0.50),
        p99_us: pick(0.99),
        max_us: pick(1.0),
        early: lateness.iter().filter(|&&l| l < 0).count() as u64,
        deliveries: lateness.len() as u64,
    }
}

// ===== the parent: rounds, figures, output =====

#[derive(Clone, Copy)]
struct Scenario {
    window_ms: u64,
    producers: u64,
    keys: u64,
}

impl Scenario {
    fn name(&self) -> String {
        let keys = match self.keys {
            1_000_000 => "1m".to_string(),
            1_000 => "1k".to_string(),
            n => n.to_string(),
        };
        format!("w{}-p{}-m{keys}", self.window_ms, self.producers)
    }

    fn variants(&self) -> &'static [&'static str] {
        if self.window_ms == 0 {
            &ALL
        } else {
            &WINDOWED
        }
    }
}

struct Plan {
    label: &'static str,
    rounds: usize,
    values: u64,
    lateness_rounds: usize,
    lateness_millis: u64,
    write_files: bool,
    only: Option<Vec<String>>,
    scenario_filter: Option<String>,
}

fn plan(args: &[String]) -> Plan {
    let has = |flag: &str| args.iter().any(|a| a == flag);
    let value = |flag: &str| {
        let at = args.iter().position(|a| a == flag)?;
        args.get(at + 1).cloned()
    };
    let mut plan = if has("--quick") {
        Plan {
            label: "quick",
            rounds: 3,
            values: 400_000,
            lateness_rounds: 1,
            lateness_millis: 2_000,
            write_files: true,
            only: None,
            scenario_filter: None,
        }
    } else if has("--bench") || has("--full") {
        Plan {
            label: "full",
            rounds: 5,
            values: 2_000_000,
            lateness_rounds: 3,
            lateness_millis: 2_000,
            write_files: true,
            only: None,
            scenario_filter: None,
        }
    } else {
        Plan {
            label: "smoke",
            rounds: 1,
            values: 20_000,
            lateness_rounds: 1,
            lateness_millis: 100,
            write_files: false,
            only: None,
            scenario_filter: None,
        }
    };
    if let Some(n) = value("--rounds").and_then(|v| v.parse().ok()) {
        plan.rounds = n;
    }
    if let Some(n) = value("--values").and_then(|v| v.parse().ok()) {
        plan.values = n;
    }
    plan.only = value("--only").map(|v| v.split(',').map(str::to_string).collect());
    plan.scenario_filter = value("--scenario");
    plan
}

fn run_child(flag: &str, args: &[String]) -> String {
    let exe = env::current_exe().expect("own path");
    let out = Command::new(exe)
        .arg(flag)
        .args(args)
        .output()
        .expect("child started");
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        panic!(
            "child {flag} {args:?} failed ({}):\n{}\n{}",
            out.status,
            stdout,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .unwrap_or_else(|| panic!("child {flag} {args:?} printed no result:\n{stdout}"))
        .to_string()
}

fn median(xs: &[f64]) -> f64 {
    let mut xs = xs.to_vec();
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => xs[n / 2],
        _ => (xs[n / 2 - 1] + xs[n / 2]) / 2.0,
    }
}

/// Every run of one scenario: variant -> one result per round.
type Runs = BTreeMap<&'static str, Vec<RunResult>>;

struct ScenarioRuns {
    scenario: Scenario,
    runs: Runs,
}

impl ScenarioRuns {
    fn has(&self, variant: &str) -> bool {
        self.runs.contains_key(variant)
    }

    fn figure(&self, variant: &str, f: impl Fn(&RunResult) -> f64) -> f64 {
        median(&self.runs[variant].iter().map(f).collect::<Vec<_>>())
    }

    /// The median over rounds of `a`'s ns/value over `b`'s in the same round.
    fn ratio(&self, a: &str, b: &str) -> Option<f64> {
        let (ra, rb) = (self.runs.get(a)?, self.runs.get(b)?);
        let per_round: Vec<f64> = ra
            .iter()
            .zip(rb)
            .map(|(x, y)| x.ns_per_value / y.ns_per_value)
            .collect();
        Some(median(&per_round))
    }

    fn ratios(&self) -> BTreeMap<String, f64> {
        let pairs = [
            ("timed", "mpsc"),
            ("timed", "diy_delayqueue"),
            ("diy_delayqueue", "mpsc"),
            ("origin_port", "mpsc"),
            ("origin_port", "diy_delayqueue"),
            ("ordered", "mpsc"),
            ("ordered", "diy_binaryheap"),
            ("diy_binaryheap", "mpsc"),
        ];
        pairs
            .iter()
            .filter_map(|&(a, b)| Some((format!("{a}/{b}"), round2(self.ratio(a, b)?))))
            .collect()
    }
}

#[derive(Serialize)]
struct Report {
    scenarios: Vec<ScenarioOut>,
    lateness: Vec<LatenessOut>,
}

#[derive(Serialize)]
struct ScenarioOut {
    name: String,
    window_ms: u64,
    producers: u64,
    keys: u64,
    results: BTreeMap<String, VariantOut>,
    ratios: BTreeMap<String, f64>,
}

#[derive(Serialize)]
struct VariantOut {
    ns_per_value: f64,
    peak_rss_mb: f64,
    allocs_per_value: f64,
}

#[derive(Serialize, Clone)]
struct LatenessOut {
    keys: u64,
    variant: String,
    p50_us: f64,
    p99_us: f64,
    max_us: f64,
    early: u64,
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn parent(args: &[String]) {
    let plan = plan(args);
    let wanted = |v: &str| plan.only.as_ref().is_none_or(|o| o.iter().any(|x| x == v));
    let started = Instant::now();

    let mut scenarios = Vec::new();
    for window_ms in [0, 50] {
        for producers in [1, 4] {
            for keys in [1_000, 1_000_000] {
                let scenario = Scenario {
                    window_ms,
                    producers,
                    keys,
                };
                let name = scenario.name();
                if plan
                    .scenario_filter
                    .as_ref()
                    .is_none_or(|f| name.contains(f))
                {
                    scenarios.push(ScenarioRuns {
                        scenario,
                        runs: BTreeMap::new(),
                    });
                }
            }
        }
    }

    eprintln!(
        "compare ({}): {} rounds, {} values a run, {} scenarios",
        plan.label,
        plan.rounds,
        plan.values,
        scenarios.len()
    );
    for round in 0..plan.rounds {
        for s in &mut scenarios {
            let mut order: Vec<&'static str> = s
                .scenario
                .variants()
                .iter()
                .copied()
                .filter(|v| wanted(v))
                .collect();
            if order.is_empty() {
                continue;
            }
            let shift = round % order.len();
            order.rotate_left(shift);
            for variant in order {
                let sc = s.scenario;
                let child_args = [
                    variant.to_string(),
                    sc.window_ms.to_string(),
                    sc.producers.to_string(),
                    sc.keys.to_string(),
                    plan.values.to_string(),
                ];
                let out = run_child("--child", &child_args);
                let result: RunResult = serde_json::from_str(&out).expect("child result");
                eprintln!(
                    "  round {}/{} {:<12} {:<15} {:>9.1} ns/value {:>8.1} MB peak {:>6.2} allocs/value",
                    round + 1,
                    plan.rounds,
                    sc.name(),
                    variant,
                    result.ns_per_value,
                    result.peak_rss_mb,
                    result.allocs_per_value
                );
                s.runs.entry(variant).or_default().push(result);
            }
        }
    }
    let throughput_secs = started.elapsed().as_secs_f64();

    let mut lateness = Vec::new();
    let lateness_variants: Vec<&str> = LATENESS.iter().copied().filter(|v| wanted(v)).collect();
    let lateness_started = Instant::now();
    if plan.scenario_filter.is_none() {
        for keys in [1_000u64, 1_000_000] {
            let mut per_variant: BTreeMap<&str, Vec<LatenessResult>> = BTreeMap::new();
            for round in 0..plan.lateness_rounds {
                let mut order = lateness_variants.clone();
                if !order.is_empty() {
                    let shift = round % order.len();
                    order.rotate_left(shift);
                }
                for variant in order {
                    let child_args = [
                        variant.to_string(),
                        keys.to_string(),
                        LATENESS_RATE.to_string(),
                        plan.lateness_millis.to_string(),
                        LATENESS_WINDOW_MS.to_string(),
                    ];
                    let out = run_child("--lateness-child", &child_args);
                    let r: LatenessResult = serde_json::from_str(&out).expect("child result");
                    eprintln!(
                        "  lateness m={keys:<8} {variant:<15} p50 {:>9.0} us  p99 {:>9.0} us  max {:>9.0} us  early {}",
                        r.p50_us, r.p99_us, r.max_us, r.early
                    );
                    per_variant.entry(variant).or_default().push(r);
                }
            }
            for variant in &lateness_variants {
                let rs = &per_variant[variant];
                lateness.push(LatenessOut {
                    keys,
                    variant: variant.to_string(),
                    p50_us: round2(median(&rs.iter().map(|r| r.p50_us).collect::<Vec<_>>())),
                    p99_us: round2(median(&rs.iter().map(|r| r.p99_us).collect::<Vec<_>>())),
                    max_us: round2(rs.iter().map(|r| r.max_us).fold(f64::MIN, f64::max)),
                    early: rs.iter().map(|r| r.early).sum(),
                });
            }
        }
    }
    let lateness_secs = lateness_started.elapsed().as_secs_f64();

    let report = Report {
        scenarios: scenarios
            .iter()
            .filter(|s| !s.runs.is_empty())
            .map(|s| ScenarioOut {
                name: s.scenario.name(),
                window_ms: s.scenario.window_ms,
                producers: s.scenario.producers,
                keys: s.scenario.keys,
                results: s
                    .runs
                    .keys()
                    .map(|v| {
                        let out = VariantOut {
                            ns_per_value: round2(s.figure(v, |r| r.ns_per_value)),
                            peak_rss_mb: round2(s.figure(v, |r| r.peak_rss_mb)),
                            allocs_per_value: round2(s.figure(v, |r| r.allocs_per_value)),
                        };
                        (v.to_string(), out)
                    })
                    .collect(),
                ratios: s.ratios(),
            })
            .collect(),
        lateness,
    };

    let mut md = String::new();
    markdown(&mut md, &plan, &scenarios, &report);
    let _ = writeln!(
        md,
        "\nTime: {:.0} s throughput, {:.0} s lateness, {:.0} s in all.",
        throughput_secs,
        lateness_secs,
        started.elapsed().as_secs_f64()
    );
    print!("{md}");

    // A narrowed run would leave a partial report behind: only whole runs write files.
    if plan.write_files && plan.only.is_none() && plan.scenario_filter.is_none() {
        let dir = target_dir();
        std::fs::create_dir_all(&dir).expect("target directory");
        let json = serde_json::to_string_pretty(&report).expect("serializable");
        std::fs::write(dir.join("compare.json"), json + "\n").expect("compare.json written");
        match chart(&dir.join("compare.svg"), &scenarios) {
            Ok(()) => eprintln!("wrote {0}/compare.json and {0}/compare.svg", dir.display()),
            Err(e) => eprintln!("chart not drawn: {e}"),
        }
    }
}

fn target_dir() -> PathBuf {
    env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"))
}

fn fmt_ratio(x: Option<f64>) -> String {
    x.map_or_else(|| "".to_string(), |x| format!("{x:.2}"))
}

fn markdown(md: &mut String, plan: &Plan, scenarios: &[ScenarioRuns], report: &Report) {
    let _ = writeln!(
        md,
        "## keyed-batch compare ({}: {} rounds, {} values a run, medians)\n",
        plan.label, plan.rounds, plan.values
    );
    let _ = writeln!(
        md,
        "| scenario | variant | ns/value | min–max | CPU ns/value | values/delivery | peak RSS MB | RSS end MB | allocs/value | ×mpsc | ×diy |"
    );
    let _ = writeln!(md, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    for s in scenarios.iter().filter(|s| !s.runs.is_empty()) {
        for (variant, runs) in &s.runs {
            let ns: Vec<f64> = runs.iter().map(|r| r.ns_per_value).collect();
            let (lo, hi) = ns
                .iter()
                .fold((f64::MAX, f64::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
            // `ordered` against its hand-written twin; the rest against the DelayQueue one.
            let diy = match *variant {
                "ordered" => s.ratio(variant, "diy_binaryheap"),
                "timed" | "origin_port" => s.ratio(variant, "diy_delayqueue"),
                _ => None,
            };
            let vs_mpsc = (*variant != "mpsc")
                .then(|| s.ratio(variant, "mpsc"))
                .flatten();
            let _ = writeln!(
                md,
                "| {} | {} | {:.0} | {:.0}–{:.0} | {:.0} | {:.1} | {:.1} | {:.1} | {:.2} | {} | {} |",
                s.scenario.name(),
                variant,
                median(&ns),
                lo,
                hi,
                s.figure(variant, |r| r.cpu_ns_per_value),
                s.figure(variant, |r| r.values_per_delivery),
                s.figure(variant, |r| r.peak_rss_mb),
                s.figure(variant, |r| r.rss_end_mb),
                s.figure(variant, |r| r.allocs_per_value),
                fmt_ratio(vs_mpsc),
                fmt_ratio(diy),
            );
        }
    }
    let _ = writeln!(
        md,
        "\n×mpsc, ×diy: medians of per-round ratios of ns/value; ×diy is against \
         `diy_delayqueue` (`diy_binaryheap` for `ordered`)."
    );

    // The compact table the README shows.
    let cols = ALL;
    let _ = writeln!(md, "\n### README table: ns per value (medians)\n");
    let _ = writeln!(
        md,
        "| scenario | {} | timed/mpsc | timed/diy_delayqueue | ordered/diy_binaryheap |",
        cols.join(" | ")
    );
    let _ = writeln!(md, "|---|{}--:|--:|--:|", "--:|".repeat(cols.len()));
    for s in scenarios.iter().filter(|s| !s.runs.is_empty()) {
        let mut row = format!("| {} |", s.scenario.name());
        for v in cols {
            if s.has(v) {
                let _ = write!(row, " {:.0} |", s.figure(v, |r| r.ns_per_value));
            } else {
                row.push_str(" – |");
            }
        }
        let _ = writeln!(
            md,
            "{row} {} | {} | {} |",
            fmt_ratio(s.ratio("timed", "mpsc")),
            fmt_ratio(s.ratio("timed", "diy_delayqueue")),
            fmt_ratio(s.ratio("ordered", "diy_binaryheap")),
        );
    }

    if !report.lateness.is_empty() {
        let _ = writeln!(
            md,
            "\n### Lateness: window {LATENESS_WINDOW_MS} ms, {LATENESS_RATE} values/s for {:.1} s, one producer (µs, per delivered key)\n",
            plan.lateness_millis as f64 / 1000.0
        );
        let _ = writeln!(md, "| keys | variant | p50 | p99 | max | early |");
        let _ = writeln!(md, "|--:|---|--:|--:|--:|--:|");
        for l in &report.lateness {
            let _ = writeln!(
                md,
                "| {} | {} | {:.0} | {:.0} | {:.0} | {} |",
                l.keys, l.variant, l.p50_us, l.p99_us, l.max_us, l.early
            );
        }
    }

    targets(md, scenarios, &report.lateness);
}

/// Checks the issue's targets against this run.
fn targets(md: &mut String, scenarios: &[ScenarioRuns], lateness: &[LatenessOut]) {
    let mut rows: Vec<(String, String, Option<f64>, bool)> = Vec::new();
    let worst = |pick: &dyn Fn(&ScenarioRuns) -> Option<f64>| {
        scenarios
            .iter()
            .filter_map(|s| pick(s).map(|x| (x, s.scenario.name())))
            .max_by(|a, b| a.0.total_cmp(&b.0))
    };
    let mut ratio_row = |label: &str, limit: f64, pick: &dyn Fn(&ScenarioRuns) -> Option<f64>| {
        if let Some((x, name)) = worst(pick) {
            rows.push((
                format!("{label} (worst: {name})"),
                format!("≤ {limit}"),
                Some(x),
                x <= limit,
            ));
        }
    };
    ratio_row("timed/diy_delayqueue, every scenario", 0.5, &|s| {
        s.ratio("timed", "diy_delayqueue")
    });
    ratio_row("timed/mpsc at 1,000 keys", 1.5, &|s| {
        (s.scenario.keys == 1_000)
            .then(|| s.ratio("timed", "mpsc"))
            .flatten()
    });
    ratio_row("timed/mpsc at 1,000,000 keys", 3.0, &|s| {
        (s.scenario.keys == 1_000_000)
            .then(|| s.ratio("timed", "mpsc"))
            .flatten()
    });
    ratio_row("ordered/diy_binaryheap", 0.7, &|s| {
        s.ratio("ordered", "diy_binaryheap")
    });
    ratio_row("peak RSS timed/mpsc, 1,000,000 keys, window 0", 2.0, &|s| {
        (s.scenario.keys == 1_000_000 && s.scenario.window_ms == 0 && s.has("timed"))
            .then(|| {
                s.has("mpsc").then(|| {
                    s.figure("timed", |r| r.peak_rss_mb) / s.figure("mpsc", |r| r.peak_rss_mb)
                })
            })
            .flatten()
    });
    for l in lateness.iter().filter(|l| l.variant == "timed") {
        if l.keys == 1_000_000 {
            rows.push((
                "timed lateness p99, 1,000,000 keys (µs)".into(),
                "≤ 2500".into(),
                Some(l.p99_us),
                l.p99_us <= 2500.0,
            ));
            rows.push((
                "timed lateness max, 1,000,000 keys (µs)".into(),
                "≤ 5000".into(),
                Some(l.max_us),
                l.max_us <= 5000.0,
            ));
        }
        rows.push((
            format!("timed early deliveries, {} keys", l.keys),
            "0".into(),
            Some(l.early as f64),
            l.early == 0,
        ));
    }
    let _ = writeln!(md, "\n### Targets\n");
    let _ = writeln!(md, "| target | limit | measured | met |");
    let _ = writeln!(md, "|---|--:|--:|:-:|");
    for (label, limit, x, ok) in rows {
        let _ = writeln!(
            md,
            "| {label} | {limit} | {} | {} |",
            x.map_or_else(String::new, |x| format!("{x:.2}")),
            if ok { "yes" } else { "**no**" }
        );
    }
}

/// ns/value against keys for `timed`, `diy_delayqueue` and `origin_port`, one panel per
/// window and producer count.
fn chart(path: &std::path::Path, scenarios: &[ScenarioRuns]) -> Result<(), Box<dyn Error>> {
    use plotters::prelude::*;

    let lines: [(&str, RGBColor); 3] = [
        ("timed", RGBColor(0x1f, 0x77, 0xb4)),
        ("diy_delayqueue", RGBColor(0xff, 0x7f, 0x0e)),
        ("origin_port", RGBColor(0x2c, 0xa0, 0x2c)),
    ];
    let root = SVGBackend::new(path, (1000, 760)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(
        "keyed-batch: ns per value against keys (lower is better)",
        ("sans-serif", 22),
    )?;
    let panels = root.split_evenly((2, 2));
    for (panel, (window_ms, producers)) in panels.iter().zip([(0, 1), (0, 4), (50, 1), (50, 4)]) {
        let points = |variant: &str| -> Vec<(f64, f64)> {
            scenarios
                .iter()
                .filter(|s| {
                    s.scenario.window_ms == window_ms
                        && s.scenario.producers == producers
                        && s.has(variant)
                })
                .map(|s| {
                    (
                        s.scenario.keys as f64,
                        s.figure(variant, |r| r.ns_per_value),
                    )
                })
                .collect()
        };
        let all: Vec<f64> = lines
            .iter()
            .flat_map(|(v, _)| points(v))
            .map(|p| p.1)
            .collect();
        if all.is_empty() {
            continue;
        }
        let lo = all.iter().copied().fold(f64::MAX, f64::min) / 1.5;
        // Head room for the legend in the upper left.
        let hi = all.iter().copied().fold(f64::MIN, f64::max) * 6.0;
        let mut chart = ChartBuilder::on(panel)
            .caption(
                format!(
                    "window {window_ms} ms, {producers} producer{}",
                    if producers == 1 { "" } else { "s" }
                ),
                ("sans-serif", 18),
            )
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d((500f64..2_000_000f64).log_scale(), (lo..hi).log_scale())?;
        chart
            .configure_mesh()
            .x_desc("keys")
            .y_desc("ns per value")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.0}"))
            .draw()?;
        for (variant, color) in lines {
            let pts = points(variant);
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
                .label(variant)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}
