//! Flush on demand: `timed::Sender::flush` and `flush_all`, and `Receiver::drain_now` in
//! both flavours.

mod common;

use std::time::Duration;

use keyed_batch::error::{TryRecvError, TrySendError};
use keyed_batch::{ordered, timed};
use tokio::time::{advance, Instant};
use tokio_test::task;
use tokio_test::{assert_pending, assert_ready_eq, assert_ready_ok};

use common::time::{ms, secs};

const WINDOW: Duration = secs(60);

// ===== flush =====

/// `flush(&key)` makes that key due at once, and only that key.
#[tokio::test(start_paused = true)]
async fn flush_makes_only_that_key_due() {
    let (tx, mut rx) = timed::channel(WINDOW);
    tx.send("a", 1).await.unwrap();
    tx.send("b", 2).await.unwrap();
    tx.send("c", 3).await.unwrap();
    tx.send("b", 4).await.unwrap();
    tx.flush(&"b");
    assert_eq!(rx.try_recv(), Ok(vec![("b", vec![2, 4])]));
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    assert_eq!(rx.next_deadline(), Some(Instant::now() + WINDOW));
    advance(WINDOW).await;
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![1]), ("c", vec![3])]));
}

/// `flush(&key)` wakes a receiver that is waiting for a later deadline, and that receiver
/// still gets the other keys at their deadline afterwards.
#[tokio::test(start_paused = true)]
async fn flush_wakes_waiting_receiver() {
    let (tx, mut rx) = timed::channel(WINDOW);
    tx.send("a", 1).await.unwrap();
    advance(secs(1)).await;
    tx.send("b", 2).await.unwrap();
    let start = Instant::now();
    {
        let mut recv = task::spawn(rx.recv());
        assert_pending!(recv.poll());
        tx.flush(&"b");
        assert!(recv.is_woken());
        assert_ready_eq!(recv.poll(), Some(vec![("b", vec![2])]));
    }
    assert_eq!(rx.recv().await, Some(vec![("a", vec![1])]));
    assert_eq!(Instant::now(), start + WINDOW - secs(1));
}

/// `flush` of a key that has no pending value does nothing: no wake-up, and a value sent
/// for that key later waits its window as usual.
#[tokio::test(start_paused = true)]
async fn flush_missing_key_does_nothing() {
    let (tx, mut rx) = timed::channel(WINDOW);
    tx.send("a", 1).await.unwrap();
    {
        let mut recv = task::spawn(rx.recv());
        assert_pending!(recv.poll());
        tx.flush(&"zz");
        assert!(!recv.is_woken());
        assert_pending!(recv.poll());
    }
    tx.send("zz", 2).await.unwrap();
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    advance(WINDOW - ms(1)).await;
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    advance(ms(1)).await;
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![1]), ("zz", vec![2])]));
}

/// `flush` makes a key due at once, but a key that is already due keeps its earlier place.
#[tokio::test(start_paused = true)]
async fn flush_keeps_earlier_due_key_first() {
    let (tx, mut rx) = timed::channel(WINDOW);
    tx.send("a", 1).await.unwrap();
    tx.send_by("b", 2, Instant::now()).await.unwrap();
    advance(ms(1)).await;
    tx.flush(&"a");
    tx.flush(&"b"); // already due earlier: no change
    assert_eq!(rx.try_recv(), Ok(vec![("b", vec![2]), ("a", vec![1])]));
}

/// A flushed key is due now; values sent to it afterwards ride along while it is pending.
#[tokio::test(start_paused = true)]
async fn flushed_key_takes_later_values_along() {
    let (tx, mut rx) = timed::channel(WINDOW);
    tx.send("a", 1).await.unwrap();
    tx.flush(&"a");
    tx.send("a", 2).await.unwrap();
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![1, 2])]));
    tx.send("a", 3).await.unwrap(); // a new run: its own window
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
}

// ===== flush_all =====

