//! Acknowledged deliveries (`acked()`): the rules in `timed::AckReceiver`'s docs, each with
//! paused time, and the promises of `Delivery`: decisions, drops, attempts, dead letters,
//! cancel safety, and deliveries sent to other tasks and threads.

mod common;

use std::time::Duration;

use futures::StreamExt;
use keyed_batch::ack::Delivery;
use keyed_batch::error::{TryRecvError, TrySendError};
use keyed_batch::{ordered, timed};
use tokio::time::{advance, Instant};
use tokio_test::task;
use tokio_test::{assert_pending, assert_ready};

use common::time::{ms, secs, HOUR};

const WINDOW: Duration = secs(1);

/// Keys and values of a batch of deliveries.
fn contents<K: Clone, V: Clone>(batch: &[Delivery<K, V>]) -> Vec<(K, Vec<V>)> {
    batch
        .iter()
        .map(|d| (d.key().clone(), d.values().to_vec()))
        .collect()
}

/// Acknowledges every delivery of a batch.
async fn ack_all<K: Send + 'static, V: Send + 'static>(batch: Vec<Delivery<K, V>>) {
    for delivery in batch {
        delivery.ack().await.unwrap();
    }
}

/// Takes every batch due now, acknowledging each; returns their keys in the order they came.
async fn keys_due_now<K, V>(rx: &mut timed::AckReceiver<K, V>) -> Vec<K>
where
    K: std::hash::Hash + Eq + Copy + Send + 'static,
    V: Send + 'static,
{
    let mut order = Vec::new();
    while let Ok(batch) = rx.try_recv() {
        order.extend(batch.iter().map(|d| *d.key()));
        keyed_batch::ack::ack_all(batch).await.unwrap();
    }
    order
}

// ===== rule 1: one delivery per key in flight =====

/// Rule 1: while a key has an undecided delivery, its newer values wait and no receiver,
/// not even a clone, gets them; once it is acknowledged, they go out.
#[tokio::test(start_paused = true)]
async fn one_delivery_per_key_in_flight() {
    let (tx, mut rx) = timed::Builder::new(WINDOW).acked();
    let mut clone = rx.clone();
    tx.send("a", 1).await.unwrap();
    tx.send("b", 2).await.unwrap();
    let first = rx.recv().await.unwrap();
    assert_eq!(contents(&first), vec![("a", vec![1]), ("b", vec![2])]);
    tx.send("a", 3).await.unwrap();
    tx.send("c", 4).await.unwrap();
    advance(WINDOW * 5).await;
    // "c" goes; "a" waits for its delivery in flight.
    let second = clone.try_recv().unwrap();
    assert_eq!(contents(&second), vec![("c", vec![4])]);
    assert_eq!(rx.try_recv().unwrap_err(), TryRecvError::Empty);
    assert_eq!((rx.len(), rx.key_count()), (1, 1));
    let mut first = first.into_iter();
    first.next().unwrap().ack().await.unwrap(); // "a"
    let third = clone.try_recv().unwrap();
    assert_eq!(contents(&third), vec![("a", vec![3])]);
    assert_eq!(third[0].attempt(), 1);
    ack_all(first.collect()).await;
    ack_all(second).await;
    ack_all(third).await;
    assert_eq!(rx.stats().acked, 4);
}

/// Rule 1 in `ordered`: a key in flight is skipped; keys behind it still go out.
#[tokio::test]
async fn one_delivery_per_key_in_flight_ordered() {
    let (tx, mut rx) = ordered::Builder::new().acked();
    tx.try_send(1, "a", 'x').unwrap();
    let a = rx.try_recv().unwrap();
    tx.try_send(0, "a", 'y').unwrap(); // ranks first, but "a" is in flight
    tx.try_send(5, "b", 'z').unwrap();
    let b = rx.try_recv().unwrap();
    assert_eq!(contents(&b), vec![("b", vec!['z'])]);
    ack_all(a).await;
    assert_eq!(contents(&rx.try_recv().unwrap()), vec![("a", vec!['y'])]);
    ack_all(b).await;
}

// ===== rule 2: a retry joins the new values =====

/// Rule 2: values sent while a key is held by `retry_after` join it; when the delay ends,
/// all of them go out in one delivery, the failed values first, with the next attempt.
#[tokio::test(start_paused = true)]
async fn retry_after_joins_new_values() {
    let (tx, mut rx) = timed::Builder::new(WINDOW).acked();
    tx.send("k", 1).await.unwrap();
    let delivery = rx.recv().await.unwrap().remove(0);
    let failed_at = Instant::now();
    delivery.retry_after(secs(5)).await.unwrap();
    tx.send("k", 2).await.unwrap();
    advance(secs(2)).await;
    tx.send("k", 3).await.unwrap(); // its own deadline, 1 s on, is before the delay's end
    advance(secs(2)).await;
    assert_eq!(rx.try_recv().unwrap_err(), TryRecvError::Empty);
    assert_eq!(rx.next_deadline(), Some(failed_at + secs(5)));
    let batch = rx.recv().await.unwrap();
    assert_eq!(Instant::now(), failed_at + secs(5));
    assert_eq!(contents(&batch), vec![("k", vec![1, 2, 3])]);
    assert_eq!(batch[0].attempt(), 2);
    ack_all(batch).await;
}

/// `max_values_per_key` and `max_key_weight` make a key due at once, but a key with a
/// delivery in flight, or held by `retry_after`, still waits for it, as their docs say.
#[tokio::test(start_paused = true)]
async fn a_full_key_still_waits_for_its_delivery_and_its_retry_delay() {
    let by_count = timed::Builder::new(WINDOW).max_values_per_key(2).acked();
    let by_weight = timed::Builder::new(WINDOW)
        .weigher(|_: &u32| 5)
        .max_key_weight(10)
        .acked();
    for (tx, rx) in [by_count, by_weight] {
        a_full_key_waits(tx, rx).await;
    }
}

/// The test above, on one channel.
async fn a_full_key_waits(
    tx: timed::Sender<&'static str, u32>,
    mut rx: timed::AckReceiver<&'static str, u32>,
) {
    tx.send("k", 1).await.unwrap();
    tx.send("k", 2).await.unwrap();
    let delivery = rx.try_recv().unwrap().remove(0); // full: due at once
    tx.send("k", 3).await.unwrap();
    tx.send("k", 4).await.unwrap(); // full again, with a delivery in flight
    assert_eq!(rx.try_recv().unwrap_err(), TryRecvError::Empty);
    let failed_at = Instant::now();
    delivery.retry_after(secs(5)).await.unwrap();
    advance(secs(4)).await;
    assert_eq!(rx.try_recv().unwrap_err(), TryRecvError::Empty);
    let batch = rx.recv().await.unwrap();
    assert_eq!(Instant::now(), failed_at + secs(5));
    // Rule 2: the retry joins the values sent meanwhile; `max_values_per_key` is no cap.
    assert_eq!(contents(&batch), vec![("k", vec![1, 2, 3, 4])]);
    ack_all(batch).await;
}

