//! `Sender` as a `futures::Sink`: `forward`, `poll_ready` waiting for room without busy
//! looping, values handed back on close; and `Sender::closed`.

mod common;

use std::collections::BTreeMap;
use std::task::Poll;
use std::time::Duration;

use futures::{stream, Sink, SinkExt, StreamExt};
use keyed_batch::error::{SendError, TrySendError};
use keyed_batch::{ordered, timed};
use tokio::time::{advance, Instant};
use tokio_test::task::{self, Spawn};
use tokio_test::{assert_pending, assert_ready, assert_ready_eq, assert_ready_ok};

use common::time::{ms, secs};

const WINDOW: Duration = secs(10);

/// `poll_ready` on a spawned sink.
fn ready<S: Sink<I> + Unpin, I>(sink: &mut Spawn<S>) -> Poll<Result<(), S::Error>> {
    sink.enter(|cx, sink| sink.poll_ready(cx))
}

/// `poll_flush` on a spawned sink.
fn flush<S: Sink<I> + Unpin, I>(sink: &mut Spawn<S>) -> Poll<Result<(), S::Error>> {
    sink.enter(|cx, sink| sink.poll_flush(cx))
}

/// `start_send` on a spawned sink.
fn start<S: Sink<I> + Unpin, I>(sink: &mut Spawn<S>, item: I) -> Result<(), S::Error> {
    sink.enter(|_, sink| sink.start_send(item))
}

/// Groups batches by key, keeping each key's values in delivery order.
fn per_key<K: Ord, V>(batches: Vec<Vec<(K, Vec<V>)>>) -> BTreeMap<K, Vec<V>> {
    let mut map = BTreeMap::new();
    for (key, values) in batches.into_iter().flatten() {
        map.entry(key).or_insert_with(Vec::new).extend(values);
    }
    map
}

// ===== forward =====

/// `stream.map(Ok).forward(tx)` sends every value in order, and dropping the sink at the
/// end closes the channel, so everything is due and the stream ends (`timed`).
#[tokio::test(start_paused = true)]
async fn forward_delivers_in_order_timed() {
    let (tx, rx) = timed::channel(WINDOW);
    let items = (0..9).map(|i| (i % 3, i));
    stream::iter(items).map(Ok).forward(tx).await.unwrap();
    assert!(rx.is_closed());
    let start = Instant::now();
    let batches: Vec<_> = rx.collect().await;
    assert_eq!(Instant::now(), start, "closed: no window to wait");
    assert_eq!(
        batches,
        vec![vec![
            (0, vec![0, 3, 6]),
            (1, vec![1, 4, 7]),
            (2, vec![2, 5, 8])
        ]]
    );
}

/// `forward` into a bounded channel waits for room and delivers everything in order while
/// a receiver drains it; the stream ends when the forward is done (`timed`).
#[tokio::test(start_paused = true)]
async fn forward_into_bounded_channel_timed() {
    let (tx, rx) = timed::Builder::new(ms(5)).capacity(3).max_batch(2).build();
    let stats = rx.clone();
    let items = (0..30).map(|i| (i % 4, i));
    let forward = stream::iter(items).map(Ok).forward(tx);
    let (sent, batches) = tokio::join!(forward, rx.collect::<Vec<_>>());
    sent.unwrap();
    assert!(batches
        .iter()
        .all(|b| b.iter().map(|(_, v)| v.len()).sum::<usize>() <= 2));
    let want: BTreeMap<_, Vec<_>> = (0..4)
        .map(|k| (k, (0..30).filter(|i| i % 4 == k).collect()))
        .collect();
    assert_eq!(per_key(batches), want);
    assert_eq!(stats.stats().sent, 30);
}

/// `forward` sends `(sort_key, key, value)` triples in order and closes the channel at the
/// end (`ordered`).
#[tokio::test(start_paused = true)]
async fn forward_delivers_in_order_ordered() {
    let (tx, rx) = ordered::channel();
    let items = vec![(3, "c", 1), (1, "a", 2), (2, "b", 3), (3, "a", 4)];
    stream::iter(items).map(Ok).forward(tx).await.unwrap();
    let batches: Vec<_> = rx.collect().await;
    assert_eq!(
        batches,
        vec![vec![("a", vec![2, 4]), ("b", vec![3]), ("c", vec![1])]]
    );
}