/// `flush_all` makes every pending key due at once, in arrival order since they now tie;
/// a key that arrives afterwards is not affected.
#[tokio::test(start_paused = true)]
async fn flush_all_makes_pending_due_not_later_keys() {
    let (tx, mut rx) = timed::channel(WINDOW);
    tx.send_by("late", 1, Instant::now() + WINDOW * 2)
        .await
        .unwrap();
    tx.send("early", 2).await.unwrap();
    advance(ms(1)).await;
    tx.flush_all();
    tx.send("after", 3).await.unwrap();
    assert_eq!(
        rx.try_recv(),
        Ok(vec![("late", vec![1]), ("early", vec![2])])
    );
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    advance(WINDOW - ms(1)).await;
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    advance(ms(1)).await;
    assert_eq!(rx.try_recv(), Ok(vec![("after", vec![3])]));
}

/// `flush_all` wakes a waiting receiver; on an empty channel it does nothing.
#[tokio::test(start_paused = true)]
async fn flush_all_wakes_waiting_receiver() {
    let (tx, mut rx) = timed::channel(WINDOW);
    let mut recv = task::spawn(rx.recv());
    assert_pending!(recv.poll());
    tx.flush_all();
    assert!(!recv.is_woken());
    tx.send("a", 1).await.unwrap();
    assert!(recv.is_woken());
    assert_pending!(recv.poll());
    tx.flush_all();
    assert!(recv.is_woken());
    assert_ready_eq!(recv.poll(), Some(vec![("a", vec![1])]));
}

/// `flush_all` respects `max_batch`: the flushed keys come out over several batches.
#[tokio::test(start_paused = true)]
async fn flush_all_respects_max_batch() {
    let (tx, mut rx) = timed::Builder::new(WINDOW).max_batch(2).build();
    for (k, v) in [("a", 1), ("b", 2), ("a", 3)] {
        tx.send(k, v).await.unwrap();
    }
    tx.flush_all();
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![1, 3])]));
    assert_eq!(rx.try_recv(), Ok(vec![("b", vec![2])]));
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
}

// ===== drain_now =====

/// `drain_now` (`timed`) returns everything pending, deadlines ignored, in rank order and
/// split by `max_batch`; the channel stays open and works as before afterwards.
#[tokio::test(start_paused = true)]
async fn drain_now_takes_everything_timed() {
    let (tx, mut rx) = timed::Builder::new(WINDOW).max_batch(2).build();
    tx.send("a", 1).await.unwrap();
    tx.send("b", 2).await.unwrap();
    tx.send("a", 3).await.unwrap();
    tx.send_by("c", 4, Instant::now() + ms(1)).await.unwrap();
    assert_eq!(
        rx.drain_now(),
        vec![
            vec![("c", vec![4]), ("a", vec![1])],
            vec![("a", vec![3]), ("b", vec![2])],
        ]
    );
    assert!(rx.is_empty());
    assert!(!rx.is_closed());
    assert!(!tx.is_closed());
    assert_eq!(rx.drain_now(), Vec::<Vec<(&str, Vec<i32>)>>::new());

    tx.send("d", 5).await.unwrap();
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    let start = Instant::now();
    assert_eq!(rx.recv().await, Some(vec![("d", vec![5])]));
    assert_eq!(Instant::now(), start + WINDOW);
}

/// `drain_now` (`ordered`) returns everything in rank order, split by `max_batch`, and
/// leaves the channel open.
#[test]
fn drain_now_takes_everything_ordered() {
    let (tx, mut rx) = ordered::Builder::new().max_batch(2).build();
    tx.try_send(3, "c", 'x').unwrap();
    tx.try_send(1, "a", 'y').unwrap();
    tx.try_send(2, "b", 'z').unwrap();
    tx.try_send(2, "a", 'w').unwrap();
    assert_eq!(
        rx.drain_now(),
        vec![
            vec![("a", vec!['y', 'w'])],
            vec![("b", vec!['z']), ("c", vec!['x'])]
        ]
    );
    assert!(rx.is_empty());
    assert!(!tx.is_closed());
    tx.try_send(0, "d", 'v').unwrap();
    assert_eq!(rx.try_recv(), Ok(vec![("d", vec!['v'])]));
}

