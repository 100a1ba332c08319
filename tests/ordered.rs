//! The `ordered` flavour: rank by the smallest sort key, ties by run start, splitting,
//! requeue, blocking sends, the stream and closing.

use std::cmp::Reverse;

use futures::StreamExt;
use keyed_batch::error::{SendError, TryRecvError};
use keyed_batch::ordered::{self, Builder};
use tokio_test::task;
use tokio_test::{assert_pending, assert_ready};

/// When a key is due: keys come out in ascending sort-key order, all due at once.
#[test]
fn ascending_order() {
    let (tx, mut rx) = ordered::channel();
    tx.try_send(3, "c", 'c').unwrap();
    tx.try_send(1, "a", 'a').unwrap();
    tx.try_send(2, "b", 'b').unwrap();
    let batch = rx.try_recv();
    assert_eq!(
        batch,
        Ok(vec![("a", vec!['a']), ("b", vec!['b']), ("c", vec!['c'])])
    );
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
}

/// When a key is due: `std::cmp::Reverse` gives descending order.
#[test]
fn reverse_is_descending() {
    let (tx, mut rx) = ordered::channel();
    tx.try_send(Reverse(1), "low", 1).unwrap();
    tx.try_send(Reverse(9), "high", 9).unwrap();
    tx.try_send(Reverse(5), "mid", 5).unwrap();
    let batch = rx.try_recv();
    assert_eq!(
        batch,
        Ok(vec![("high", vec![9]), ("mid", vec![5]), ("low", vec![1])])
    );
}

/// When a key is due and What a batch holds: a key ranks by the smallest sort key among its
/// pending values, and its values stay in send order.
#[test]
fn rank_is_min_sort_key() {
    let (tx, mut rx) = ordered::channel();
    tx.try_send(5, "x", 1).unwrap();
    tx.try_send(3, "y", 2).unwrap();
    tx.try_send(1, "x", 3).unwrap(); // x drops to 1
    tx.try_send(9, "y", 4).unwrap(); // y stays at 3
    tx.try_send(2, "z", 5).unwrap();
    let batch = rx.try_recv();
    assert_eq!(
        batch,
        Ok(vec![("x", vec![1, 3]), ("z", vec![5]), ("y", vec![2, 4])])
    );
}

/// What a batch holds: equal sort keys go to the key whose pending run started first, even if
/// it reached that sort key later.
#[test]
fn ties_go_to_earlier_run() {
    let (tx, mut rx) = ordered::channel();
    tx.try_send(5, "z", 1).unwrap();
    tx.try_send(2, "y", 2).unwrap();
    tx.try_send(2, "x", 3).unwrap();
    tx.try_send(2, "z", 4).unwrap();
    let batch = rx.try_recv();
    assert_eq!(
        batch,
        Ok(vec![("z", vec![1, 4]), ("y", vec![2]), ("x", vec![3])])
    );
}

/// What a batch holds: a key that empties and refills is a new arrival and loses ties to keys
/// already pending.
#[test]
fn refilled_key_is_new_arrival() {
    let (tx, mut rx) = Builder::new().max_batch(1).build();
    tx.try_send(1, "a", 1).unwrap();
    tx.try_send(1, "b", 2).unwrap();
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![1])]));
    tx.try_send(1, "a", 3).unwrap();
    assert_eq!(rx.try_recv(), Ok(vec![("b", vec![2])]));
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![3])]));
}