/// `drain_now` takes every key that is pending, due or not, but a key held by
/// `retry_after` waits out its delay there too, as the docs say; `len` counts its values.
#[tokio::test(start_paused = true)]
async fn drain_now_leaves_retry_delays_alone() {
    let (tx, mut rx) = timed::Builder::new(secs(60)).acked();
    tx.try_send("a", 1).unwrap();
    tx.try_send("b", 2).unwrap();
    for delivery in rx.drain_now().into_iter().flatten() {
        delivery.retry_after(secs(5)).await.unwrap();
    }
    tx.try_send("c", 3).unwrap();
    let drained = rx.drain_now();
    assert_eq!(drained.len(), 1);
    assert_eq!(contents(&drained[0]), vec![("c", vec![3])]);
    ack_all(drained.into_iter().flatten().collect()).await;
    assert_eq!(rx.len(), 2);
    advance(secs(5)).await;
    let mut again: Vec<_> = rx.drain_now().iter().flat_map(|b| contents(b)).collect();
    again.sort_unstable();
    assert_eq!(again, vec![("a", vec![1]), ("b", vec![2])]);
}

/// `flush` and `flush_all` make pending keys due, but a key held by `retry_after` still
/// waits out its delay, as their docs say.
#[tokio::test(start_paused = true)]
async fn flush_leaves_retry_delays_alone() {
    let (tx, mut rx) = timed::Builder::new(secs(60)).acked();
    tx.try_send("k", 1).unwrap();
    tx.flush(&"k");
    let delivery = rx.try_recv().unwrap().remove(0);
    delivery.retry_after(secs(5)).await.unwrap();
    tx.flush(&"k");
    assert_eq!(rx.try_recv().unwrap_err(), TryRecvError::Empty);
    tx.flush_all();
    assert_eq!(rx.try_recv().unwrap_err(), TryRecvError::Empty);
    advance(secs(5)).await;
    let again = rx.try_recv().unwrap();
    assert_eq!(contents(&again), vec![("k", vec![1])]);
    ack_all(again).await;
}

/// Closing ends every retry delay, and a receiver already waiting for the held key is woken
/// to take it at once.
#[tokio::test(start_paused = true)]
async fn close_wakes_a_receiver_waiting_on_a_retry_delay() {
    let (tx, mut rx) = timed::Builder::new(Duration::ZERO).acked();
    tx.send(1, "v").await.unwrap();
    rx.recv()
        .await
        .unwrap()
        .remove(0)
        .retry_after(secs(60))
        .await
        .unwrap();
    let mut waiting = task::spawn(rx.recv());
    assert_pending!(waiting.poll());
    drop(tx);
    assert!(waiting.is_woken());
    let batch = assert_ready!(waiting.poll()).unwrap();
    assert_eq!(contents(&batch), vec![(1, vec!["v"])]);
    assert_eq!(batch[0].attempt(), 2);
}

/// Rule 2: the retried key still respects `max_batch`; the rest stays held, and a value
/// that came back never has attempt 1 again, even in the part split off.
#[tokio::test(start_paused = true)]
async fn retried_key_is_split_by_max_batch() {
    let (tx, mut rx) = timed::Builder::new(Duration::ZERO).max_batch(2).acked();
    for v in 1..=2 {
        tx.send("k", v).await.unwrap();
    }
    let first = rx.recv().await.unwrap().remove(0);
    assert_eq!((first.values(), first.attempt()), (&[1, 2][..], 1));
    tx.send("k", 3).await.unwrap();
    first.retry().await.unwrap();
    let again = rx.recv().await.unwrap().remove(0);
    assert_eq!((again.values(), again.attempt()), (&[1, 2][..], 2));
    again.retry().await.unwrap();
    // Split: [1, 2] came back twice, 3 never went out.
    let part = rx.try_recv().unwrap().remove(0);
    assert_eq!((part.values(), part.attempt()), (&[1, 2][..], 3));
    assert_eq!(
        rx.try_recv().unwrap_err(),
        TryRecvError::Empty,
        "the rest is held"
    );
    part.ack().await.unwrap();
    let rest = rx.try_recv().unwrap().remove(0);
    assert_eq!((rest.values(), rest.attempt()), (&[3][..], 1));
    // A split of values that came back: the part behind never reads attempt 1.
    rest.retry().await.unwrap();
    for v in 4..=5 {
        tx.send("k", v).await.unwrap();
    }
    let front = rx.try_recv().unwrap().remove(0);
    assert_eq!((front.values(), front.attempt()), (&[3, 4][..], 2));
    front.retry().await.unwrap();
    let front = rx.try_recv().unwrap().remove(0);
    assert_eq!((front.values(), front.attempt()), (&[3, 4][..], 3));
    front.ack().await.unwrap();
    let back = rx.try_recv().unwrap().remove(0);
    assert_eq!((back.values(), back.attempt()), (&[5][..], 1));
    back.ack().await.unwrap();
}

/// `retry` in `ordered` ranks the key by the smaller of its sort key and its newer values'.
#[tokio::test]
async fn retry_keeps_the_sort_key_ordered() {
    let (tx, mut rx) = ordered::Builder::new().max_batch(1).acked();
    tx.try_send(1, "urgent", 1).unwrap();
    let delivery = rx.try_recv().unwrap().remove(0);
    tx.try_send(5, "later", 2).unwrap();
    tx.try_send(9, "urgent", 3).unwrap();
    delivery.retry().await.unwrap();
    let batch = rx.try_recv().unwrap();
    assert_eq!(contents(&batch), vec![("urgent", vec![1])]);
    ack_all(batch).await;
}

// ===== rule 3: capacity until the decision =====

/// Rule 3: values in flight count toward `capacity` until acknowledged: room returns on the
/// decision, not when the batch is taken; a waiting send is woken then.
#[tokio::test(start_paused = true)]
async fn capacity_returns_on_ack() {
    let (tx, mut rx) = timed::Builder::new(Duration::ZERO).capacity(2).acked();
    tx.send("a", 1).await.unwrap();
    tx.send("b", 2).await.unwrap();
    let batch = rx.recv().await.unwrap();
    assert_eq!(tx.try_send("c", 3), Err(TrySendError::Full(("c", 3))));
    let mut send = task::spawn(tx.send("c", 3));
    assert_pending!(send.poll());
    let mut batch = batch.into_iter();
    batch.next().unwrap().give_up().await.unwrap();
    assert!(send.is_woken());
    assert!(assert_ready!(send.poll()).is_ok());
    assert_eq!(tx.try_send("d", 4), Err(TrySendError::Full(("d", 4))));
    batch.next().unwrap().ack().await.unwrap();
    tx.try_send("d", 4).unwrap();
}

