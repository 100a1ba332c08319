//! Bounded channels: waiting for room, first come first served, `Full`, requeue past the
//! bound, cancelled sends and blocking sends.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use keyed_batch::error::{TryRecvError, TrySendError};
use keyed_batch::{ordered, timed};
use tokio::time::{advance, Instant};
use tokio_test::task;
use tokio_test::{assert_pending, assert_ready, assert_ready_ok};

use common::time::{ms, secs};

const WINDOW: Duration = secs(10);

/// Limits: `send` waits while the channel is full, and proceeds as soon as a batch is taken.
#[tokio::test(start_paused = true)]
async fn send_waits_for_room() {
    let (tx, mut rx) = timed::Builder::new(WINDOW).capacity(2).build();
    tx.send("a", 1).await.unwrap();
    tx.send("a", 2).await.unwrap();
    let mut send = task::spawn(tx.send("b", 3));
    assert_pending!(send.poll());
    assert_eq!(tx.len(), 2);

    advance(WINDOW - ms(1)).await;
    assert!(!send.is_woken());
    let taken_at = Instant::now() + ms(1);
    assert_eq!(rx.recv().await, Some(vec![("a", vec![1, 2])]));
    assert_eq!(Instant::now(), taken_at);
    assert!(send.is_woken());
    assert_ready_ok!(send.poll());
    assert_eq!(rx.len(), 1);
}

/// Limits: capacity counts values, not keys.
#[test]
fn capacity_counts_values() {
    let (tx, mut rx) = ordered::Builder::new().capacity(3).build();
    for v in 0..3 {
        tx.try_send(1, "a", v).unwrap();
    }
    assert_eq!(rx.key_count(), 1);
    assert_eq!(tx.try_send(0, "b", 9), Err(TrySendError::Full((0, "b", 9))));
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![0, 1, 2])]));
    tx.try_send(0, "b", 9).unwrap();
}

/// Limits: waiting senders go first come first served: only the head proceeds when room
/// returns, whoever is polled first.
#[tokio::test(start_paused = true)]
async fn waiting_senders_are_fifo() {
    let (tx, mut rx) = timed::Builder::new(Duration::ZERO).capacity(1).build();
    tx.try_send("k", 0).unwrap();
    let mut s1 = task::spawn(tx.send("k", 1));
    let mut s2 = task::spawn(tx.send("k", 2));
    let mut s3 = task::spawn(tx.send("k", 3));
    assert_pending!(s1.poll());
    assert_pending!(s2.poll());
    assert_pending!(s3.poll());

    assert_eq!(rx.try_recv(), Ok(vec![("k", vec![0])]));
    assert!(s1.is_woken());
    assert!(!s2.is_woken());
    assert!(!s3.is_woken());
    assert_pending!(s3.poll());
    assert_pending!(s2.poll());
    assert_ready_ok!(s1.poll());
    assert!(!s2.is_woken()); // full again

    assert_eq!(rx.try_recv(), Ok(vec![("k", vec![1])]));
    assert!(s2.is_woken());
    assert!(!s3.is_woken());
    assert_ready_ok!(s2.poll());
    assert_eq!(rx.try_recv(), Ok(vec![("k", vec![2])]));
    assert!(s3.is_woken());
    assert_ready_ok!(s3.poll());
    assert_eq!(rx.try_recv(), Ok(vec![("k", vec![3])]));
}

/// Limits: when a batch frees room for several values, the head proceeds and then lets the
/// next waiting sender in.
#[tokio::test(start_paused = true)]
async fn room_for_two_wakes_two_in_turn() {
    let (tx, mut rx) = timed::Builder::new(Duration::ZERO).capacity(2).build();
    tx.try_send("a", 0).unwrap();
    tx.try_send("a", 1).unwrap();
    let mut s1 = task::spawn(tx.send("b", 2));
    let mut s2 = task::spawn(tx.send("c", 3));
    assert_pending!(s1.poll());
    assert_pending!(s2.poll());

    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![0, 1])]));
    assert!(s1.is_woken());
    assert!(!s2.is_woken());
    assert_ready_ok!(s1.poll());
    assert!(s2.is_woken());
    assert_ready_ok!(s2.poll());
    assert_eq!(rx.try_recv(), Ok(vec![("b", vec![2]), ("c", vec![3])]));
}