/// `forward` into a bounded `ordered` channel with a receiver draining it concurrently.
#[tokio::test(start_paused = true)]
async fn forward_into_bounded_channel_ordered() {
    let (tx, mut rx) = ordered::Builder::new().capacity(2).build();
    let items = (0..20).map(|i| (i, i % 3, i));
    let forward = stream::iter(items).map(Ok).forward(tx);
    let receive = async {
        let mut batches = Vec::new();
        while let Some(batch) = rx.recv().await {
            batches.push(batch);
            tokio::task::yield_now().await;
        }
        batches
    };
    let (sent, batches) = tokio::join!(forward, receive);
    sent.unwrap();
    assert!(batches.len() > 1, "the bound made the forward wait");
    let want: BTreeMap<_, Vec<_>> = (0..3)
        .map(|k| (k, (0..20).filter(|i| i % 3 == k).collect()))
        .collect();
    assert_eq!(per_key(batches), want);
}

/// `forward` into a closed channel fails at once: `poll_ready` refuses, with no value.
#[tokio::test(start_paused = true)]
async fn forward_into_closed_channel_hands_value_back() {
    let (tx, rx) = timed::channel::<&str, i32>(WINDOW);
    drop(rx);
    let items = vec![("a", 1), ("b", 2)];
    // `poll_ready` refuses before any value is handed over.
    let err = stream::iter(items).map(Ok).forward(tx).await.unwrap_err();
    assert_eq!(err, SendError(None));

    let (tx, rx) = ordered::channel::<u8, &str, i32>();
    rx.close();
    let err = stream::iter(vec![(1, "a", 1)])
        .map(Ok)
        .forward(tx)
        .await
        .unwrap_err();
    assert_eq!(err.into_inner(), None);
}

// ===== poll_ready =====

/// `poll_ready` with a buffered value on a full channel is `Pending`; the task is not woken
/// (no busy loop), even when polled again or as time passes, until a batch is taken; then
/// the value goes in, and its window starts then (`timed`).
#[tokio::test(start_paused = true)]
async fn poll_ready_waits_for_room_timed() {
    let (tx, mut rx) = timed::Builder::new(WINDOW).capacity(1).build();
    let mut sink = task::spawn(tx);
    assert_ready_ok!(ready(&mut sink));
    start(&mut sink, ("a", 1)).unwrap();
    assert_ready_ok!(ready(&mut sink));
    assert_eq!(rx.len(), 1);

    start(&mut sink, ("b", 2)).unwrap();
    assert_pending!(ready(&mut sink));
    assert!(!sink.is_woken());
    assert_pending!(flush(&mut sink));
    assert!(!sink.is_woken());
    advance(WINDOW - ms(1)).await;
    assert!(!sink.is_woken());
    assert_eq!(rx.len(), 1);

    assert_eq!(rx.recv().await, Some(vec![("a", vec![1])]));
    assert!(sink.is_woken());
    assert_ready_ok!(ready(&mut sink));
    assert_eq!(rx.len(), 1);
    assert_eq!(rx.next_deadline(), Some(Instant::now() + WINDOW));
    assert_eq!(sink.stats().sent, 2);
}

/// `poll_ready` waits for room and is woken only when a batch is taken (`ordered`).
#[tokio::test(start_paused = true)]
async fn poll_ready_waits_for_room_ordered() {
    let (tx, mut rx) = ordered::Builder::new().capacity(1).build();
    let mut sink = task::spawn(tx);
    start(&mut sink, (1, "a", 'x')).unwrap();
    assert_ready_ok!(flush(&mut sink));
    start(&mut sink, (0, "b", 'y')).unwrap();
    assert_pending!(ready(&mut sink));
    assert_pending!(ready(&mut sink));
    assert!(!sink.is_woken());
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec!['x'])]));
    assert!(sink.is_woken());
    assert_ready_ok!(ready(&mut sink));
    assert_eq!(rx.try_recv(), Ok(vec![("b", vec!['y'])]));
}