/// Rule 1 for a split key: the rest of a key that a batch split waits until the first
/// part's delivery is decided; other keys go meanwhile, through the stream as a user reads it.
#[tokio::test(start_paused = true)]
async fn split_rest_waits_for_the_first_part() {
    let (tx, mut rx) = ordered::Builder::new().max_batch(1).acked();
    tx.try_send(0, "k", 1).unwrap();
    tx.try_send(0, "k", 2).unwrap();
    tx.try_send(0, "j", 3).unwrap();
    drop(tx);
    let first = rx.next().await.unwrap().remove(0);
    assert_eq!((first.key(), first.values()), (&"k", &[1][..]));
    let j = rx.next().await.unwrap().remove(0);
    assert_eq!(j.key(), &"j", "the rest of \"k\" waits");
    j.ack().await.unwrap();
    first.ack().await.unwrap();
    let rest = rx.next().await.unwrap().remove(0);
    assert_eq!((rest.key(), rest.values()), (&"k", &[2][..]));
    rest.ack().await.unwrap();
    assert!(rx.next().await.is_none());
}

/// Rule 3: in-flight weight counts toward `max_weight`, and a key in flight toward
/// `max_keys`, even with no newer values.
#[tokio::test(start_paused = true)]
async fn weight_and_keys_until_ack() {
    let (tx, mut rx) = ordered::Builder::new()
        .weigher(|v: &usize| *v)
        .max_weight(10)
        .max_keys(1)
        .acked();
    tx.try_send(0, "a", 8).unwrap();
    let a = rx.try_recv().unwrap();
    assert!(tx.try_send(0, "a", 3).unwrap_err().is_full(), "8 + 3 > 10");
    assert!(
        tx.try_send(0, "b", 1).unwrap_err().is_full(),
        "\"a\" holds the key slot"
    );
    tx.try_send(0, "a", 2).unwrap();
    ack_all(a).await;
    assert!(
        tx.try_send(0, "b", 1).unwrap_err().is_full(),
        "\"a\" is pending"
    );
    let a = rx.try_recv().unwrap();
    assert_eq!(contents(&a), vec![("a", vec![2])]);
    ack_all(a).await;
    tx.try_send(0, "b", 9).unwrap();
}

/// Rule 3: dead letters not yet taken count toward `capacity`: an ignored dead-letter stream
/// shows up as backpressure; taking them gives the room back.
#[tokio::test(start_paused = true)]
async fn untaken_dead_letters_hold_capacity() {
    let (tx, mut rx) = timed::Builder::new(Duration::ZERO)
        .capacity(2)
        .max_attempts(1)
        .acked();
    let mut dead = rx.dead_letters();
    tx.send("a", 1).await.unwrap();
    tx.send("b", 2).await.unwrap();
    for delivery in rx.recv().await.unwrap() {
        delivery.retry().await.unwrap();
    }
    assert_eq!(rx.stats().dead_letters, 2);
    let mut send = task::spawn(tx.send("c", 3));
    assert_pending!(send.poll());
    let letter = dead.recv().await.unwrap();
    assert_eq!(
        (letter.key, letter.values, letter.attempts),
        ("a", vec![1], 1)
    );
    assert!(send.is_woken());
    assert!(assert_ready!(send.poll()).is_ok());
    let stats = rx.stats();
    assert_eq!((stats.dead_lettered, stats.dead_letters), (2, 1));
}

/// Rule 3: a dead letter not yet taken holds no key slot under `max_keys`: a key counts there
/// only while it has values pending or in flight.
#[tokio::test(start_paused = true)]
async fn untaken_dead_letters_hold_no_key_slot() {
    let (tx, mut rx) = ordered::Builder::new().max_keys(1).max_attempts(1).acked();
    let _dead = rx.dead_letters();
    tx.try_send(0, "a", 1).unwrap();
    let mut a = rx.recv().await.unwrap();
    assert!(
        tx.try_send(0, "b", 2).unwrap_err().is_full(),
        "a is in flight"
    );
    a.remove(0).retry().await.unwrap();
    assert_eq!(rx.stats().dead_letters, 1);
    tx.try_send(0, "b", 2).unwrap();
    assert_eq!(contents(&rx.recv().await.unwrap()), vec![("b", vec![2])]);
}

// ===== rule 4: closing =====

/// Rule 4: closing makes everything due at once, held retries included, and the stream ends
/// only once nothing is pending and every delivery is decided; a retry after the close still
/// goes out.
#[tokio::test(start_paused = true)]
async fn close_waits_for_every_decision() {
    let (tx, mut rx) = timed::Builder::new(secs(60)).acked();
    tx.send("a", 1).await.unwrap();
    tx.send("b", 2).await.unwrap();
    tx.flush_all();
    let mut batch = rx.recv().await.unwrap().into_iter();
    let a = batch.next().unwrap();
    let b = batch.next().unwrap();
    a.retry_after(secs(3600)).await.unwrap();
    drop(tx);
    let start = Instant::now();
    // "a" is due at once despite its hour-long delay; "b" is still in flight.
    let again = rx.recv().await.unwrap();
    assert_eq!(Instant::now(), start);
    assert_eq!(contents(&again), vec![("a", vec![1])]);
    again.into_iter().next().unwrap().ack().await.unwrap();
    let mut end = task::spawn(rx.recv());
    assert_pending!(end.poll(), "b is undecided");
    b.retry().await.unwrap();
    assert!(end.is_woken());
    let last = assert_ready!(end.poll()).unwrap();
    assert_eq!(contents(&last), vec![("b", vec![2])]);
    drop(end);
    ack_all(last).await;
    assert!(rx.recv().await.is_none());
    assert_eq!(rx.try_recv().unwrap_err(), TryRecvError::Disconnected);
}

// ===== rule 5: every receiver dropped =====

/// Rule 5: with every receiver gone, pending values and dead letters are dropped; deliveries
/// still undecided can be acknowledged, and a retry or a drop loses its values; `lost` counts
/// them all.
#[tokio::test(start_paused = true)]
async fn decisions_after_every_receiver_is_gone() {
    let (tx, mut rx) = ordered::Builder::new().max_attempts(1).acked();
    tx.try_send(0, "a", 1).unwrap();
    tx.try_send(0, "b", 2).unwrap();
    tx.try_send(0, "c", 3).unwrap();
    tx.try_send(0, "d", 4).unwrap();
    let dead = rx.dead_letters();
    let mut batch = rx.try_recv().unwrap().into_iter();
    let a = batch.next().unwrap();
    let b = batch.next().unwrap();
    let c = batch.next().unwrap();
    let d = batch.next().unwrap();
    d.retry().await.unwrap(); // dead-lettered, not taken
    tx.try_send(1, "e", 5).unwrap(); // pending
    drop(rx);
    assert!(tx.is_closed());
    a.ack().await.unwrap();
    b.retry().await.unwrap();
    drop(c);
    let stats = tx.stats();
    assert_eq!((stats.acked, stats.lost, stats.receivers), (1, 4, 0));
    assert_eq!(stats.in_flight_keys, 0);
    let mut dead = dead;
    assert_eq!(dead.recv().await, None);
}

