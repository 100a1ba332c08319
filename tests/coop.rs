//! Cooperative scheduling (the crate docs' "No polling"): `send`, `recv` and the `Sink` spend
//! tokio's task budget, as tokio's own channels do, so a task that is always ready yields to
//! the runtime now and then instead of starving the other tasks and the timer.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::SinkExt;
use keyed_batch::{ordered, timed};

use common::time::{ms, secs};

const MANY: usize = 100_000;

/// On a current-thread runtime, a task sending in a tight loop into an unbounded channel
/// never has to wait; it must still yield, so another task gets to run before it is done.
#[tokio::test]
async fn a_tight_send_loop_yields() {
    let (tx, _rx) = timed::channel::<usize, usize>(secs(1));
    let sent = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&sent);
    let producer = tokio::spawn(async move {
        for i in 0..MANY {
            tx.send(i % 100, i).await.unwrap();
            count.fetch_add(1, Ordering::Relaxed);
        }
    });
    tokio::task::yield_now().await;
    let when_we_ran = sent.load(Ordering::Relaxed);
    assert!(when_we_ran < MANY, "the producer never yielded");
    producer.await.unwrap();
}

/// `try_send` spends no task budget, as tokio's `UnboundedSender::send` does not, where
/// `send` spends one unit a call.
#[tokio::test]
async fn try_send_spends_no_budget() {
    let (tx, _rx) = timed::channel::<usize, usize>(secs(1));
    for i in 0..1_000 {
        tx.try_send(i % 100, i).unwrap();
    }
    assert!(tokio::task::coop::has_budget_remaining());
    let (tx, _rx) = ordered::channel::<usize, usize, usize>();
    for i in 0..1_000 {
        tx.try_send(i, i % 100, i).unwrap();
    }
    assert!(tokio::task::coop::has_budget_remaining());
    let mut sends = 0;
    while tokio::task::coop::has_budget_remaining() {
        tx.send(sends, sends % 100, sends).await.unwrap();
        sends += 1;
        assert!(sends <= 1_000, "send spends no budget either");
    }
}

/// The same for the `Sink`: a `forward` of a ready stream yields now and then.
#[tokio::test]
async fn a_tight_sink_loop_yields() {
    let (tx, _rx) = ordered::channel::<usize, usize, usize>();
    let sent = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&sent);
    let producer = tokio::spawn(async move {
        let mut tx = tx;
        for i in 0..MANY {
            SinkExt::send(&mut tx, (i, i % 100, i)).await.unwrap();
            count.fetch_add(1, Ordering::Relaxed);
        }
    });
    tokio::task::yield_now().await;
    assert!(
        sent.load(Ordering::Relaxed) < MANY,
        "the sink never yielded"
    );
    producer.await.unwrap();
}

/// A consumer with a batch always ready (window 0, one value per batch) yields too.
#[tokio::test]
async fn a_tight_recv_loop_yields() {
    let (tx, mut rx) = timed::Builder::new(Duration::ZERO)
        .max_batch(1)
        .build::<usize, usize>();
    for i in 0..MANY {
        tx.try_send(i, i).unwrap();
    }
    let taken = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&taken);
    let consumer = tokio::spawn(async move {
        while let Some(batch) = rx.recv().await {
            count.fetch_add(batch.len(), Ordering::Relaxed);
        }
    });
    tokio::task::yield_now().await;
    assert!(
        taken.load(Ordering::Relaxed) < MANY,
        "the consumer never yielded"
    );
    drop(tx);
    consumer.await.unwrap();
}

/// `ordered`'s receiver, driven as a `Stream` with every key pending, yields too: its
/// `poll_recv` returns `Pending` with keys pending once the task's budget is spent.
#[tokio::test]
async fn a_tight_ordered_stream_loop_yields() {
    use futures::StreamExt;
    let (tx, mut rx) = ordered::Builder::new()
        .max_batch(1)
        .build::<usize, usize, usize>();
    for i in 0..MANY {
        tx.try_send(i, i, i).unwrap();
    }
    let taken = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&taken);
    let consumer = tokio::spawn(async move {
        while let Some(batch) = rx.next().await {
            count.fetch_add(batch.len(), Ordering::Relaxed);
        }
    });
    tokio::task::yield_now().await;
    let seen = taken.load(Ordering::Relaxed);
    assert!(
        0 < seen && seen < MANY,
        "the consumer took {seen} values before yielding"
    );
    drop(tx);
    consumer.await.unwrap();
    assert_eq!(taken.load(Ordering::Relaxed), MANY);
}

/// The case from the field, on a real multi-thread runtime with 2 workers and real time:
/// two producers send in a tight loop into an unbounded channel. The receiver used to get
/// no batch for 15 s, because no worker ever returned to drive the timer; the first batch
/// is due 20 ms after the first send, and must come well within a second.
#[test]
fn busy_producers_do_not_stop_the_receiver() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let waited = runtime.block_on(async {
        let (tx, mut rx) = timed::channel::<u32, u64>(ms(20));
        let stop = Arc::new(AtomicBool::new(false));
        let start = std::time::Instant::now();
        let producers: Vec<_> = (0..2u64)
            .map(|p| {
                let (tx, stop) = (tx.clone(), Arc::clone(&stop));
                tokio::spawn(async move {
                    let mut i = 0u64;
                    // Bounded in real time too, so that a regression fails instead of
                    // hanging: without yielding, nothing would ever set `stop`.
                    while !stop.load(Ordering::Relaxed) && start.elapsed() < secs(3) {
                        tx.send((i % 1_000) as u32, p).await.unwrap();
                        i += 1;
                    }
                })
            })
            .collect();
        drop(tx);
        let first = tokio::time::timeout(secs(10), rx.recv()).await;
        let waited = start.elapsed();
        stop.store(true, Ordering::Relaxed);
        for producer in producers {
            producer.await.unwrap();
        }
        assert!(matches!(first, Ok(Some(_))), "no batch within 10 s");
        waited
    });
    assert!(waited < secs(1), "the first batch took {waited:?}");
}