/// Limits: `try_send` says `Full` while earlier `send`s wait, even when there is room.
#[tokio::test(start_paused = true)]
async fn try_send_full_while_senders_wait() {
    let (tx, mut rx) = timed::Builder::new(Duration::ZERO).capacity(1).build();
    tx.try_send("a", 0).unwrap();
    let mut s1 = task::spawn(tx.send("a", 1));
    assert_pending!(s1.poll());
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![0])]));
    assert!(rx.is_empty());
    assert_eq!(tx.try_send("b", 9), Err(TrySendError::Full(("b", 9))));
    assert_eq!(
        tx.try_send_by("b", 9, Instant::now()),
        Err(TrySendError::Full(("b", 9)))
    );
    assert_ready_ok!(s1.poll());
    assert_eq!(tx.try_send("b", 9), Err(TrySendError::Full(("b", 9))));
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![1])]));
    tx.try_send("b", 9).unwrap();
}

/// When a key is due: a value that waited for room gets its window from when it went in, not
/// from when `send` was called.
#[tokio::test(start_paused = true)]
async fn window_starts_after_wait() {
    let (tx, mut rx) = timed::Builder::new(WINDOW).capacity(1).build();
    let start = Instant::now();
    tx.send("a", 1).await.unwrap();
    let mut send = task::spawn(tx.send("b", 2));
    assert_pending!(send.poll());

    advance(WINDOW).await;
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![1])]));
    assert_ready_ok!(send.poll());
    assert_eq!(rx.next_deadline(), Some(start + 2 * WINDOW));
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
}

/// Limits: requeue is always accepted at once, may take pending past the capacity, and
/// waiting senders stay waiting until pending drops below it.
#[tokio::test(start_paused = true)]
async fn requeue_exceeds_capacity() {
    let (tx, mut rx) = timed::Builder::new(Duration::ZERO)
        .capacity(2)
        .max_batch(1)
        .build();
    tx.try_send("a", 1).unwrap();
    tx.try_send("b", 2).unwrap();
    rx.requeue("c", vec![3, 4]).unwrap();
    assert_eq!(rx.len(), 4);
    assert_eq!(tx.len(), 4);
    assert_eq!(tx.try_send("d", 5), Err(TrySendError::Full(("d", 5))));

    let mut send = task::spawn(tx.send("d", 5));
    assert_pending!(send.poll());
    rx.try_recv().unwrap(); // 3 pending
    assert!(!send.is_woken());
    rx.try_recv().unwrap(); // 2 pending
    assert!(!send.is_woken());
    rx.try_recv().unwrap(); // 1 pending
    assert!(send.is_woken());
    assert_ready_ok!(send.poll());
    assert_eq!(rx.len(), 2);
}

/// Limits: requeue into an `ordered` channel also ignores the bound.
#[test]
fn requeue_exceeds_capacity_ordered() {
    let (tx, mut rx) = ordered::Builder::new().capacity(1).build();
    tx.try_send(1, "a", 1).unwrap();
    rx.requeue(0, "b", vec![2, 3]).unwrap();
    assert_eq!(rx.len(), 3);
    assert!(tx.try_send(1, "c", 4).unwrap_err().is_full());
    assert_eq!(rx.try_recv(), Ok(vec![("b", vec![2, 3]), ("a", vec![1])]));
}

/// Limits: a cancelled waiting send at the head passes its turn on, and its value is not sent.
#[tokio::test(start_paused = true)]
async fn cancelled_send_passes_turn() {
    let (tx, mut rx) = timed::Builder::new(Duration::ZERO).capacity(1).build();
    tx.try_send("a", 0).unwrap();
    let mut s1 = task::spawn(tx.send("b", 1));
    let mut s2 = task::spawn(tx.send("c", 2));
    assert_pending!(s1.poll());
    assert_pending!(s2.poll());

    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![0])]));
    assert!(s1.is_woken());
    assert!(!s2.is_woken());
    drop(s1);
    assert!(s2.is_woken());
    assert_ready_ok!(s2.poll());
    assert_eq!(rx.try_recv(), Ok(vec![("c", vec![2])]));
    assert!(rx.is_empty());
}

