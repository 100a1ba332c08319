//! The workload: which key each value goes under, what a value is, and the producer tasks
//! that send it.

use std::fmt::Write as _;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use keyed_batch::{ordered, timed};
use tokio::sync::mpsc;

use crate::common::mix;
use crate::measure::SENT_ALL;
use crate::origin::OriginQueue;

/// A producer yields to the scheduler after this many values.
const YIELD_EVERY: u64 = 256;
/// Lateness runs pack the send time above the value index.
pub(crate) const INDEX_BITS: u32 = 24;
pub(crate) const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;

/// The key value `index` goes under when `keys` keys are equally likely.
pub(crate) fn key_of(index: u64, keys: u64) -> u64 {
    mix(index) % keys
}

/// The random sort key `ordered` and `diy_binaryheap` give value `index`.
fn sort_key_of(index: u64) -> u32 {
    (mix(index ^ 0x5555_5555_5555_5555) >> 32) as u32
}

/// How values pick their keys: the producers and the verifier ask the same one.
#[derive(Clone)]
pub(crate) enum Keys {
    /// [`key_of`]: each of this many keys equally likely.
    Uniform(u64),
    /// A few keys take most of the values, as a few customers make most of the traffic.
    Zipf(Arc<Zipf>),
}

impl Keys {
    /// The key value `index` goes under.
    pub(crate) fn of(&self, index: u64) -> u64 {
        match self {
            Keys::Uniform(keys) => key_of(index, *keys),
            Keys::Zipf(zipf) => zipf.key_of(index),
        }
    }
}

/// Zipf-distributed keys: key `k` (of `n`, from 0) comes with probability proportional to
/// `1 / (k + 1)^s`, so key 0 is the busiest. A draw is O(1) (Walker's alias method) from a
/// hash of the value's index, so it is the same in every run and in the verifier, and the
/// tables are built once, before a run is timed.
pub(crate) struct Zipf {
    /// Column `c` gives key `c` when the draw's low 32 bits are below `keep[c]`, ...
    keep: Vec<u32>,
    /// ... and key `alias[c]` otherwise.
    alias: Vec<u32>,
}

impl Zipf {
    /// The alias tables for `n` keys and exponent `s`.
    ///
    /// # Panics
    ///
    /// If `n` is 0 or does not fit in a `u32`, or if the tables do not give back the
    /// probabilities they were built from.
    pub(crate) fn new(n: u64, s: f64) -> Zipf {
        assert!(
            n > 0 && n <= u64::from(u32::MAX),
            "zipf keys out of range: {n}"
        );
        let n = n as usize;
        let weights: Vec<f64> = (0..n).map(|k| ((k + 1) as f64).powf(-s)).collect();
        let total: f64 = weights.iter().sum();
        // Each column holds probability 1/n: key `c`'s own share of it, topped up from one
        // key with more than its share (Vose's construction).
        let mut share: Vec<f64> = weights.iter().map(|w| w * n as f64 / total).collect();
        let mut keep = vec![1.0; n];
        let mut alias: Vec<u32> = (0..n as u32).collect();
        let (mut small, mut large): (Vec<usize>, Vec<usize>) =
            (0..n).partition(|&k| share[k] < 1.0);
        while let (Some(&lo), Some(&hi)) = (small.last(), large.last()) {
            small.pop();
            keep[lo] = share[lo];
            alias[lo] = hi as u32;
            share[hi] -= 1.0 - share[lo];
            if share[hi] < 1.0 {
                large.pop();
                small.push(hi);
            }
        }
        // What is left over holds a share of 1 up to rounding: `keep` stays 1.
        let keep: Vec<u32> = keep
            .iter()
            .map(|p| (p * 4_294_967_296.0).min(f64::from(u32::MAX)) as u32)
            .collect();

        // The tables must give every key its probability back.
        let mut drawn = vec![0.0; n];
        for c in 0..n {
            let p = f64::from(keep[c]) / 4_294_967_296.0;
            drawn[c] += p / n as f64;
            drawn[alias[c] as usize] += (1.0 - p) / n as f64;
        }
        for (k, (drawn, weight)) in drawn.iter().zip(&weights).enumerate() {
            let want = weight / total;
            assert!(
                ((drawn - want) / want).abs() < 1e-6,
                "zipf key {k}: the tables give {drawn}, not {want}"
            );
        }
        Zipf { keep, alias }
    }

    /// The key value `index` goes under.
    pub(crate) fn key_of(&self, index: u64) -> u64 {
        let draw = mix(index ^ 0x2545_f491_4f6c_dd1d);
        // The high half picks a column, the low half whether it keeps its own key.
        let column = ((draw >> 32) * self.keep.len() as u64) >> 32;
        let c = column as usize;
        if (draw as u32) < self.keep[c] {
            column
        } else {
            u64::from(self.alias[c])
        }
    }
}

/// What a producer sends: made from its index, and telling its index back to the verifier.
pub(crate) trait Value: Clone + Send + Sync + 'static {
    fn make(index: u64) -> Self;
    fn index(&self) -> u64;
}

/// The index itself.
impl Value for u64 {
    fn make(index: u64) -> Self {
        index
    }

    fn index(&self) -> u64 {
        *self
    }
}

/// Text that pads an event out to its length.
const FILLER: &str = "customer event: order placed, items reserved, payment pending; ";