/// `poll_ready` honours `max_weight`: a buffered value that does not fit waits.
#[tokio::test(start_paused = true)]
async fn poll_ready_honours_max_weight() {
    let (tx, mut rx) = timed::Builder::new(Duration::ZERO)
        .weigher(|v: &usize| *v)
        .max_weight(10)
        .build();
    tx.try_send("a", 8).unwrap();
    let mut sink = task::spawn(tx.clone());
    start(&mut sink, ("b", 3)).unwrap();
    assert_pending!(ready(&mut sink));
    assert!(!sink.is_woken());
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![8])]));
    assert!(sink.is_woken());
    assert_ready_ok!(ready(&mut sink));
    assert_eq!(rx.stats().pending_weight, 3);
}

/// `poll_ready` honours `max_keys`: a buffered value for a new key waits, while values for
/// pending keys still go in from other senders.
#[tokio::test(start_paused = true)]
async fn poll_ready_honours_max_keys() {
    let (tx, mut rx) = ordered::Builder::new().max_keys(1).build();
    tx.try_send(1, "a", 1).unwrap();
    let mut sink = task::spawn(tx.clone());
    start(&mut sink, (1, "b", 2)).unwrap();
    assert_pending!(ready(&mut sink));
    tx.try_send(1, "a", 3).unwrap();
    assert!(!sink.is_woken());
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![1, 3])]));
    assert!(sink.is_woken());
    assert_ready_ok!(ready(&mut sink));
    assert_eq!(rx.try_recv(), Ok(vec![("b", vec![2])]));
}

/// A sink waiting for room holds no place in line: when room comes back, a waiting `send`
/// goes first, and the sink is woken once no send waits.
#[tokio::test(start_paused = true)]
async fn waiting_sink_holds_no_place_in_line() {
    let (tx, mut rx) = timed::Builder::new(Duration::ZERO).capacity(1).build();
    tx.try_send("a", 1).unwrap();
    let tx2 = tx.clone();
    let mut sink = task::spawn(tx);
    start(&mut sink, ("b", 2)).unwrap();
    assert_pending!(ready(&mut sink));
    let mut send = task::spawn(tx2.send("c", 3));
    assert_pending!(send.poll());
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![1])]));
    assert!(send.is_woken());
    assert_pending!(ready(&mut sink));
    assert_ready_ok!(send.poll());
    assert_eq!(rx.try_recv(), Ok(vec![("c", vec![3])]));
    assert!(sink.is_woken());
    assert_ready_ok!(ready(&mut sink));
    assert_eq!(rx.try_recv(), Ok(vec![("b", vec![2])]));
}

// ===== values handed back =====

/// A buffered value waiting for room comes back in the error when the channel closes
/// (`timed`, `close`).
#[tokio::test(start_paused = true)]
async fn buffered_value_comes_back_on_close_timed() {
    let (tx, rx) = timed::Builder::new(WINDOW).capacity(1).build();
    tx.try_send("a", 1).unwrap();
    let mut sink = task::spawn(tx);
    start(&mut sink, ("b", 2)).unwrap();
    assert_pending!(ready(&mut sink));
    rx.close();
    assert!(sink.is_woken());
    assert_ready_eq!(ready(&mut sink), Err(SendError(Some(("b", 2)))));
}

/// A buffered value waiting for room comes back in the error when every receiver is gone
/// (`ordered`).
#[tokio::test(start_paused = true)]
async fn buffered_value_comes_back_on_drop_ordered() {
    let (tx, rx) = ordered::Builder::new().capacity(1).build();
    tx.try_send(1, "a", 1).unwrap();
    let mut sink = task::spawn(tx);
    start(&mut sink, (0, "b", 2)).unwrap();
    assert_pending!(flush(&mut sink));
    drop(rx);
    assert!(sink.is_woken());
    assert_ready_eq!(flush(&mut sink), Err(SendError(Some((0, "b", 2)))));
}

/// A value buffered on an already closed channel comes back from the next flush or close.
#[tokio::test(start_paused = true)]
async fn buffered_value_comes_back_on_closed_channel() {
    let (tx, rx) = timed::channel(WINDOW);
    drop(rx);
    let mut sink = task::spawn(tx);
    start(&mut sink, ("a", 1)).unwrap();
    let closed = sink.enter(|cx, sink| sink.poll_close(cx));
    assert_ready_eq!(closed, Err(SendError(Some(("a", 1)))));

    let (tx, rx) = ordered::channel();
    rx.close();
    let mut sink = task::spawn(tx);
    start(&mut sink, (1, "a", 1)).unwrap();
    assert_ready_eq!(flush(&mut sink), Err(SendError(Some((1, "a", 1)))));
}