/// `drain_now` splits by `max_batch_weight` too, with a heavy value alone (`timed`).
#[tokio::test(start_paused = true)]
async fn drain_now_splits_by_weight_timed() {
    let (tx, mut rx) = timed::Builder::new(WINDOW)
        .weigher(|v: &usize| *v)
        .max_batch_weight(5)
        .build();
    for (k, v) in [("a", 2), ("a", 2), ("b", 3), ("c", 9)] {
        tx.send(k, v).await.unwrap();
    }
    assert_eq!(
        rx.drain_now(),
        vec![
            vec![("a", vec![2, 2])],
            vec![("b", vec![3])],
            vec![("c", vec![9])],
        ]
    );
    assert_eq!(rx.stats().pending_weight, 0);
}

/// `drain_now` splits by `max_batch_weight` (`ordered`).
#[test]
fn drain_now_splits_by_weight_ordered() {
    let (tx, mut rx) = ordered::Builder::new()
        .weigher(|v: &usize| *v)
        .max_batch_weight(4)
        .build();
    for v in [3, 1, 3] {
        tx.try_send(0, "k", v).unwrap();
    }
    assert_eq!(
        rx.drain_now(),
        vec![vec![("k", vec![3, 1])], vec![("k", vec![3])]]
    );
}

/// `drain_now` frees room: a `send` waiting for capacity is woken and goes in.
#[tokio::test(start_paused = true)]
async fn drain_now_wakes_waiting_send() {
    let (tx, mut rx) = timed::Builder::new(WINDOW).capacity(1).build();
    tx.send("a", 1).await.unwrap();
    let mut send = task::spawn(tx.send("b", 2));
    assert_pending!(send.poll());
    assert_eq!(rx.drain_now(), vec![vec![("a", vec![1])]]);
    assert!(send.is_woken());
    assert_ready_ok!(send.poll());
    assert_eq!(rx.len(), 1);
}

/// `drain_now` frees key slots: a new-key `send` waiting on `max_keys` is woken and goes in
/// (`ordered`).
#[tokio::test(start_paused = true)]
async fn drain_now_wakes_waiting_new_key() {
    let (tx, mut rx) = ordered::Builder::new().max_keys(1).build();
    tx.send(1, "a", 1).await.unwrap();
    let mut send = task::spawn(tx.send(1, "b", 2));
    assert_pending!(send.poll());
    assert_eq!(rx.drain_now(), vec![vec![("a", vec![1])]]);
    assert!(send.is_woken());
    assert_ready_ok!(send.poll());
    assert_eq!(tx.try_send(1, "c", 3), Err(TrySendError::Full((1, "c", 3))));
}

/// `drain_now` after `close` takes what is left; the stream then ends.
#[tokio::test(start_paused = true)]
async fn drain_now_after_close() {
    let (tx, mut rx) = timed::channel(WINDOW);
    tx.send("a", 1).await.unwrap();
    tx.send("b", 2).await.unwrap();
    rx.close();
    assert_eq!(rx.drain_now(), vec![vec![("a", vec![1]), ("b", vec![2])]]);
    assert_eq!(rx.recv().await, None);
}

/// A second receiver waiting for a deadline is not left waiting for work that `drain_now`
/// took: once the queue is empty, nothing is due, and new work still reaches it.
#[tokio::test(start_paused = true)]
async fn drain_now_with_a_waiting_clone() {
    let (tx, mut rx) = timed::channel(WINDOW);
    let mut rx2 = rx.clone();
    tx.send("a", 1).await.unwrap();
    let mut recv = task::spawn(rx2.recv());
    assert_pending!(recv.poll());
    assert_eq!(rx.drain_now(), vec![vec![("a", vec![1])]]);
    assert_pending!(recv.poll());
    tx.send("b", 2).await.unwrap();
    tx.flush(&"b");
    assert!(recv.is_woken());
    assert_ready_eq!(recv.poll(), Some(vec![("b", vec![2])]));
}
