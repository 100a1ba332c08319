//! Weight and key limits: `max_batch_weight` (cap and split), `max_key_weight` (due at
//! once), `max_weight` (memory budget) and `max_keys` (live keys), in both flavours.
//!
//! Values here are `usize`s that weigh what they are, so `4` weighs 4.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::SinkExt;
use keyed_batch::error::{SendError, TryRecvError, TrySendError};
use keyed_batch::{ordered, timed};
use tokio::time::{advance, Instant};
use tokio_test::task;
use tokio_test::{assert_pending, assert_ready, assert_ready_eq, assert_ready_ok};

use common::time::{ms, secs};

const WINDOW: Duration = secs(10);

/// The weigher used throughout: a value weighs itself.
fn weight(v: &usize) -> usize {
    *v
}

/// The weigher runs once per value, when it is sent, however often a waiting `send` is
/// polled; a requeue weighs the values it hands back again.
#[tokio::test(start_paused = true)]
async fn weigher_runs_once_per_value() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let (tx, mut rx) = timed::Builder::new(Duration::ZERO)
        .weigher(move |v: &usize| {
            counted.fetch_add(1, Ordering::SeqCst);
            *v
        })
        .max_weight(10)
        .build();
    tx.send("a", 6).await.unwrap();
    tx.send("a", 4).await.unwrap();
    let mut send = task::spawn(tx.send("b", 3));
    assert_pending!(send.poll());
    assert_pending!(send.poll());
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    let (key, values) = rx.try_recv().unwrap().remove(0);
    assert_ready_ok!(send.poll());
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    rx.requeue(key, values).unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 5);
    assert_eq!(rx.stats().pending_weight, 13);
}

// ===== max_batch_weight =====

/// `max_batch_weight` is a hard cap: a key that does not fit is split, and its remainder
/// leads the next batch, ahead of a key that arrived after it (`timed`).
#[tokio::test(start_paused = true)]
async fn batch_weight_splits_key_timed() {
    let (tx, mut rx) = timed::Builder::new(Duration::ZERO)
        .weigher(weight)
        .max_batch_weight(10)
        .build();
    for v in [4, 4, 4] {
        tx.try_send("k", v).unwrap();
    }
    tx.try_send("b", 1).unwrap();
    assert_eq!(rx.try_recv(), Ok(vec![("k", vec![4, 4])]));
    assert_eq!(rx.try_recv(), Ok(vec![("k", vec![4]), ("b", vec![1])]));
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
}

/// `max_batch_weight` splits in `ordered` too: the remainder keeps its rank, so it leads
/// the next batch unless a key of smaller rank came in meanwhile.
#[test]
fn batch_weight_splits_key_ordered() {
    let (tx, mut rx) = ordered::Builder::new()
        .weigher(weight)
        .max_batch_weight(10)
        .build();
    for v in [4, 4, 4] {
        tx.try_send(5, "k", v).unwrap();
    }
    tx.try_send(9, "late", 1).unwrap();
    assert_eq!(rx.try_recv(), Ok(vec![("k", vec![4, 4])]));
    assert_eq!(rx.try_recv(), Ok(vec![("k", vec![4]), ("late", vec![1])]));

    for v in [6, 6] {
        tx.try_send(5, "k", v).unwrap();
    }
    assert_eq!(rx.try_recv(), Ok(vec![("k", vec![6])]));
    tx.try_send(1, "urgent", 2).unwrap();
    assert_eq!(rx.try_recv(), Ok(vec![("urgent", vec![2]), ("k", vec![6])]));
}

/// A single value heavier than `max_batch_weight` goes out alone, in a batch of its own,
/// rather than being stuck; the keys around it are not held up (`timed`).
#[tokio::test(start_paused = true)]
async fn heavy_value_goes_out_alone_timed() {
    let (tx, mut rx) = timed::Builder::new(Duration::ZERO)
        .weigher(weight)
        .max_batch_weight(5)
        .build();
    tx.try_send("a", 2).unwrap();
    tx.try_send("b", 9).unwrap();
    tx.try_send("c", 1).unwrap();
    tx.try_send("d", 8).unwrap();
    tx.try_send("d", 1).unwrap();
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![2])]));
    assert_eq!(rx.try_recv(), Ok(vec![("b", vec![9])]));
    assert_eq!(rx.try_recv(), Ok(vec![("c", vec![1])]));
    assert_eq!(rx.try_recv(), Ok(vec![("d", vec![8])]));
    assert_eq!(rx.try_recv(), Ok(vec![("d", vec![1])]));
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
}

/// A single value heavier than `max_batch_weight` goes out alone (`ordered`).
#[test]
fn heavy_value_goes_out_alone_ordered() {
    let (tx, mut rx) = ordered::Builder::new()
        .weigher(weight)
        .max_batch_weight(5)
        .build();
    tx.try_send(1, "a", 2).unwrap();
    tx.try_send(2, "b", 9).unwrap();
    tx.try_send(2, "b", 1).unwrap();
    tx.try_send(3, "c", 1).unwrap();
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![2])]));
    assert_eq!(rx.try_recv(), Ok(vec![("b", vec![9])]));
    assert_eq!(rx.try_recv(), Ok(vec![("b", vec![1]), ("c", vec![1])]));
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
}

