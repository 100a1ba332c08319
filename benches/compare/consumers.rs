//! The consumers: one task per variant that takes what is due and hands it to a [`Sink`],
//! and [`Json`], the work a webhook's consumer does with each key before sending it.

use std::cmp::Reverse;
use std::collections::hash_map::Entry;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use keyed_batch::ack::{self, Delivery};
use keyed_batch::Batch;
use serde::Serialize;
use tokio::sync::mpsc;
use tokio::time::{self, Instant};
use tokio_util::time::DelayQueue;

use crate::measure::waiting;
use crate::origin::OriginQueue;
use crate::verify::Sink;
use crate::workload::Value;

/// mpsc-based consumers read up to this many messages at a time.
const RECV_CHUNK: usize = 128;
/// The origin's demo calls `Pull(100)`.
const ORIGIN_PULL: usize = 100;
/// The origin's consumer sleeps this long when nothing is due.
const ORIGIN_NAP: Duration = Duration::from_millis(100);

/// The floor: hands every message on as it comes, one value per delivery.
pub(crate) async fn consume_mpsc<V: Value, S: Sink<V>>(
    mut rx: mpsc::UnboundedReceiver<(u64, V)>,
    mut sink: S,
) -> S {
    let mut buf = Vec::with_capacity(RECV_CHUNK);
    while !sink.done() {
        let n = waiting(rx.recv_many(&mut buf, RECV_CHUNK)).await;
        assert!(n > 0, "channel closed early");
        for (key, value) in buf.drain(..) {
            sink.deliver(key, std::slice::from_ref(&value));
        }
    }
    assert!(
        rx.try_recv().is_err(),
        "a value arrived after all were seen"
    );
    sink
}

/// The hand-written batcher: a map of pending values and a `DelayQueue` of keys.
pub(crate) async fn consume_delayqueue<V: Value, S: Sink<V>>(
    mut rx: mpsc::UnboundedReceiver<(u64, V)>,
    window: Duration,
    mut sink: S,
) -> S {
    let mut pending: HashMap<u64, Vec<V>> = HashMap::new();
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

/// The hand-written batcher with `timed`'s promise: a key is due exactly a window after its
/// first pending value was sent (the producer stamps each value), and every due key goes
/// out at once. With one window for every key, deadlines come in the order keys arrive, so
/// a FIFO of `(deadline, key)` is the timer, and one `Sleep` waits for its front.
pub(crate) async fn consume_exact<V: Value, S: Sink<V>>(
    mut rx: mpsc::UnboundedReceiver<(u64, V, Instant)>,
    window: Duration,
    mut sink: S,
) -> S {
    let mut pending: hashbrown::HashMap<u64, Vec<V>> = hashbrown::HashMap::new();
    let mut deadlines: VecDeque<(Instant, u64)> = VecDeque::new();
    let mut buf = Vec::with_capacity(RECV_CHUNK);
    let mut closed = false;
    let mut sleep = pin!(time::sleep(Duration::ZERO));
    loop {
        for (key, value, sent) in buf.drain(..) {
            match pending.entry(key) {
                hashbrown::hash_map::Entry::Occupied(mut entry) => entry.get_mut().push(value),
                hashbrown::hash_map::Entry::Vacant(entry) => {
                    deadlines.push_back((sent + window, key));
                    entry.insert(vec![value]);
                }
            }
        }
        let now = Instant::now();
        while let Some(&(_, key)) = deadlines.front().filter(|(due, _)| *due <= now) {
            deadlines.pop_front();
            let values = pending.remove(&key).expect("a deadline's key is pending");
            sink.deliver(key, &values);
        }
        if sink.done() {
            break;
        }
        let front = deadlines.front().map(|(due, _)| *due);
        if let Some(due) = front {
            sleep.as_mut().reset(due);
        }
        waiting(async {
            tokio::select! {
                n = rx.recv_many(&mut buf, RECV_CHUNK), if !closed => closed = n == 0,
                () = sleep.as_mut(), if front.is_some() => {}
                else => panic!("channel closed with values missing"),
            }
        })
        .await;
    }
    assert!(
        pending.is_empty() && deadlines.is_empty(),
        "values left over"
    );
    assert!(
        rx.try_recv().is_err(),
        "a value arrived after all were seen"
    );
    sink
}

/// The hand-written priority batcher: after each read from the channel, every pending key
/// goes out in ascending order of its smallest sort key (ties: first arrival).
pub(crate) async fn consume_binaryheap<S: Sink<u64>>(
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

/// What a `keyed_batch` receiver yields: a batch the consumer hands to its sink.
pub(crate) trait Taken: Send {
    /// What the batch's keys hold.
    type Value;
    fn is_empty(&self) -> bool;
    /// Hands every key to `sink`, and does what the receiver asks of the consumer after.
    fn hand_to<S: Sink<Self::Value>>(self, sink: &mut S) -> impl Future<Output = ()> + Send;
}

impl<V: Value> Taken for Batch<u64, V> {
    type Value = V;

    fn is_empty(&self) -> bool {
        self.is_empty()
    }

    async fn hand_to<S: Sink<V>>(self, sink: &mut S) {
        for (key, values) in &self {
            sink.deliver(*key, values);
        }
    }
}

/// An acknowledging receiver's batch: every delivery's values are checked, then the batch is
/// acknowledged at once with `ack_all`, as a consumer that pushed the whole batch would.
/// (Acknowledging each delivery on its own takes the channel's lock once per delivery.)
impl<V: Value> Taken for Vec<Delivery<u64, V>> {
    type Value = V;

    fn is_empty(&self) -> bool {
        self.is_empty()
    }

    async fn hand_to<S: Sink<V>>(self, sink: &mut S) {
        for delivery in &self {
            sink.deliver(*delivery.key(), delivery.values());
        }
        ack::ack_all(self)
            .await
            .expect("an in-memory ack takes effect");
    }
}

/// Reads batches from a `timed` or `ordered` receiver, acknowledging or not; `is_empty` is
/// that receiver's own.
pub(crate) async fn consume_batches<R, S>(mut rx: R, is_empty: fn(&R) -> bool, mut sink: S) -> S
where
    R: Stream + Unpin,
    R::Item: Taken,
    S: Sink<<R::Item as Taken>::Value>,
{
    while !sink.done() {
        let batch = waiting(rx.next()).await.expect("channel is open");
        assert!(!batch.is_empty(), "an empty batch");
        batch.hand_to(&mut sink).await;
    }
    assert!(is_empty(&rx), "values left over");
    sink
}

/// The origin's consumer: pulls what is due, and naps when nothing is.
pub(crate) async fn consume_origin<V: Value, S: Sink<V>>(
    queue: Arc<OriginQueue<V>>,
    mut sink: S,
) -> S {
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

/// A webhook consumer's own work: it serializes each key's values into a JSON body, one
/// allocation per body, before it would send it (there is no network here), then hands the
/// key on to the sink inside.
pub(crate) struct Json<S>(pub(crate) S);

/// The body a webhook consumer posts for one customer.
#[derive(Serialize)]
struct Body<'a, V> {
    customer: u64,
    events: &'a [V],
}

impl<V: Value + Serialize, S: Sink<V>> Sink<V> for Json<S> {
    fn deliver(&mut self, key: u64, values: &[V]) {
        let body = serde_json::to_vec(&Body {
            customer: key,
            events: values,
        })
        .expect("a body serializes");
        std::hint::black_box(body);
        self.0.deliver(key, values);
    }

    fn done(&self) -> bool {
        self.0.done()
    }
}
