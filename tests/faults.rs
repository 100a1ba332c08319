//! Faults: user code that panics (`Hash`, `Eq`, `Ord`, `Clone`), values whose drops are
//! counted, a consumer that panics holding a batch, runtimes dropped under waiting tasks,
//! the races between closing, sending and receiving (everything is under one mutex, so
//! each interleaving is played out deterministically with `tokio_test::task`), and memory
//! after a million distinct keys.
//!
//! This binary counts allocations (`stats_alloc`) for the memory test.

mod common;

use std::alloc::System;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use keyed_batch::ack::Delivery;
use keyed_batch::error::{SendError, TryRecvError, TrySendError};
use keyed_batch::queue::{Capacity, SortedQueue};
use keyed_batch::{ordered, timed, Batch};
use stats_alloc::{StatsAlloc, INSTRUMENTED_SYSTEM};
use tokio::time::{advance, Instant};
use tokio_test::task;
use tokio_test::{assert_pending, assert_ready};

use common::time::{ms, paused_runtime, secs, HOUR};
use common::touchy::{arm, disarm, panics, Touchy, TouchyRank, What};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const MS10: Duration = ms(10);

/// A batch as `(key id, value)` pairs, in order.
fn flat<K, V: Copy>(batches: &[Batch<K, V>], id: impl Fn(&K) -> u32) -> Vec<(u32, V)> {
    batches
        .iter()
        .flatten()
        .flat_map(|(key, values)| values.iter().map(|v| (id(key), *v)).collect::<Vec<_>>())
        .collect()
}

// ===== panics in Hash, Eq, Ord and Clone =====

/// A key whose `Hash` panics: `try_send`, `send`, `blocking_send` and `requeue` of that key
/// panic; other keys go on working while it is armed, the table grows and batches come out
/// without hashing it, a waiting receiver is still woken, and the key works again once its
/// `Hash` does. Nothing else is lost.
#[tokio::test(start_paused = true)]
async fn hash_panic_leaves_channel_usable() {
    let (tx, rx) = timed::channel::<Touchy, u32>(MS10);
    let mut rx2 = rx.clone();
    let mut waiting = task::spawn(async move { rx2.recv().await });
    assert_pending!(waiting.poll());
    tx.try_send(Touchy(1), 10).unwrap();
    tx.try_send(Touchy(7), 70).unwrap();

    arm(7, &[What::Hash]);
    assert!(panics(|| tx.try_send(Touchy(7), 71)));
    assert!(panics(|| tx.blocking_send(Touchy(7), 72)));
    assert!(panics(|| rx.requeue(Touchy(7), vec![73])));
    let tx2 = tx.clone();
    let spawned = tokio::spawn(async move { tx2.send(Touchy(7), 74).await }).await;
    assert!(spawned.unwrap_err().is_panic());
    // Other keys work, and growing the table does not hash key 7.
    for id in 100..300 {
        tx.try_send(Touchy(id), id).unwrap();
    }
    assert_eq!((rx.len(), rx.key_count()), (202, 202));

    // Due: the waiting receiver is woken and takes everything, without hashing key 7.
    advance(MS10).await;
    assert!(waiting.is_woken());
    let batch = assert_ready!(waiting.poll()).unwrap();
    let mut want = vec![(Touchy(1), vec![10]), (Touchy(7), vec![70])];
    want.extend((100..300).map(|id| (Touchy(id), vec![id])));
    assert_eq!(batch, want);

    disarm();
    tx.try_send(Touchy(7), 75).unwrap();
    drop(tx);
    let mut rx = rx;
    assert_eq!(rx.recv().await, Some(vec![(Touchy(7), vec![75])]));
    assert_eq!(rx.recv().await, None);
}

/// A key whose `Eq` panics: sending or requeueing to that key while it is pending panics;
/// its pending values and every other key are intact, and it works again afterwards.
#[tokio::test(start_paused = true)]
async fn eq_panic_leaves_channel_usable() {
    let (tx, mut rx) = timed::channel::<Touchy, u32>(MS10);
    tx.try_send(Touchy(1), 10).unwrap();
    tx.try_send(Touchy(7), 70).unwrap();
    tx.try_send(Touchy(2), 20).unwrap();

    arm(7, &[What::Eq]);
    assert!(panics(|| tx.try_send(Touchy(7), 71)));
    assert!(panics(|| rx.requeue(Touchy(7), vec![72])));
    let tx2 = tx.clone();
    let spawned = tokio::spawn(async move { tx2.send(Touchy(7), 73).await }).await;
    assert!(spawned.unwrap_err().is_panic());
    for id in 100..300 {
        tx.try_send(Touchy(id), id).unwrap();
    }
    tx.try_send(Touchy(1), 11).unwrap();
    assert_eq!((rx.len(), rx.key_count()), (204, 203));

    advance(MS10).await;
    let got = rx.try_recv().unwrap();
    let ids: Vec<(u32, Vec<u32>)> = got.into_iter().map(|(k, v)| (k.0, v)).collect();
    let mut want = vec![(1, vec![10, 11]), (7, vec![70]), (2, vec![20])];
    want.extend((100..300).map(|id| (id, vec![id])));
    assert_eq!(ids, want);

    disarm();
    tx.try_send(Touchy(7), 74).unwrap();
    tx.try_send(Touchy(7), 75).unwrap();
    advance(MS10).await;
    let got = rx.try_recv().unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].0 .0, got[0].1.clone()), (7, vec![74, 75]));
}

/// Drains an `ordered` channel of `TouchyRank` sort keys with nothing armed, after the batches
/// taken while armed, and checks the values against `want`. The value of a call that
/// panicked (`maybe`) may have gone in or not, but at most once.
fn check_drain(
    rx: &mut ordered::Receiver<TouchyRank, u32, u32>,
    mut batches: Vec<Batch<u32, u32>>,
    want: &[(u32, u32)],
    maybe: (u32, u32),
) {
    disarm();
    while let Ok(batch) = rx.try_recv() {
        batches.push(batch);
    }
    let mut got = flat(&batches, |k| *k);
    let extra = got.iter().filter(|pair| **pair == maybe).count();
    assert!(extra <= 1, "{maybe:?} delivered {extra} times");
    got.retain(|pair| *pair != maybe);
    assert_eq!(got, want);
}

/// A sort key whose `Ord` panics, at each place the queue compares ranks: lowering a key's
/// rank, pushing into the heap, and taking a batch (heap pops). That call panics; once
/// `Ord` works again, every other value comes out once, in rank order.
#[test]
fn ord_panic_leaves_channel_usable() {
    let setup = |max_batch: usize| {
        let (tx, rx) = ordered::Builder::new()
            .max_batch(max_batch)
            .build::<TouchyRank, u32, u32>();
        // Falling ranks: all but the first go into the heap.
        for (rank, key) in [(50, 1), (40, 2), (30, 3), (20, 4), (10, 5)] {
            tx.try_send(TouchyRank(rank), key, key * 10).unwrap();
        }
        (tx, rx)
    };
    let all = [(5, 50), (4, 40), (3, 30), (2, 20), (1, 10)];

    // Lowering the rank of the key ranked 30.
    let (tx, mut rx) = setup(10);
    arm(30, &[What::Ord]);
    assert!(panics(|| tx.try_send(TouchyRank(25), 3, 31)));
    check_drain(&mut rx, Vec::new(), &all, (3, 31));

    // Pushing a new smallest rank into the heap: it is compared with the heap's top, 10.
    let (tx, mut rx) = setup(10);
    arm(10, &[What::Ord]);
    assert!(panics(|| tx.try_send(TouchyRank(5), 9, 90)));
    check_drain(&mut rx, Vec::new(), &all, (9, 90));

    // Taking batches: heap pops compare 30 with its neighbours. Batches taken before the
    // panic are kept; once `Ord` works again, the index is repaired and nothing is lost.
    let (tx, mut rx) = setup(2);
    arm(30, &[What::Ord]);
    let mut batches = Vec::new();
    let mut failed = false;
    while !failed {
        match catch_unwind(AssertUnwindSafe(|| rx.try_recv())) {
            Ok(Ok(batch)) => batches.push(batch),
            Ok(Err(_)) => break,
            Err(_) => failed = true,
        }
    }
    assert!(failed, "no try_recv compared the armed rank");
    disarm();
    tx.try_send(TouchyRank(60), 6, 60).unwrap();
    let mut want = all.to_vec();
    want.push((6, 60));
    check_drain(&mut rx, batches, &want, (0, 0));
}

