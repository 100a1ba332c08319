//! `stats()`: every field of the snapshot, with exact values, in both flavours.

mod common;

use std::time::Duration;

use futures::SinkExt;
use keyed_batch::error::TrySendError;
use keyed_batch::stats::Stats;
use keyed_batch::{ordered, timed};
use tokio::time::{advance, Instant};

use common::time::{ms, secs};

const WINDOW: Duration = secs(10);

/// The stats of a channel with one sender and one receiver, changed by `f`.
fn expect(f: impl FnOnce(&mut Stats)) -> Stats {
    let mut stats = Stats::default();
    stats.senders = 1;
    stats.receivers = 1;
    f(&mut stats);
    stats
}

/// A fresh channel: nothing pending, no totals, one sender and one receiver; the sender and
/// the receiver see the same snapshot.
#[test]
fn fresh_channel() {
    let (tx, rx) = timed::channel::<u8, u8>(WINDOW);
    assert_eq!(tx.stats(), expect(|_| {}));
    assert_eq!(rx.stats(), expect(|_| {}));
    let (tx, rx) = ordered::channel::<u8, u8, u8>();
    assert_eq!(tx.stats(), expect(|_| {}));
    assert_eq!(rx.stats(), expect(|_| {}));
}

/// Pending values, keys and weight (summed weigher results), the oldest age and `sent`
/// (`timed`, with a weigher).
#[tokio::test(start_paused = true)]
async fn pending_fields_timed() {
    let (tx, rx) = timed::Builder::new(WINDOW)
        .weigher(|s: &&str| s.len())
        .build();
    tx.send("a", "xyz").await.unwrap();
    tx.send("a", "wxyz").await.unwrap();
    tx.send("b", "vwxyz").await.unwrap();
    let want = expect(|s| {
        s.pending_values = 3;
        s.pending_keys = 2;
        s.pending_weight = 12;
        s.oldest_pending = Some(Duration::ZERO);
        s.sent = 3;
    });
    assert_eq!(rx.stats(), want);
    assert_eq!(tx.stats(), want);
}

/// Without a weigher, the pending weight is the pending value count (`ordered`).
#[tokio::test(start_paused = true)]
async fn pending_fields_ordered() {
    let (tx, rx) = ordered::channel();
    tx.try_send(2, "a", 'x').unwrap();
    tx.try_send(1, "b", 'y').unwrap();
    tx.try_send(3, "a", 'z').unwrap();
    assert_eq!(
        rx.stats(),
        expect(|s| {
            s.pending_values = 3;
            s.pending_keys = 2;
            s.pending_weight = 3;
            s.oldest_pending = Some(Duration::ZERO);
            s.sent = 3;
        })
    );
}

/// `sent`, `delivered` and `batches`; refused sends are not counted; a split key counts a
/// delivery per `(key, values)` entry; keys due by deadline count as `due` (`timed`).
#[tokio::test(start_paused = true)]
async fn totals_and_due_timed() {
    let (tx, mut rx) = timed::Builder::new(WINDOW).max_batch(2).capacity(3).build();
    tx.send("a", 1).await.unwrap();
    tx.send("a", 2).await.unwrap();
    tx.send("a", 3).await.unwrap();
    assert_eq!(tx.try_send("b", 4), Err(TrySendError::Full(("b", 4))));
    advance(secs(1)).await;
    assert_eq!(
        rx.stats(),
        expect(|s| {
            s.pending_values = 3;
            s.pending_keys = 1;
            s.pending_weight = 3;
            s.oldest_pending = Some(secs(1));
            s.sent = 3;
        })
    );

    assert_eq!(rx.recv().await, Some(vec![("a", vec![1, 2])]));
    tx.send("b", 4).await.unwrap();
    assert_eq!(rx.recv().await, Some(vec![("a", vec![3])]));
    assert_eq!(
        tx.stats(),
        expect(|s| {
            s.pending_values = 1;
            s.pending_keys = 1;
            s.pending_weight = 1;
            s.oldest_pending = Some(Duration::ZERO);
            s.sent = 4;
            s.delivered = 3;
            s.batches = 2;
            s.delivered_by.due = 2;
        })
    );
}

/// Every delivery of an open `ordered` channel counts as `due`, one per `(key, values)`
/// entry.
#[test]
fn totals_and_due_ordered() {
    let (tx, mut rx) = ordered::Builder::new().max_batch(3).build();
    for (s, k) in [(1, "a"), (2, "b"), (1, "a"), (3, "c")] {
        tx.try_send(s, k, ()).unwrap();
    }
    assert_eq!(rx.try_recv().unwrap().len(), 2); // a (2 values), b
    assert_eq!(rx.drain_now().len(), 1); // c
    assert_eq!(
        rx.stats(),
        expect(|s| {
            s.sent = 4;
            s.delivered = 4;
            s.batches = 2;
            s.delivered_by.due = 3;
        })
    );
}