// ===== closed =====

/// `closed()` is pending while a receiver lives, and resolves when the last one is dropped
/// (`timed`).
#[tokio::test(start_paused = true)]
async fn closed_resolves_on_receiver_drop_timed() {
    let (tx, rx) = timed::channel::<u8, u8>(WINDOW);
    let rx2 = rx.clone();
    let mut closed = task::spawn(tx.closed());
    assert_pending!(closed.poll());
    drop(rx);
    assert!(!closed.is_woken());
    assert_pending!(closed.poll());
    drop(rx2);
    assert!(closed.is_woken());
    assert_ready!(closed.poll());
}

/// `closed()` resolves when the last receiver is dropped (`ordered`).
#[tokio::test(start_paused = true)]
async fn closed_resolves_on_receiver_drop_ordered() {
    let (tx, rx) = ordered::channel::<u8, u8, u8>();
    let mut closed = task::spawn(tx.closed());
    assert_pending!(closed.poll());
    advance(WINDOW).await;
    assert!(!closed.is_woken());
    drop(rx);
    assert!(closed.is_woken());
    assert_ready!(closed.poll());
}

/// `closed()` resolves on `Receiver::close`, for every waiting call (`timed`).
#[tokio::test(start_paused = true)]
async fn closed_resolves_on_close_timed() {
    let (tx, rx) = timed::channel::<u8, u8>(WINDOW);
    let tx2 = tx.clone();
    let mut closed = task::spawn(tx.closed());
    let mut closed2 = task::spawn(tx2.closed());
    assert_pending!(closed.poll());
    assert_pending!(closed2.poll());
    rx.close();
    assert!(closed.is_woken());
    assert!(closed2.is_woken());
    assert_ready!(closed.poll());
    assert_ready!(closed2.poll());
}

/// `closed()` resolves on `Receiver::close` (`ordered`).
#[tokio::test(start_paused = true)]
async fn closed_resolves_on_close_ordered() {
    let (tx, rx) = ordered::channel::<u8, u8, u8>();
    tx.try_send(1, 1, 1).unwrap();
    let mut closed = task::spawn(tx.closed());
    assert_pending!(closed.poll());
    rx.close();
    assert!(closed.is_woken());
    assert_ready!(closed.poll());
}

/// `closed()` on a channel that is already closed resolves at once.
#[tokio::test(start_paused = true)]
async fn closed_when_already_closed() {
    let (tx, rx) = timed::channel::<u8, u8>(WINDOW);
    rx.close();
    let mut closed = task::spawn(tx.closed());
    assert_ready!(closed.poll());
    drop(closed);
    let (tx, rx) = ordered::channel::<u8, u8, u8>();
    drop(rx);
    let mut closed = task::spawn(tx.closed());
    assert_ready!(closed.poll());
}

/// `closed()` resolves once this handle was closed as a `Sink`, though the channel stays
/// open for the other senders.
#[tokio::test(start_paused = true)]
async fn closed_resolves_for_a_handle_closed_as_a_sink() {
    let (mut tx, rx) = ordered::channel::<u8, u8, u8>();
    let tx2 = tx.clone();
    // As a user would: a task that closes its sink, then waits on `closed()`.
    let closer = tokio::spawn(async move {
        SinkExt::close(&mut tx).await.unwrap();
        tx.closed().await;
    });
    let waited = tokio::time::timeout(secs(1), closer).await;
    waited.expect("closed() resolved").unwrap();
    assert!(!rx.is_closed() && !tx2.is_closed());
    tx2.try_send(0, 1, 2).unwrap();
}

/// `closed()` is not resolved by other senders coming and going.
#[tokio::test(start_paused = true)]
async fn closed_ignores_other_senders() {
    let (tx, _rx) = timed::channel::<u8, u8>(WINDOW);
    let tx2 = tx.clone();
    let mut closed = task::spawn(tx.closed());
    assert_pending!(closed.poll());
    drop(tx2);
    assert!(!closed.is_woken());
    assert_pending!(closed.poll());
    assert!(!tx.is_closed());
}

