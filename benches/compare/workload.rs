//! The workload: which key each value goes under, and the producer tasks that send it.

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

/// The key value `index` goes under.
pub(crate) fn key_of(index: u64, keys: u64) -> u64 {
    mix(index) % keys
}

/// The random sort key `ordered` and `diy_binaryheap` give value `index`.
fn sort_key_of(index: u64) -> u32 {
    (mix(index ^ 0x5555_5555_5555_5555) >> 32) as u32
}

/// Something a producer task sends through.
pub(crate) trait Produce: Clone + Send + Sync + 'static {
    fn put(&self, key: u64, value: u64) -> impl Future<Output = ()> + Send;
}

#[derive(Clone)]
pub(crate) struct MpscTx(pub(crate) mpsc::UnboundedSender<(u64, u64)>);

impl Produce for MpscTx {
    fn put(&self, key: u64, value: u64) -> impl Future<Output = ()> + Send {
        self.0.send((key, value)).expect("consumer is alive");
        std::future::ready(())
    }
}

#[derive(Clone)]
pub(crate) struct HeapTx(pub(crate) mpsc::UnboundedSender<(u32, u64, u64)>);

impl Produce for HeapTx {
    fn put(&self, key: u64, value: u64) -> impl Future<Output = ()> + Send {
        let sort = sort_key_of(value & INDEX_MASK);
        self.0.send((sort, key, value)).expect("consumer is alive");
        std::future::ready(())
    }
}

#[derive(Clone)]
pub(crate) struct TimedTx(pub(crate) timed::Sender<u64, u64>);

impl Produce for TimedTx {
    async fn put(&self, key: u64, value: u64) {
        self.0.send(key, value).await.expect("channel is open")
    }
}

#[derive(Clone)]
pub(crate) struct OrderedTx(pub(crate) ordered::Sender<u32, u64, u64>);

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
pub(crate) struct OriginTx(pub(crate) Arc<OriginQueue>);

impl Produce for OriginTx {
    fn put(&self, key: u64, value: u64) -> impl Future<Output = ()> + Send {
        self.0.publish(key, value);
        std::future::ready(())
    }
}

/// What the producers send, and how fast.
pub(crate) trait Load {
    /// Sends the whole load through `tx`, and waits for the producers.
    async fn send_through<T: Produce>(&self, tx: T);
}

/// The throughput workload: [`produce_all`].
pub(crate) struct Burst {
    pub(crate) producers: u64,
    pub(crate) values: u64,
    pub(crate) keys: u64,
}

impl Load for Burst {
    async fn send_through<T: Produce>(&self, tx: T) {
        produce_all(tx, self.producers, self.values, self.keys).await
    }
}

/// The lateness workload: [`produce_paced`].
pub(crate) struct Paced {
    pub(crate) total: u64,
    pub(crate) rate: u64,
    pub(crate) keys: u64,
    pub(crate) base: Instant,
}

impl Load for Paced {
    async fn send_through<T: Produce>(&self, tx: T) {
        produce_paced(tx, self.total, self.rate, self.keys, self.base).await
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