/// What a batch holds: `max_batch` caps a batch; a split key keeps its rank and leads the next
/// batch unless a key of smaller rank arrived.
#[test]
fn max_batch_split() {
    let (tx, mut rx) = Builder::new().max_batch(3).build();
    for v in 1..=4 {
        tx.try_send(1, "a", v).unwrap();
    }
    tx.try_send(0, "b", 0).unwrap();
    tx.try_send(1, "c", 10).unwrap();
    assert_eq!(rx.try_recv(), Ok(vec![("b", vec![0]), ("a", vec![1, 2])]));

    // Same rank as a, but a's run is older: a's remainder still leads.
    tx.try_send(1, "d", 20).unwrap();
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![3, 4]), ("c", vec![10])]));
    assert_eq!(rx.try_recv(), Ok(vec![("d", vec![20])]));

    for v in 1..=4 {
        tx.try_send(5, "e", v).unwrap();
    }
    assert_eq!(rx.try_recv(), Ok(vec![("e", vec![1, 2, 3])]));
    tx.try_send(4, "f", 30).unwrap(); // smaller rank overtakes the remainder
    assert_eq!(rx.try_recv(), Ok(vec![("f", vec![30]), ("e", vec![4])]));
}

/// Failed deliveries: requeued values go in front of newer ones, and the key's rank becomes
/// the smaller of its rank and the given one.
#[test]
fn requeue_rank_is_min() {
    let (tx, mut rx) = ordered::channel();
    tx.try_send(5, "a", 1).unwrap();
    let (key, values) = rx.try_recv().unwrap().remove(0);
    tx.try_send(7, "a", 2).unwrap();
    tx.try_send(6, "b", 3).unwrap();
    rx.requeue(1, key, values).unwrap(); // a: min(7, 1) = 1
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![1, 2]), ("b", vec![3])]));

    tx.try_send(2, "a", 4).unwrap();
    tx.try_send(3, "b", 5).unwrap();
    rx.requeue(9, "a", vec![0]).unwrap(); // a: min(2, 9) = 2, not 9
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![0, 4]), ("b", vec![5])]));
}

/// No polling: a waiting receiver is woken by the first value and by a requeue into an empty
/// channel.
#[tokio::test]
async fn send_and_requeue_wake_receiver() {
    let (tx, mut rx) = ordered::channel();
    let handle = rx.clone();
    let mut recv = task::spawn(rx.recv());
    assert_pending!(recv.poll());
    tx.send(1, "a", 1).await.unwrap();
    assert!(recv.is_woken());
    assert_eq!(assert_ready!(recv.poll()), Some(vec![("a", vec![1])]));
    drop(recv);

    let mut recv = task::spawn(rx.recv());
    assert_pending!(recv.poll());
    handle.requeue(1, "a", vec![1]).unwrap();
    assert!(recv.is_woken());
    assert_eq!(assert_ready!(recv.poll()), Some(vec![("a", vec![1])]));
}

/// `blocking_send` works from a plain thread with no runtime.
#[test]
fn blocking_send_from_thread() {
    let (tx, mut rx) = ordered::channel();
    let thread = std::thread::spawn(move || {
        for v in 0..4 {
            tx.blocking_send(3 - v, v % 2, v).unwrap();
        }
    });
    thread.join().unwrap();
    assert_eq!(rx.try_recv(), Ok(vec![(1, vec![1, 3]), (0, vec![0, 2])]));
    assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
}

/// Disconnection: after close, what is pending drains in rank order within `max_batch`, then
/// the stream ends; sends fail with their value.
#[tokio::test]
async fn close_drains_then_ends() {
    let (tx, mut rx) = Builder::new().max_batch(2).build();
    tx.send(3, "c", 3).await.unwrap();
    tx.send(1, "a", 1).await.unwrap();
    tx.send(2, "b", 2).await.unwrap();
    rx.close();
    assert!(tx.is_closed());
    assert_eq!(tx.send(0, "z", 0).await, Err(SendError((0, "z", 0))));

    assert_eq!(rx.recv().await, Some(vec![("a", vec![1]), ("b", vec![2])]));
    assert_eq!(rx.recv().await, Some(vec![("c", vec![3])]));
    assert_eq!(rx.recv().await, None);
    assert_eq!(rx.recv().await, None);
}

