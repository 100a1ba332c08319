//! The inbox path: sends that go through the lock-free inbox instead of the lock, and are
//! taken in by whoever takes the lock next.
//!
//! A send uses the inbox only while the lock is held or values wait there, which one thread
//! never sees (but for the sends `tests/reentry.rs` makes from under the lock). These
//! tests make every send use it, with `KEYED_BATCH_INBOX=always` (read when a channel is
//! built, with the `fault-injection` feature), so that the rules can be checked exactly, in
//! paused time. Every test in this file sets it, so the tests may run in parallel. The model
//! test runs over the inbox path the same way:
//!
//! ```text
//! KEYED_BATCH_INBOX=always cargo test --all-features --test model
//! ```
#![cfg(feature = "fault-injection")]

mod common;

use std::collections::HashMap;
use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread;
use std::time::Duration;

use keyed_batch::error::{TryRecvError, TrySendError};
use keyed_batch::{ordered, timed};
use tokio::time::{advance, Instant};
use tokio_test::task::spawn;
use tokio_test::{assert_pending, assert_ready};

use common::time::ms;
use common::touchy::{arm, disarm, panics, Touchy, TouchyRank, What};

/// Every send in this test binary goes through the inbox. Checked: through the inbox a
/// send runs no `Eq`, so a key whose `Eq` panics does not make it panic, where under the
/// lock it would.
fn inbox_always() {
    // Edition 2021: `set_var` is safe; every test sets the same value.
    std::env::set_var("KEYED_BATCH_INBOX", "always");
    let (probe, _rx) = timed::channel::<Touchy, u32>(Duration::from_secs(3600));
    probe.try_send(Touchy(1), 1).unwrap();
    arm(1, &[What::Eq]);
    let under_the_lock = panics(|| probe.try_send(Touchy(1), 2));
    disarm();
    assert!(
        !under_the_lock,
        "a send took the lock: the inbox is not forced"
    );
}

/// A value is due a window after it was sent, not after it was taken in: a receiver that
/// looks late takes the first key at 1 s and the second at 1.6 s.
#[tokio::test(start_paused = true)]
async fn due_a_window_after_send() {
    inbox_always();
    let (tx, mut rx) = timed::channel::<&str, u32>(ms(1000));
    tx.try_send("a", 1).unwrap();
    advance(ms(600)).await;
    tx.try_send("b", 2).unwrap();
    advance(ms(399)).await;
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    advance(ms(1)).await;
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![1])]));
    advance(ms(599)).await;
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    advance(ms(1)).await;
    assert_eq!(rx.try_recv(), Ok(vec![("b", vec![2])]));
}

/// A window too long to reach: a send through the inbox moves no deadline, so a receiver
/// waiting with nothing due is not woken. Such sends used to compare their deadline, past
/// the range, with the receiver's "none", and woke it every time.
#[tokio::test(start_paused = true)]
async fn sends_that_never_come_due_wake_no_one() {
    inbox_always();
    let two_centuries = Duration::from_secs(200 * 365 * 24 * 3600);
    let (tx, mut rx) = timed::channel::<u32, u32>(two_centuries);
    tx.try_send(0, 0).unwrap();
    let mut recv = spawn(async move { rx.recv().await });
    // Its first poll takes the first value in from the inbox, and may wake itself for it.
    assert_pending!(recv.poll());
    if recv.is_woken() {
        assert_pending!(recv.poll());
    }
    assert!(!recv.is_woken());
    for i in 1..100 {
        tx.try_send(i, i).unwrap();
        assert!(!recv.is_woken(), "woken by send {i}");
    }
    drop(tx);
    assert!(recv.is_woken(), "the close wakes it");
}

/// `len`, `stats` and `drain_now` count and take values still in the inbox, in the order
/// they were sent.
#[tokio::test(start_paused = true)]
async fn len_stats_and_drain_see_the_inbox() {
    inbox_always();
    let (tx, mut rx) = timed::channel::<u8, u32>(ms(1000));
    for v in 0..6 {
        tx.send(v as u8 % 2, v).await.unwrap();
    }
    assert_eq!(tx.len(), 6);
    assert_eq!(rx.len(), 6);
    let stats = rx.stats();
    assert_eq!(
        (stats.pending_values, stats.pending_keys, stats.sent),
        (6, 2, 6)
    );
    assert_eq!(
        rx.drain_now(),
        vec![vec![(0, vec![0, 2, 4]), (1, vec![1, 3, 5])]]
    );
    assert!(rx.is_empty());
}