/// A receiver whose `recv` panics in `Ord` while it is the first waiting receiver: it
/// gives up its place, and the next waiting receiver is woken and gets the batch.
#[tokio::test]
async fn ord_panic_in_recv_hands_over() {
    let (tx, rx) = ordered::channel::<TouchyRank, u32, u32>();
    let (mut rx_a, mut rx_b) = (rx.clone(), rx);
    let mut a = task::spawn(async move { rx_a.recv().await });
    let mut b = task::spawn(async move { rx_b.recv().await });
    assert_pending!(a.poll());
    assert_pending!(b.poll());
    tx.try_send(TouchyRank(30), 3, 30).unwrap();
    assert!(a.is_woken());
    tx.try_send(TouchyRank(20), 2, 20).unwrap();
    tx.try_send(TouchyRank(10), 1, 10).unwrap();

    arm(20, &[What::Ord]);
    assert!(panics(|| a.poll()));
    drop(a);
    assert!(b.is_woken(), "the next receiver was not woken");
    disarm();
    let batch = assert_ready!(b.poll()).unwrap();
    assert_eq!(batch, vec![(1, vec![10]), (2, vec![20]), (3, vec![30])]);
}

/// A key whose `Clone` panics when a batch has to split it: the split panics, and the
/// key's values and every other key are intact. The key is not split again: it goes out
/// whole, in a batch of its own, and the keys behind it follow.
#[test]
fn clone_panic_on_split_loses_nothing() {
    let (tx, mut rx) = ordered::Builder::new()
        .max_batch(2)
        .build::<u32, Touchy, u32>();
    tx.try_send(1, Touchy(7), 1).unwrap();
    tx.try_send(1, Touchy(7), 2).unwrap();
    tx.try_send(1, Touchy(7), 3).unwrap();
    tx.try_send(2, Touchy(8), 4).unwrap();
    arm(7, &[What::Clone]);
    assert!(panics(|| rx.try_recv()));
    assert_eq!(rx.len(), 4);
    assert_eq!(rx.stats().delivered_by.due, 0, "a panic delivers nothing");
    disarm();
    assert_eq!(rx.try_recv(), Ok(vec![(Touchy(7), vec![1, 2, 3])]));
    assert_eq!(rx.try_recv(), Ok(vec![(Touchy(8), vec![4])]));
    assert_eq!(rx.stats().delivered_by.due, 2);
}

/// A key whose `Clone` always panics, split by `max_batch`, used to wedge the channel: every
/// later receive panicked, even after `close`, and each panic counted a delivery. Now only
/// the first call panics; the key goes out whole and alone, and the other keys follow.
#[test]
fn clone_that_always_panics_does_not_wedge_the_channel() {
    let (tx, mut rx) = timed::Builder::new(Duration::ZERO)
        .max_batch(2)
        .build::<Touchy, u32>();
    for v in 0..5 {
        tx.try_send(Touchy(7), v).unwrap();
    }
    tx.try_send(Touchy(8), 10).unwrap();
    tx.try_send(Touchy(9), 20).unwrap();
    arm(7, &[What::Clone]);
    assert!(panics(|| rx.try_recv()));
    assert_eq!(rx.stats().delivered, 0);
    assert_eq!(rx.stats().delivered_by.due, 0);
    assert_eq!(rx.try_recv(), Ok(vec![(Touchy(7), vec![0, 1, 2, 3, 4])]));
    assert_eq!(
        rx.try_recv(),
        Ok(vec![(Touchy(8), vec![10]), (Touchy(9), vec![20])])
    );
    rx.close();
    assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
    disarm();
    let stats = rx.stats();
    assert_eq!(
        (stats.delivered, stats.batches, stats.delivered_by.due),
        (7, 2, 3)
    );
}

/// The same key with `drain_now` and `recv`: only the call that split it panics.
#[tokio::test(start_paused = true)]
async fn clone_panic_then_drain_and_recv_make_progress() {
    let (tx, mut rx) = timed::Builder::new(Duration::from_secs(60))
        .max_batch(1)
        .build::<Touchy, u32>();
    tx.try_send(Touchy(7), 1).unwrap();
    tx.try_send(Touchy(7), 2).unwrap();
    tx.try_send(Touchy(8), 3).unwrap();
    arm(7, &[What::Clone]);
    assert!(panics(|| rx.drain_now()));
    assert_eq!(
        rx.drain_now(),
        vec![vec![(Touchy(7), vec![1, 2])], vec![(Touchy(8), vec![3])]]
    );
    tx.try_send(Touchy(7), 4).unwrap();
    tx.try_send(Touchy(7), 5).unwrap();
    drop(tx);
    // A new run of the key: splitting is tried again, panics once, then it goes whole.
    let recv = tokio::spawn(async move {
        let first = std::panic::AssertUnwindSafe(rx.recv());
        let first = futures::FutureExt::catch_unwind(first).await;
        (first.is_err(), rx.recv().await, rx.recv().await)
    });
    let (panicked, whole, end) = recv.await.unwrap();
    disarm();
    assert!(panicked);
    assert_eq!(whole, Some(vec![(Touchy(7), vec![4, 5])]));
    assert_eq!(end, None);
}

/// `drain_now` takes a batch, then panics splitting the next key: the batch it took used to
/// be dropped with the panic, though counted delivered. Now the drain hands over what it
/// took, and the next drain takes the key whole.
#[test]
fn drain_now_keeps_the_batches_taken_before_a_panic() {
    let (tx, mut rx) = timed::Builder::new(secs(60))
        .max_batch(2)
        .build::<Touchy, u32>();
    tx.try_send(Touchy(1), 10).unwrap();
    tx.try_send(Touchy(1), 11).unwrap();
    for v in 1..=3 {
        tx.try_send(Touchy(7), v).unwrap();
    }
    arm(7, &[What::Clone]);
    let first = rx.drain_now();
    disarm();
    assert_eq!(first, vec![vec![(Touchy(1), vec![10, 11])]]);
    assert_eq!(rx.drain_now(), vec![vec![(Touchy(7), vec![1, 2, 3])]]);
    let stats = rx.stats();
    assert_eq!((stats.sent, stats.delivered), (5, 5));
}

/// In an acknowledging channel, a key whose `Clone` panicked cannot be held: a retry puts
/// it back as new values would, and `oldest_pending` counts it from the retry.
#[tokio::test(start_paused = true)]
async fn unheld_retry_counts_from_the_retry() {
    let (tx, mut rx) = timed::Builder::new(Duration::ZERO).acked::<Touchy, u32>();
    tx.try_send(Touchy(7), 1).unwrap();
    advance(secs(5)).await;
    assert_eq!(rx.stats().oldest_pending, Some(secs(5)));
    arm(7, &[What::Clone]);
    assert!(panics(|| rx.try_recv()));
    let delivery = rx.try_recv().unwrap().remove(0); // whole, and not held
    disarm();
    advance(secs(1)).await;
    delivery.retry().await.unwrap();
    advance(secs(1)).await;
    assert_eq!(rx.stats().oldest_pending, Some(secs(1)));
    let again = rx.try_recv().unwrap().remove(0);
    assert_eq!((again.values(), again.attempt()), (&[1][..], 2));
}

/// In an acknowledging channel the weight in flight counts toward the total that must fit
/// in a `usize`: a send that would overflow it panics, changing nothing. It used to go in,
/// and the receiver that took it then overflowed the weight in flight.
#[test]
fn acked_send_that_overflows_the_weight_in_flight_panics() {
    let (tx, mut rx) = timed::Builder::new(Duration::ZERO)
        .weigher(|v: &usize| *v)
        .capacity(2)
        .acked::<&str, usize>();
    tx.try_send("a", usize::MAX).unwrap();
    let in_flight = rx.try_recv().unwrap();
    assert!(panics(|| tx.try_send("b", 1)));
    assert_eq!(rx.try_recv().unwrap_err(), TryRecvError::Empty);
    let stats = rx.stats();
    assert_eq!(
        (stats.sent, stats.pending_values, stats.in_flight_values),
        (1, 0, 1)
    );
    assert_eq!(in_flight[0].values(), &[usize::MAX]);
    // Room for one more: "a" in flight, and this.
    tx.try_send("b", 0).unwrap();
    assert_eq!(rx.try_recv().unwrap()[0].values(), &[0]);
}

/// Through the `Sink`, a value whose weight would overflow the total pending weight makes
/// `poll_flush` panic, changing nothing: the value stays in the sink, and goes in at a later
/// flush once there is weight to spare (the builder's `weigher` docs).
#[test]
fn a_sink_flush_that_would_overflow_the_weight_panics_and_keeps_the_value() {
    let (tx, mut rx) = timed::Builder::new(Duration::ZERO)
        .weigher(|v: &usize| *v)
        .build();
    tx.try_send("a", usize::MAX).unwrap();
    let mut sink = task::spawn(tx.clone());
    sink.enter(|_, sink| futures::Sink::start_send(sink, ("b", 1)))
        .unwrap();
    let flush = |sink: &mut task::Spawn<timed::Sender<_, _>>| {
        sink.enter(|cx, sink| futures::Sink::<(&str, usize)>::poll_flush(sink, cx).is_ready())
    };
    assert!(panics(|| flush(&mut sink)));
    let stats = rx.stats();
    assert_eq!((stats.sent, stats.pending_values), (1, 1));

    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![usize::MAX])]));
    assert!(flush(&mut sink), "the flush is done");
    assert_eq!(rx.try_recv(), Ok(vec![("b", vec![1])]));
}