/// Keys made due by `max_values_per_key` or `max_key_weight` count as `full_key`.
#[tokio::test(start_paused = true)]
async fn delivered_by_full_key() {
    let (tx, mut rx) = timed::Builder::new(WINDOW)
        .weigher(|v: &usize| *v)
        .max_values_per_key(2)
        .max_key_weight(10)
        .build();
    tx.send("a", 1).await.unwrap();
    tx.send("a", 1).await.unwrap();
    tx.send("b", 10).await.unwrap();
    assert_eq!(
        rx.recv().await,
        Some(vec![("a", vec![1, 1]), ("b", vec![10])])
    );
    let stats = rx.stats();
    assert_eq!(stats.delivered_by.full_key, 2);
    assert_eq!(
        stats.delivered_by.due + stats.delivered_by.flush + stats.delivered_by.close,
        0
    );
    assert_eq!((stats.delivered, stats.batches), (3, 1));
}

/// The first reason counts: a key due because it was full stays `full_key` when a later
/// value's `send_by` moves its deadline further into the past.
#[tokio::test(start_paused = true)]
async fn delivered_by_keeps_the_first_reason() {
    let (tx, mut rx) = timed::Builder::new(WINDOW).max_values_per_key(2).build();
    let start = Instant::now();
    advance(secs(5)).await;
    tx.send("k", 1).await.unwrap();
    tx.send("k", 2).await.unwrap(); // full: due now
    advance(secs(1)).await;
    tx.send_by("k", 3, start + secs(1)).await.unwrap();
    assert_eq!(rx.try_recv(), Ok(vec![("k", vec![1, 2, 3])]));
    let by = rx.stats().delivered_by;
    assert_eq!((by.full_key, by.due), (1, 0));
}

/// Keys made due by `flush`, `flush_all` or `drain_now` count as `flush`; a key that was
/// already due when `drain_now` took it counts as `due`.
#[tokio::test(start_paused = true)]
async fn delivered_by_flush() {
    let (tx, mut rx) = timed::channel(WINDOW);
    tx.send("a", 1).await.unwrap();
    tx.flush(&"a");
    assert_eq!(rx.recv().await, Some(vec![("a", vec![1])]));
    tx.send("b", 2).await.unwrap();
    tx.send("c", 3).await.unwrap();
    tx.flush_all();
    assert_eq!(rx.recv().await, Some(vec![("b", vec![2]), ("c", vec![3])]));
    tx.send_by("d", 4, Instant::now()).await.unwrap();
    tx.send("e", 5).await.unwrap();
    assert_eq!(rx.drain_now(), vec![vec![("d", vec![4]), ("e", vec![5])]]);
    assert_eq!(
        rx.stats(),
        expect(|s| {
            s.sent = 5;
            s.delivered = 5;
            s.batches = 3;
            s.delivered_by.flush = 4;
            s.delivered_by.due = 1;
        })
    );
}

/// Keys delivered because the channel closed before their deadline count as `close`; a key
/// whose deadline had passed counts as `due` (`timed`).
#[tokio::test(start_paused = true)]
async fn delivered_by_close_timed() {
    let (tx, mut rx) = timed::Builder::new(WINDOW).max_batch(1).build();
    tx.send_by("due", 1, Instant::now()).await.unwrap();
    tx.send("a", 2).await.unwrap();
    tx.send("b", 3).await.unwrap();
    drop(tx);
    assert_eq!(rx.recv().await, Some(vec![("due", vec![1])]));
    assert_eq!(rx.recv().await, Some(vec![("a", vec![2])]));
    assert_eq!(rx.recv().await, Some(vec![("b", vec![3])]));
    assert_eq!(rx.recv().await, None);
    let mut want = Stats::default();
    want.receivers = 1;
    want.sent = 3;
    want.delivered = 3;
    want.batches = 3;
    want.delivered_by.due = 1;
    want.delivered_by.close = 2;
    assert_eq!(rx.stats(), want);
}

