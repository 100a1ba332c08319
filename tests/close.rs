//! Closing: by dropping every sender, by `close()`, or by dropping every receiver. What
//! pending values do, what sends and requeues do afterwards, and who is woken.

mod common;

use std::sync::Arc;

use futures::StreamExt;
use keyed_batch::error::{SendError, TryRecvError, TrySendError};
use keyed_batch::{ordered, timed};
use tokio::time::{advance, Instant};
use tokio_test::task;
use tokio_test::{assert_pending, assert_ready};

use common::time::{ms, secs, HOUR};

/// Sends one key with three values and two single keys, with `b` ranked before `a`.
async fn fill(tx: &timed::Sender<&'static str, i32>) {
    let start = Instant::now();
    for v in 1..=3 {
        tx.send("a", v).await.unwrap(); // start + 1 h
    }
    tx.send_by("b", 10, start + HOUR / 2).await.unwrap();
    tx.send("c", 20).await.unwrap();
}

/// Disconnection: dropping the last sender (not just one) makes everything due at once;
/// batches keep `max_batch` and rank order, then the stream ends.
#[tokio::test(start_paused = true)]
async fn drop_senders_flushes() {
    let (tx, mut rx) = timed::Builder::new(HOUR).max_batch(2).build();
    let start = Instant::now();
    let tx2 = tx.clone();
    fill(&tx).await;
    drop(tx);
    assert!(!rx.is_closed());
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));

    drop(tx2);
    assert!(rx.is_closed());
    assert_eq!(rx.recv().await, Some(vec![("b", vec![10]), ("a", vec![1])]));
    assert_eq!(rx.recv().await, Some(vec![("a", vec![2, 3])]));
    assert_eq!(rx.recv().await, Some(vec![("c", vec![20])]));
    assert_eq!(rx.recv().await, None);
    assert_eq!(rx.recv().await, None);
    assert_eq!(Instant::now(), start);
}

/// Disconnection: `close()` flushes the same way while senders are still alive.
#[tokio::test(start_paused = true)]
async fn close_flushes() {
    let (tx, mut rx) = timed::Builder::new(HOUR).max_batch(2).build();
    let start = Instant::now();
    fill(&tx).await;
    rx.close();
    assert!(tx.is_closed());
    assert!(rx.is_closed());
    assert_eq!(rx.try_recv(), Ok(vec![("b", vec![10]), ("a", vec![1])]));
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![2, 3])]));
    assert_eq!(rx.try_recv(), Ok(vec![("c", vec![20])]));
    assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
    assert_eq!(rx.recv().await, None);
    assert_eq!(Instant::now(), start);
}

/// Disconnection: after close, every `timed` send method fails and hands the value back.
#[tokio::test(start_paused = true)]
async fn send_after_close_timed() {
    let (tx, rx) = timed::channel(HOUR);
    rx.close();
    let soon = Instant::now() + HOUR;
    assert_eq!(tx.send("a", 1).await, Err(SendError(("a", 1))));
    assert_eq!(tx.send_by("a", 2, soon).await, Err(SendError(("a", 2))));
    assert_eq!(tx.try_send("a", 3), Err(TrySendError::Closed(("a", 3))));
    assert_eq!(
        tx.try_send_by("a", 4, soon),
        Err(TrySendError::Closed(("a", 4)))
    );
    assert!(rx.is_empty());
}

/// Disconnection: after close, every `ordered` send method fails and hands the value back.
#[tokio::test]
async fn send_after_close_ordered() {
    let (tx, rx) = ordered::channel();
    rx.close();
    assert_eq!(tx.send(1, "a", 'x').await, Err(SendError((1, "a", 'x'))));
    assert_eq!(
        tx.try_send(2, "a", 'y'),
        Err(TrySendError::Closed((2, "a", 'y')))
    );
    assert!(rx.is_empty());
}

/// Disconnection: `blocking_send` fails and hands the value back after `close()` or once every
/// receiver is gone (both flavours).
#[test]
fn blocking_send_after_close() {
    let (tx, rx) = timed::channel(HOUR);
    rx.close();
    assert_eq!(tx.blocking_send("a", 1), Err(SendError(("a", 1))));
    let (tx, rx) = timed::channel(HOUR);
    drop(rx);
    assert_eq!(tx.blocking_send("a", 2), Err(SendError(("a", 2))));

    let (tx, rx) = ordered::channel();
    rx.close();
    assert_eq!(tx.blocking_send(1, "a", 3), Err(SendError((1, "a", 3))));
    let (tx, rx) = ordered::channel();
    drop(rx);
    assert_eq!(tx.blocking_send(1, "a", 4), Err(SendError((1, "a", 4))));
}