/// Limits: cancelling a send in the middle of the line removes it; the others keep order.
#[tokio::test(start_paused = true)]
async fn cancelled_send_leaves_line() {
    let (tx, mut rx) = ordered::Builder::new().capacity(1).build();
    tx.try_send(0, "k", 0).unwrap();
    let mut s1 = task::spawn(tx.send(0, "k", 1));
    let mut s2 = task::spawn(tx.send(0, "k", 2));
    let mut s3 = task::spawn(tx.send(0, "k", 3));
    assert_pending!(s1.poll());
    assert_pending!(s2.poll());
    assert_pending!(s3.poll());
    drop(s2);

    rx.try_recv().unwrap();
    assert_ready_ok!(s1.poll());
    rx.try_recv().unwrap();
    assert!(s3.is_woken());
    assert_ready_ok!(s3.poll());
    assert_eq!(rx.try_recv(), Ok(vec![("k", vec![3])]));
}

/// Limits: `blocking_send` blocks its thread while the channel is full and returns once a
/// batch is taken.
#[test]
fn blocking_send_waits_for_room() {
    let (tx, mut rx) = timed::Builder::new(Duration::ZERO).capacity(1).build();
    tx.try_send("a", 1).unwrap();
    let started = Arc::new(AtomicBool::new(false));
    let sender = {
        let started = Arc::clone(&started);
        thread::spawn(move || {
            started.store(true, Ordering::SeqCst);
            tx.blocking_send("b", 2)
        })
    };
    while !started.load(Ordering::SeqCst) {
        thread::yield_now();
    }
    for _ in 0..10_000 {
        thread::yield_now();
    }
    assert!(!sender.is_finished());
    assert_eq!(rx.len(), 1);

    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![1])]));
    assert_eq!(sender.join().unwrap(), Ok(()));
    assert_eq!(rx.try_recv(), Ok(vec![("b", vec![2])]));
}

/// Limits: the same holds for `ordered`: `try_send` hands the value back with `Full`, and
/// `send` waits for room.
#[tokio::test]
async fn ordered_send_waits_for_room() {
    let (tx, mut rx) = ordered::Builder::new().capacity(1).build();
    tx.send(1, "a", 1).await.unwrap();
    assert_eq!(tx.try_send(0, "b", 2), Err(TrySendError::Full((0, "b", 2))));
    let mut send = task::spawn(tx.send(0, "b", 2));
    assert_pending!(send.poll());
    assert_eq!(rx.recv().await, Some(vec![("a", vec![1])]));
    assert!(send.is_woken());
    assert_ready!(send.poll()).unwrap();
    assert_eq!(rx.recv().await, Some(vec![("b", vec![2])]));
}

/// Limits: `blocking_send` from async code panics with a clear message, as tokio's does,
/// whether or not there is room: blocking the thread could stall the task that makes room.
/// It used to hang when it had to wait.
#[tokio::test]
async fn blocking_send_in_async_code_panics() {
    let (tx, rx) = timed::Builder::new(WINDOW).capacity(1).build::<&str, u32>();
    let panicked =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| tx.blocking_send("a", 1)));
    let message = panicked.expect_err("blocking_send in async code must panic");
    let message = message
        .downcast_ref::<String>()
        .map(String::as_str)
        .or(message.downcast_ref::<&str>().copied())
        .unwrap_or_default();
    assert!(message.contains("runtime"), "unclear message: {message}");
    assert!(rx.is_empty(), "nothing went in");
}

/// Limits: `blocking_send` works on a `spawn_blocking` thread, waiting there for room
/// while the runtime drains the channel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_send_on_a_blocking_thread() {
    let (tx, mut rx) = ordered::Builder::new().capacity(1).build();
    let producer = tokio::task::spawn_blocking(move || {
        for i in 0..20u32 {
            tx.blocking_send(i, "k", i).unwrap();
        }
    });
    let mut got = Vec::new();
    while let Some(batch) = rx.recv().await {
        got.extend(batch.into_iter().flat_map(|(_, values)| values));
    }
    producer.await.unwrap();
    assert_eq!(got, (0..20).collect::<Vec<_>>());
}