/// A `Sink` send given up on (here, by a timeout) keeps its value, but holds up no one:
/// other handles' `try_send` and this handle's own `send` go in once there is room, and
/// `abort_send` takes the value back. (It used to keep first place in line for ever.)
#[tokio::test(start_paused = true)]
async fn abandoned_sink_send_holds_up_no_one() {
    let (mut tx, mut rx) = timed::Builder::new(Duration::from_secs(1))
        .capacity(2)
        .build();
    let tx2 = tx.clone();
    tx.try_send("a", 1).unwrap();
    tx.try_send("a", 2).unwrap();
    let sent = tokio::time::timeout(Duration::from_millis(10), SinkExt::send(&mut tx, ("b", 3)));
    assert!(sent.await.is_err());
    assert_eq!(rx.drain_now(), vec![vec![("a", vec![1, 2])]]);
    tx2.try_send("c", 4).unwrap();
    let own = tokio::time::timeout(Duration::from_millis(10), tx.send("d", 5));
    own.await
        .expect("the handle's own send is not stuck")
        .unwrap();
    assert_eq!(tx.abort_send(), Some(("b", 3)));
    assert_eq!(tx.abort_send(), None);
    assert_eq!(rx.drain_now(), vec![vec![("c", vec![4]), ("d", vec![5])]]);
}

/// Even with room for one value, an abandoned sink send lets the others through.
#[tokio::test(start_paused = true)]
async fn abandoned_sink_send_at_capacity_one() {
    let (mut tx, mut rx) = timed::Builder::new(Duration::from_secs(1))
        .capacity(1)
        .build();
    let tx2 = tx.clone();
    tx.try_send("a", 1).unwrap();
    let sent = tokio::time::timeout(ms(10), SinkExt::send(&mut tx, ("b", 2)));
    assert!(sent.await.is_err());
    assert_eq!(rx.drain_now(), vec![vec![("a", vec![1])]]);
    tx2.try_send("c", 3).unwrap();
    assert_eq!(rx.drain_now(), vec![vec![("c", vec![3])]]);
    let own = tokio::time::timeout(Duration::from_millis(10), tx.send("d", 4));
    own.await
        .expect("the handle's own send is not stuck")
        .unwrap();
    // The buffered value goes in on the sink's next flush, once there is room.
    assert_eq!(rx.drain_now(), vec![vec![("d", vec![4])]]);
    SinkExt::flush(&mut tx).await.unwrap();
    assert_eq!(rx.drain_now(), vec![vec![("b", vec![2])]]);
}

// ===== closing a sink =====

/// `SinkExt::close` disconnects the handle: it was the last sender, so the channel closes,
/// the stream delivers what is pending and ends, and the closed handle refuses later sends.
#[tokio::test(start_paused = true)]
async fn sink_close_of_the_last_sender_closes_the_channel() {
    let (mut tx, mut rx) = timed::channel(secs(60));
    SinkExt::send(&mut tx, ("a", 1)).await.unwrap();
    SinkExt::close(&mut tx).await.unwrap();
    assert!(tx.is_closed());
    assert_eq!(rx.recv().await, Some(vec![("a", vec![1])]));
    assert_eq!(rx.recv().await, None);
    assert_eq!(tx.try_send("b", 2), Err(TrySendError::Closed(("b", 2))));
    assert_eq!(tx.send("b", 3).await, Err(SendError(("b", 3))));
    assert_eq!(
        SinkExt::send(&mut tx, ("b", 4)).await,
        Err(SendError(None)),
        "poll_ready refuses on a closed handle"
    );
}

/// Closing one of two senders leaves the channel open for the other; the closed handle
/// refuses, and so does a clone of it, which does not count as a sender either.
#[tokio::test(start_paused = true)]
async fn sink_close_of_one_sender_disconnects_only_it() {
    let (mut tx, mut rx) = ordered::channel();
    let other = tx.clone();
    SinkExt::close(&mut tx).await.unwrap();
    assert!(tx.is_closed());
    assert!(!other.is_closed());
    assert_eq!(rx.stats().senders, 1);
    let clone = tx.clone();
    assert!(clone.is_closed());
    assert_eq!(
        clone.try_send(1, "a", 1),
        Err(TrySendError::Closed((1, "a", 1)))
    );
    drop((tx, clone));
    other.try_send(1, "b", 2).unwrap();
    assert_eq!(rx.try_recv(), Ok(vec![("b", vec![2])]));
    drop(other);
    assert_eq!(rx.recv().await, None);
}