/// Takes `Touchy(7)`, the only key pending, while its `Clone` panics: the first take
/// panics, and the next takes it whole and unheld.
fn take_unheld(rx: &mut ordered::AckReceiver<u8, Touchy, u32>) -> Delivery<Touchy, u32> {
    arm(7, &[What::Clone]);
    assert!(panics(|| rx.try_recv()));
    let delivery = rx.try_recv().unwrap().remove(0);
    disarm();
    delivery
}

/// A key that cannot be held may have two deliveries out. Value 2 goes out three times
/// while value 1 is out; retried, 1 goes in front of 2, and their delivery's attempt is
/// the first value's (its second), as `Delivery::attempt` says, not value 2's fourth.
#[tokio::test(start_paused = true)]
async fn unheld_key_attempt_is_the_first_values() {
    let (tx, mut rx) = ordered::Builder::new().acked::<u8, Touchy, u32>();
    tx.try_send(0, Touchy(7), 1).unwrap();
    let first = take_unheld(&mut rx);
    assert_eq!((first.values(), first.attempt()), (&[1][..], 1));
    tx.try_send(0, Touchy(7), 2).unwrap();
    for attempt in 1..=3 {
        let d = rx.try_recv().unwrap().remove(0);
        assert_eq!((d.values(), d.attempt()), (&[2][..], attempt));
        d.retry().await.unwrap();
    }
    first.retry().await.unwrap();
    let d = rx.try_recv().unwrap().remove(0);
    assert_eq!((d.values(), d.attempt()), (&[1, 2][..], 2));
}

/// A key that cannot be held goes back at once when retried, whatever the delay asked for
/// (crate docs, *Panics in user code*).
#[tokio::test(start_paused = true)]
async fn unheld_key_retry_after_goes_back_at_once() {
    let (tx, mut rx) = ordered::Builder::new().acked::<u8, Touchy, u32>();
    tx.try_send(0, Touchy(7), 1).unwrap();
    take_unheld(&mut rx).retry_after(secs(5)).await.unwrap();
    let again = rx.try_recv().unwrap().remove(0);
    assert_eq!((again.values(), again.attempt()), (&[1][..], 2));
}

/// Each retry of a key that cannot be held puts its values in front of the key's pending
/// ones: the values retried last come first, whatever order they were sent in.
#[tokio::test(start_paused = true)]
async fn unheld_key_retries_go_back_last_retried_first() {
    let (tx, mut rx) = ordered::Builder::new().acked::<u8, Touchy, u32>();
    tx.try_send(0, Touchy(7), 1).unwrap();
    let first = take_unheld(&mut rx);
    tx.try_send(0, Touchy(7), 2).unwrap();
    let second = rx.try_recv().unwrap().remove(0); // out while 1 is
    tx.try_send(0, Touchy(7), 3).unwrap(); // waits behind 2, which is held
    first.retry().await.unwrap();
    second.retry().await.unwrap();
    let d = rx.try_recv().unwrap().remove(0);
    assert_eq!(d.values(), &[2, 1, 3]);
}

/// A key whose `Clone` panicked goes out whole: alone when it does not fit, and beside
/// other keys when it does.
#[test]
fn unsplittable_key_shares_a_batch_when_it_fits() {
    let (tx, mut rx) = ordered::Builder::new()
        .max_batch(3)
        .build::<u8, Touchy, u32>();
    tx.try_send(0, Touchy(1), 1).unwrap();
    tx.try_send(0, Touchy(1), 2).unwrap();
    tx.try_send(1, Touchy(7), 3).unwrap();
    tx.try_send(1, Touchy(7), 4).unwrap();
    tx.try_send(2, Touchy(9), 5).unwrap();
    arm(7, &[What::Clone]);
    assert!(panics(|| rx.try_recv()));
    disarm();
    assert_eq!(rx.try_recv(), Ok(vec![(Touchy(1), vec![1, 2])]));
    assert_eq!(
        rx.try_recv(),
        Ok(vec![(Touchy(7), vec![3, 4]), (Touchy(9), vec![5])])
    );
}

// ===== panics in user code, acknowledging channels =====

/// The keys a drain of `rx` hands out, each delivery acknowledged; ends when the stream
/// does, or fails if it has not ended an hour of paused time after the last batch.
async fn ack_until_end<S, K: Clone, V: Clone>(rx: &mut S) -> Vec<(K, Vec<V>)>
where
    S: futures::Stream<Item = Vec<keyed_batch::ack::Delivery<K, V>>> + Unpin,
{
    use futures::StreamExt;
    let mut seen = Vec::new();
    loop {
        let next = tokio::time::timeout(HOUR, rx.next()).await;
        let Some(batch) = next.expect("the stream ended") else {
            return seen;
        };
        for d in batch {
            seen.push((d.key().clone(), d.values().to_vec()));
            d.ack().await.unwrap();
        }
    }
}

/// A retry runs no user code: the key's hash and weights were kept when it went out. So a
/// retry of a key whose `Hash` now panics still puts it back, and the key is not stuck.
#[tokio::test(start_paused = true)]
async fn retry_runs_no_user_hash() {
    let (tx, mut rx) = ordered::Builder::new()
        .capacity(2)
        .acked::<u32, Touchy, u32>();
    tx.try_send(0, Touchy(7), 1).unwrap();
    let d = rx.try_recv().unwrap().remove(0);
    arm(7, &[What::Hash]);
    let retried = catch_unwind(AssertUnwindSafe(|| d.retry()));
    disarm();
    retried.expect("retry hashed the key").await.unwrap();
    assert_eq!(rx.stats().in_flight_keys, 0);
    tx.try_send(0, Touchy(7), 2).unwrap();
    drop(tx);
    let seen = ack_until_end(&mut rx).await;
    let seen: Vec<_> = seen.into_iter().map(|(k, v)| (k.0, v)).collect();
    assert_eq!(seen, vec![(7, vec![1, 2])]);
}

/// An `Ord` that panics while an ack ends a key's hold (its newer values go back in order)
/// leaves the key released, not held for ever: its values still come out.
#[tokio::test(start_paused = true)]
async fn ack_whose_ord_panics_still_releases_the_key() {
    let (tx, mut rx) = ordered::Builder::new().acked::<TouchyRank, u32, u32>();
    tx.try_send(TouchyRank(1), 1, 10).unwrap();
    let d = rx.try_recv().unwrap().remove(0);
    tx.try_send(TouchyRank(5), 2, 20).unwrap();
    tx.try_send(TouchyRank(7), 1, 11).unwrap(); // joins held key 1
    arm(7, &[What::Ord]);
    let acked = catch_unwind(AssertUnwindSafe(|| d.ack()));
    disarm();
    assert!(acked.is_err(), "the ack compared no armed rank");
    drop(tx);
    let mut seen = ack_until_end(&mut rx).await;
    seen.sort_unstable();
    assert_eq!(seen, vec![(1, vec![11]), (2, vec![20])]);
    assert_eq!(rx.stats().in_flight_keys, 0);
}

/// Spawns a consumer that waits on `rx` as a stream, takes one batch, acknowledges it and
/// returns what it held.
fn one_batch_consumer(
    mut rx: ordered::AckReceiver<TouchyRank, u32, u32>,
) -> tokio::task::JoinHandle<Vec<(u32, Vec<u32>)>> {
    use futures::StreamExt;
    tokio::spawn(async move {
        let batch = rx.next().await.expect("the stream ended");
        let got = batch
            .iter()
            .map(|d| (*d.key(), d.values().to_vec()))
            .collect();
        keyed_batch::ack::ack_all(batch).await.unwrap();
        got
    })
}