/// A key that came due because the channel closed before its deadline counts as `close`,
/// even if the receiver only takes it after that deadline has passed (`timed`).
#[tokio::test(start_paused = true)]
async fn delivered_by_close_taken_late() {
    let (tx, mut rx) = timed::channel(WINDOW);
    tx.send("a", 1).await.unwrap();
    drop(tx);
    advance(WINDOW * 2).await;
    assert_eq!(rx.recv().await, Some(vec![("a", vec![1])]));
    let by = rx.stats().delivered_by;
    assert_eq!((by.due, by.close), (0, 1));
}

/// `ordered` keys are due as soon as they are pending, so every delivery counts as `due`,
/// even one taken after close.
#[tokio::test(start_paused = true)]
async fn delivered_by_close_ordered() {
    let (tx, mut rx) = ordered::channel();
    tx.send(1, "a", 1).await.unwrap();
    assert_eq!(rx.recv().await, Some(vec![("a", vec![1])]));
    tx.send(1, "b", 2).await.unwrap();
    rx.close();
    assert_eq!(rx.recv().await, Some(vec![("b", vec![2])]));
    assert_eq!(rx.recv().await, None);
    let by = rx.stats().delivered_by;
    assert_eq!((by.due, by.close), (2, 0));
}

/// `oldest_pending` is the time since the longest-waiting key's current run began; a split
/// key keeps its run, a key that empties and refills starts a new one, and a requeue into
/// an empty key starts one at the requeue (`timed`).
#[tokio::test(start_paused = true)]
async fn oldest_pending_timed() {
    let (tx, mut rx) = timed::Builder::new(secs(60)).max_batch(1).build();
    assert_eq!(rx.stats().oldest_pending, None);
    tx.send("a", 1).await.unwrap();
    tx.send("a", 2).await.unwrap();
    advance(secs(3)).await;
    tx.send("b", 3).await.unwrap();
    advance(secs(2)).await;
    assert_eq!(rx.stats().oldest_pending, Some(secs(5)));

    tx.flush(&"a");
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![1])])); // split: "a" still pending
    assert_eq!(rx.stats().oldest_pending, Some(secs(5)));
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![2])]));
    assert_eq!(rx.stats().oldest_pending, Some(secs(2)));

    tx.send("a", 4).await.unwrap(); // "a" refills: a new run, now
    advance(secs(1)).await;
    assert_eq!(tx.stats().oldest_pending, Some(secs(3)));
    tx.flush(&"b");
    let (key, values) = rx.try_recv().unwrap().remove(0);
    assert_eq!((key, &values), ("b", &vec![3]));
    assert_eq!(rx.stats().oldest_pending, Some(secs(1)));

    advance(secs(1)).await;
    rx.requeue(key, values).unwrap(); // into an empty key: a run from now
    assert_eq!(rx.stats().oldest_pending, Some(secs(2))); // "a" is older
    assert_eq!(rx.try_recv(), Ok(vec![("b", vec![3])])); // requeued: due at once
    advance(secs(1)).await;
    tx.flush(&"a");
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![4])]));
    assert_eq!(rx.stats().oldest_pending, None);
}

/// `oldest_pending` in an acknowledging channel: values in flight are not pending; values
/// that a retry brings back keep their run's start, and so do those a `retry_after` holds;
/// a retry into a key that took new values meanwhile joins their run.
#[tokio::test(start_paused = true)]
async fn oldest_pending_after_retries() {
    let (tx, mut rx) = timed::Builder::new(secs(60)).acked();
    tx.send("a", 1).await.unwrap();
    advance(secs(2)).await;
    tx.send("b", 2).await.unwrap();
    advance(secs(1)).await;
    tx.flush(&"a");
    let a = rx.try_recv().unwrap().remove(0);
    assert_eq!(rx.stats().oldest_pending, Some(secs(1))); // "a" is in flight: "b" is oldest
    advance(secs(1)).await;
    a.retry().await.unwrap();
    let stats = rx.stats();
    assert_eq!(stats.pending_values, 2);
    assert_eq!(stats.oldest_pending, Some(secs(4))); // "a" went in 4 s ago

    let a = rx.try_recv().unwrap().remove(0); // retried: due at once
    assert_eq!(a.key(), &"a");
    a.retry_after(secs(30)).await.unwrap();
    assert_eq!(rx.stats().oldest_pending, Some(secs(4))); // held, but pending

    tx.flush(&"b");
    advance(secs(30)).await;
    let mut batch = rx.try_recv().unwrap();
    batch.sort_by_key(|d| *d.key());
    let (a, b) = (batch.remove(0), batch.remove(0));
    assert_eq!((a.key(), b.key()), (&"a", &"b"));
    b.ack().await.unwrap();
    assert_eq!(rx.stats().oldest_pending, None); // "a" is in flight
    advance(secs(1)).await;
    tx.send("a", 3).await.unwrap(); // waits behind the delivery: a run from now
    advance(secs(1)).await;
    a.retry().await.unwrap(); // joins that run, in front of its value
    let stats = rx.stats();
    assert_eq!(
        (stats.pending_values, stats.oldest_pending),
        (2, Some(secs(1)))
    );
    let a = rx.try_recv().unwrap().remove(0);
    assert_eq!(a.values(), &[1, 3]);
    assert_eq!(rx.stats().oldest_pending, None);
    advance(secs(1)).await;
    a.retry().await.unwrap(); // the run it went out in began 2 s ago
    assert_eq!(rx.stats().oldest_pending, Some(secs(2)));
}