/// Disconnection: dropping the last receiver (not just one) makes sends fail with the value.
#[tokio::test(start_paused = true)]
async fn drop_receivers_timed() {
    let (tx, rx) = timed::channel(HOUR);
    let rx2 = rx.clone();
    drop(rx);
    assert!(!tx.is_closed());
    tx.send("a", 1).await.unwrap();
    drop(rx2);
    assert!(tx.is_closed());
    assert_eq!(tx.send("a", 2).await, Err(SendError(("a", 2))));
    let soon = Instant::now();
    assert_eq!(tx.send_by("a", 3, soon).await, Err(SendError(("a", 3))));
    assert_eq!(tx.try_send("a", 4), Err(TrySendError::Closed(("a", 4))));
    assert_eq!(
        tx.try_send_by("a", 5, soon),
        Err(TrySendError::Closed(("a", 5)))
    );
}

/// Disconnection: dropping the last receiver makes `ordered` sends fail with the value.
#[tokio::test]
async fn drop_receivers_ordered() {
    let (tx, rx) = ordered::channel();
    let rx2 = rx.clone();
    drop(rx);
    tx.send(1, "a", 1).await.unwrap();
    drop(rx2);
    assert!(tx.is_closed());
    assert_eq!(tx.send(2, "a", 2).await, Err(SendError((2, "a", 2))));
    assert_eq!(
        tx.try_send(3, "a", 3),
        Err(TrySendError::Closed((3, "a", 3)))
    );
}

/// With every receiver gone, the values still pending are dropped, not leaked.
#[test]
fn drop_receivers_drops_pending() {
    let value = Arc::new(());
    let (tx, rx) = ordered::channel();
    tx.try_send(1, "a", Arc::clone(&value)).unwrap();
    tx.try_send(2, "b", Arc::clone(&value)).unwrap();
    assert_eq!(Arc::strong_count(&value), 3);
    drop(rx);
    assert_eq!(Arc::strong_count(&value), 1);
    drop(tx);
}

/// Disconnection: a requeue after close but before the end joins the flush, in front of the
/// key's other values.
#[tokio::test(start_paused = true)]
async fn requeue_joins_flush() {
    let (tx, mut rx) = timed::Builder::new(HOUR).max_batch(2).build();
    for v in 1..=3 {
        tx.send("a", v).await.unwrap();
    }
    drop(tx);
    let (key, values) = rx.recv().await.unwrap().remove(0);
    assert_eq!(values, vec![1, 2]);
    rx.requeue(key, values).unwrap();
    assert_eq!(rx.recv().await, Some(vec![("a", vec![1, 2])]));
    assert_eq!(rx.recv().await, Some(vec![("a", vec![3])]));
    rx.requeue("b", vec![4]).unwrap();
    assert_eq!(rx.recv().await, Some(vec![("b", vec![4])]));
    assert_eq!(rx.recv().await, None);
}

/// Disconnection: a key requeued after the close with nothing pending is due as of the
/// close, after the keys due by then and before those the close made due, and counts as
/// `due`, not `close`, however long after the close it came. It used to be due as of the
/// requeue, and counted as `close` once time had passed.
#[tokio::test(start_paused = true)]
async fn requeue_after_close_is_due_as_of_the_close() {
    let (tx, mut rx) = timed::Builder::new(secs(10)).max_batch(1).build();
    tx.send("a", 1).await.unwrap(); // due at 10 s
    advance(secs(1)).await;
    tx.send("c", 2).await.unwrap(); // due at 11 s
    advance(ms(1500)).await;
    tx.send("b", 3).await.unwrap(); // due at 12.5 s
    advance(ms(9500)).await; // 12 s
    drop(tx); // the close makes "b" due
    let (key, values) = rx.recv().await.unwrap().remove(0);
    assert_eq!((key, &values[..]), ("a", &[1][..]));
    advance(secs(1)).await;
    rx.requeue(key, values).unwrap();
    let rest: Vec<_> = rx.by_ref().collect().await;
    assert_eq!(
        rest,
        vec![
            vec![("c", vec![2])],
            vec![("a", vec![1])],
            vec![("b", vec![3])]
        ]
    );
    let by = rx.stats().delivered_by;
    assert_eq!((by.due, by.close), (3, 1), "{by:?}");
}

/// Disconnection: once `recv` has returned `None`, requeue fails and hands the values back,
/// for this receiver and its clones (`timed`).
#[tokio::test(start_paused = true)]
async fn requeue_after_end_timed() {
    let (tx, mut rx) = timed::channel::<&str, i32>(HOUR);
    let other = rx.clone();
    drop(tx);
    assert_eq!(rx.recv().await, None);
    assert_eq!(rx.requeue("a", vec![1]), Err(SendError(("a", vec![1]))));
    assert_eq!(other.requeue("a", vec![2]), Err(SendError(("a", vec![2]))));
    assert!(rx.is_empty());
}

/// Disconnection: once `recv` has returned `None`, requeue fails and hands the values back
/// (`ordered`).
#[tokio::test]
async fn requeue_after_end_ordered() {
    let (tx, mut rx) = ordered::channel::<u8, &str, i32>();
    tx.send(1, "a", 1).await.unwrap();
    rx.close();
    let batch = rx.recv().await.unwrap();
    assert_eq!(batch, vec![("a", vec![1])]);
    assert_eq!(rx.recv().await, None);
    assert_eq!(
        rx.requeue(1, "a", vec![1]),
        Err(SendError((1, "a", vec![1])))
    );
}