/// A decision that panics in a sort key's `Clone` or `Ord` as the key's hold ends (its
/// newer values go back in rank order) still wakes a receiver already waiting in another
/// task: the key is due, and it comes out. The panic used to skip that wake, and the
/// consumer slept until some other event. `Drop` of an undecided delivery makes the same
/// decision as `retry`.
#[tokio::test(start_paused = true)]
async fn a_decision_that_panics_in_a_sort_key_wakes_the_waiting_receiver() {
    // An ack clones the newer values' sort key into the index; a retry first compares it
    // with the one the key went out with.
    for (what, decision) in [
        (What::Clone, "ack"),
        (What::Ord, "retry"),
        (What::Ord, "drop"),
    ] {
        let (tx, rx) = ordered::Builder::new().acked::<TouchyRank, u32, u32>();
        let mut mine = rx.clone();
        tx.try_send(TouchyRank(1), 1, 10).unwrap();
        let delivery = mine.try_recv().unwrap().remove(0);
        let waiting = one_batch_consumer(rx);
        tokio::task::yield_now().await; // the consumer waits: key 1 is in flight
        tx.try_send(TouchyRank(7), 1, 11).unwrap(); // joins held key 1
        arm(7, &[what]);
        let decided = catch_unwind(AssertUnwindSafe(|| match decision {
            "ack" => drop(delivery.ack()),
            "retry" => drop(delivery.retry()),
            _ => drop(delivery),
        }));
        disarm();
        assert!(
            decided.is_err(),
            "{decision}: no armed sort key was touched"
        );
        let got = tokio::time::timeout(secs(10), waiting).await;
        let got = got.unwrap_or_else(|_| panic!("{decision}: the receiver was never woken"));
        let want = match decision {
            "ack" => vec![(1, vec![11])],
            _ => vec![(1, vec![10, 11])],
        };
        assert_eq!(got.unwrap(), want, "{what:?} in {decision}");
        drop((tx, mine));
    }
}

/// The room an ack gives back reaches a send waiting for it, though the ack panicked in a
/// sort key's `Clone` as the key's hold ended.
#[tokio::test(start_paused = true)]
async fn a_decision_that_panics_in_a_sort_key_wakes_a_waiting_send() {
    let (tx, mut rx) = ordered::Builder::new()
        .capacity(2)
        .acked::<TouchyRank, u32, u32>();
    tx.try_send(TouchyRank(1), 1, 10).unwrap();
    let delivery = rx.try_recv().unwrap().remove(0);
    tx.try_send(TouchyRank(7), 1, 11).unwrap(); // full: one in flight, one pending
    let tx2 = tx.clone();
    let sender = tokio::spawn(async move { tx2.send(TouchyRank(3), 2, 20).await });
    tokio::task::yield_now().await;
    assert!(!sender.is_finished(), "the send waits for room");
    arm(7, &[What::Clone]);
    let acked = catch_unwind(AssertUnwindSafe(|| delivery.ack()));
    disarm();
    assert!(acked.is_err(), "the ack cloned no armed sort key");
    let sent = tokio::time::timeout(secs(10), sender).await;
    sent.expect("room came back, but the send was never woken")
        .unwrap()
        .unwrap();
    drop(tx);
    let mut seen = ack_until_end(&mut rx).await;
    seen.sort_unstable();
    assert_eq!(seen, vec![(1, vec![11]), (2, vec![20])]);
}

/// `ack_all` whose first decision panics in a sort key still makes the others, in this
/// channel and in another: none of those keys stays in flight for good.
#[tokio::test(start_paused = true)]
async fn ack_all_makes_every_decision_though_one_panics() {
    let (tx, mut rx) = ordered::Builder::new().acked::<TouchyRank, u32, u32>();
    let (other_tx, mut other_rx) = ordered::Builder::new().acked::<u32, u32, u32>();
    tx.try_send(TouchyRank(1), 1, 10).unwrap();
    tx.try_send(TouchyRank(2), 2, 20).unwrap();
    other_tx.try_send(0, 3, 30).unwrap();
    let batch = rx.try_recv().unwrap();
    let other = other_rx.try_recv().unwrap();
    tx.try_send(TouchyRank(5), 4, 40).unwrap();
    tx.try_send(TouchyRank(7), 1, 11).unwrap(); // joins held key 1
    tx.try_send(TouchyRank(8), 2, 21).unwrap(); // joins held key 2
                                                // Key 1's hold ends first, and its 7 is compared with key 4's 5 as it goes back.
    arm(7, &[What::Ord]);
    let all: Vec<_> = batch.into_iter().chain(other).collect();
    let acked = catch_unwind(AssertUnwindSafe(|| keyed_batch::ack::ack_all(all)));
    disarm();
    assert!(acked.is_err(), "the ack compared no armed sort key");
    assert_eq!((rx.stats().acked, rx.stats().in_flight_keys), (2, 0));
    let other_stats = other_rx.stats();
    assert_eq!((other_stats.acked, other_stats.in_flight_keys), (1, 0));
    drop(tx);
    let mut seen = ack_until_end(&mut rx).await;
    seen.sort_unstable();
    assert_eq!(seen, vec![(1, vec![11]), (2, vec![21]), (4, vec![40])]);
}

/// An undecided delivery dropped while another panic unwinds, whose retry panics in a sort
/// key too, does not abort the process: the first panic goes on, and the retry is made.
#[tokio::test(start_paused = true)]
async fn a_delivery_dropped_in_a_panic_whose_retry_panics_does_not_abort() {
    let (tx, mut rx) = ordered::Builder::new().acked::<TouchyRank, u32, u32>();
    tx.try_send(TouchyRank(1), 1, 10).unwrap();
    let delivery = rx.try_recv().unwrap().remove(0);
    tx.try_send(TouchyRank(7), 1, 11).unwrap();
    arm(7, &[What::Ord]);
    let consumer = catch_unwind(AssertUnwindSafe(|| {
        let _held = delivery;
        panic!("the consumer's own panic");
    }));
    disarm();
    let panic = consumer.unwrap_err();
    assert_eq!(
        panic.downcast_ref::<&str>(),
        Some(&"the consumer's own panic")
    );
    assert_eq!(rx.stats().retried, 1);
    drop(tx);
    assert_eq!(ack_until_end(&mut rx).await, vec![(1, vec![10, 11])]);
}

/// An `Ord` that panics after a batch of deliveries was taken, while the receiver looks at
/// what comes next: the panic does not deadlock the channel (the deliveries it dropped go
/// back), and nothing is lost.
#[test]
fn ord_panic_after_deliveries_are_taken() {
    on_thread("acked Ord panic", || {
        let rt = paused_runtime();
        let (tx, mut rx) = ordered::Builder::new()
            .max_batch(2)
            .acked::<TouchyRank, u32, u32>();
        tx.try_send(TouchyRank(1), 1, 10).unwrap();
        tx.try_send(TouchyRank(5), 2, 20).unwrap();
        tx.try_send(TouchyRank(3), 3, 30).unwrap(); // out of order

        // Key 1 is taken; then the next front is sought, comparing 5 with 3.
        arm(5, &[What::Ord]);
        let first = catch_unwind(AssertUnwindSafe(|| rx.try_recv()));
        disarm();
        assert!(first.is_err(), "no comparison of the armed rank");
        drop(tx);
        let mut seen = rt.block_on(ack_until_end(&mut rx));
        seen.sort_unstable();
        assert_eq!(seen, vec![(1, vec![10]), (2, vec![20]), (3, vec![30])]);
    });
}

/// `ack_all` over an iterator that panics part way decides nothing, and the deliveries it
/// had taken go back when dropped (as every undecided delivery does): none is stuck.
#[tokio::test(start_paused = true)]
async fn ack_all_iterator_panic_gives_the_deliveries_back() {
    let (tx, mut rx) = ordered::Builder::new().acked::<u32, u32, u32>();
    tx.try_send(0, 1, 1).unwrap();
    tx.try_send(0, 2, 2).unwrap();
    let batch = rx.try_recv().unwrap();
    assert!(panics(|| {
        keyed_batch::ack::ack_all(batch.into_iter().enumerate().map(|(i, d)| {
            assert!(i < 1, "user code in the iterator");
            d
        }))
    }));
    let stats = rx.stats();
    assert_eq!((stats.acked, stats.in_flight_keys), (0, 0));
    drop(tx);
    let mut seen = ack_until_end(&mut rx).await;
    seen.sort_unstable();
    assert_eq!(seen, vec![(1, vec![1]), (2, vec![2])]);
}

/// A sort key whose `Clone` always panics, when its held key needs a copy: as in a plain
/// channel (`clone_that_always_panics_does_not_wedge_the_channel`), only the first receive
/// panics, delivering nothing; the key then goes out whole, and the other keys follow.
#[tokio::test(start_paused = true)]
async fn acked_sort_key_clone_panic_does_not_wedge_the_channel() {
    let (tx, mut rx) = ordered::Builder::new()
        .max_batch(1)
        .acked::<TouchyRank, u32, u32>();
    tx.try_send(TouchyRank(5), 1, 10).unwrap();
    tx.try_send(TouchyRank(5), 1, 11).unwrap();
    tx.try_send(TouchyRank(6), 2, 20).unwrap();
    arm(5, &[What::Clone]);
    assert!(panics(|| rx.try_recv()));
    assert_eq!((rx.len(), rx.stats().in_flight_keys), (3, 0));
    let second = catch_unwind(AssertUnwindSafe(|| rx.try_recv()));
    disarm();
    let batch = second.expect("every receive panics").unwrap();
    let got: Vec<_> = batch
        .iter()
        .map(|d| (*d.key(), d.values().to_vec()))
        .collect();
    assert_eq!(got, vec![(1, vec![10, 11])]);
    keyed_batch::ack::ack_all(batch).await.unwrap();
    drop(tx);
    assert_eq!(ack_until_end(&mut rx).await, vec![(2, vec![20])]);
}