/// An event: its index in 16 hex digits, then filler, 100 to 400 bytes in all (the length a
/// hash of the index). Made in the producer, one allocation each, as a user's would be.
impl Value for String {
    fn make(index: u64) -> Self {
        let len = 100 + (mix(index ^ 0x1f83_d9ab_fb41_bd6b) % 301) as usize;
        let mut event = String::with_capacity(len);
        write!(event, "{index:016x}").expect("a String takes any text");
        while event.len() < len {
            let take = (len - event.len()).min(FILLER.len());
            event.push_str(&FILLER[..take]);
        }
        event
    }

    fn index(&self) -> u64 {
        u64::from_str_radix(&self[..16], 16).expect("an event starts with its index")
    }
}

/// Something a producer task sends `V`s through.
pub(crate) trait Produce<V>: Clone + Send + Sync + 'static {
    fn put(&self, key: u64, value: V) -> impl Future<Output = ()> + Send;
}

#[derive(Clone)]
pub(crate) struct MpscTx<V>(pub(crate) mpsc::UnboundedSender<(u64, V)>);

impl<V: Value> Produce<V> for MpscTx<V> {
    fn put(&self, key: u64, value: V) -> impl Future<Output = ()> + Send {
        self.0.send((key, value)).expect("consumer is alive");
        std::future::ready(())
    }
}

/// An mpsc sender that stamps each value with when it was sent, for `diy_exact`.
#[derive(Clone)]
pub(crate) struct StampedTx<V>(pub(crate) mpsc::UnboundedSender<(u64, V, tokio::time::Instant)>);

impl<V: Value> Produce<V> for StampedTx<V> {
    fn put(&self, key: u64, value: V) -> impl Future<Output = ()> + Send {
        let sent = tokio::time::Instant::now();
        self.0.send((key, value, sent)).expect("consumer is alive");
        std::future::ready(())
    }
}

#[derive(Clone)]
pub(crate) struct HeapTx(pub(crate) mpsc::UnboundedSender<(u32, u64, u64)>);

impl Produce<u64> for HeapTx {
    fn put(&self, key: u64, value: u64) -> impl Future<Output = ()> + Send {
        let sort = sort_key_of(value & INDEX_MASK);
        self.0.send((sort, key, value)).expect("consumer is alive");
        std::future::ready(())
    }
}

#[derive(Clone)]
pub(crate) struct TimedTx<V>(pub(crate) timed::Sender<u64, V>);

impl<V: Value> Produce<V> for TimedTx<V> {
    fn put(&self, key: u64, value: V) -> impl Future<Output = ()> + Send {
        // The unbounded channel's counterpart of `UnboundedSender::send`: see the bench's
        // docs on why not `send().await`.
        self.0
            .try_send(key, value)
            .expect("an open, unbounded channel takes every value");
        std::future::ready(())
    }
}

#[derive(Clone)]
pub(crate) struct OrderedTx(pub(crate) ordered::Sender<u32, u64, u64>);

impl Produce<u64> for OrderedTx {
    fn put(&self, key: u64, value: u64) -> impl Future<Output = ()> + Send {
        let sort = sort_key_of(value & INDEX_MASK);
        self.0
            .try_send(sort, key, value)
            .expect("an open, unbounded channel takes every value");
        std::future::ready(())
    }
}

#[derive(Clone)]
pub(crate) struct OriginTx<V>(pub(crate) Arc<OriginQueue<V>>);

impl<V: Value> Produce<V> for OriginTx<V> {
    fn put(&self, key: u64, value: V) -> impl Future<Output = ()> + Send {
        self.0.publish(key, value);
        std::future::ready(())
    }
}

/// What the producers send (`V`s), and how fast.
pub(crate) trait Load<V> {
    /// Sends the whole load through `tx`, and waits for the producers.
    async fn send_through<T: Produce<V>>(&self, tx: T);
}

/// The throughput workload: [`produce_all`], of any [`Value`].
pub(crate) struct Burst {
    pub(crate) producers: u64,
    pub(crate) values: u64,
    pub(crate) keys: Keys,
}

impl<V: Value> Load<V> for Burst {
    async fn send_through<T: Produce<V>>(&self, tx: T) {
        produce_all(tx, self.producers, self.values, &self.keys).await
    }
}

/// The lateness workload: [`produce_paced`].
pub(crate) struct Paced {
    pub(crate) total: u64,
    pub(crate) rate: u64,
    pub(crate) keys: u64,
    pub(crate) base: Instant,
}

impl Load<u64> for Paced {
    async fn send_through<T: Produce<u64>>(&self, tx: T) {
        produce_paced(tx, self.total, self.rate, self.keys, self.base).await
    }
}

/// Sends `values` values from `producers` tasks at full speed, and waits for them.
async fn produce_all<V: Value, T: Produce<V>>(tx: T, producers: u64, values: u64, keys: &Keys) {
    let per = values / producers;
    let tasks: Vec<_> = (0..producers)
        .map(|p| {
            let tx = tx.clone();
            let keys = keys.clone();
            let start = p * per;
            let end = if p + 1 == producers {
                values
            } else {
                start + per
            };
            tokio::spawn(async move {
                for (n, index) in (start..end).enumerate() {
                    tx.put(keys.of(index), V::make(index)).await;
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

/// Sends `total` values from one task at `rate` values per second, each value carrying its
/// send time (ns since `base`) above its index.
async fn produce_paced<T: Produce<u64>>(tx: T, total: u64, rate: u64, keys: u64, base: Instant) {
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