/// Disconnection: dropping the last sender wakes a receiver sleeping on a far deadline, which
/// then gets the batch without waiting and then `None`.
#[tokio::test(start_paused = true)]
async fn drop_senders_wakes_receiver() {
    let (tx, mut rx) = timed::channel(HOUR);
    let start = Instant::now();
    tx.send("a", 1).await.unwrap();
    let mut recv = task::spawn(rx.recv());
    assert_pending!(recv.poll());
    drop(tx);
    assert!(recv.is_woken());
    assert_eq!(assert_ready!(recv.poll()), Some(vec![("a", vec![1])]));
    drop(recv);
    assert_eq!(rx.recv().await, None);
    assert_eq!(Instant::now(), start);
}

/// Disconnection: `close()` wakes every waiting receiver on an empty channel, and they see the
/// end.
#[tokio::test(start_paused = true)]
async fn close_wakes_receiver() {
    let (_tx, mut rx1) = timed::channel::<&str, i32>(HOUR);
    let mut rx2 = rx1.clone();
    let closer = rx1.clone();
    let mut r1 = task::spawn(rx1.recv());
    let mut r2 = task::spawn(rx2.recv());
    assert_pending!(r1.poll());
    assert_pending!(r2.poll());
    advance(HOUR).await;
    assert!(!r1.is_woken());
    closer.close();
    assert!(r1.is_woken());
    assert!(r2.is_woken());
    assert_eq!(assert_ready!(r1.poll()), None);
    assert_eq!(assert_ready!(r2.poll()), None);
}

/// Disconnection: `close()` wakes a sender waiting for room, which fails with its value.
#[tokio::test(start_paused = true)]
async fn close_wakes_sender() {
    let (tx, rx) = timed::Builder::new(HOUR).capacity(1).build();
    tx.send("a", 1).await.unwrap();
    let mut send = task::spawn(tx.send("b", 2));
    assert_pending!(send.poll());
    rx.close();
    assert!(send.is_woken());
    assert_eq!(assert_ready!(send.poll()), Err(SendError(("b", 2))));
    assert_eq!(rx.len(), 1);
}

/// Disconnection: dropping the last receiver wakes a sender waiting for room, which fails with
/// its value.
#[tokio::test]
async fn drop_receivers_wakes_sender() {
    let (tx, rx) = ordered::Builder::new().capacity(1).build();
    tx.send(1, "a", 1).await.unwrap();
    let mut send = task::spawn(tx.send(2, "b", 2));
    assert_pending!(send.poll());
    drop(rx);
    assert!(send.is_woken());
    assert_eq!(assert_ready!(send.poll()), Err(SendError((2, "b", 2))));
}

/// Limits and Disconnection: a channel that is both closed and full reports `Closed`, not
/// `Full`.
#[test]
fn closed_and_full_is_closed() {
    let (tx, rx) = timed::Builder::new(HOUR).capacity(1).build();
    tx.try_send("a", 1).unwrap();
    assert_eq!(tx.try_send("a", 2), Err(TrySendError::Full(("a", 2))));
    rx.close();
    assert_eq!(tx.try_send("a", 3), Err(TrySendError::Closed(("a", 3))));

    let (tx, rx) = ordered::Builder::new().capacity(1).build();
    tx.try_send(1, "a", 1).unwrap();
    drop(rx);
    assert_eq!(
        tx.try_send(1, "a", 2),
        Err(TrySendError::Closed((1, "a", 2)))
    );
}

/// Found in review: `close` woke `closed()` waiters with the lock held, so a waker that looks
/// at the channel deadlocked. Waiters are now woken after the lock is released.
#[test]
fn closed_waiters_are_woken_outside_the_lock() {
    use std::future::Future;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::task::{Context, Wake, Waker};

    struct Peek {
        tx: timed::Sender<u8, u8>,
        saw_closed: AtomicBool,
    }
    impl Wake for Peek {
        fn wake(self: Arc<Self>) {
            // Takes the channel's lock.
            self.saw_closed.store(self.tx.is_closed(), Ordering::SeqCst);
        }
    }

    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let (tx, rx) = timed::channel::<u8, u8>(secs(1));
        let peek = Arc::new(Peek {
            tx: tx.clone(),
            saw_closed: AtomicBool::new(false),
        });
        let waker = Waker::from(Arc::clone(&peek));
        let mut cx = Context::from_waker(&waker);
        let mut closed = Box::pin(tx.closed());
        assert!(closed.as_mut().poll(&mut cx).is_pending());
        drop(rx);
        let _ = done.send(peek.saw_closed.load(Ordering::SeqCst));
    });
    let saw_closed = finished
        .recv_timeout(secs(10))
        .expect("dropping the receiver deadlocked in the closed() waker");
    assert!(saw_closed);
}