// ===== counted drops =====

/// Counts the drops of each `Tracked` value it made.
struct Tracker {
    drops: Mutex<Vec<u32>>,
}

/// A value whose drop is counted by its `Tracker`.
#[derive(Debug)]
struct Tracked {
    id: usize,
    tracker: Arc<Tracker>,
}

impl std::fmt::Debug for Tracker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tracker")
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        let mut drops = self
            .tracker
            .drops
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        drops[self.id] += 1;
    }
}

impl Tracker {
    fn new(n: usize) -> Arc<Self> {
        Arc::new(Tracker {
            drops: Mutex::new(vec![0; n]),
        })
    }

    fn make(self: &Arc<Self>, id: usize) -> Tracked {
        Tracked {
            id,
            tracker: Arc::clone(self),
        }
    }

    fn drops(&self) -> Vec<u32> {
        self.drops.lock().unwrap().clone()
    }

    fn dropped(&self) -> usize {
        self.drops().iter().filter(|&&n| n > 0).count()
    }

    /// Every value made was dropped, and none twice.
    fn assert_all_dropped_once(&self) {
        let drops = self.drops();
        let wrong: Vec<(usize, u32)> = drops
            .iter()
            .enumerate()
            .filter(|(_, &n)| n != 1)
            .map(|(id, &n)| (id, n))
            .collect();
        assert!(
            wrong.is_empty(),
            "(value, drops) not dropped once: {wrong:?}"
        );
    }
}

/// Dropping the last receiver drops every pending value exactly once (a clone alive keeps
/// them); later sends hand their value back.
#[test]
fn last_receiver_drop_drops_pending_once() {
    let tracker = Tracker::new(101);
    let (tx, mut rx) = timed::Builder::new(HOUR)
        .max_batch(7)
        .build::<u32, Tracked>();
    let rx2 = rx.clone();
    for id in 0..100 {
        tx.try_send((id % 13) as u32, tracker.make(id)).unwrap();
    }
    // A batch requeued before the drop is pending like the rest.
    rx.close();
    let batch = rx.try_recv().unwrap();
    let (key, values) = batch.into_iter().next().unwrap();
    rx.requeue(key, values).unwrap();
    drop(rx);
    assert_eq!(tracker.dropped(), 0, "a receiver is still alive");
    drop(rx2);
    let err = tx.try_send(1, tracker.make(100)).unwrap_err();
    assert_eq!(tracker.dropped(), 100);
    assert!(err.is_closed());
    drop(err);
    tracker.assert_all_dropped_once();
}

/// Closing, taking a few batches and dropping the receiver mid-drain: the batches taken and
/// the values left behind are each dropped exactly once.
#[test]
fn close_and_drop_mid_drain_drops_once() {
    for flavour in 0..2 {
        let tracker = Tracker::new(100);
        let mut taken = Vec::new();
        if flavour == 0 {
            let (tx, mut rx) = timed::Builder::new(HOUR)
                .max_batch(7)
                .build::<u32, Tracked>();
            for id in 0..100 {
                tx.try_send((id % 13) as u32, tracker.make(id)).unwrap();
            }
            drop(tx);
            for _ in 0..3 {
                taken.push(rx.try_recv().unwrap());
            }
        } else {
            let (tx, mut rx) = ordered::Builder::new()
                .max_batch(7)
                .build::<u32, u32, Tracked>();
            for id in 0..100 {
                tx.try_send((id % 5) as u32, (id % 13) as u32, tracker.make(id))
                    .unwrap();
            }
            rx.close();
            for _ in 0..3 {
                taken.push(rx.try_recv().unwrap());
            }
            drop(tx);
        }
        // The channel is gone: what it held is dropped, what was taken is not.
        let held: usize = taken.iter().flatten().map(|(_, v)| v.len()).sum();
        assert_eq!(held, 21);
        assert_eq!(tracker.dropped(), 100 - held);
        drop(taken);
        tracker.assert_all_dropped_once();
    }
}

/// Values handed back in errors (`Full`, `Closed`, refused requeue), values of a cancelled
/// waiting `send`, and of a waiting `send` failed by the last receiver's drop, are each
/// dropped once, by whoever ends up holding them.
#[tokio::test]
async fn refused_and_cancelled_values_drop_once() {
    let tracker = Tracker::new(7);
    let (tx, mut rx) = timed::Builder::new(Duration::ZERO)
        .capacity(1)
        .build::<u32, Tracked>();
    tx.try_send(1, tracker.make(0)).unwrap();
    let full = tx.try_send(1, tracker.make(1)).unwrap_err();
    assert!(full.is_full());
    drop(full);
    assert_eq!(tracker.drops()[1], 1);

    let mut cancelled = task::spawn(tx.send(2, tracker.make(2)));
    assert_pending!(cancelled.poll());
    drop(cancelled);
    assert_eq!(tracker.drops()[2], 1);

    let mut waiting = task::spawn(tx.send(3, tracker.make(3)));
    assert_pending!(waiting.poll());
    let rx2 = rx.clone();
    let batch = rx.try_recv().unwrap();
    drop(rx);
    assert_eq!(tracker.dropped(), 2, "a receiver is still alive");
    drop(rx2);
    assert!(waiting.is_woken());
    let SendError((key, value)) = assert_ready!(waiting.poll()).unwrap_err();
    assert_eq!((key, value.id), (3, 3));
    drop(value);
    drop(batch);

    let SendError((_, value)) = tx.send(4, tracker.make(4)).await.unwrap_err();
    assert_eq!(value.id, 4);
    drop(value);
    let _ = (tracker.make(5), tracker.make(6));
    tracker.assert_all_dropped_once();
}

// ===== user Drop that uses the channel =====