/// A waiting receiver is woken by a send whose value is due before its timer, and by no
/// other: the wake rule of the locked path, checked without the lock.
#[tokio::test(start_paused = true)]
async fn wakes_only_for_an_earlier_deadline() {
    inbox_always();
    let (tx, rx) = timed::channel::<&str, u32>(ms(100));
    let mut rx = rx;
    let mut recv = spawn(async move {
        let batch = rx.recv().await;
        (batch, rx)
    });
    assert_pending!(recv.poll());

    // The first value: the receiver had no deadline.
    tx.try_send("a", 1).unwrap();
    assert!(recv.is_woken());
    assert_pending!(recv.poll());

    // Due later than "a": no wake.
    advance(ms(10)).await;
    tx.try_send("b", 2).unwrap();
    assert!(!recv.is_woken());

    // Due sooner than "a", by `send_by`: woken.
    tx.send_by("c", 3, Instant::now() + ms(20)).await.unwrap();
    assert!(recv.is_woken());
    assert_pending!(recv.poll());

    advance(ms(20)).await;
    assert!(recv.is_woken());
    let (batch, mut rx) = assert_ready!(recv.poll());
    assert_eq!(batch, Some(vec![("c", vec![3])]));
    advance(ms(100)).await;
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![1]), ("b", vec![2])]));
}

/// Closing takes the inbox in: every value whose send returned is delivered, then the
/// stream ends; later sends fail and hand the value back.
#[tokio::test(start_paused = true)]
async fn close_delivers_the_inbox() {
    inbox_always();
    let (tx, mut rx) = timed::channel::<&str, u32>(Duration::from_secs(3600));
    tx.try_send("a", 1).unwrap();
    tx.try_send("b", 2).unwrap();
    tx.try_send("a", 3).unwrap();
    rx.close();
    assert!(matches!(tx.try_send("a", 4), Err(TrySendError::Closed(_))));
    assert_eq!(
        rx.recv().await,
        Some(vec![("a", vec![1, 3]), ("b", vec![2])])
    );
    assert_eq!(rx.recv().await, None);

    let (tx, mut rx) = ordered::channel::<u32, &str, u32>();
    tx.try_send(2, "x", 1).unwrap();
    tx.try_send(1, "y", 2).unwrap();
    drop(tx);
    assert_eq!(rx.recv().await, Some(vec![("y", vec![2]), ("x", vec![1])]));
    assert_eq!(rx.recv().await, None);
}

/// A key whose `Eq` panics while the inbox is taken in loses that value only: the call that
/// took it in goes on, every other value goes in, and the loss is counted.
#[tokio::test(start_paused = true)]
async fn eq_panic_in_the_inbox_loses_that_value_only() {
    inbox_always();
    let (tx, mut rx) = timed::channel::<Touchy, u32>(ms(10));
    tx.try_send(Touchy(7), 70).unwrap();
    assert_eq!(rx.len(), 1);
    tx.try_send(Touchy(1), 10).unwrap();
    tx.try_send(Touchy(7), 71).unwrap();
    tx.try_send(Touchy(2), 20).unwrap();
    arm(7, &[What::Eq]);
    // Taking the inbox in compares the second 7 with the pending one: that panics, and is
    // caught.
    assert!(!panics(|| rx.len()));
    disarm();
    assert_eq!(rx.len(), 3);
    assert_eq!(rx.stats().lost, 1);
    advance(ms(10)).await;
    let got: Vec<(u32, Vec<u32>)> = rx
        .try_recv()
        .unwrap()
        .into_iter()
        .map(|(k, v)| (k.0, v))
        .collect();
    assert_eq!(got, vec![(7, vec![70]), (1, vec![10]), (2, vec![20])]);
}

/// A value whose weight would overflow the total pending weight is dropped and counted as
/// lost when the inbox is taken in, as for a panicking `Eq`: its `try_send` returned `Ok`,
/// and the call that took it in goes on.
#[tokio::test(start_paused = true)]
async fn weight_overflow_in_the_inbox_loses_that_value_only() {
    inbox_always();
    let (tx, mut rx) = timed::Builder::new(ms(10))
        .weigher(|v: &usize| *v)
        .build::<&str, usize>();
    tx.try_send("a", usize::MAX).unwrap();
    assert_eq!(rx.len(), 1);
    tx.try_send("b", 1).unwrap();
    tx.try_send("c", 0).unwrap();
    assert!(!panics(|| rx.len()));
    assert_eq!(rx.len(), 2);
    assert_eq!(rx.stats().lost, 1);
    advance(ms(10)).await;
    assert_eq!(
        rx.try_recv(),
        Ok(vec![("a", vec![usize::MAX]), ("c", vec![0])])
    );
}