/// After close, everything pending is due at once, and batches still respect
/// `max_batch_weight`, heavy values alone.
#[tokio::test(start_paused = true)]
async fn close_flush_respects_batch_weight() {
    let (tx, mut rx) = timed::Builder::new(WINDOW)
        .weigher(weight)
        .max_batch_weight(6)
        .build();
    for (k, v) in [("a", 3), ("b", 2), ("a", 4), ("c", 7), ("d", 1)] {
        tx.send(k, v).await.unwrap();
    }
    drop(tx);
    assert_eq!(rx.recv().await, Some(vec![("a", vec![3])]));
    assert_eq!(rx.recv().await, Some(vec![("a", vec![4]), ("b", vec![2])]));
    assert_eq!(rx.recv().await, Some(vec![("c", vec![7])]));
    assert_eq!(rx.recv().await, Some(vec![("d", vec![1])]));
    assert_eq!(rx.recv().await, None);
}

/// Value count and weight caps both apply; whichever is reached first cuts the batch
/// (`timed`).
#[tokio::test(start_paused = true)]
async fn count_and_weight_caps_whichever_first_timed() {
    let (tx, mut rx) = timed::Builder::new(Duration::ZERO)
        .weigher(weight)
        .max_batch(3)
        .max_batch_weight(10)
        .build();
    for v in [1, 1, 1, 1] {
        tx.try_send("light", v).unwrap();
    }
    assert_eq!(rx.try_recv(), Ok(vec![("light", vec![1, 1, 1])])); // count first
    assert_eq!(rx.try_recv(), Ok(vec![("light", vec![1])]));
    for v in [6, 3, 2] {
        tx.try_send("heavy", v).unwrap();
    }
    assert_eq!(rx.try_recv(), Ok(vec![("heavy", vec![6, 3])])); // weight first
    assert_eq!(rx.try_recv(), Ok(vec![("heavy", vec![2])]));
}

/// Value count and weight caps both apply (`ordered`).
#[test]
fn count_and_weight_caps_whichever_first_ordered() {
    let (tx, mut rx) = ordered::Builder::new()
        .weigher(weight)
        .max_batch(2)
        .max_batch_weight(10)
        .build();
    tx.try_send(1, "a", 1).unwrap();
    tx.try_send(2, "b", 1).unwrap();
    tx.try_send(3, "c", 1).unwrap();
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![1]), ("b", vec![1])]));
    assert_eq!(rx.try_recv(), Ok(vec![("c", vec![1])]));
    tx.try_send(1, "a", 7).unwrap();
    tx.try_send(2, "b", 7).unwrap();
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![7])]));
    assert_eq!(rx.try_recv(), Ok(vec![("b", vec![7])]));
}

/// Without a weigher every value weighs 1, so `max_batch_weight` caps values.
#[tokio::test(start_paused = true)]
async fn batch_weight_without_weigher_counts_values() {
    let (tx, mut rx) = timed::Builder::new(Duration::ZERO)
        .max_batch_weight(2)
        .build();
    for v in ['x', 'y', 'z'] {
        tx.try_send("k", v).unwrap();
    }
    assert_eq!(rx.try_recv(), Ok(vec![("k", vec!['x', 'y'])]));
    assert_eq!(rx.try_recv(), Ok(vec![("k", vec!['z'])]));
    assert_eq!(rx.stats().pending_weight, 0);
}

/// `max_batch_weight(0)` panics with a clear message.
#[test]
#[should_panic(expected = "max_batch_weight must be at least 1")]
fn batch_weight_zero_panics() {
    let _ = timed::Builder::new(WINDOW).max_batch_weight(0);
}

// ===== max_key_weight =====

/// `timed`: a key whose pending weight reaches `max_key_weight` is due at once, not at its
/// deadline; a single value at or over it makes a new key due at once.
#[tokio::test(start_paused = true)]
async fn key_weight_makes_key_due() {
    let (tx, mut rx) = timed::Builder::new(WINDOW)
        .weigher(weight)
        .max_key_weight(10)
        .build();
    tx.send("a", 4).await.unwrap();
    tx.send("a", 5).await.unwrap();
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty)); // 9: not yet
    tx.send("a", 1).await.unwrap(); // 10: at the limit
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![4, 5, 1])]));

    tx.send("b", 12).await.unwrap();
    assert_eq!(rx.try_recv(), Ok(vec![("b", vec![12])]));

    tx.send("c", 3).await.unwrap();
    advance(WINDOW - ms(1)).await;
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    advance(ms(1)).await;
    assert_eq!(rx.try_recv(), Ok(vec![("c", vec![3])]));
}

/// `timed`: a key made full by weight wakes a receiver that waits for a later deadline.
#[tokio::test(start_paused = true)]
async fn key_weight_wakes_receiver() {
    let (tx, mut rx) = timed::Builder::new(WINDOW)
        .weigher(weight)
        .max_key_weight(10)
        .build();
    tx.send("a", 1).await.unwrap();
    tx.send("b", 6).await.unwrap();
    let mut recv = task::spawn(rx.recv());
    assert_pending!(recv.poll());
    tx.send("b", 4).await.unwrap();
    assert!(recv.is_woken());
    assert_ready_eq!(recv.poll(), Some(vec![("b", vec![6, 4])]));
}