// ===== decisions =====

/// A delivery dropped undecided is retried at once, with the next attempt: it covers a
/// consumer task that panics or is cancelled in the middle of its work.
#[tokio::test(start_paused = true)]
async fn dropped_delivery_is_retried() {
    let (tx, mut rx) = timed::Builder::new(WINDOW).acked();
    tx.send("k", 1).await.unwrap();
    let batch = rx.recv().await.unwrap();
    let at = Instant::now();
    drop(batch);
    let again = rx.recv().await.unwrap();
    assert_eq!(Instant::now(), at, "due at once");
    assert_eq!(contents(&again), vec![("k", vec![1])]);
    assert_eq!(again[0].attempt(), 2);
    assert_eq!(rx.stats().retried, 1);
    ack_all(again).await;
}

/// A consumer that panics with a delivery in hand: another receiver gets it again, with
/// attempt 2.
#[tokio::test(start_paused = true)]
async fn panicking_consumer_hands_the_batch_to_another() {
    let (tx, rx) = timed::Builder::new(WINDOW).acked::<&str, u32>();
    let mut other = rx.clone();
    let mut panicky = rx;
    let crashed = tokio::spawn(async move {
        let batch = panicky.recv().await.unwrap();
        assert_eq!(batch[0].attempt(), 1);
        panic!("the push crashed with {} deliveries in hand", batch.len());
    });
    tx.send("k", 1).await.unwrap();
    assert!(crashed.await.unwrap_err().is_panic());
    let batch = other.recv().await.unwrap();
    assert_eq!(contents(&batch), vec![("k", vec![1])]);
    assert_eq!(batch[0].attempt(), 2);
    ack_all(batch).await;
}

/// `give_up` hands the key and values back and they leave the channel.
#[tokio::test(start_paused = true)]
async fn give_up_hands_the_values_back() {
    let (tx, mut rx) = timed::Builder::new(Duration::ZERO).acked();
    tx.send("k", 1).await.unwrap();
    tx.send("k", 2).await.unwrap();
    let delivery = rx.recv().await.unwrap().remove(0);
    tx.send("k", 3).await.unwrap();
    assert_eq!(delivery.give_up().await.unwrap(), ("k", vec![1, 2]));
    let next = rx.recv().await.unwrap();
    assert_eq!(contents(&next), vec![("k", vec![3])]);
    ack_all(next).await;
    let stats = rx.stats();
    assert_eq!(
        (stats.given_up, stats.acked, stats.in_flight_keys),
        (2, 1, 0)
    );
}

/// A decision is made when it is called: a `give_up` whose future loses a `select!` still
/// gives up, and its values, which only the future hands back, are dropped with it.
#[tokio::test(start_paused = true)]
async fn a_give_up_whose_future_is_dropped_still_gives_up() {
    let (tx, mut rx) = timed::Builder::new(Duration::ZERO).acked();
    tx.send("k", 1).await.unwrap();
    let delivery = rx.recv().await.unwrap().remove(0);
    tokio::select! {
        biased;
        () = std::future::ready(()) => {}
        _ = delivery.give_up() => panic!("the ready branch goes first"),
    }
    let stats = rx.stats();
    assert_eq!((stats.given_up, stats.in_flight_keys), (1, 0));
    assert_eq!(rx.len(), 0);
    drop(tx);
    assert!(rx.recv().await.is_none());
}

/// `max_attempts(n)`: the retry after the n-th attempt sends the values to the dead
/// letters, with the attempt count; nothing is dropped silently.
#[tokio::test(start_paused = true)]
async fn retries_beyond_max_attempts_are_dead_letters() {
    let (tx, mut rx) = timed::Builder::new(Duration::ZERO).max_attempts(3).acked();
    let mut dead = rx.dead_letters();
    tx.send("k", 1).await.unwrap();
    for attempt in 1..=3 {
        let delivery = rx.recv().await.unwrap().remove(0);
        assert_eq!(delivery.attempt(), attempt);
        delivery.retry_after(ms(10)).await.unwrap();
    }
    let letter = dead.recv().await.unwrap();
    assert_eq!(
        (letter.key, letter.values, letter.attempts),
        ("k", vec![1], 3)
    );
    assert_eq!(rx.try_recv().unwrap_err(), TryRecvError::Empty);
    let stats = rx.stats();
    assert_eq!((stats.retried, stats.dead_lettered), (2, 1));
    assert_eq!(&stats.attempts[..3], &[1, 1, 1]);
    drop(tx);
    assert!(rx.recv().await.is_none());
    assert_eq!(dead.recv().await, None, "nothing more can die");
}

/// `entered` is when the oldest value entered, also after a retry.
#[tokio::test(start_paused = true)]
async fn entered_is_the_oldest_values_arrival() {
    let (tx, mut rx) = timed::Builder::new(WINDOW).acked();
    let start = Instant::now();
    tx.send("k", 1).await.unwrap();
    advance(ms(300)).await;
    tx.send("k", 2).await.unwrap();
    let delivery = rx.recv().await.unwrap().remove(0);
    assert_eq!(delivery.entered(), start);
    delivery.retry_after(secs(2)).await.unwrap();
    let again = rx.recv().await.unwrap().remove(0);
    assert_eq!(again.entered(), start);
    again.ack().await.unwrap();
}

// ===== cancel safety, tasks and threads =====

/// `recv` is cancel safe: a cancelled `recv` takes nothing and leaves no key in flight.
#[tokio::test(start_paused = true)]
async fn cancelled_recv_leaves_no_key_in_flight() {
    let (tx, mut rx) = timed::Builder::new(WINDOW).acked();
    tx.send("k", 1).await.unwrap();
    let cancelled = tokio::time::timeout(ms(500), rx.recv()).await;
    assert!(cancelled.is_err());
    assert_eq!(rx.stats().in_flight_keys, 0);
    let batch = rx.recv().await.unwrap();
    assert_eq!(contents(&batch), vec![("k", vec![1])]);
    assert_eq!(batch[0].attempt(), 1);
    ack_all(batch).await;
}