/// A send that finds the inbox full goes in under the lock, after what the inbox holds: no
/// send is refused for it, and a key's values stay in the order they were sent.
#[tokio::test(start_paused = true)]
async fn a_full_inbox_sends_under_the_lock() {
    inbox_always();
    // More than the inbox holds (4,096), with no receiver looking meanwhile.
    const SENT: u32 = 10_000;
    let (tx, mut rx) = timed::channel::<u32, u32>(ms(10));
    for v in 0..SENT {
        tx.try_send(v % 3, v).unwrap();
    }
    assert_eq!(rx.len(), SENT as usize);
    advance(ms(10)).await;
    let batch = rx.try_recv().unwrap();
    for (key, values) in &batch {
        let want: Vec<u32> = (0..SENT).filter(|v| v % 3 == *key).collect();
        assert_eq!(values, &want, "key {key}");
    }
    assert_eq!(batch.len(), 3);
}

/// Sends refused because the channel is closed, on other threads, never make a closed and
/// drained channel look as if a send were still in flight: every look says so. (They used
/// to count themselves in flight for a moment, and a receiver that looked then waited for
/// a wake that never came.)
#[test]
fn refused_sends_do_not_hold_the_end_of_the_stream() {
    inbox_always();
    let (tx, mut rx) = timed::channel::<u32, u32>(Duration::ZERO);
    rx.close();
    let stop = Arc::new(AtomicBool::new(false));
    let senders: Vec<_> = (0..2)
        .map(|_| {
            let (tx, stop) = (tx.clone(), Arc::clone(&stop));
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    assert!(matches!(tx.try_send(1, 1), Err(TrySendError::Closed(_))));
                }
            })
        })
        .collect();
    let looks = (0..200_000)
        .filter(|_| rx.try_recv() != Err(TryRecvError::Disconnected))
        .count();
    stop.store(true, Ordering::Relaxed);
    senders.into_iter().for_each(|s| s.join().unwrap());
    assert_eq!(
        looks, 0,
        "looks that did not find the channel closed and drained"
    );
}

/// In `ordered`, a value whose insert panics after it went in (another sort key's `Ord`,
/// as the index settles) is pending, counted as sent, and delivered: not counted lost.
#[tokio::test]
async fn a_panic_after_the_value_went_in_keeps_it() {
    inbox_always();
    let (tx, mut rx) = ordered::channel::<TouchyRank, u32, u32>();
    tx.try_send(TouchyRank(5), 1, 10).unwrap();
    tx.try_send(TouchyRank(9), 2, 20).unwrap();
    assert_eq!(rx.len(), 2);
    tx.try_send(TouchyRank(3), 3, 30).unwrap();
    // Taking the inbox in pushes 3 past 9, then compares the two fronts: 5 and 3.
    arm(5, &[What::Ord]);
    assert!(!panics(|| rx.len()));
    disarm();
    let stats = rx.stats();
    assert_eq!((stats.sent, stats.lost, stats.pending_values), (3, 0, 3));
    let mut got: Vec<(u32, Vec<u32>)> = rx.drain_now().into_iter().flatten().collect();
    got.sort_unstable();
    assert_eq!(got, vec![(1, vec![10]), (2, vec![20]), (3, vec![30])]);
}

/// Many producers on many threads, every send through the inbox: each value comes out once,
/// and each producer's values for a key in the order it sent them.
#[test]
fn many_producers_keep_order() {
    inbox_always();
    const PRODUCERS: u32 = 4;
    const EACH: u32 = 20_000;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (tx, mut rx) = timed::channel::<u32, (u32, u32)>(Duration::ZERO);
        let mut producers = Vec::new();
        for p in 0..PRODUCERS {
            let tx = tx.clone();
            producers.push(tokio::spawn(async move {
                for i in 0..EACH {
                    tx.send(i % 16, (p, i)).await.unwrap();
                }
            }));
        }
        drop(tx);
        let consumer = tokio::spawn(async move {
            let mut last: HashMap<(u32, u32), u32> = HashMap::new();
            let mut count = 0;
            while let Some(batch) = rx.recv().await {
                for (key, values) in batch {
                    for (p, i) in values {
                        assert_eq!(i % 16, key);
                        if let Some(prev) = last.insert((key, p), i) {
                            assert!(prev < i, "key {key}: {p}'s {i} after {prev}");
                        }
                        count += 1;
                    }
                }
            }
            count
        });
        for producer in producers {
            producer.await.unwrap();
        }
        let count = tokio::time::timeout(Duration::from_secs(30), consumer)
            .await
            .expect("the stream ends once every sender is gone")
            .unwrap();
        assert_eq!(count, PRODUCERS * EACH);
    });
}