/// `timed`: `max_values_per_key` and `max_key_weight` both apply; whichever is reached
/// first makes the key due.
#[tokio::test(start_paused = true)]
async fn key_count_and_weight_whichever_first() {
    let (tx, mut rx) = timed::Builder::new(WINDOW)
        .weigher(weight)
        .max_values_per_key(3)
        .max_key_weight(100)
        .build();
    for v in [1, 1] {
        tx.send("k", v).await.unwrap();
    }
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    tx.send("k", 1).await.unwrap(); // third value
    assert_eq!(rx.try_recv(), Ok(vec![("k", vec![1, 1, 1])]));
    tx.send("k", 60).await.unwrap();
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    tx.send("k", 40).await.unwrap(); // weight 100
    assert_eq!(rx.try_recv(), Ok(vec![("k", vec![60, 40])]));
}

/// `max_key_weight(0)` panics with a clear message.
#[test]
#[should_panic(expected = "max_key_weight must be at least 1")]
fn key_weight_zero_panics() {
    let _ = timed::Builder::new(WINDOW).max_key_weight(0);
}

// ===== max_weight =====

/// `max_weight`: a value goes in only if the pending weight stays at or under the budget
/// with it; otherwise `try_send` says `Full` and hands the value back (`timed`).
#[tokio::test(start_paused = true)]
async fn max_weight_try_send_full_timed() {
    let (tx, mut rx) = timed::Builder::new(Duration::ZERO)
        .weigher(weight)
        .max_weight(10)
        .build();
    tx.try_send("a", 6).unwrap();
    assert_eq!(tx.try_send("b", 5), Err(TrySendError::Full(("b", 5))));
    tx.try_send("b", 4).unwrap(); // exactly 10
    assert_eq!(tx.try_send("a", 1), Err(TrySendError::Full(("a", 1))));
    assert_eq!(rx.stats().pending_weight, 10);
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![6]), ("b", vec![4])]));
    tx.try_send("a", 10).unwrap();
}

/// `max_weight` in `ordered`: `Full` when the value would take the weight over the budget.
#[test]
fn max_weight_try_send_full_ordered() {
    let (tx, mut rx) = ordered::Builder::new()
        .weigher(weight)
        .max_weight(10)
        .max_batch(1)
        .build();
    tx.try_send(1, "a", 6).unwrap();
    tx.try_send(2, "b", 3).unwrap();
    assert_eq!(tx.try_send(0, "c", 2), Err(TrySendError::Full((0, "c", 2))));
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![6])]));
    tx.try_send(0, "c", 7).unwrap();
    assert_eq!(rx.stats().pending_weight, 10);
}

/// `max_weight`: `send` waits while its value does not fit, is not woken before a batch
/// is taken, and goes in once one is (`timed`).
#[tokio::test(start_paused = true)]
async fn max_weight_send_waits_timed() {
    let (tx, mut rx) = timed::Builder::new(WINDOW)
        .weigher(weight)
        .max_weight(10)
        .max_batch(1)
        .build();
    tx.send("a", 6).await.unwrap();
    tx.send("a", 4).await.unwrap();
    let mut send = task::spawn(tx.send("b", 3));
    assert_pending!(send.poll());
    advance(WINDOW - ms(1)).await;
    assert!(!send.is_woken());

    assert_eq!(rx.recv().await, Some(vec![("a", vec![6])]));
    assert!(send.is_woken());
    assert_ready_ok!(send.poll());
    assert_eq!(rx.stats().pending_weight, 7);
}

/// `max_weight`: `send` waits and is woken when a batch is taken (`ordered`).
#[tokio::test(start_paused = true)]
async fn max_weight_send_waits_ordered() {
    let (tx, mut rx) = ordered::Builder::new()
        .weigher(weight)
        .max_weight(10)
        .build();
    tx.send(1, "a", 8).await.unwrap();
    let mut send = task::spawn(tx.send(0, "b", 3));
    assert_pending!(send.poll());
    assert!(!send.is_woken());
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![8])]));
    assert!(send.is_woken());
    assert_ready_ok!(send.poll());
    assert_eq!(rx.try_recv(), Ok(vec![("b", vec![3])]));
}

/// `max_weight`: a waiting send whose value still does not fit after a batch stays
/// pending, and is not woken again until another batch is taken: no busy loop.
#[tokio::test(start_paused = true)]
async fn max_weight_waiter_that_still_does_not_fit() {
    let (tx, mut rx) = ordered::Builder::new()
        .weigher(weight)
        .max_weight(10)
        .max_batch(1)
        .build();
    tx.try_send(1, "a", 5).unwrap();
    tx.try_send(2, "b", 4).unwrap();
    let mut send = task::spawn(tx.send(0, "c", 8));
    assert_pending!(send.poll());
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![5])])); // 4 + 8 > 10
    assert_pending!(send.poll());
    assert!(!send.is_woken());
    assert_eq!(rx.try_recv(), Ok(vec![("b", vec![4])]));
    assert!(send.is_woken());
    assert_ready_ok!(send.poll());
}

/// `max_weight`: a value heavier than the whole budget goes into an empty channel, with
/// `try_send` or `send`; nothing else goes in beside it (`timed`).
#[tokio::test(start_paused = true)]
async fn heavy_value_enters_empty_channel_timed() {
    let (tx, mut rx) = timed::Builder::new(Duration::ZERO)
        .weigher(weight)
        .max_weight(10)
        .build();
    tx.try_send("a", 50).unwrap();
    assert_eq!(tx.try_send("b", 1), Err(TrySendError::Full(("b", 1))));
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![50])]));

    tx.try_send("a", 1).unwrap();
    let mut send = task::spawn(tx.send("b", 50));
    assert_pending!(send.poll());
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![1])]));
    assert!(send.is_woken());
    assert_ready_ok!(send.poll());
    assert_eq!(rx.stats().pending_weight, 50);
}