/// A delivery can be sent to another task and decided there, and decided from a blocking
/// thread, where the in-memory decision's future is ready at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decided_from_other_tasks_and_threads() {
    let (tx, mut rx) = timed::Builder::new(Duration::ZERO).acked::<u32, u32>();
    for key in 0..4 {
        tx.send(key, key).await.unwrap();
    }
    drop(tx);
    let mut decided = Vec::new();
    while let Some(batch) = rx.recv().await {
        for delivery in batch {
            let key = *delivery.key();
            decided.push(if key % 2 == 0 {
                tokio::spawn(async move { delivery.ack().await })
                    .await
                    .unwrap()
            } else {
                tokio::task::spawn_blocking(move || futures::executor::block_on(delivery.ack()))
                    .await
                    .unwrap()
            });
        }
    }
    assert_eq!(decided.len(), 4);
    assert!(decided.iter().all(Result::is_ok));
    assert_eq!(rx.stats().acked, 4);
}

/// A delivery dropped with the runtime its consumer ran on is retried; another runtime's
/// receiver gets it.
#[test]
fn delivery_dropped_with_its_runtime_is_retried() {
    let first = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let (tx, mut rx) = timed::Builder::new(Duration::ZERO).acked::<&str, u32>();
    tx.try_send("k", 1).unwrap();
    let mut held = rx.clone();
    first.block_on(async {
        let batch = held.recv().await.unwrap();
        // Left in a task the runtime never finishes.
        tokio::spawn(async move {
            let _batch = batch;
            std::future::pending::<()>().await;
        });
        tokio::task::yield_now().await;
    });
    drop(first);
    let again = rx.try_recv().unwrap();
    assert_eq!(again[0].attempt(), 2);
    assert_eq!(contents(&again), vec![("k", vec![1])]);
}

/// The stream of deliveries composes with `StreamExt` and ends after the last decision.
#[tokio::test(start_paused = true)]
async fn deliveries_as_a_stream() {
    let (tx, rx) = timed::Builder::new(WINDOW).acked::<u32, u32>();
    for i in 0..10 {
        tx.send(i % 3, i).await.unwrap();
    }
    drop(tx);
    let acked: Vec<u32> = rx
        .then(|batch| async move {
            let mut values = Vec::new();
            for delivery in batch {
                values.extend_from_slice(delivery.values());
                delivery.ack().await.unwrap();
            }
            values
        })
        .concat()
        .await;
    let mut acked = acked;
    acked.sort_unstable();
    assert_eq!(acked, (0..10).collect::<Vec<_>>());
}

/// A dead-letter stream waiting when the last receiver goes ends then, even if the channel
/// was closed before.
#[tokio::test(start_paused = true)]
async fn dead_letter_stream_ends_with_the_last_receiver() {
    let (tx, mut rx) = timed::Builder::new(Duration::ZERO).acked::<&str, u32>();
    let mut dead = rx.dead_letters();
    tx.send("k", 1).await.unwrap();
    drop(tx);
    let batch = rx.recv().await.unwrap(); // in flight: the dead letters may still come
    let mut waiting = task::spawn(dead.recv());
    assert_pending!(waiting.poll());
    drop(rx);
    assert!(waiting.is_woken());
    assert_eq!(assert_ready!(waiting.poll()), None);
    drop(batch);
}

/// `ack_all` acknowledges a whole batch, with its room and the keys' newer values back.
#[tokio::test(start_paused = true)]
async fn ack_all_acknowledges_a_batch() {
    let (tx, mut rx) = timed::Builder::new(Duration::ZERO).capacity(3).acked();
    for key in ["a", "b", "c"] {
        tx.send(key, 1).await.unwrap();
    }
    let batch = rx.recv().await.unwrap();
    assert!(
        tx.try_send("a", 2).unwrap_err().is_full(),
        "three in flight"
    );
    keyed_batch::ack::ack_all(batch).await.unwrap();
    let stats = rx.stats();
    assert_eq!((stats.acked, stats.in_flight_keys), (3, 0));
    tx.try_send("b", 2).unwrap();
    let next = rx.recv().await.unwrap();
    assert_eq!(contents(&next), vec![("b", vec![2])]);
    keyed_batch::ack::ack_all(next).await.unwrap();
}

/// A key held by `retry_after` is due when its delay ends, however late a receiver looks:
/// it goes out ahead of a key due after that, even once values came for it while it was out.
#[tokio::test(start_paused = true)]
async fn a_delayed_retry_ranks_by_the_end_of_its_delay() {
    let (tx, mut rx) = timed::Builder::new(ms(100)).acked();
    let start = Instant::now();
    tx.send(1, 10).await.unwrap();
    advance(ms(100)).await;
    let delivery = rx.try_recv().unwrap().remove(0);
    tx.send(1, 11).await.unwrap(); // a new run, due at 200 ms
    tx.send_by(2, 20, start + ms(120)).await.unwrap();
    delivery.retry_after(ms(10)).await.unwrap(); // due at 110 ms
    assert_eq!(rx.next_deadline(), Some(start + ms(110)));
    advance(ms(50)).await; // a receiver looks at 150 ms
    let batch = rx.try_recv().unwrap();
    assert_eq!(contents(&batch), vec![(1, vec![10, 11]), (2, vec![20])]);
    ack_all(batch).await;
}

/// `retry_after`: a delay whose end the clock cannot hold never ends, and no deadline is
/// reported for it; the close brings the key out, and from then `next_deadline` is the time
/// it closed. It used to end about 584 years after the channel was made, which
/// `next_deadline` reported too; and after the close, `next_deadline` said `None`.
#[tokio::test(start_paused = true)]
async fn a_retry_after_the_longest_delay_waits_for_the_close() {
    let year = secs(365 * 24 * 3600);
    // Waited a millennium, past what the channel's clock holds, then closed by dropping the
    // sender; or waited a year and closed by the receiver.
    for (wait, close_by_drop) in [(year * 1000, true), (year, false)] {
        let (tx, mut rx) = timed::Builder::new(Duration::ZERO).acked();
        tx.send("k", 1).await.unwrap();
        let delivery = rx.recv().await.unwrap().remove(0);
        delivery.retry_after(Duration::MAX).await.unwrap();
        assert_eq!(rx.next_deadline(), None);
        let waited = tokio::time::timeout(wait, rx.recv()).await;
        assert!(waited.is_err(), "came back after {wait:?}");
        match close_by_drop {
            true => drop(tx),
            false => rx.close(),
        }
        let closed_at = Instant::now();
        let next = rx.next_deadline().expect("due once closed");
        if wait == year {
            assert_eq!(next, closed_at);
        }
        let again = rx.recv().await.unwrap().remove(0);
        assert_eq!(Instant::now(), closed_at);
        assert_eq!((again.values(), again.attempt()), (&[1][..], 2));
    }
}