/// Disconnection: dropping every sender ends the stream once drained.
#[tokio::test]
async fn drop_senders_ends_stream() {
    let (tx, rx) = Builder::new().max_batch(1).build();
    let tx2 = tx.clone();
    tx.send(2, "b", 'b').await.unwrap();
    tx2.send(1, "a", 'a').await.unwrap();
    drop(tx);
    assert!(!rx.is_closed());
    drop(tx2);
    assert!(rx.is_closed());
    let keys: Vec<_> = rx.map(|batch| batch[0].0).collect().await;
    assert_eq!(keys, vec!["a", "b"]);
}

/// Counters and `try_recv`: `len` counts values, `key_count` keys, the sender's `len` matches
/// the receiver's.
#[test]
fn counters() {
    let (tx, mut rx) = Builder::new().max_batch(1).build();
    assert!(rx.is_empty());
    tx.try_send(1, "a", ()).unwrap();
    tx.try_send(1, "a", ()).unwrap();
    tx.try_send(2, "b", ()).unwrap();
    assert_eq!((rx.len(), rx.key_count(), tx.len()), (3, 2, 3));
    assert!(!tx.is_empty());
    rx.try_recv().unwrap();
    assert_eq!((rx.len(), rx.key_count(), tx.len()), (2, 2, 2));
    rx.try_recv().unwrap();
    rx.try_recv().unwrap();
    assert!(rx.is_empty());
    assert!(tx.is_empty());
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
}

/// What a batch holds: cloned receivers share the work; each value comes out exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receivers_share_work() {
    const N: u32 = 1_000;
    let (tx, rx) = Builder::new().max_batch(5).build();
    let consumers: Vec<_> = (0..2)
        .map(|_| {
            let mut rx = rx.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                while let Some(batch) = rx.recv().await {
                    got.extend(batch.into_iter().flat_map(|(_, values)| values));
                }
                got
            })
        })
        .collect();
    drop(rx);
    for v in 0..N {
        tx.send(v % 7, v % 11, v).await.unwrap();
    }
    drop(tx);
    let mut all = Vec::new();
    for consumer in consumers {
        all.extend(consumer.await.unwrap());
    }
    all.sort_unstable();
    assert_eq!(all, (0..N).collect::<Vec<_>>());
}

/// Limits: `max_batch(0)` panics with a clear message.
#[test]
#[should_panic(expected = "max_batch must be at least 1")]
fn zero_max_batch_panics() {
    let _ = Builder::new().max_batch(0);
}

/// Limits: `capacity(0)` panics with a clear message.
#[test]
#[should_panic(expected = "capacity must be at least 1")]
fn zero_capacity_panics() {
    let _ = Builder::new().capacity(0);
}

/// Receivers are `FusedStream`s: `futures::select!` with `select_next_some()` compiles and
/// drains the channel, and `is_terminated` is true once the stream has ended.
#[tokio::test]
async fn fused_stream_in_futures_select() {
    use futures::stream::FusedStream;

    let (tx, mut rx) = ordered::channel();
    tx.send(2, "b", 'x').await.unwrap();
    tx.send(1, "a", 'y').await.unwrap();
    drop(tx);
    assert!(!rx.is_terminated());
    let mut got = Vec::new();
    loop {
        futures::select! {
            batch = rx.select_next_some() => got.push(batch),
            complete => break,
        }
    }
    assert_eq!(got, vec![vec![("a", vec!['y']), ("b", vec!['x'])]]);
    assert!(rx.is_terminated());
}

/// The rest of a key that a batch split keeps the key's rank: it leads the next batch
/// although the sort keys of its own values are larger than another key's.
#[tokio::test]
async fn split_rest_keeps_the_rank_of_its_key() {
    let (tx, mut rx) = Builder::new().max_batch(1).build();
    tx.send(1, "k", 'a').await.unwrap();
    tx.send(9, "k", 'b').await.unwrap();
    tx.send(5, "j", 'c').await.unwrap();
    drop(tx);
    let batches: Vec<_> = rx.by_ref().collect().await;
    assert_eq!(
        batches,
        vec![
            vec![("k", vec!['a'])],
            vec![("k", vec!['b'])], // rank 1, as the key had
            vec![("j", vec!['c'])],
        ]
    );
}