/// `max_weight`: a value heavier than the whole budget goes into an empty channel
/// (`ordered`).
#[test]
fn heavy_value_enters_empty_channel_ordered() {
    let (tx, mut rx) = ordered::Builder::new()
        .weigher(weight)
        .max_weight(10)
        .build();
    tx.try_send(1, "a", 11).unwrap();
    assert_eq!(tx.try_send(0, "b", 1), Err(TrySendError::Full((0, "b", 1))));
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![11])]));
    tx.try_send(0, "b", 1).unwrap();
}

/// Without a weigher, `max_weight` counts values.
#[test]
fn max_weight_without_weigher_counts_values() {
    let (tx, _rx) = ordered::Builder::new().max_weight(2).build();
    tx.try_send(1, "a", "x").unwrap();
    tx.try_send(1, "a", "y").unwrap();
    assert_eq!(
        tx.try_send(1, "a", "z"),
        Err(TrySendError::Full((1, "a", "z")))
    );
}

/// Requeued values keep their weights (the weigher is applied again): they count against
/// `max_weight` and are split by `max_batch_weight` as when first sent (`timed`).
#[tokio::test(start_paused = true)]
async fn requeue_keeps_weights_timed() {
    let (tx, mut rx) = timed::Builder::new(Duration::ZERO)
        .weigher(weight)
        .max_weight(10)
        .max_batch_weight(6)
        .build();
    tx.try_send("a", 4).unwrap();
    tx.try_send("a", 5).unwrap();
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![4])]));
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![5])]));
    assert_eq!(rx.stats().pending_weight, 0);

    rx.requeue("a", vec![4, 5]).unwrap();
    assert_eq!(rx.stats().pending_weight, 9);
    assert_eq!(tx.try_send("b", 2), Err(TrySendError::Full(("b", 2))));
    tx.try_send("b", 1).unwrap();
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![4])]));
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![5]), ("b", vec![1])]));
}

/// Requeued values keep their weights (`ordered`).
#[test]
fn requeue_keeps_weights_ordered() {
    let (tx, mut rx) = ordered::Builder::new()
        .weigher(weight)
        .max_weight(10)
        .max_batch_weight(7)
        .build();
    tx.try_send(1, "a", 3).unwrap();
    tx.try_send(1, "a", 3).unwrap();
    let (key, values) = rx.try_recv().unwrap().remove(0);
    assert_eq!(values, vec![3, 3]);
    tx.try_send(2, "b", 5).unwrap();
    rx.requeue(1, key, values).unwrap();
    assert_eq!(rx.stats().pending_weight, 11); // requeue may pass the budget
    assert_eq!(tx.try_send(0, "c", 1), Err(TrySendError::Full((0, "c", 1))));
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![3, 3])]));
    assert_eq!(rx.try_recv(), Ok(vec![("b", vec![5])]));
}

/// `max_weight`: a cancelled waiting send passes its turn to the next in line.
#[tokio::test(start_paused = true)]
async fn cancelled_weight_waiter_passes_turn() {
    let (tx, mut rx) = timed::Builder::new(Duration::ZERO)
        .weigher(weight)
        .max_weight(10)
        .build();
    tx.try_send("a", 10).unwrap();
    let mut s1 = task::spawn(tx.send("b", 5));
    let mut s2 = task::spawn(tx.send("c", 5));
    assert_pending!(s1.poll());
    assert_pending!(s2.poll());
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![10])]));
    assert!(s1.is_woken());
    assert!(!s2.is_woken());
    drop(s1);
    assert!(s2.is_woken());
    assert_ready_ok!(s2.poll());
    assert_eq!(rx.try_recv(), Ok(vec![("c", vec![5])]));
}

/// `max_weight`: closing the channel fails a waiting send and hands its value back.
#[tokio::test(start_paused = true)]
async fn weight_waiter_fails_on_close() {
    let (tx, rx) = ordered::Builder::new()
        .weigher(weight)
        .max_weight(10)
        .build();
    tx.try_send(1, "a", 10).unwrap();
    let mut send = task::spawn(tx.send(1, "b", 1));
    assert_pending!(send.poll());
    rx.close();
    assert!(send.is_woken());
    assert_ready_eq!(send.poll(), Err(SendError((1, "b", 1))));
}

/// `max_weight(0)` panics with a clear message.
#[test]
#[should_panic(expected = "max_weight must be at least 1")]
fn max_weight_zero_panics() {
    let _ = ordered::Builder::new().max_weight(0);
}

// ===== max_keys =====

/// `max_keys`: a value for a new key is refused with `Full` while `n` keys are pending;
/// values for pending keys still go in (`timed`).
#[tokio::test(start_paused = true)]
async fn max_keys_try_send_timed() {
    let (tx, mut rx) = timed::Builder::new(WINDOW).max_keys(2).build();
    tx.try_send("a", 1).unwrap();
    tx.try_send("b", 2).unwrap();
    assert_eq!(tx.try_send("c", 3), Err(TrySendError::Full(("c", 3))));
    tx.try_send("a", 4).unwrap();
    tx.try_send_by("b", 5, Instant::now()).unwrap();
    assert_eq!(rx.key_count(), 2);
    assert_eq!(rx.try_recv(), Ok(vec![("b", vec![2, 5])]));
    tx.try_send("c", 3).unwrap();
    assert_eq!(tx.try_send("d", 6), Err(TrySendError::Full(("d", 6))));
}