/// `Deliveries::due`: values sent, or a flush, while a `retry_after` holds a key give it no
/// other reason when the deadline it went out with is earlier: it counts by that one's.
#[tokio::test(start_paused = true)]
async fn values_sent_while_a_retry_after_holds_the_key_give_it_no_other_reason() {
    let (tx, mut rx) = timed::Builder::new(secs(1)).acked();
    tx.send("k", 1).await.unwrap();
    let d = rx.recv().await.unwrap().remove(0);
    d.retry_after(secs(5)).await.unwrap();
    tx.send("k", 2).await.unwrap();
    tx.flush(&"k");
    assert!(rx.try_recv().is_err(), "held until its delay ends");
    let d = rx.recv().await.unwrap().remove(0);
    assert_eq!(d.values(), &[1, 2]);
    let by = rx.stats().delivered_by;
    assert_eq!((by.due, by.flush), (2, 0), "{by:?}");
}

/// `Deliveries::due`: a retried key counts by the reason it went out with, unless values sent
/// while it was out made it due sooner for another reason: a full key, or a flush.
#[tokio::test(start_paused = true)]
async fn a_retried_key_counts_by_the_reason_its_newer_values_gave_it() {
    let (tx, mut rx) = timed::Builder::new(secs(1)).max_values_per_key(2).acked();
    tx.send("k", 1).await.unwrap();
    let d = rx.recv().await.unwrap().remove(0);
    tx.send("k", 2).await.unwrap();
    tx.send("k", 3).await.unwrap(); // full while out
    d.retry().await.unwrap();
    let d = rx.try_recv().unwrap().remove(0);
    assert_eq!(d.values(), &[1, 2, 3]);
    let by = rx.stats().delivered_by;
    assert_eq!((by.due, by.full_key), (1, 1), "{by:?}");
    d.ack().await.unwrap();

    tx.send("j", 1).await.unwrap();
    advance(secs(1)).await;
    let d = rx.recv().await.unwrap().remove(0);
    tx.send("j", 2).await.unwrap();
    tx.flush(&"j"); // flushed while out
    d.retry().await.unwrap();
    let d = rx.try_recv().unwrap().remove(0);
    assert_eq!(d.values(), &[1, 2]);
    let by = rx.stats().delivered_by;
    assert_eq!((by.due, by.full_key, by.flush), (2, 1, 1), "{by:?}");

    // A retried key whose newer values gave it no other reason counts by its own.
    tx.send("i", 1).await.unwrap();
    advance(secs(1)).await;
    let d = rx.recv().await.unwrap().remove(0);
    tx.send("i", 2).await.unwrap();
    d.retry().await.unwrap();
    assert_eq!(rx.try_recv().unwrap().remove(0).values(), &[1, 2]);
    assert_eq!(rx.stats().delivered_by.due, 4);
}

/// `ordered::AckReceiver::recv`: its one wait that needs tokio's timer is a `retry_after`
/// delay. In a runtime without time, it waits for sends and decisions, and panics only
/// when it has to wait out such a delay.
#[test]
fn an_ordered_receiver_needs_a_timer_only_for_a_retry_delay() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        let (tx, mut rx) = ordered::Builder::new().acked();
        let sender = tx.clone();
        tokio::spawn(async move { sender.send(1, "k", 1).await.unwrap() });
        let delivery = rx.recv().await.unwrap().remove(0);
        delivery.retry().await.unwrap();
        let delivery = rx.recv().await.unwrap().remove(0);
        assert_eq!(delivery.attempt(), 2);
        delivery.retry_after(ms(20)).await.unwrap();
        let waited = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(rx.recv()));
        let panic = waited
            .await
            .expect_err("waited out a delay without a timer");
        let text = panic.downcast_ref::<String>().map_or("", String::as_str);
        assert!(text.contains("timers are disabled"), "{text}");
        drop(tx);
    });
}

/// `timed::AckReceiver`: a retried key keeps the deadline it went out with, so once due
/// again (at once, or when its `retry_after` delay ends) it comes before a key whose
/// deadline is later, though that one came due while it was out. `next_deadline` counts a
/// held key from its delay's end, and a key retried at once by the deadline it kept.
#[tokio::test(start_paused = true)]
async fn a_retried_key_keeps_the_deadline_it_went_out_with() {
    for delay in [ms(0), ms(10)] {
        let (tx, mut rx) = timed::Builder::new(ms(100)).max_batch(1).acked();
        let start = Instant::now();
        tx.send(1, 10).await.unwrap(); // due at 100 ms
        advance(ms(10)).await;
        tx.send(2, 20).await.unwrap(); // due at 110 ms
        advance(ms(90)).await;
        let first = rx.try_recv().unwrap().remove(0);
        assert_eq!(*first.key(), 1);
        advance(ms(20)).await; // key 2 came due while key 1 was out
        first.retry_after(delay).await.unwrap();
        let next = rx.next_deadline();
        match delay.is_zero() {
            true => assert_eq!(next, Some(start + ms(100)), "the deadline it kept"),
            false => assert_eq!(next, Some(start + ms(110)), "key 2's: key 1 is held"),
        }
        advance(delay).await;
        let order = keys_due_now(&mut rx).await;
        assert_eq!(order, vec![1, 2], "retried after {delay:?}");
    }
}

/// `Deliveries::due`: a retried key counts by the reason it went out with (a flush, a full
/// key), unless a value sent for it while it was out came due before the retry's time:
/// then by that value's deadline, `due`.
#[tokio::test(start_paused = true)]
async fn a_retried_key_counts_by_a_newer_values_deadline_that_passed_first() {
    // Went out flushed; retried at once, after the newer value's deadline.
    let (tx, mut rx) = timed::Builder::new(secs(1)).acked();
    tx.send("k", 1).await.unwrap();
    tx.flush(&"k");
    let d = rx.try_recv().unwrap().remove(0);
    tx.send("k", 2).await.unwrap(); // waits behind the delivery; due 1 s on
    advance(secs(2)).await;
    d.retry().await.unwrap();
    let d = rx.try_recv().unwrap().remove(0);
    assert_eq!(d.values(), &[1, 2]);
    let by = rx.stats().delivered_by;
    assert_eq!((by.flush, by.due), (1, 1), "{by:?}");
    // Went out full; its retry delay ends after the newer value's deadline.
    let (tx, mut rx) = timed::Builder::new(secs(1)).max_values_per_key(2).acked();
    tx.send("k", 1).await.unwrap();
    tx.send("k", 2).await.unwrap(); // full: due at once
    let d = rx.try_recv().unwrap().remove(0);
    tx.send("k", 3).await.unwrap(); // one value behind the delivery: not full
    d.retry_after(secs(5)).await.unwrap();
    let waited = tokio::spawn(async move {
        let d = rx.recv().await.unwrap().remove(0);
        let values = d.values().to_vec();
        d.ack().await.unwrap();
        (values, rx.stats().delivered_by)
    });
    let (values, by) = waited.await.unwrap();
    assert_eq!(values, [1, 2, 3]);
    assert_eq!((by.full_key, by.due), (1, 1), "{by:?}");
    drop(tx);
}