/// The rest of a split key keeps its rank and run: a key that reaches an equal rank leads
/// the next batch if its run started earlier, and waits behind the rest if it started later.
#[test]
fn split_rest_goes_behind_an_equal_rank_of_an_older_run() {
    let (tx, mut rx) = Builder::new().max_batch(2).build();
    tx.try_send(5, "older", 1).unwrap();
    for v in 10..14 {
        tx.try_send(1, "split", v).unwrap();
    }
    assert_eq!(rx.try_recv(), Ok(vec![("split", vec![10, 11])]));
    tx.try_send(1, "newer", 20).unwrap();
    tx.try_send(1, "older", 2).unwrap(); // now level with the rest, and older
    assert_eq!(rx.try_recv(), Ok(vec![("older", vec![1, 2])]));
    assert_eq!(rx.try_recv(), Ok(vec![("split", vec![12, 13])]));
    assert_eq!(rx.try_recv(), Ok(vec![("newer", vec![20])]));
}

/// A retried key's run is the one it went out in, unless values came for it while it was
/// out: then it is theirs, and a key of equal rank that came between goes first.
#[tokio::test]
async fn a_retried_keys_run_is_that_of_values_sent_while_it_was_out() {
    let order = |sent_while_out: bool| async move {
        let (tx, mut rx) = Builder::new().acked();
        tx.send(1, "a", 1).await.unwrap();
        let delivery = rx.recv().await.unwrap().remove(0);
        tx.send(1, "c", 3).await.unwrap();
        if sent_while_out {
            tx.send(9, "a", 4).await.unwrap(); // does not lower the rank
        }
        delivery.retry().await.unwrap();
        let batch = rx.recv().await.unwrap();
        batch.iter().map(|d| *d.key()).collect::<Vec<_>>()
    };
    assert_eq!(order(false).await, ["a", "c"]);
    assert_eq!(order(true).await, ["c", "a"]);
}

/// ... unless the key was split: its rest stayed pending with the run, and values that came
/// while the first part was out joined that run, so the retried key keeps it (and
/// `oldest_pending` counts from its start).
#[tokio::test(start_paused = true)]
async fn a_split_keys_retry_keeps_its_run_with_values_sent_while_out() {
    let (tx, mut rx) = Builder::new().max_batch(1).acked();
    tx.send(1, "a", 1).await.unwrap();
    tx.send(1, "a", 2).await.unwrap();
    let delivery = rx.recv().await.unwrap().remove(0);
    tokio::time::advance(std::time::Duration::from_millis(100)).await;
    tx.send(1, "c", 3).await.unwrap();
    tx.send(1, "a", 4).await.unwrap();
    tokio::time::advance(std::time::Duration::from_millis(10)).await;
    delivery.retry().await.unwrap();
    assert_eq!(
        rx.stats().oldest_pending,
        Some(std::time::Duration::from_millis(110))
    );
    let mut keys = Vec::new();
    while keys.len() < 4 {
        let batch = rx.recv().await.unwrap();
        for delivery in batch {
            keys.push(*delivery.key());
            delivery.ack().await.unwrap();
        }
    }
    assert_eq!(keys, ["a", "a", "a", "c"]);
}

/// Requeue: an empty `Vec` changes nothing; the key keeps its rank.
#[tokio::test(start_paused = true)]
async fn requeue_of_nothing_changes_nothing() {
    let (tx, mut rx) = ordered::channel();
    tx.send(5, "k", 1).await.unwrap();
    tx.send(7, "j", 2).await.unwrap();
    rx.requeue(9, "k", Vec::new()).unwrap();
    rx.requeue(1, "j", Vec::new()).unwrap();
    rx.requeue(1, "x", Vec::new()).unwrap();
    assert_eq!(rx.len(), 2);
    assert_eq!(rx.try_recv(), Ok(vec![("k", vec![1]), ("j", vec![2])]));
}