/// `max_keys`: a new key is refused while `n` keys are pending (`ordered`).
#[test]
fn max_keys_try_send_ordered() {
    let (tx, mut rx) = ordered::Builder::new().max_keys(1).build();
    tx.try_send(5, "a", 1).unwrap();
    assert_eq!(tx.try_send(0, "b", 2), Err(TrySendError::Full((0, "b", 2))));
    tx.try_send(0, "a", 3).unwrap();
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![1, 3])]));
    tx.try_send(0, "b", 2).unwrap();
}

/// `max_keys`: a `send` for a new key waits while `n` keys are pending, and values for
/// pending keys still go in meanwhile, from `send` and `try_send`; a later new key is
/// refused while the first waits. The waiting send proceeds once a key is delivered
/// (`timed`).
#[tokio::test(start_paused = true)]
async fn new_key_waits_existing_key_goes_in_timed() {
    let (tx, mut rx) = timed::Builder::new(WINDOW).max_keys(1).build();
    tx.send("a", 1).await.unwrap();
    let mut send_b = task::spawn(tx.send("b", 2));
    assert_pending!(send_b.poll());

    tx.try_send("a", 3).unwrap();
    let mut send_a = task::spawn(tx.send("a", 4));
    assert_ready_ok!(send_a.poll());
    assert_eq!(tx.try_send("c", 5), Err(TrySendError::Full(("c", 5))));
    assert!(!send_b.is_woken());

    assert_eq!(rx.recv().await, Some(vec![("a", vec![1, 3, 4])]));
    assert!(send_b.is_woken());
    assert_ready_ok!(send_b.poll());
    assert_eq!(rx.key_count(), 1);
    assert_eq!(tx.try_send("a", 6), Err(TrySendError::Full(("a", 6))));
}

/// `max_keys`: a waiting new-key send does not block values for pending keys (`ordered`).
#[tokio::test(start_paused = true)]
async fn new_key_waits_existing_key_goes_in_ordered() {
    let (tx, mut rx) = ordered::Builder::new().max_keys(2).build();
    tx.send(1, "a", 1).await.unwrap();
    tx.send(2, "b", 2).await.unwrap();
    let mut send_c = task::spawn(tx.send(0, "c", 3));
    assert_pending!(send_c.poll());
    tx.send(3, "b", 4).await.unwrap();
    tx.try_send(3, "a", 5).unwrap();
    assert!(!send_c.is_woken());
    assert_eq!(
        rx.try_recv(),
        Ok(vec![("a", vec![1, 5]), ("b", vec![2, 4])])
    );
    assert!(send_c.is_woken());
    assert_ready_ok!(send_c.poll());
    assert_eq!(rx.try_recv(), Ok(vec![("c", vec![3])]));
}

/// `max_keys` keeps per-key order. Two sends for a new key "b" wait; when a slot frees, the
/// first goes in and "b" is pending. The second used to stay asleep, so a later
/// `try_send("b", 3)` overtook it and the batches came out `[1, 3]`, then `[2]`. Now the
/// second is woken, and `try_send` waits its turn.
#[tokio::test(start_paused = true)]
async fn max_keys_keeps_per_key_order() {
    let (tx, mut rx) = timed::Builder::new(Duration::ZERO).max_keys(1).build();
    tx.send("a", 0).await.unwrap();
    let mut first = task::spawn(tx.send("b", 1));
    let mut second = task::spawn(tx.send("b", 2));
    assert_pending!(first.poll());
    assert_pending!(second.poll());

    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![0])]));
    assert_ready_ok!(first.poll());
    assert_eq!(tx.try_send("b", 3), Err(TrySendError::Full(("b", 3))));
    assert!(
        second.is_woken(),
        "the key became pending: the next send of it may go in"
    );
    assert_ready_ok!(second.poll());
    tx.try_send("b", 3).unwrap();
    assert_eq!(rx.try_recv(), Ok(vec![("b", vec![1, 2, 3])]));
}

/// The same through spawned tasks, the way producers run: every producer's values of one
/// key arrive in the order it sent them.
#[tokio::test(start_paused = true)]
async fn max_keys_keeps_per_key_order_across_tasks() {
    let (tx, mut rx) = timed::Builder::new(ms(5)).max_keys(2).build();
    let producers: Vec<_> = (0..4u32)
        .map(|p| {
            let tx = tx.clone();
            tokio::spawn(async move {
                for i in 0..50u32 {
                    tx.send(p % 3, (p, i)).await.unwrap();
                    if i % 7 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
            })
        })
        .collect();
    drop(tx);
    let mut seen: std::collections::HashMap<u32, u32> = Default::default();
    let mut count = 0;
    while let Some(batch) = rx.recv().await {
        for (key, values) in batch {
            for (p, i) in values {
                assert_eq!(key, p % 3);
                let next = seen.entry(p).or_default();
                assert_eq!(i, *next, "producer {p}'s values out of order");
                *next += 1;
                count += 1;
            }
        }
    }
    for producer in producers {
        producer.await.unwrap();
    }
    assert_eq!(count, 200);
}

/// `max_keys` with `capacity`: a send for a pending key that waits in the key line behind an
/// earlier send of its key needs room, not a key slot. It used to sleep while room came back
/// with every slot taken; it is woken as soon as there is room.
#[test]
fn key_line_send_for_a_pending_key_is_woken_when_room_returns() {
    let (tx, mut rx) = ordered::Builder::new()
        .max_keys(2)
        .capacity(3)
        .max_batch(1)
        .build::<u8, &str, u32>();
    tx.try_send(0, "a", 1).unwrap();
    tx.try_send(0, "b", 1).unwrap();
    let mut first = task::spawn(tx.send(0, "c", 1));
    let mut second = task::spawn(tx.send(0, "c", 2));
    assert_pending!(first.poll());
    assert_pending!(second.poll());
    // A pending key goes in past sends that wait for a key slot: the last place.
    tx.try_send(0, "b", 2).unwrap();
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![1])])); // a slot, and room for one
    assert_ready_ok!(first.poll());
    assert_pending!(second.poll()); // no room: it waits, first in the key line
    assert_eq!(rx.try_recv(), Ok(vec![("b", vec![1])])); // room is back; two keys still
    assert!(
        second.is_woken(),
        "room came back for a send that needs no key slot"
    );
    assert_ready_ok!(second.poll());
}