/// A retried key with values sent for it while it was out is due by the earliest of their
/// deadlines, if that comes before the retry: here after a key due a moment before them.
#[tokio::test(start_paused = true)]
async fn a_retried_key_with_newer_values_is_due_by_theirs() {
    let (tx, mut rx) = timed::Builder::new(ms(100)).max_batch(1).acked();
    tx.send(1, 10).await.unwrap(); // due at 100 ms
    advance(ms(100)).await;
    let delivery = rx.try_recv().unwrap().remove(0);
    advance(ms(5)).await;
    tx.send(2, 20).await.unwrap(); // due at 205 ms
    advance(ms(5)).await;
    tx.send(1, 11).await.unwrap(); // due at 210 ms, behind the delivery
    advance(ms(190)).await;
    delivery.retry().await.unwrap();
    let order = keys_due_now(&mut rx).await;
    // Key 1's two values go out a batch each.
    let want = vec![2, 1, 1];
    assert_eq!(order, want, "key 2 (205 ms) before key 1 (210 ms, not 100)");
}

/// `Deliveries::close`: a key retried after the close counts by its own reason, `due`
/// here, though a value sent for it while it was out (due later) gave it no other: the
/// retry is ranked as of the close at the latest. It used to be ranked as of the decision,
/// after the close, and counted `close`. A receiver task waits in `recv`.
#[tokio::test(start_paused = true)]
async fn a_key_retried_after_the_close_counts_by_its_reason_with_a_newer_value() {
    let (tx, mut rx) = timed::Builder::new(secs(1)).acked();
    tx.send("k", 1).await.unwrap();
    advance(secs(1)).await;
    let d = rx.recv().await.unwrap().remove(0); // due by its deadline
    tx.send("k", 2).await.unwrap(); // due at 2 s: gives the key no other reason
    let consumer = tokio::spawn(async move {
        let mut seen = Vec::new();
        while let Some(batch) = rx.recv().await {
            for d in batch {
                seen.push(d.values().to_vec());
                d.ack().await.unwrap();
            }
        }
        (seen, rx.stats().delivered_by)
    });
    advance(ms(100)).await;
    drop(tx); // the close
    advance(ms(100)).await;
    d.retry().await.unwrap();
    let (seen, by) = consumer.await.unwrap();
    assert_eq!(seen, vec![vec![1, 2]]);
    assert_eq!((by.due, by.close), (2, 0), "{by:?}");
}

/// The same for a key that a `retry_after` holds when the channel closes and a receiver
/// takes a moment after.
#[tokio::test(start_paused = true)]
async fn a_key_held_by_retry_after_at_the_close_counts_by_its_reason_when_taken_later() {
    let (tx, mut rx) = timed::Builder::new(secs(1)).acked();
    let start = Instant::now();
    tx.send("k", 1).await.unwrap();
    advance(secs(1)).await;
    let d = rx.recv().await.unwrap().remove(0); // due by its deadline
    tx.send("k", 2).await.unwrap(); // due at 2 s: gives the key no other reason
    d.retry_after(secs(10)).await.unwrap();
    advance(ms(100)).await;
    drop(tx); // the close, while the delay holds the key
    advance(ms(100)).await;
    assert!(start.elapsed() < secs(2));
    let d = rx.try_recv().unwrap().remove(0);
    assert_eq!(d.values(), &[1, 2]);
    d.ack().await.unwrap();
    let by = rx.stats().delivered_by;
    assert_eq!((by.due, by.close), (2, 0), "{by:?}");
}

/// `timed::AckReceiver`: the rest of a key that a batch split keeps the deadline the key
/// went out with, lowered only by an earlier one, so its retry is due by that deadline,
/// though a value sent while its first part was out is due later than the retry.
#[tokio::test(start_paused = true)]
async fn a_split_keys_retry_keeps_the_deadline_it_went_out_with() {
    let (tx, mut rx) = timed::Builder::new(ms(100)).max_batch(2).acked();
    let start = Instant::now();
    for v in 0..3 {
        tx.send(1, v).await.unwrap(); // due at 100 ms
    }
    advance(ms(10)).await;
    tx.send(2, 20).await.unwrap(); // due at 110 ms
    advance(ms(90)).await;
    let first = rx.try_recv().unwrap().remove(0);
    assert_eq!((first.key(), first.values()), (&1, &[0, 1][..]), "split");
    advance(ms(5)).await;
    tx.send(1, 3).await.unwrap(); // sent while key 1 is out: due at 205 ms
    advance(ms(15)).await; // 120 ms: key 2 came due while key 1 was out
    first.retry().await.unwrap();
    let next = rx.next_deadline();
    let order = keys_due_now(&mut rx).await;
    assert_eq!(
        order[0], 1,
        "key 1 (100 ms) before key 2 (110 ms): {order:?}"
    );
    assert_eq!(next, Some(start + ms(100)), "the deadline it went out with");
}

/// `Deliveries::close`: a key that went out for the close, before its deadline, counts as
/// `close` again when retried after it, at once or by a `retry_after` (which the close does
/// not wait out).
#[tokio::test(start_paused = true)]
async fn a_key_that_went_out_for_the_close_counts_close_when_retried() {
    for delay in [Duration::ZERO, HOUR] {
        let (tx, mut rx) = timed::Builder::new(Duration::from_secs(1)).acked();
        tx.send("k", 1).await.unwrap();
        advance(ms(100)).await;
        drop(tx); // closed 900 ms before the key's deadline
        let consumer = tokio::spawn(async move {
            let d = rx.recv().await.unwrap().remove(0);
            let by = rx.stats().delivered_by;
            assert_eq!((by.close, by.due), (1, 0), "{by:?}");
            advance(ms(100)).await;
            d.retry_after(delay).await.unwrap();
            let d = rx.recv().await.unwrap().remove(0);
            assert_eq!(d.attempt(), 2);
            d.ack().await.unwrap();
            assert!(rx.recv().await.is_none());
            rx.stats().delivered_by
        });
        let by = consumer.await.unwrap();
        assert_eq!(
            (by.close, by.due),
            (2, 0),
            "retried after {delay:?}: {by:?}"
        );
    }
}