/// A value whose deadline is never reached wakes no one when it is taken in from the inbox
/// either, by whichever call takes the lock next.
#[tokio::test(start_paused = true)]
async fn taking_in_a_value_that_never_comes_due_wakes_no_one() {
    inbox_always();
    let two_centuries = Duration::from_secs(200 * 365 * 24 * 3600);
    let (tx, mut rx) = timed::channel::<u32, u32>(two_centuries);
    let mut recv = spawn(rx.recv());
    assert_pending!(recv.poll());
    tx.try_send(1, 1).unwrap();
    assert_eq!(tx.stats().pending_values, 1); // takes it in
    assert!(!recv.is_woken(), "woken for a value that never comes due");
}

/// A waker that counts its wakes: a task's own merges repeated wakes.
#[derive(Default)]
struct Count(AtomicUsize);

impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A counting waker, and its count.
fn counter() -> (Arc<Count>, Waker) {
    let count = Arc::new(Count::default());
    (Arc::clone(&count), Waker::from(Arc::clone(&count)))
}

fn wakes(count: &Count) -> usize {
    count.0.load(Ordering::SeqCst)
}

fn poll_with<F: Future>(fut: Pin<&mut F>, waker: &Waker) -> Poll<F::Output> {
    fut.poll(&mut Context::from_waker(waker))
}

/// One send through the inbox whose key comes to the front is one event: it wakes each
/// waiting receiver once (the crate docs, *No polling*: `n` wakes for `n` receivers). It
/// used to wake each twice: once from the send that took the lock to wake them, and again
/// as the same lock took its value in.
#[tokio::test(start_paused = true)]
async fn one_send_through_the_inbox_wakes_each_receiver_once() {
    inbox_always();
    let (tx, mut rx) = timed::channel::<u32, u32>(ms(100));
    let mut rx2 = rx.clone();
    let ((c1, w1), (c2, w2)) = (counter(), counter());
    let mut r1 = pin!(rx.recv());
    let mut r2 = pin!(rx2.recv());
    assert!(poll_with(r1.as_mut(), &w1).is_pending());
    assert!(poll_with(r2.as_mut(), &w2).is_pending());
    tx.try_send(1, 1).unwrap();
    assert_eq!((wakes(&c1), wakes(&c2)), (1, 1));
    advance(ms(100)).await;
    assert_eq!(
        poll_with(r1.as_mut(), &w1),
        Poll::Ready(Some(vec![(1, vec![1])]))
    );
}

/// Once a flush has woken the receivers, a send whose key does not come to the front (the
/// flushed key, due now, stays there) wakes no one. It used to: the inbox compared with
/// the deadline the receiver slept until, which the flush left in place.
#[tokio::test(start_paused = true)]
async fn a_send_behind_a_flushed_key_does_not_wake() {
    inbox_always();
    let (tx, mut rx) = timed::channel::<u32, u32>(ms(100));
    tx.try_send(1, 1).unwrap();
    let (count, waker) = counter();
    {
        let mut recv = pin!(rx.recv());
        assert!(poll_with(recv.as_mut(), &waker).is_pending());
        tx.flush(&1);
        assert_eq!(wakes(&count), 1, "the flush wakes the receiver");
        tx.try_send_by(2, 2, Instant::now() + ms(50)).unwrap();
        assert_eq!(wakes(&count), 1, "key 2 does not come to the front");
        let batch = poll_with(recv.as_mut(), &waker);
        assert_eq!(batch, Poll::Ready(Some(vec![(1, vec![1])])));
    }
    // Looking again, the receiver sleeps until key 2's deadline, and an earlier send wakes
    // it once more.
    let mut recv = pin!(rx.recv());
    assert!(poll_with(recv.as_mut(), &waker).is_pending());
    tx.try_send_by(3, 3, Instant::now() + ms(10)).unwrap();
    assert_eq!(wakes(&count), 2, "key 3 comes to the front");
}