/// The same after a burst: the second send of a key waits behind a send of another new key;
/// once the first send of its key takes the freed slot, the second (its key pending, room
/// free) goes, while the other new key still waits for a slot.
#[test]
fn burst_for_a_pending_key_goes_in_after_another_key_takes_the_slot() {
    let (tx, mut rx) = ordered::Builder::new()
        .max_keys(2)
        .capacity(3)
        .max_batch(2)
        .build::<u8, &str, u32>();
    tx.try_send(0, "a", 1).unwrap();
    tx.try_send(5, "b", 1).unwrap();
    let mut c1 = task::spawn(tx.send(5, "c", 1));
    let mut d1 = task::spawn(tx.send(5, "d", 1));
    let mut c2 = task::spawn(tx.send(5, "c", 2));
    assert_pending!(c1.poll());
    assert_pending!(d1.poll());
    assert_pending!(c2.poll());
    tx.try_send(0, "a", 2).unwrap();
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![1, 2])]));
    assert_ready_ok!(c1.poll());
    assert!(c2.is_woken(), "c is pending and there is room");
    assert_pending!(d1.poll()); // no slot for d
    assert_ready_ok!(c2.poll());
    assert_eq!(rx.try_recv(), Ok(vec![("b", vec![1]), ("c", vec![1])]));
    assert!(d1.is_woken(), "b left: a slot, and room");
    assert_ready_ok!(d1.poll());
    assert_eq!(rx.try_recv(), Ok(vec![("c", vec![2]), ("d", vec![1])]));
}

/// Once a key slot is free, the first send of the key line waits for room alone, and goes
/// in first come, first served: a later value for a pending key, from `try_send`, `send` or
/// the `Sink`, does not take the room it waits for (as it may while the send waits for a
/// slot).
#[tokio::test(start_paused = true)]
async fn a_key_line_send_with_a_slot_is_not_passed() {
    for how in ["try_send", "send", "sink"] {
        let (tx, mut rx) = timed::Builder::new(secs(10))
            .capacity(3)
            .max_keys(2)
            .max_batch(1)
            .build();
        tx.try_send("a", 1).unwrap();
        tx.try_send("c", 1).unwrap();
        let mut b = task::spawn(tx.send("b", 1));
        assert_pending!(b.poll()); // no key slot
        tx.try_send("a", 2).unwrap(); // a pending key passes it: the last place
        tx.flush(&"c");
        assert_eq!(rx.try_recv(), Ok(vec![("c", vec![1])])); // a slot, and room for one
        assert!(b.is_woken());
        let passed = match how {
            "try_send" => tx.try_send("a", 3).is_ok(),
            "send" => task::spawn(tx.send("a", 3)).poll().is_ready(),
            _ => {
                let mut sink = tx.clone();
                let passed = task::spawn(SinkExt::send(&mut sink, ("a", 3)))
                    .poll()
                    .is_ready();
                passed
            }
        };
        assert!(
            !passed,
            "{how} went in past a send that waits for room alone"
        );
        assert_ready_ok!(b.poll());
        assert_eq!(rx.len(), 3);
    }
}

/// The same, with the waiting send in a task of its own, as a user would run it: once it
/// has a key slot, a later `try_send` of a pending key is refused while it waits, and the
/// task's send goes in when it runs.
#[tokio::test(start_paused = true)]
async fn a_key_line_send_with_a_slot_goes_first_from_a_task() {
    let (tx, mut rx) = timed::Builder::new(secs(10))
        .capacity(3)
        .max_keys(2)
        .max_batch(1)
        .build();
    tx.try_send("a", 1).unwrap();
    tx.try_send("c", 1).unwrap();
    let b = tokio::spawn({
        let tx = tx.clone();
        async move { tx.send("b", 1).await }
    });
    tokio::task::yield_now().await;
    assert!(!b.is_finished(), "no key slot yet");
    tx.try_send("a", 2).unwrap(); // a pending key passes a send waiting for a slot
    tx.flush(&"c");
    assert_eq!(rx.recv().await, Some(vec![("c", vec![1])]));
    assert!(tx.try_send("a", 3).unwrap_err().is_full());
    b.await.unwrap().unwrap();
    assert_eq!(rx.len(), 3);
}