/// `oldest_pending` with paused time (`ordered`).
#[tokio::test(start_paused = true)]
async fn oldest_pending_ordered() {
    let (tx, mut rx) = ordered::Builder::new().max_batch(1).build();
    tx.send(2, "late", 1).await.unwrap();
    advance(secs(4)).await;
    tx.send(1, "soon", 2).await.unwrap();
    advance(secs(1)).await;
    assert_eq!(rx.stats().oldest_pending, Some(secs(5)));
    assert_eq!(rx.try_recv(), Ok(vec![("soon", vec![2])]));
    assert_eq!(rx.stats().oldest_pending, Some(secs(5)));
    assert_eq!(rx.try_recv(), Ok(vec![("late", vec![1])]));
    assert_eq!(rx.stats().oldest_pending, None);
    let (tx2, rx2) = ordered::channel::<u8, u8, u8>();
    tx2.try_send(0, 0, 0).unwrap();
    advance(secs(7)).await;
    assert_eq!(rx2.stats().oldest_pending, Some(secs(7)));
}

/// `oldest_pending` stays exact over many keys delivered out of arrival order, some of
/// them refilled, checked against a plain map of run starts (`timed`).
#[tokio::test(start_paused = true)]
async fn oldest_pending_many_keys() {
    let (tx, mut rx) = timed::Builder::new(secs(100_000)).build();
    let mut starts = std::collections::HashMap::new();
    let mut seed = 7_u64;
    let mut next = move |n: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % n
    };
    for _ in 0..600 {
        let key = next(20);
        if next(3) == 0 {
            tx.flush(&key);
            let batch = rx.try_recv();
            assert_eq!(batch.is_ok(), starts.remove(&key).is_some());
        } else {
            tx.send(key, ()).await.unwrap();
            starts.entry(key).or_insert_with(Instant::now);
        }
        advance(ms(1 + next(1000))).await;
        let want = starts.values().min().map(|start| start.elapsed());
        assert_eq!(rx.stats().oldest_pending, want);
        assert_eq!(rx.stats().pending_keys, starts.len());
    }
}

/// `requeued` counts values handed back; they count as delivered again when they go out,
/// and not as sent. A refused requeue is not counted (`timed`: the requeued key is `due`).
#[tokio::test(start_paused = true)]
async fn requeued_timed() {
    let (tx, mut rx) = timed::Builder::new(Duration::ZERO)
        .weigher(|v: &usize| *v)
        .build();
    tx.send("a", 3).await.unwrap();
    tx.send("a", 4).await.unwrap();
    let (key, values) = rx.recv().await.unwrap().remove(0);
    rx.requeue(key, values).unwrap();
    rx.requeue("b", Vec::new()).unwrap();
    assert_eq!(
        rx.stats(),
        expect(|s| {
            s.pending_values = 2;
            s.pending_keys = 1;
            s.pending_weight = 7;
            s.oldest_pending = Some(Duration::ZERO);
            s.sent = 2;
            s.delivered = 2;
            s.batches = 1;
            s.delivered_by.due = 1;
            s.requeued = 2;
        })
    );
    drop(tx);
    assert_eq!(rx.recv().await, Some(vec![("a", vec![3, 4])]));
    assert_eq!(rx.recv().await, None);
    assert!(rx.requeue("a", vec![5]).is_err());
    let stats = rx.stats();
    assert_eq!((stats.requeued, stats.delivered, stats.batches), (2, 4, 2));
    assert_eq!(stats.delivered_by.due, 2);
    assert_eq!(stats.pending_values, 0);
}