thread_local! {
    /// What a `Reentrant` does when dropped, on this thread: here, use the channel.
    static ON_DROP: std::cell::RefCell<Option<Box<dyn Fn()>>> = const { std::cell::RefCell::new(None) };
    /// How many `Reentrant`s ran the hook.
    static HOOKED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A key or sort key whose `Drop` calls back into the channel. Dropped under the channel's
/// lock, it would deadlock.
#[derive(Debug, Clone)]
struct Reentrant(u32);

impl Drop for Reentrant {
    fn drop(&mut self) {
        ON_DROP.with(|hook| {
            if let Some(hook) = &*hook.borrow() {
                hook();
                HOOKED.with(|n| n.set(n.get() + 1));
            }
        });
    }
}

impl PartialEq for Reentrant {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl Eq for Reentrant {}

impl std::hash::Hash for Reentrant {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

impl PartialOrd for Reentrant {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Reentrant {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.cmp(&other.0)
    }
}

/// Runs `f` with every `Reentrant` drop calling `hook`; returns how many drops did.
fn with_drop_hook(hook: impl Fn() + 'static, f: impl FnOnce()) -> usize {
    HOOKED.with(|n| n.set(0));
    ON_DROP.with(|h| *h.borrow_mut() = Some(Box::new(hook)));
    f();
    let hook = ON_DROP.with(|h| h.borrow_mut().take());
    drop(hook);
    HOOKED.with(|n| n.get())
}

/// A send to a pending key drops the key it brought, and that drop used to happen under the
/// lock: a `Drop` that used the channel deadlocked. Now it runs after the lock.
#[test]
fn spare_key_is_dropped_outside_the_lock() {
    on_thread("spare key", || {
        let (tx, mut rx) = timed::channel::<Reentrant, u32>(Duration::ZERO);
        let probe = tx.clone();
        let hooked = with_drop_hook(
            move || assert_eq!(probe.len(), probe.len()),
            || {
                tx.try_send(Reentrant(1), 1).unwrap();
                tx.try_send(Reentrant(1), 2).unwrap();
            },
        );
        assert_eq!(hooked, 1);
        assert_eq!(rx.try_recv(), Ok(vec![(Reentrant(1), vec![1, 2])]));
    });
}

/// In `ordered`, a sort key that does not lower its key's rank is dropped, after the lock.
#[test]
fn spare_sort_key_is_dropped_outside_the_lock() {
    on_thread("spare sort key", || {
        let (tx, mut rx) = ordered::channel::<Reentrant, &str, u32>();
        let probe = tx.clone();
        let hooked = with_drop_hook(
            move || assert!(!probe.is_closed()),
            || {
                tx.try_send(Reentrant(1), "a", 1).unwrap();
                tx.try_send(Reentrant(5), "a", 2).unwrap();
            },
        );
        assert_eq!(hooked, 1);
        assert_eq!(rx.try_recv(), Ok(vec![("a", vec![1, 2])]));
    });
}

/// In `ordered`, a send whose value goes in and which then panics in another sort key's
/// `Ord` (the fronts of the index compared as it settles) drops the key it brought after
/// the lock, as any spare key.
#[test]
fn spare_key_of_a_send_that_panics_after_it_went_in_is_dropped_outside_the_lock() {
    on_thread("spare key after a panic", || {
        let (tx, rx) = ordered::channel::<TouchyRank, Reentrant, u32>();
        tx.try_send(TouchyRank(1), Reentrant(1), 10).unwrap();
        tx.try_send(TouchyRank(9), Reentrant(9), 90).unwrap();
        tx.try_send(TouchyRank(3), Reentrant(3), 30).unwrap();
        let probe = tx.clone();
        let hooked = with_drop_hook(
            move || assert!(!probe.is_closed()),
            || {
                // Key 9's rank falls to 5; then the fronts, 1 and 3, are compared.
                arm(1, &[What::Ord]);
                assert!(panics(|| tx.try_send(TouchyRank(5), Reentrant(9), 91)));
                disarm();
            },
        );
        assert_eq!(hooked, 1);
        assert_eq!(rx.len(), 4);
    });
}

/// A key that cannot be held may have two deliveries out at once: `in_flight_keys` counts
/// deliveries, so it counts that key twice.
#[test]
fn an_unheld_key_counts_each_delivery_in_flight() {
    let (tx, mut rx) = ordered::Builder::new().acked::<u8, Touchy, u32>();
    tx.try_send(0, Touchy(7), 1).unwrap();
    arm(7, &[What::Clone]);
    assert!(panics(|| rx.try_recv()));
    let first = rx.try_recv().unwrap().remove(0); // whole, and not held
    disarm();
    tx.try_send(0, Touchy(7), 2).unwrap();
    let second = rx.try_recv().unwrap().remove(0); // out while the first is
    assert_eq!((first.key(), second.key()), (&Touchy(7), &Touchy(7)));
    let stats = rx.stats();
    assert_eq!((stats.in_flight_values, stats.in_flight_keys), (2, 2));
}

/// A delivery that went out unheld holds no `max_keys` slot: another key's value goes in
/// while it is out, and a value for its own key then needs a slot, as a new key's does. Its
/// values still count toward `capacity`.
#[tokio::test(start_paused = true)]
async fn an_unheld_key_in_flight_holds_no_key_slot() {
    let (tx, mut rx) = ordered::Builder::new()
        .max_keys(1)
        .capacity(3)
        .acked::<u8, Touchy, u32>();
    tx.try_send(0, Touchy(7), 1).unwrap();
    arm(7, &[What::Clone]);
    assert!(panics(|| rx.try_recv()));
    let delivery = rx.try_recv().unwrap().remove(0); // whole, and not held
    disarm();
    assert_eq!(rx.stats().in_flight_keys, 1);
    tx.try_send(0, Touchy(8), 2).unwrap();
    let full = tx.try_send(0, Touchy(7), 3).unwrap_err();
    assert!(full.is_full(), "key 8 holds the one slot");
    tx.try_send(0, Touchy(8), 3).unwrap();
    let full = tx.try_send(0, Touchy(8), 4).unwrap_err();
    assert!(full.is_full(), "capacity 3: two pending, one in flight");
    delivery.ack().await.unwrap();
    tx.try_send(0, Touchy(8), 4).unwrap();
}

/// A send whose value goes in before another sort key's `Ord` panics is counted as sent,
/// and its key's run as pending, as the same panic is through the inbox.
#[test]
fn a_send_that_panics_after_it_went_in_is_counted() {
    let (tx, mut rx) = ordered::Builder::new()
        .max_batch(3)
        .build::<TouchyRank, u32, u32>();
    tx.try_send(TouchyRank(5), 1, 10).unwrap();
    tx.try_send(TouchyRank(9), 2, 20).unwrap();
    tx.try_send(TouchyRank(7), 4, 40).unwrap();
    // Key 3 goes in at rank 10; then the fronts, 5 and 7, are compared.
    arm(5, &[What::Ord]);
    assert!(panics(|| tx.try_send(TouchyRank(10), 3, 30)));
    disarm();
    let stats = rx.stats();
    assert_eq!((stats.sent, stats.pending_values), (4, 4));
    let first = rx.try_recv().unwrap();
    assert_eq!(first, vec![(1, vec![10]), (4, vec![40]), (2, vec![20])]);
    let stats = rx.stats();
    assert_eq!(stats.pending_values, 1);
    assert!(
        stats.oldest_pending.is_some(),
        "key 3 is pending: {stats:?}"
    );
    assert_eq!(rx.try_recv().unwrap(), vec![(3, vec![30])]);
    assert_eq!((rx.stats().sent, rx.stats().delivered), (4, 4));
}

/// In `ordered`, lowering a rank replaces it and leaves a stale index entry behind; both
/// ranks are dropped after the lock, whenever the queue lets go of them.
#[test]
fn replaced_and_stale_ranks_are_dropped_outside_the_lock() {
    on_thread("stale ranks", || {
        let (tx, mut rx) = ordered::channel::<Reentrant, &str, u32>();
        let probe = tx.clone();
        let hooked = with_drop_hook(
            move || {
                let _ = probe.stats();
            },
            || {
                tx.try_send(Reentrant(5), "a", 1).unwrap();
                tx.try_send(Reentrant(6), "b", 2).unwrap();
                tx.try_send(Reentrant(1), "a", 3).unwrap();
                tx.try_send(Reentrant(0), "b", 4).unwrap();
                assert_eq!(
                    rx.try_recv(),
                    Ok(vec![("b", vec![2, 4]), ("a", vec![1, 3])])
                );
            },
        );
        // Two replaced slot ranks, two stale tickets, two delivered ranks and two live
        // tickets: every rank the channel held was dropped by then, none under the lock.
        assert!(hooked >= 6, "only {hooked} drops ran the hook");
    });
}

/// Sends one value for `Reentrant(1)` through an acknowledging channel, takes its delivery,
/// and decides it with `decide` while every `Reentrant` drop uses the channel (and would
/// deadlock under its lock). Returns how many drops ran the hook, and the receiver.
fn decide_with_drop_hook(
    decide: impl FnOnce(&tokio::runtime::Runtime, Delivery<Reentrant, u32>),
) -> (usize, timed::AckReceiver<Reentrant, u32>) {
    let rt = paused_runtime();
    let (tx, mut rx) = timed::Builder::new(Duration::ZERO).acked::<Reentrant, u32>();
    tx.try_send(Reentrant(1), 1).unwrap();
    let d = rx.try_recv().unwrap().remove(0);
    let probe = tx.clone();
    let hooked = with_drop_hook(
        move || assert_eq!(probe.len(), probe.len()),
        || decide(&rt, d),
    );
    (hooked, rx)
}

/// A retried key goes back to the queue, and the key that is not needed any more (the queue
/// already holds one) is dropped after the lock.
#[test]
fn retried_key_is_dropped_outside_the_lock() {
    on_thread("retried key", || {
        let (hooked, mut rx) = decide_with_drop_hook(|rt, d| rt.block_on(d.retry()).unwrap());
        assert_eq!(hooked, 1);
        let batch = rx.try_recv().unwrap();
        assert_eq!(batch[0].values(), [1]);
        assert_eq!(batch[0].attempt(), 2);
    });
}

/// An acknowledged key with nothing newer pending leaves the queue, and the copy of it the
/// queue kept while the key was in flight used to be dropped under the lock: a `Drop` that
/// used the channel deadlocked. Now it is dropped after the lock, for `give_up` too.
#[test]
fn decided_key_is_dropped_outside_the_lock() {
    for give_up in [false, true] {
        on_thread("decided key", move || {
            let (hooked, rx) = decide_with_drop_hook(|rt, d| match give_up {
                false => rt.block_on(d.ack()).unwrap(),
                true => drop(rt.block_on(d.give_up()).unwrap()),
            });
            // The delivery's key and the queue's copy.
            assert_eq!(hooked, 2);
            assert_eq!(rx.len(), 0);
            let stats = rx.stats();
            let decided = (stats.acked, stats.given_up);
            assert_eq!(decided, (u64::from(!give_up), u64::from(give_up)));
        });
    }
}

// ===== consumers that panic, runtimes that go away =====

/// A consumer task that panics while holding a batch does not stop the other receiver:
/// everything else is delivered to it, and its stream ends.
#[tokio::test(start_paused = true)]
async fn consumer_panic_does_not_stop_others() {
    let (tx, rx) = timed::channel::<u32, u32>(MS10);
    let lost = Arc::new(Mutex::new(Vec::new()));
    let mut bad_rx = rx.clone();
    let bad_lost = Arc::clone(&lost);
    let bad = tokio::spawn(async move {
        let batch = bad_rx.recv().await.unwrap();
        bad_lost.lock().unwrap().extend(batch);
        panic!("consumer failed while holding its batch");
    });
    let good = tokio::spawn(async move {
        let mut rx = rx;
        let mut got = Vec::new();
        while let Some(batch) = rx.recv().await {
            got.extend(batch);
        }
        got
    });
    tokio::task::yield_now().await;
    for key in 0..20 {
        tx.send(key, key * 10).await.unwrap();
        tokio::time::sleep(ms(3)).await;
    }
    drop(tx);
    assert!(bad.await.unwrap_err().is_panic());
    let got = good.await.unwrap();
    let lost = lost.lock().unwrap().clone();
    assert!(!lost.is_empty(), "the panicking consumer took nothing");
    let mut all: Vec<(u32, Vec<u32>)> = lost.into_iter().chain(got).collect();
    all.sort();
    let want: Vec<(u32, Vec<u32>)> = (0..20).map(|k| (k, vec![k * 10])).collect();
    assert_eq!(all, want);
}

/// Runs `f` on its own thread and fails if it panics or does not finish in time.
fn on_thread(name: &str, f: impl FnOnce() + Send + 'static) {
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let ok = catch_unwind(AssertUnwindSafe(f)).is_ok();
        let _ = done.send(ok);
    });
    let ok = finished
        .recv_timeout(secs(20))
        .unwrap_or_else(|_| panic!("{name}: hung"));
    assert!(ok, "{name}: panicked");
}

/// Dropping the runtime while a bounded `send` waits (current-thread and multi-thread
/// runtimes) neither hangs nor panics; the waiting value is dropped once and the channel
/// goes on working without that sender.
#[test]
fn runtime_drop_while_send_waits() {
    for multi in [false, true] {
        on_thread("runtime drop", move || {
            let tracker = Tracker::new(4);
            let (tx, mut rx) = timed::Builder::new(Duration::ZERO)
                .capacity(1)
                .build::<u32, Tracked>();
            tx.try_send(1, tracker.make(0)).unwrap();
            let rt = match multi {
                false => tokio::runtime::Builder::new_current_thread().build(),
                true => tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .build(),
            }
            .unwrap();
            let (registered, is_registered) = std::sync::mpsc::channel();
            let (tx2, value) = (tx.clone(), tracker.make(1));
            rt.block_on(async {
                tokio::spawn(async move {
                    let mut send = pin!(tx2.send(2, value));
                    assert!(futures::poll!(send.as_mut()).is_pending());
                    registered.send(()).unwrap();
                    send.await
                });
                while is_registered.try_recv().is_err() {
                    tokio::task::yield_now().await;
                }
            });
            assert!(tx.try_send(9, tracker.make(2)).unwrap_err().is_full());
            drop(rt);
            assert_eq!(tracker.drops(), vec![0, 1, 1, 0]);
            // The waiting sender is gone: room goes to the next caller.
            let batch = rx.try_recv().unwrap();
            assert_eq!(batch[0].1[0].id, 0);
            drop(batch);
            tx.try_send(3, tracker.make(3)).unwrap();
        });
    }
}

/// Dropping the runtime while a receiver waits on its deadline timer neither hangs nor
/// panics, and the receiver still works without a runtime (`try_recv`).
#[test]
fn runtime_drop_while_recv_waits() {
    on_thread("runtime drop under recv", || {
        let (tx, mut rx) = timed::channel::<u32, u32>(HOUR);
        let rt = paused_runtime();
        rt.block_on(async {
            tx.send(1, 10).await.unwrap();
            let mut recv = task::spawn(rx.recv());
            assert_pending!(recv.poll()); // sleeping on the deadline timer
        });
        drop(rt);
        drop(tx);
        assert_eq!(rx.try_recv(), Ok(vec![(1, vec![10])]));
        assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
    });
}

/// A receiver that slept on its deadline timer in one runtime still works in a later one,
/// once the first is gone. It used to reuse the timer made in the first runtime and panic
/// ("A Tokio 1.x context was found, but it is being shutdown").
#[test]
fn receiver_in_a_second_runtime() {
    on_thread("receiver in a second runtime", || {
        let (tx, mut rx) = timed::channel::<u32, u32>(HOUR);
        let rt = paused_runtime();
        rt.block_on(async {
            tx.send(1, 10).await.unwrap();
            let mut recv = task::spawn(rx.recv());
            assert_pending!(recv.poll()); // sleeping on the deadline timer
        });
        drop(rt);
        let rt = paused_runtime();
        rt.block_on(async {
            tx.send(2, 20).await.unwrap();
            // Key 1 is due an hour after it was sent; the paused clock jumps there. Key 2,
            // sent on this runtime's clock, may be due by the same millisecond tick.
            let batch = rx.recv().await.unwrap();
            assert_eq!(batch[0], (1, vec![10]));
        });
    });
}

/// A receiver that slept on its deadline timer in one runtime, then waits in another while
/// the first is alive but idle, is woken at its deadline. It used to keep its timer in the
/// first runtime, which nobody drives, and hang.
#[test]
fn receiver_moved_to_another_runtime() {
    on_thread("receiver moved to another runtime", || {
        let (tx, mut rx) = timed::channel::<u32, u32>(HOUR);
        let first = paused_runtime();
        first.block_on(async {
            tx.send(1, 10).await.unwrap();
            let mut recv = task::spawn(rx.recv());
            assert_pending!(recv.poll()); // sleeping on the deadline timer
        });
        let second = paused_runtime();
        second.block_on(async {
            let mut recv = task::spawn(rx.recv());
            assert_pending!(recv.poll());
            // Key 1 is due an hour after it was sent, by the first runtime's clock, which
            // the second runtime's clock is ahead of.
            advance(HOUR).await;
            assert!(recv.is_woken(), "recv was not woken at the deadline");
            assert_eq!(assert_ready!(recv.poll()), Some(vec![(1, vec![10])]));
        });
        drop(first);
    });
}

// ===== close, send and recv interleavings =====

/// `close()` while bounded sends wait wakes each of them with `Closed` and its value; the
/// pending values still come out.
#[tokio::test]
async fn close_wakes_waiting_senders() {
    let (tx, mut rx) = timed::Builder::new(HOUR).capacity(1).build::<&str, i32>();
    tx.try_send("a", 1).unwrap();
    let mut b = task::spawn(tx.send("b", 2));
    let mut c = task::spawn(tx.send_by("c", 3, Instant::now()));
    assert_pending!(b.poll());
    assert_pending!(c.poll());
    rx.close();
    assert!(b.is_woken() && c.is_woken());
    assert_eq!(assert_ready!(b.poll()), Err(SendError(("b", 2))));
    assert_eq!(assert_ready!(c.poll()), Err(SendError(("c", 3))));
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![1])]));
    assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));

    let (tx, rx) = ordered::Builder::new().capacity(1).build::<u8, &str, i32>();
    tx.try_send(1, "a", 1).unwrap();
    let mut b = task::spawn(tx.send(2, "b", 2));
    assert_pending!(b.poll());
    rx.close();
    assert!(b.is_woken());
    assert_eq!(assert_ready!(b.poll()), Err(SendError((2, "b", 2))));
}