/// `max_keys` keeps per-key order when the key becomes pending through `requeue`: the
/// waiting send of that key is woken and goes in, behind the requeued values.
#[tokio::test(start_paused = true)]
async fn max_keys_requeue_wakes_the_waiting_send_of_that_key() {
    let (tx, mut rx) = ordered::Builder::new().max_keys(1).build();
    tx.send(1, "b", 1).await.unwrap();
    let (key, values) = rx.try_recv().unwrap().remove(0);
    tx.send(1, "a", 2).await.unwrap();
    let mut send_b = task::spawn(tx.send(1, "b", 3));
    assert_pending!(send_b.poll());
    rx.requeue(0, key, values).unwrap();
    assert!(send_b.is_woken());
    assert_ready_ok!(send_b.poll());
    assert_eq!(tx.try_send(1, "b", 4), Ok(()));
    assert_eq!(
        rx.try_recv(),
        Ok(vec![("b", vec![1, 3, 4]), ("a", vec![2])])
    );
}

/// `max_keys`: a key split by `max_batch` is still pending and keeps its slot; the waiting
/// new-key send proceeds only once the key is fully delivered.
#[tokio::test(start_paused = true)]
async fn split_key_keeps_its_slot() {
    let (tx, mut rx) = ordered::Builder::new().max_keys(1).max_batch(1).build();
    tx.send(1, "a", 1).await.unwrap();
    tx.send(1, "a", 2).await.unwrap();
    let mut send = task::spawn(tx.send(1, "b", 3));
    assert_pending!(send.poll());
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![1])]));
    assert!(!send.is_woken());
    assert_pending!(send.poll());
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![2])]));
    assert!(send.is_woken());
    assert_ready_ok!(send.poll());
}

/// `max_keys`: waiting new-key sends go first come first served; a cancelled one passes
/// its turn to the next (`timed`).
#[tokio::test(start_paused = true)]
async fn cancelled_key_waiter_passes_turn_timed() {
    let (tx, mut rx) = timed::Builder::new(Duration::ZERO).max_keys(1).build();
    tx.try_send("a", 1).unwrap();
    let mut s1 = task::spawn(tx.send("b", 2));
    let mut s2 = task::spawn(tx.send("c", 3));
    assert_pending!(s1.poll());
    assert_pending!(s2.poll());
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![1])]));
    assert!(s1.is_woken());
    assert!(!s2.is_woken());
    // A slot is free, but an earlier send waits for it.
    assert_eq!(tx.try_send("d", 4), Err(TrySendError::Full(("d", 4))));
    drop(s1);
    assert!(s2.is_woken());
    assert_ready_ok!(s2.poll());
    assert_eq!(rx.try_recv(), Ok(vec![("c", vec![3])]));
}

/// `max_keys`: a cancelled waiting new-key send passes its turn on (`ordered`).
#[tokio::test(start_paused = true)]
async fn cancelled_key_waiter_passes_turn_ordered() {
    let (tx, mut rx) = ordered::Builder::new().max_keys(1).build();
    tx.try_send(1, "a", 1).unwrap();
    let mut s1 = task::spawn(tx.send(1, "b", 2));
    let mut s2 = task::spawn(tx.send(1, "c", 3));
    assert_pending!(s1.poll());
    assert_pending!(s2.poll());
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![1])]));
    assert!(s1.is_woken());
    assert!(!s2.is_woken());
    // Only the head may take the slot, whoever polls first.
    assert_pending!(s2.poll());
    drop(s1);
    assert!(s2.is_woken());
    assert_ready_ok!(s2.poll());
    assert_eq!(rx.try_recv(), Ok(vec![("c", vec![3])]));
}

/// `max_keys`: a waiting send whose key became pending meanwhile (another send for the
/// same key got the slot) goes in when polled, and the sends still waiting for a slot keep
/// their turn: the next one is woken when a slot frees. Spurious polls are legal.
#[tokio::test(start_paused = true)]
async fn waiting_send_whose_key_became_pending() {
    let (tx, mut rx) = ordered::Builder::new().max_keys(1).build();
    tx.try_send(1, "a", 1).unwrap();
    let mut s1 = task::spawn(tx.send(1, "b", 2));
    let mut s2 = task::spawn(tx.send(1, "c", 3));
    let mut s3 = task::spawn(tx.send(1, "b", 4));
    assert_pending!(s1.poll());
    assert_pending!(s2.poll());
    assert_pending!(s3.poll());
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![1])]));
    assert!(s1.is_woken());
    assert_ready_ok!(s1.poll()); // "b" is pending now
    assert_ready_ok!(s3.poll()); // a value for a pending key goes in
    assert!(!s2.is_woken());

    assert_eq!(rx.try_recv(), Ok(vec![("b", vec![2, 4])]));
    assert!(s2.is_woken(), "the send for \"c\" lost its turn");
    assert_ready_ok!(s2.poll());
    assert_eq!(rx.try_recv(), Ok(vec![("c", vec![3])]));
}

/// `max_keys`: the same, when the key became pending through `requeue`.
#[tokio::test(start_paused = true)]
async fn waiting_send_whose_key_was_requeued() {
    let (tx, mut rx) = timed::Builder::new(Duration::ZERO).max_keys(1).build();
    tx.try_send("a", 1).unwrap();
    let mut s1 = task::spawn(tx.send("c", 2));
    let mut s2 = task::spawn(tx.send("b", 3));
    assert_pending!(s1.poll());
    assert_pending!(s2.poll());
    rx.requeue("b", vec![0]).unwrap();
    assert_ready_ok!(s2.poll()); // "b" is pending now
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![1]), ("b", vec![0, 3])]));
    assert!(s1.is_woken(), "the send for \"c\" lost its turn");
    assert_ready_ok!(s1.poll());
    assert_eq!(rx.try_recv(), Ok(vec![("c", vec![2])]));
}