/// `requeued` counts values handed back (`ordered`).
#[test]
fn requeued_ordered() {
    let (tx, mut rx) = ordered::channel();
    tx.try_send(1, "a", 'x').unwrap();
    let (key, values) = rx.try_recv().unwrap().remove(0);
    rx.requeue(1, key, values).unwrap();
    rx.requeue(0, "b", vec!['y', 'z']).unwrap();
    let stats = rx.stats();
    assert_eq!((stats.sent, stats.requeued, stats.delivered), (1, 3, 1));
    assert_eq!((stats.pending_values, stats.pending_keys), (3, 2));
    assert_eq!(
        rx.try_recv(),
        Ok(vec![("b", vec!['y', 'z']), ("a", vec!['x'])])
    );
    assert_eq!(rx.stats().delivered, 4);
}

/// `senders` and `receivers` follow clones and drops; once every receiver is gone, the
/// pending values are dropped and no longer counted (`timed`).
#[test]
fn handle_counts_timed() {
    let (tx, rx) = timed::channel(WINDOW);
    let tx2 = tx.clone();
    let tx3 = tx2.clone();
    let rx2 = rx.clone();
    let stats = rx2.stats();
    assert_eq!((stats.senders, stats.receivers), (3, 2));
    drop(tx3);
    drop(rx);
    let stats = tx.stats();
    assert_eq!((stats.senders, stats.receivers), (2, 1));
    tx.try_send("a", 1).unwrap();
    drop(rx2);
    let stats = tx2.stats();
    assert_eq!((stats.senders, stats.receivers), (2, 0));
    assert_eq!((stats.pending_values, stats.pending_keys), (0, 0));
    assert_eq!((stats.pending_weight, stats.oldest_pending), (0, None));
    assert_eq!(stats.sent, 1);
}

/// `senders` drops to 0 when every sender is gone (`ordered`).
#[test]
fn handle_counts_ordered() {
    let (tx, rx) = ordered::channel::<u8, u8, u8>();
    let rx2 = rx.clone();
    let tx2 = tx.clone();
    drop(tx);
    assert_eq!((rx.stats().senders, rx.stats().receivers), (1, 2));
    drop(tx2);
    drop(rx2);
    assert_eq!((rx.stats().senders, rx.stats().receivers), (0, 1));
}

/// Every way of sending counts in `sent`: `send`, `send_by`, `try_send`, `try_send_by`,
/// `blocking_send` and the `Sink`; refused ones do not.
#[tokio::test(start_paused = true)]
async fn sent_counts_every_send_kind() {
    let (mut tx, rx) = timed::Builder::new(WINDOW).max_keys(1).build();
    tx.send("a", 1).await.unwrap();
    tx.send_by("a", 2, Instant::now() + secs(1)).await.unwrap();
    tx.try_send("a", 3).unwrap();
    tx.try_send_by("a", 4, Instant::now()).unwrap();
    SinkExt::send(&mut tx, ("a", 5)).await.unwrap();
    let tx2 = tx.clone();
    std::thread::spawn(move || tx2.blocking_send("a", 6).unwrap())
        .join()
        .unwrap();
    assert!(tx.try_send("b", 7).unwrap_err().is_full());
    rx.close();
    assert!(tx.send("a", 8).await.is_err());
    assert!(tx.try_send("a", 9).unwrap_err().is_closed());
    let stats = tx.stats();
    assert_eq!((stats.sent, stats.pending_values), (6, 6));
}

/// A retried key counts again by the reason it first came due for, whether or not values
/// came for it while it was out: a flushed key as `flush`, a full one as `full_key`.
#[tokio::test(start_paused = true)]
async fn a_retried_key_counts_by_its_first_reason_with_newer_values() {
    let (tx, mut rx) = timed::Builder::new(secs(60)).acked();
    tx.send("k", 1).await.unwrap();
    tx.flush(&"k");
    let delivery = rx.try_recv().unwrap().remove(0);
    tx.send("k", 2).await.unwrap(); // waits behind the delivery in flight
    delivery.retry().await.unwrap();
    assert_eq!(rx.try_recv().unwrap()[0].values(), [1, 2]);
    let by = rx.stats().delivered_by;
    assert_eq!((by.flush, by.due, by.full_key), (2, 0, 0));

    let (tx, mut rx) = timed::Builder::new(secs(60)).max_values_per_key(2).acked();
    tx.send("k", 1).await.unwrap();
    tx.send("k", 2).await.unwrap(); // full: due at once
    let delivery = rx.try_recv().unwrap().remove(0);
    tx.send("k", 3).await.unwrap();
    delivery.retry().await.unwrap();
    assert_eq!(rx.try_recv().unwrap()[0].values(), [1, 2, 3]);
    let by = rx.stats().delivered_by;
    assert_eq!((by.full_key, by.due, by.flush), (2, 0, 0));
}