/// A `SinkExt::close` abandoned while its value waits for room has not disconnected the
/// handle: it still counts as a sender, and its value goes in at the next flush.
#[tokio::test(start_paused = true)]
async fn an_abandoned_sink_close_leaves_the_handle_connected() {
    let (mut tx, mut rx) = timed::Builder::new(secs(60)).capacity(1).build();
    tx.try_send("a", 1).unwrap();
    let sent = tokio::time::timeout(ms(10), SinkExt::send(&mut tx, ("b", 2)));
    assert!(sent.await.is_err(), "no room for b");
    let closed = tokio::time::timeout(ms(10), SinkExt::close(&mut tx));
    assert!(closed.await.is_err(), "b still waits for room");
    assert!(!tx.is_closed());
    assert_eq!(rx.stats().senders, 1);
    assert_eq!(rx.drain_now(), vec![vec![("a", vec![1])]]);
    SinkExt::flush(&mut tx).await.unwrap();
    assert_eq!(rx.drain_now(), vec![vec![("b", vec![2])]]);
}

/// `poll_ready` on a closed channel, with nothing taken, returns the error at once.
#[tokio::test(start_paused = true)]
async fn poll_ready_on_a_closed_channel_fails() {
    let (tx, rx) = timed::channel::<&str, u32>(secs(1));
    let mut sink = task::spawn(tx);
    assert_ready_ok!(ready(&mut sink));
    drop(rx);
    assert_ready_eq!(ready(&mut sink), Err(SendError(None)));
}

/// A sink closed while it holds a value that waits for room sends it first, once there is
/// room, then disconnects.
#[tokio::test(start_paused = true)]
async fn sink_close_sends_what_it_holds_first() {
    let (mut tx, mut rx) = timed::Builder::new(Duration::ZERO).capacity(1).build();
    tx.try_send("a", 1).unwrap();
    let consumer = tokio::spawn(async move {
        let mut got = Vec::new();
        while let Some(batch) = rx.recv().await {
            got.extend(batch);
            tokio::time::sleep(ms(5)).await;
        }
        got
    });
    SinkExt::send(&mut tx, ("b", 2)).await.unwrap();
    tx.start_send_unpin(("c", 3)).unwrap();
    SinkExt::close(&mut tx).await.unwrap();
    let got = consumer.await.unwrap();
    assert_eq!(got, vec![("a", vec![1]), ("b", vec![2]), ("c", vec![3])]);
}

// ===== sinks and max_keys =====

/// A sink held back by an earlier send of the same key is woken when that send gives up,
/// wherever it stood in the key line.
#[test]
fn sink_is_woken_when_a_same_key_send_ahead_leaves() {
    let (tx, rx) = ordered::Builder::new().max_keys(1).build::<u8, &str, u32>();
    tx.try_send(0, "a", 1).unwrap();
    let mut first = task::spawn(tx.send(0, "c", 1)); // first in the key line
    let mut ahead = task::spawn(tx.send(0, "b", 1)); // a new key too, behind it
    assert_pending!(first.poll());
    assert_pending!(ahead.poll());
    rx.requeue(0, "b", vec![0]).unwrap(); // "b" is pending now
    let mut sink = tx.clone();
    let mut fed = task::spawn(async move { SinkExt::send(&mut sink, (0, "b", 2)).await });
    assert_pending!(fed.poll()); // behind the earlier "b"
    drop(ahead);
    assert!(fed.is_woken(), "nothing holds the sink back now");
    assert_ready_ok!(fed.poll());
    drop(first);
}

/// A sink waiting for a key slot is woken when a `requeue` makes its key pending.
#[test]
fn sink_is_woken_when_a_requeue_makes_its_key_pending() {
    let (tx, rx) = ordered::Builder::new().max_keys(1).build::<u8, &str, u32>();
    tx.try_send(0, "a", 1).unwrap();
    let mut sink = tx.clone();
    let mut fed = task::spawn(async move { SinkExt::send(&mut sink, (0, "b", 2)).await });
    assert_pending!(fed.poll());
    rx.requeue(0, "b", vec![0]).unwrap();
    assert!(fed.is_woken());
    assert_ready_ok!(fed.poll());
}