/// `max_keys`: closing the channel fails a waiting new-key send and hands its value back.
#[tokio::test(start_paused = true)]
async fn key_waiter_fails_on_close() {
    let (tx, rx) = timed::Builder::new(WINDOW).max_keys(1).build();
    tx.try_send("a", 1).unwrap();
    let mut send = task::spawn(tx.send("b", 2));
    assert_pending!(send.poll());
    rx.close();
    assert!(send.is_woken());
    assert_ready_eq!(send.poll(), Err(SendError(("b", 2))));
}

/// `max_keys` and `capacity` together: a new-key send that has its key slot still waits
/// for room, and goes in once both are there.
#[tokio::test(start_paused = true)]
async fn max_keys_and_capacity() {
    let (tx, mut rx) = ordered::Builder::new()
        .max_keys(2)
        .capacity(2)
        .max_batch(1)
        .build();
    tx.try_send(1, "a", 1).unwrap();
    tx.try_send(1, "a", 2).unwrap();
    let mut send = task::spawn(tx.send(0, "b", 3));
    assert_pending!(send.poll());
    assert_eq!(tx.try_send(0, "a", 4), Err(TrySendError::Full((0, "a", 4))));
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![1])]));
    assert!(send.is_woken());
    assert_ready_ok!(send.poll());
    assert_eq!(rx.key_count(), 2);
}

/// `max_keys` and `max_weight`: a new key's send waits for room first, in turn, and only
/// then for a key slot. So while it lacks room, a value for a pending key that would fit
/// waits behind it too (`try_send` is `Full`), as behind any send that waits for room; once
/// room comes back, the new key's send waits for its slot, and values for the pending key
/// go in past it.
#[tokio::test(start_paused = true)]
async fn a_new_keys_send_waits_for_room_before_its_key_slot() {
    let (tx, mut rx) = ordered::Builder::new()
        .max_keys(1)
        .max_weight(3)
        .max_batch(1)
        .weigher(|v: &usize| *v)
        .build::<u8, &str, usize>();
    tx.send(0, "a", 1).await.unwrap();
    tx.send(0, "a", 1).await.unwrap();
    let other = tx.clone();
    let waiting = tokio::spawn(async move { other.send(0, "b", 2).await });
    tokio::task::yield_now().await;
    assert!(!waiting.is_finished(), "no room and no slot");
    let behind = tx.try_send(0, "a", 1).unwrap_err();
    assert!(behind.is_full(), "behind a send that waits for room");
    // Room comes back, but not the slot: "a" is still pending.
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![1])]));
    tokio::task::yield_now().await;
    assert!(!waiting.is_finished(), "it waits for a key slot now");
    tx.try_send(0, "a", 1).unwrap();
    assert_eq!(rx.len(), 2, "a value for the pending key goes past it");
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![1])]));
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![1])]));
    tokio::task::yield_now().await;
    waiting.await.unwrap().unwrap();
    assert_eq!(rx.try_recv(), Ok(vec![("b", vec![2])]));
}

/// Requeue always goes in: past `max_keys` and past `max_weight`.
#[test]
fn requeue_ignores_limits() {
    let (tx, mut rx) = ordered::Builder::new()
        .weigher(weight)
        .max_keys(1)
        .max_weight(5)
        .build();
    tx.try_send(1, "a", 5).unwrap();
    let (key, values) = rx.try_recv().unwrap().remove(0);
    tx.try_send(1, "b", 5).unwrap();
    rx.requeue(1, key, values).unwrap();
    let stats = rx.stats();
    assert_eq!((stats.pending_keys, stats.pending_weight), (2, 10));
    assert_eq!(tx.try_send(1, "b", 1), Err(TrySendError::Full((1, "b", 1))));
    // Equal ranks: "b" started its run before "a" was requeued.
    assert_eq!(rx.try_recv(), Ok(vec![("b", vec![5]), ("a", vec![5])]));
}

/// `max_keys(0)` panics with a clear message.
#[test]
#[should_panic(expected = "max_keys must be at least 1")]
fn max_keys_zero_panics() {
    let _ = timed::Builder::new(WINDOW).max_keys(0);
}

/// `try_send` on a closed channel says `Closed`, not `Full`, even when a limit is reached.
#[test]
fn closed_wins_over_limits() {
    let (tx, rx) = timed::Builder::new(WINDOW)
        .weigher(weight)
        .max_keys(1)
        .max_weight(5)
        .build();
    tx.try_send("a", 5).unwrap();
    rx.close();
    assert_eq!(tx.try_send("b", 1), Err(TrySendError::Closed(("b", 1))));
    assert_eq!(tx.try_send("a", 1), Err(TrySendError::Closed(("a", 1))));
}

/// Without `max_weight`, weight is not bounded: heavy values go in at once.
#[tokio::test(start_paused = true)]
async fn weight_unbounded_without_max_weight() {
    let (tx, _rx) = timed::Builder::new(WINDOW).weigher(weight).build();
    for _ in 0..2 {
        let mut send = task::spawn(tx.send("k", 1_000_000));
        assert_ready!(send.poll()).unwrap();
    }
    assert_eq!(tx.stats().pending_weight, 2_000_000);
}
