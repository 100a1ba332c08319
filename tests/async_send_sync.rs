//! Compile-time checks of the auto traits: the handles are `Send + Sync` when the keys,
//! values and sort keys are `Send` (not necessarily `Sync`), receivers are `Unpin` whatever
//! they carry, senders and receivers are `Clone`, and the futures of `send` and `recv` are
//! `Send`, so they can run on a multi-threaded runtime.
//!
//! If a bound is missing, this file does not compile.

use std::cell::Cell;
use std::future::Future;
use std::marker::{PhantomData, PhantomPinned};
use std::time::Duration;

use futures::Stream;
use keyed_batch::{ordered, timed};
use tokio::time::Instant;

/// A key that is `Send` but not `Sync`.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Key(u8, PhantomData<Cell<()>>);

/// A sort key that is `Send` but not `Sync`.
type Sort = Key;

/// A value that is `Send` but neither `Sync` nor `Clone`.
type Value = Cell<u8>;

fn is_send<T: Send>() {}
fn is_sync<T: Sync>() {}
fn is_unpin<T: Unpin>() {}
fn is_clone<T: Clone>() {}
fn is_stream<T: Stream + Unpin>() {}
fn is_send_future<F: Future + Send>(future: F) -> F {
    future
}

fn key() -> Key {
    Key(0, PhantomData)
}

/// `timed::Sender` and `timed::Receiver` are `Send + Sync + Clone`, and the receiver is an
/// `Unpin` stream even for a value that is `!Unpin`.
#[test]
fn timed_handles() {
    is_send::<timed::Sender<Key, Value>>();
    is_sync::<timed::Sender<Key, Value>>();
    is_clone::<timed::Sender<Key, Value>>();
    is_unpin::<timed::Sender<Key, Value>>();
    is_send::<timed::Receiver<Key, Value>>();
    is_sync::<timed::Receiver<Key, Value>>();
    is_clone::<timed::Receiver<Key, Value>>();
    is_unpin::<timed::Receiver<Key, Value>>();
    is_unpin::<timed::Receiver<Key, PhantomPinned>>();
    is_stream::<timed::Receiver<Key, Value>>();
}

/// `ordered::Sender` and `ordered::Receiver` are `Send + Sync + Clone`, and the receiver is
/// an `Unpin` stream even for a value that is `!Unpin`.
#[test]
fn ordered_handles() {
    is_send::<ordered::Sender<Sort, Key, Value>>();
    is_sync::<ordered::Sender<Sort, Key, Value>>();
    is_clone::<ordered::Sender<Sort, Key, Value>>();
    is_unpin::<ordered::Sender<Sort, Key, Value>>();
    is_send::<ordered::Receiver<Sort, Key, Value>>();
    is_sync::<ordered::Receiver<Sort, Key, Value>>();
    is_clone::<ordered::Receiver<Sort, Key, Value>>();
    is_unpin::<ordered::Receiver<Sort, Key, Value>>();
    is_unpin::<ordered::Receiver<Sort, Key, PhantomPinned>>();
    is_stream::<ordered::Receiver<Sort, Key, Value>>();
}

/// The futures of the `timed` `send`, `send_by` and `recv` are `Send`.
#[tokio::test]
async fn timed_futures_are_send() {
    let (tx, mut rx) = timed::channel::<Key, Value>(Duration::from_secs(1));
    drop(is_send_future(tx.send(key(), Cell::new(1))));
    drop(is_send_future(tx.send_by(
        key(),
        Cell::new(2),
        Instant::now(),
    )));
    drop(is_send_future(rx.recv()));
    // The handles cross threads for real, too.
    let sent = tokio::spawn(async move { tx.send(key(), Cell::new(3)).await.is_ok() });
    assert!(sent.await.unwrap());
    assert_eq!(rx.len(), 1);
}

/// The futures of the `ordered` `send` and `recv` are `Send`.
#[tokio::test]
async fn ordered_futures_are_send() {
    let (tx, mut rx) = ordered::channel::<Sort, Key, Value>();
    drop(is_send_future(tx.send(key(), key(), Cell::new(1))));
    drop(is_send_future(rx.recv()));
    let sent = tokio::spawn(async move { tx.send(key(), key(), Cell::new(2)).await.is_ok() });
    assert!(sent.await.unwrap());
    let batch = tokio::spawn(async move { rx.recv().await.map(|batch| batch.len()) });
    assert_eq!(batch.await.unwrap(), Some(1));
}

/// The acknowledging handles: receivers and dead-letter streams are `Send + Sync + Clone`
/// `Unpin` streams, and a `Delivery` is `Send`, so it can be decided from another task or
/// thread (and `Sync` when its key and values are, since it lends them out); its decision
/// futures are `Send`.
#[test]
fn acked_handles() {
    use keyed_batch::ack::{DeadLetters, Decided, Delivery};

    is_send::<timed::AckReceiver<Key, Value>>();
    is_sync::<timed::AckReceiver<Key, Value>>();
    is_clone::<timed::AckReceiver<Key, Value>>();
    is_stream::<timed::AckReceiver<Key, Value>>();
    is_send::<ordered::AckReceiver<Sort, Key, Value>>();
    is_sync::<ordered::AckReceiver<Sort, Key, Value>>();
    is_stream::<ordered::AckReceiver<Sort, Key, Value>>();
    is_send::<Delivery<Key, Value>>();
    is_sync::<Delivery<u8, u8>>();
    is_send::<Decided<(Key, Vec<Value>)>>();
    is_unpin::<Decided<()>>();
    is_send::<DeadLetters<Key, Value>>();
    is_clone::<DeadLetters<Key, Value>>();
    is_stream::<DeadLetters<Key, Value>>();

    let (_tx, mut rx) = timed::Builder::new(Duration::ZERO).acked::<Key, Value>();
    drop(is_send_future(rx.recv()));
}

/// The Redis handles are `Send + Sync + Clone`, and the futures of every async method,
/// those that take `&self` included, are `Send`: each can be awaited in a spawned task.
/// Checked by type alone (a queue needs a server): this function is never called.
#[cfg(feature = "redis")]
#[allow(dead_code)]
fn redis_handles_and_futures(
    tx: keyed_batch::redis::Sender<u8, u32>,
    mut rx: keyed_batch::redis::Receiver<u8, u32>,
) {
    use keyed_batch::redis::{Receiver, Sender};

    is_send::<Sender<u8, u32>>();
    is_sync::<Sender<u8, u32>>();
    is_clone::<Sender<u8, u32>>();
    is_send::<Receiver<u8, u32>>();
    is_sync::<Receiver<u8, u32>>();
    is_clone::<Receiver<u8, u32>>();
    is_stream::<Receiver<u8, u32>>();
    drop(is_send_future(tx.send(1, 1)));
    drop(is_send_future(tx.send_by(1, 1, Duration::ZERO)));
    drop(is_send_future(tx.close()));
    drop(is_send_future(rx.take_undecodable(1)));
    drop(is_send_future(rx.close()));
    drop(is_send_future(rx.len()));
    drop(is_send_future(rx.is_empty()));
    drop(is_send_future(rx.recv()));
}