/// The last sender is dropped on either side of the receiver registering its waker, with
/// one or two receivers waiting, and with the waker changed between polls: whoever waits
/// is woken, the pending values come out, and the stream ends.
#[tokio::test(start_paused = true)]
async fn last_sender_drop_vs_receiver_registering() {
    // Registered first, then the drop: woken, flushes the undue value, then ends.
    let (tx, mut rx) = timed::channel::<u8, u8>(HOUR);
    tx.try_send(1, 1).unwrap();
    let mut recv = task::spawn(rx.recv());
    assert_pending!(recv.poll());
    drop(tx);
    assert!(recv.is_woken());
    assert_eq!(assert_ready!(recv.poll()), Some(vec![(1, vec![1])]));
    drop(recv);
    assert_eq!(rx.recv().await, None);

    // Dropped first, then the first poll: ready at once.
    let (tx, mut rx) = timed::channel::<u8, u8>(HOUR);
    drop(tx);
    let mut recv = task::spawn(rx.recv());
    assert_eq!(assert_ready!(recv.poll()), None);

    // Two receivers waiting (one holds the timer): both are woken; one gets the value, the
    // other the end.
    let (tx, rx) = timed::channel::<u8, u8>(HOUR);
    let (mut rx1, mut rx2) = (rx.clone(), rx);
    let mut r1 = task::spawn(async move { rx1.recv().await });
    let mut r2 = task::spawn(async move { rx2.recv().await });
    assert_pending!(r1.poll());
    assert_pending!(r2.poll());
    tx.try_send(1, 1).unwrap();
    assert_pending!(r1.poll());
    drop(tx);
    assert!(r1.is_woken() && r2.is_woken());
    let outcomes = [assert_ready!(r2.poll()), assert_ready!(r1.poll())];
    assert_eq!(outcomes, [Some(vec![(1, vec![1])]), None]);

    // The receiver re-registers from another task between polls: the newest waker counts.
    let (tx, mut rx) = timed::channel::<u8, u8>(HOUR);
    let mut first = task::spawn(());
    let mut second = task::spawn(());
    assert!(first.enter(|cx, _| rx.poll_recv(cx)).is_pending());
    assert!(second.enter(|cx, _| rx.poll_recv(cx)).is_pending());
    drop(tx);
    assert!(second.is_woken(), "the current waker was not woken");
    assert!(second.enter(|cx, _| rx.poll_recv(cx)).is_ready());
}

