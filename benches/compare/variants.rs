//! The variants: which ones there are, which scenarios each runs in, and how each one is
//! wired up for a run.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use keyed_batch::{ordered, timed};
use tokio::sync::mpsc;

use crate::consumers::{
    consume_batches, consume_binaryheap, consume_delayqueue, consume_exact, consume_mpsc,
    consume_origin,
};
use crate::origin::OriginQueue;
use crate::verify::{Sink, Verifier};
use crate::workload::{
    Burst, HeapTx, Load, MpscTx, OrderedTx, OriginTx, Produce, StampedTx, TimedTx, Value,
};

/// Every variant, in the order the README table shows them. Window 0 scenarios run all.
pub(crate) const ALL: [&str; 8] = [
    "mpsc",
    "diy_delayqueue",
    "diy_exact",
    "origin_port",
    "timed",
    "timed_acked",
    "ordered",
    "diy_binaryheap",
];
/// The variants that take a window and any value: the only ones windowed scenarios run.
pub(crate) const WINDOWED: [&str; 6] = [
    "mpsc",
    "diy_delayqueue",
    "diy_exact",
    "origin_port",
    "timed",
    "timed_acked",
];
/// The variants the lateness scenario runs, in this order.
pub(crate) const LATENESS: [&str; 5] = [
    "timed",
    "timed_acked",
    "diy_delayqueue",
    "diy_exact",
    "origin_port",
];

/// Runs `variant` once in a `u64` throughput scenario: starts its consumer with `sink`,
/// sends `load` through it, and hands the sink back once every value has arrived, failing
/// the run if that takes over `limit`. Only the sorted variants, which take `u64` values
/// alone, are here; the rest are in [`run`].
pub(crate) async fn run_throughput(
    variant: &str,
    window: Duration,
    load: Burst,
    sink: Verifier,
    limit: Duration,
) -> Verifier {
    match variant {
        "diy_binaryheap" => {
            let (tx, rx) = mpsc::unbounded_channel();
            drive(consume_binaryheap(rx, sink), HeapTx(tx), &load, limit).await
        }
        "ordered" => {
            let (tx, rx) = ordered::channel();
            // This sender stays until the end, as in `timed`.
            let _open = tx.clone();
            let consumer = consume_batches(rx, ordered::Receiver::is_empty, sink);
            drive(consumer, OrderedTx(tx), &load, limit).await
        }
        _ => run::<u64, _>(variant, window, load, sink, limit).await,
    }
}

/// Runs `variant` once, with values of any kind, in any scenario: [`run_throughput`] says
/// what a run does. Only the variants in [`WINDOWED`] are here.
pub(crate) async fn run<V: Value, S: Sink<V>>(
    variant: &str,
    window: Duration,
    load: impl Load<V>,
    sink: S,
    limit: Duration,
) -> S {
    match variant {
        "mpsc" => {
            let (tx, rx) = mpsc::unbounded_channel();
            drive(consume_mpsc(rx, sink), MpscTx(tx), &load, limit).await
        }
        "diy_delayqueue" => {
            let (tx, rx) = mpsc::unbounded_channel();
            let consumer = consume_delayqueue(rx, window, sink);
            drive(consumer, MpscTx(tx), &load, limit).await
        }
        "diy_exact" => {
            let (tx, rx) = mpsc::unbounded_channel();
            let consumer = consume_exact(rx, window, sink);
            drive(consumer, StampedTx(tx), &load, limit).await
        }
        "origin_port" => {
            let queue = Arc::new(OriginQueue::new(window));
            let consumer = consume_origin(Arc::clone(&queue), sink);
            drive(consumer, OriginTx(queue), &load, limit).await
        }
        "timed" => {
            let (tx, rx) = timed::channel(window);
            // This sender stays until the end: the channel never closes, so keys come out
            // by their deadlines, not by a flush.
            let _open = tx.clone();
            let consumer = consume_batches(rx, timed::Receiver::is_empty, sink);
            drive(consumer, TimedTx(tx), &load, limit).await
        }
        "timed_acked" => {
            let (tx, rx) = timed::Builder::new(window).acked();
            let _open = tx.clone(); // as in `timed`
                                    // Values acked are gone: nothing pending and nothing in flight.
            let drained =
                |rx: &timed::AckReceiver<u64, V>| rx.is_empty() && rx.stats().in_flight_keys == 0;
            let consumer = consume_batches(rx, drained, sink);
            drive(consumer, TimedTx(tx), &load, limit).await
        }
        other => panic!("unknown variant {other}"),
    }
}

/// Spawns `consumer`, has the producers send `load` through `tx`, and waits for the
/// consumer, failing the run if values stop arriving.
async fn drive<V, S: Send + 'static>(
    consumer: impl Future<Output = S> + Send + 'static,
    tx: impl Produce<V>,
    load: &impl Load<V>,
    limit: Duration,
) -> S {
    let consumer = tokio::spawn(consumer);
    load.send_through(tx).await;
    match tokio::time::timeout(limit, consumer).await {
        Ok(done) => done.expect("consumer ran to the end"),
        Err(_) => panic!("not every value arrived within {limit:?}"),
    }
}