/// `Deliveries::due`: a key that `drain_now` took before its deadline counted as `flush`;
/// retried, it counts by its deadline's reason, `due`.
#[tokio::test(start_paused = true)]
async fn a_key_that_drain_now_took_counts_by_its_deadlines_reason_when_retried() {
    let (tx, mut rx) = timed::Builder::new(Duration::from_secs(1)).acked();
    tx.send("k", 1).await.unwrap();
    let d = rx.drain_now().remove(0).remove(0);
    let by = rx.stats().delivered_by;
    assert_eq!((by.flush, by.due), (1, 0), "{by:?}");
    d.retry().await.unwrap();
    let d = rx.try_recv().unwrap().remove(0);
    assert_eq!(d.attempt(), 2);
    d.ack().await.unwrap();
    let by = rx.stats().delivered_by;
    assert_eq!((by.flush, by.due), (1, 1), "{by:?}");
    drop(tx);
}

/// `timed::AckReceiver`, `Deliveries::due`: while a `retry_after` holds a key, a flush, a
/// value that fills it, or a `send_by` earlier than its delay's end lowers the deadline it
/// is due by when the delay ends, and a flush or a full key gives it that reason. Here key
/// `k` (a value sent while it was out is due at 200 ms; held until 150 ms) comes before `c`
/// (due at 130 ms), as of 110 ms.
#[tokio::test(start_paused = true)]
async fn what_comes_while_a_retry_after_holds_a_key_can_make_it_due_sooner() {
    for what in ["flush", "fill", "send_by"] {
        let builder = timed::Builder::new(ms(100));
        let (tx, mut rx) = match what {
            "fill" => builder.max_values_per_key(3).acked(),
            _ => builder.acked(),
        };
        let start = Instant::now();
        tx.send("k", 1).await.unwrap();
        advance(ms(100)).await;
        let d = rx.try_recv().unwrap().remove(0);
        tx.send("k", 2).await.unwrap(); // due at 200 ms, behind the delivery
        d.retry_after(ms(50)).await.unwrap(); // held until 150 ms
        advance(ms(10)).await;
        match what {
            "flush" => tx.flush(&"k"),
            "fill" => tx.send("k", 3).await.unwrap(),
            _ => tx.send_by("k", 3, start + ms(115)).await.unwrap(),
        }
        tx.send_by("c", 9, start + ms(130)).await.unwrap();
        advance(ms(60)).await;
        let order = keys_due_now(&mut rx).await;
        assert_eq!(order, vec!["k", "c"], "{what}");
        let by = rx.stats().delivered_by;
        let want = match what {
            "flush" => (2, 1, 0),
            "fill" => (2, 0, 1),
            _ => (3, 0, 0),
        };
        assert_eq!((by.due, by.flush, by.full_key), want, "{what}: {by:?}");
    }
}

/// `Deliveries::due`: a value sent while a key was out, due exactly at the retry's time,
/// gives the retried key its reason (`due`), though the key went out for a flush.
#[tokio::test(start_paused = true)]
async fn a_newer_deadline_at_the_retry_time_gives_its_reason() {
    let (tx, mut rx) = timed::Builder::new(ms(100)).acked();
    tx.send("k", 1).await.unwrap();
    tx.flush(&"k");
    let d = rx.try_recv().unwrap().remove(0); // `flush`
    tx.send("k", 2).await.unwrap(); // due at 100 ms
    advance(ms(100)).await;
    d.retry().await.unwrap();
    let d = rx.try_recv().unwrap().remove(0);
    assert_eq!(d.values(), &[1, 2]);
    d.ack().await.unwrap();
    let by = rx.stats().delivered_by;
    assert_eq!((by.flush, by.due), (1, 1), "{by:?}");
    drop(tx);
}

/// `Deliveries::close`: a key that went out for the close counts as `close` again when
/// retried at the very moment of the close, too: its retry keeps its deadline, after it.
#[tokio::test(start_paused = true)]
async fn a_key_that_went_out_for_the_close_retried_at_the_close_counts_close() {
    let (tx, mut rx) = timed::Builder::new(Duration::from_secs(1)).acked();
    tx.send("k", 1).await.unwrap();
    drop(tx);
    let consumer = tokio::spawn(async move {
        let d = rx.recv().await.unwrap().remove(0); // `close`
        d.retry().await.unwrap();
        let d = rx.recv().await.unwrap().remove(0);
        d.ack().await.unwrap();
        assert!(rx.recv().await.is_none());
        rx.stats().delivered_by
    });
    let by = consumer.await.unwrap();
    assert_eq!((by.close, by.due), (2, 0), "{by:?}");
}

/// `timed::AckReceiver`: a key that `drain_now` took before the close did not go out for
/// it: retried after the close, it is due as of the close, before a key due after it, and
/// counts by its deadline's reason (`due`).
#[tokio::test(start_paused = true)]
async fn a_key_drain_now_took_before_the_close_is_due_by_the_close_when_retried_after_it() {
    let start = Instant::now();
    let (tx, mut rx) = timed::Builder::new(Duration::from_secs(1)).acked();
    tx.send("k", 1).await.unwrap();
    let d = rx.drain_now().remove(0).remove(0); // `flush`
    advance(ms(50)).await;
    tx.send_by("b", 2, start + ms(150)).await.unwrap();
    advance(ms(50)).await;
    rx.close(); // at 100 ms
    advance(ms(100)).await;
    d.retry().await.unwrap(); // at 200 ms
    let consumer = tokio::spawn(async move {
        let mut order = Vec::new();
        while let Some(batch) = rx.recv().await {
            order.extend(batch.iter().map(|d| *d.key()));
            keyed_batch::ack::ack_all(batch).await.unwrap();
        }
        (order, rx.stats().delivered_by)
    });
    let (order, by) = consumer.await.unwrap();
    assert_eq!(order, vec!["k", "b"], "{by:?}");
    assert_eq!((by.flush, by.due, by.close), (1, 1, 1), "{by:?}");
}

/// `flush` and `flush_all` of a key in flight with nothing pending: its retry ranks as of
/// the flush at the latest, with that reason. Here `k`, taken early by `drain_now` (due at
/// 100 ms), flushed at 10 ms and retried at 20 ms, comes before `c` (due at 15 ms).
#[tokio::test(start_paused = true)]
async fn a_flush_of_a_key_in_flight_ranks_its_retry() {
    for all in [false, true] {
        let (tx, mut rx) = timed::Builder::new(ms(100)).acked();
        let start = Instant::now();
        tx.send("k", 1).await.unwrap();
        let d = rx.drain_now().remove(0).remove(0); // `flush`
        advance(ms(10)).await;
        match all {
            true => tx.flush_all(),
            false => tx.flush(&"k"),
        }
        tx.send_by("c", 2, start + ms(15)).await.unwrap();
        advance(ms(10)).await;
        d.retry().await.unwrap();
        let order = keys_due_now(&mut rx).await;
        assert_eq!(order, vec!["k", "c"], "flush_all: {all}");
        let by = rx.stats().delivered_by;
        assert_eq!((by.flush, by.due), (2, 1), "flush_all: {all}: {by:?}");
    }
}