/// A send racing `close`: sent before, it is delivered in the flush; after, it fails with
/// its value; waiting for room, it fails with its value even if room came first (closed
/// wins), and nothing it carried is delivered.
#[tokio::test(start_paused = true)]
async fn send_vs_close() {
    // Send, then close.
    let (tx, mut rx) = timed::channel::<u8, u8>(HOUR);
    tx.send(1, 1).await.unwrap();
    rx.close();
    assert_eq!(rx.recv().await, Some(vec![(1, vec![1])]));
    assert_eq!(rx.recv().await, None);
    assert_eq!(tx.send(1, 2).await, Err(SendError((1, 2))));

    // Close, then send.
    let (tx, rx) = timed::channel::<u8, u8>(HOUR);
    rx.close();
    assert_eq!(tx.send(1, 1).await, Err(SendError((1, 1))));
    assert_eq!(tx.try_send(1, 2), Err(TrySendError::Closed((1, 2))));

    // Waiting for room; room comes (the sender is woken), then close before it runs.
    let (tx, mut rx) = timed::Builder::new(Duration::ZERO)
        .capacity(1)
        .build::<u8, u8>();
    tx.try_send(1, 1).unwrap();
    let mut send = task::spawn(tx.send(2, 2));
    assert_pending!(send.poll());
    assert_eq!(rx.try_recv(), Ok(vec![(1, vec![1])]));
    assert!(send.is_woken());
    rx.close();
    assert_eq!(assert_ready!(send.poll()), Err(SendError((2, 2))));
    assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));

    // Full and closed at once: Closed wins.
    let (tx, rx) = timed::Builder::new(HOUR).capacity(1).build::<u8, u8>();
    tx.try_send(1, 1).unwrap();
    rx.close();
    assert_eq!(tx.try_send(1, 2), Err(TrySendError::Closed((1, 2))));
}

/// A send racing the receiver that takes the last due key, in each order: the value is
/// never lost or delayed past its deadline, and a waiting receiver is woken for it.
#[tokio::test(start_paused = true)]
async fn send_vs_taking_last_due_key() {
    let (tx, mut rx) = timed::channel::<u8, u8>(MS10);
    let start = Instant::now();
    tx.send(1, 1).await.unwrap();

    // The receiver is woken at the deadline; a send lands before it runs, due later.
    let mut recv = task::spawn(rx.recv());
    assert_pending!(recv.poll());
    advance(MS10).await;
    assert!(recv.is_woken());
    tx.send(2, 2).await.unwrap(); // due at start + 20 ms
    assert_eq!(assert_ready!(recv.poll()), Some(vec![(1, vec![1])]));
    drop(recv);
    // It took the last due key; the next recv sleeps until key 2 is due.
    let mut recv = task::spawn(rx.recv());
    assert_pending!(recv.poll());
    advance(MS10).await;
    assert!(recv.is_woken());
    assert_eq!(assert_ready!(recv.poll()), Some(vec![(2, vec![2])]));
    drop(recv);
    assert_eq!(Instant::now(), start + 2 * MS10);

    // The queue is empty and the receiver waits without a timer; a send wakes it, and it
    // then sleeps until that value is due.
    let mut recv = task::spawn(rx.recv());
    assert_pending!(recv.poll());
    tx.send(3, 3).await.unwrap();
    assert!(recv.is_woken());
    assert_pending!(recv.poll());
    advance(MS10 - ms(1)).await;
    assert!(!recv.is_woken());
    advance(ms(1)).await;
    assert!(recv.is_woken());
    assert_eq!(assert_ready!(recv.poll()), Some(vec![(3, vec![3])]));
    drop(recv);

    // A value due at once, sent right after the receiver emptied the queue: woken at once.
    let mut recv = task::spawn(rx.recv());
    assert_pending!(recv.poll());
    tx.send_by(4, 4, Instant::now()).await.unwrap();
    assert!(recv.is_woken());
    assert_eq!(assert_ready!(recv.poll()), Some(vec![(4, vec![4])]));
    drop(recv);

    // A due value sent between the timer firing and the receiver running joins the batch,
    // after the key that was due first.
    tx.send(5, 5).await.unwrap();
    let mut recv = task::spawn(rx.recv());
    assert_pending!(recv.poll());
    advance(MS10).await;
    tx.send_by(6, 6, Instant::now()).await.unwrap();
    assert_eq!(
        assert_ready!(recv.poll()),
        Some(vec![(5, vec![5]), (6, vec![6])])
    );
}

// ===== memory =====

/// Bytes the whole process holds from the allocator now.
fn live_bytes() -> isize {
    let stats = GLOBAL.stats();
    stats.bytes_allocated as isize - stats.bytes_deallocated as isize
}

/// Distinct keys for the memory test: a million, or fewer in debug builds.
const KEYS: u64 = 1_000_000;

/// After a million distinct keys have gone through and been delivered, memory falls back:
/// the queue's reported capacity (keys and index entries) drops to a small figure, both
/// after one burst and over waves of new keys with rising and falling ranks; and a channel
/// that has delivered them all holds little more than a new one (allocator counts).
#[test]
fn memory_falls_back_after_a_million_keys() {
    // One burst through the queue, in rising rank order (the FIFO index).
    let mut q: SortedQueue<u64, u64, u8> = SortedQueue::new();
    for key in 0..KEYS {
        q.push(key, 0, key);
    }
    assert!(q.capacity().keys >= KEYS as usize);
    while !q.pop_batch(10_000, |_| true).is_empty() {}
    let Capacity { keys, index, .. } = q.capacity();
    assert!(
        keys <= 128 && index <= 128,
        "capacity after drain: {keys}, {index}"
    );

    // Waves of new keys with scattered ranks (the heap index): what stays allocated does
    // not grow with the number of keys seen.
    let wave = KEYS / 20;
    for n in 0..20 {
        for i in 0..wave {
            let key = KEYS + n * wave + i;
            q.push(key, 0, (i * 7_919) % wave);
        }
        while !q.pop_batch(5_000, |_| true).is_empty() {}
        let Capacity { keys, index, .. } = q.capacity();
        assert!(
            keys <= 128 && index <= 128,
            "capacity after wave {n}: {keys}, {index}"
        );
    }

    // The same through a channel, counted by the allocator. Batches of 4,000 keys: the
    // queue keeps a batch's plan for the next, and must give that back too.
    let before = live_bytes();
    let (tx, mut rx) = ordered::Builder::new()
        .max_batch(4_000)
        .build::<u64, u64, u8>();
    for key in 0..KEYS {
        tx.try_send(key % 1_000, key, 0).unwrap();
    }
    let peak = live_bytes() - before;
    let mut delivered = 0;
    while let Ok(batch) = rx.try_recv() {
        delivered += batch.len() as u64;
    }
    assert_eq!(delivered, KEYS);
    assert_eq!((rx.len(), rx.key_count()), (0, 0));
    let retained = live_bytes() - before;
    assert!(
        peak > (KEYS * 32) as isize,
        "peak {peak} bytes: the counter missed the keys"
    );
    assert!(
        retained < 256 * 1024,
        "{retained} bytes retained after delivering {KEYS} keys (peak {peak})"
    );
    drop((tx, rx));
}

/// A later delivery of a key that could not be held is held as usual, if its `Clone` does
/// not panic: a `retry_after` of the first delivery then goes back at once, but waits, with
/// the newer values, for the held delivery's decision (crate docs, *Panics in user code*).
#[tokio::test(start_paused = true)]
async fn unheld_keys_retry_waits_for_its_held_delivery() {
    let (tx, mut rx) = ordered::Builder::new().acked::<u8, Touchy, u32>();
    tx.try_send(0, Touchy(7), 1).unwrap();
    let first = take_unheld(&mut rx);
    tx.try_send(0, Touchy(7), 2).unwrap();
    let second = rx.try_recv().unwrap().remove(0); // held: its clone went well
    tx.try_send(0, Touchy(7), 3).unwrap();
    first.retry_after(secs(5)).await.unwrap();
    assert_eq!(rx.stats().pending_values, 2);
    advance(secs(10)).await;
    assert_eq!(rx.try_recv().unwrap_err(), TryRecvError::Empty);
    second.ack().await.unwrap();
    let again = rx.try_recv().unwrap().remove(0);
    assert_eq!(again.values(), &[1, 3]);
}
