//! Sends made by user code under the channel's lock (an `Eq` that sends on the same
//! channel; the crate docs, "Panics in user code"): in a channel with an inbox they leave
//! their value there and return, without waiting for the lock, which their own caller holds.
//! A receiver sleeping until a later deadline is still woken for such a value, and a later
//! send that finds such values still waiting joins them.
//!
//! Keys here all hash alike, so putting a value in compares keys with `Eq`, which runs a
//! hook the test sets. A send that waited for the lock would wait for ever, so each test runs
//! on a thread of its own, and fails if that thread does not finish.
//!
//! These are about the send that holds the lock, so they are not among the tests `.ci/run`
//! runs with `KEYED_BATCH_INBOX=always`, where that send goes through the inbox too.

use std::cell::{Cell, RefCell};
use std::hash::{Hash, Hasher};
use std::rc::Rc;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use futures::StreamExt;
use keyed_batch::timed;
use tokio::time::Instant;

/// A key whose `Eq` runs this thread's hook, once, when one is set.
#[derive(Clone, Debug)]
struct Hooked(u32);

thread_local! {
    static HOOK: RefCell<Option<Box<dyn FnOnce()>>> = RefCell::new(None);
}

/// Sets this thread's hook to send with a clone of `tx`. The clone is kept until the
/// returned receiver is dropped: dropped under the lock, it would take the lock, a drop the
/// docs rule out.
fn hook_sends<V: 'static>(
    tx: &timed::Sender<Hooked, V>,
    send: impl FnOnce(&timed::Sender<Hooked, V>) + 'static,
) -> mpsc::Receiver<timed::Sender<Hooked, V>> {
    let (again, (keep, kept)) = (tx.clone(), mpsc::channel());
    let hook = move || {
        send(&again);
        keep.send(again).unwrap();
    };
    set_hook(hook);
    kept
}

/// Sets this thread's hook.
fn set_hook(hook: impl FnOnce() + 'static) {
    HOOK.with(|h| *h.borrow_mut() = Some(Box::new(hook)));
}

impl PartialEq for Hooked {
    fn eq(&self, other: &Self) -> bool {
        if let Some(hook) = HOOK.with(|h| h.borrow_mut().take()) {
            hook();
        }
        self.0 == other.0
    }
}

impl Eq for Hooked {}

impl Hash for Hooked {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // Every key collides, so that a new key is compared with the pending ones.
        state.write_u8(0);
    }
}

/// Runs `test` on a thread of its own, and fails if it has not finished in `limit`: a
/// send that waited for the lock would never return.
fn finishes_within<T: Send + 'static>(
    limit: Duration,
    test: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (done, finished) = mpsc::channel();
    thread::spawn(move || done.send(test()).unwrap());
    finished
        .recv_timeout(limit)
        .expect("a send waited for the lock its own caller holds")
}

/// A current-thread runtime with time paused, as these tests' receivers need.
fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

fn keys<V: Copy>(batch: &[(Hooked, Vec<V>)]) -> Vec<(u32, Vec<V>)> {
    batch.iter().map(|(k, v)| (k.0, v.clone())).collect()
}

/// An `Eq` that sends on the same channel: its send goes through the inbox, and the value is
/// delivered after the one whose send ran the `Eq`.
#[test]
fn eq_that_sends_on_the_same_channel() {
    let batches = finishes_within(Duration::from_secs(10), || {
        let (tx, mut rx) = timed::channel(Duration::ZERO);
        tx.try_send(Hooked(1), 1).unwrap();
        let _kept = hook_sends(&tx, |tx| tx.try_send(Hooked(2), 20).unwrap());
        // Compares `Hooked(1)` with itself, under the lock: the hook sends.
        tx.try_send(Hooked(1), 2).unwrap();
        let mut batches = Vec::new();
        while let Ok(batch) = rx.try_recv() {
            batches.extend(keys(&batch));
        }
        batches
    });
    assert_eq!(batches, vec![(1, vec![1, 2]), (2, vec![20])]);
}

/// A receiver that sleeps until a key's deadline is woken at once for a value that an `Eq`
/// under the lock sends, due before it: the send cannot take the lock to wake it, so the
/// lock's holder does, once it lets go.
#[test]
fn receiver_is_woken_for_a_value_sent_under_the_lock() {
    let got = finishes_within(Duration::from_secs(10), || {
        paused_runtime().block_on(async {
            let (tx, mut rx) = timed::channel(Duration::from_secs(1));
            let start = Instant::now();
            let receiver = tokio::spawn(async move {
                let batch = rx.next().await.unwrap();
                (keys(&batch), start.elapsed())
            });
            tx.try_send(Hooked(1), 1).unwrap();
            // The receiver sleeps until `Hooked(1)` is due, 1 s from now.
            tokio::task::yield_now().await;
            let _kept = hook_sends(&tx, |tx| {
                tx.try_send_by(Hooked(3), 30, Instant::now()).unwrap()
            });
            // Compares `Hooked(2)` with `Hooked(1)`, under the lock: the hook sends a value
            // due now.
            tx.try_send(Hooked(2), 2).unwrap();
            receiver.await.unwrap()
        })
    });
    assert_eq!(got, (vec![(3, vec![30])], Duration::ZERO));
}

/// Sends from user code under the lock go through the inbox even past its bound, since
/// the lock they would wait for instead is their own caller's.
#[test]
fn eq_that_sends_more_than_the_inbox_holds() {
    const SENT: u32 = 10_000;
    let values = finishes_within(Duration::from_secs(10), || {
        let (tx, mut rx) = timed::channel(Duration::ZERO);
        tx.try_send(Hooked(1), 0).unwrap();
        let _kept = hook_sends(&tx, |tx| {
            for v in 1..=SENT {
                tx.try_send(Hooked(2), v).unwrap();
            }
        });
        tx.try_send(Hooked(1), 0).unwrap();
        let mut values = Vec::new();
        while let Ok(batch) = rx.try_recv() {
            for (key, mut vs) in batch {
                if key.0 == 2 {
                    values.append(&mut vs);
                }
            }
        }
        values
    });
    assert_eq!(values, (1..=SENT).collect::<Vec<_>>());
}

/// A send that finds values waiting in the inbox joins them, even with the lock free: its
/// value goes in behind them, and its key's `Eq` runs in the call that takes the inbox in
/// (here the receiver's, at the first deadline), not in the send.
#[test]
fn a_send_that_finds_values_in_the_inbox_joins_them() {
    let (eq_in_send, got) = finishes_within(Duration::from_secs(10), || {
        paused_runtime().block_on(async {
            let (tx, mut rx) = timed::channel(Duration::from_secs(1));
            let start = Instant::now();
            let receiver = tokio::spawn(async move {
                let mut got = Vec::new();
                while got.len() < 2 {
                    let batch = rx.next().await.unwrap();
                    got.push((keys(&batch), start.elapsed()));
                }
                got
            });
            tx.try_send(Hooked(1), 1).unwrap();
            // The receiver sleeps until `Hooked(1)` is due, 1 s from now.
            tokio::task::yield_now().await;
            tokio::time::advance(Duration::from_millis(500)).await;
            // Kept to the end: dropping a sender takes the lock, and the inbox in.
            let _kept = hook_sends(&tx, |tx| tx.try_send(Hooked(2), 2).unwrap());
            // Compares `Hooked(3)` with `Hooked(1)`, under the lock: the hook sends a value
            // due at 1.5 s, after the receiver's deadline, so it waits in the inbox.
            tx.try_send(Hooked(3), 3).unwrap();
            let eq_ran = Rc::new(Cell::new(false));
            let ran = Rc::clone(&eq_ran);
            set_hook(move || ran.set(true));
            // The lock is free, and the inbox holds `Hooked(2)`'s value.
            tx.try_send(Hooked(4), 4).unwrap();
            let eq_in_send = eq_ran.get();
            (eq_in_send, receiver.await.unwrap())
        })
    });
    assert!(!eq_in_send, "the send took the inbox in itself");
    let (first, second) = (Duration::from_secs(1), Duration::from_millis(1500));
    assert_eq!(
        got,
        vec![
            (vec![(1, vec![1])], first),
            (vec![(3, vec![3]), (2, vec![2]), (4, vec![4])], second),
        ]
    );
}

/// `Stats::lost`: a value that an `Eq` under the lock sends, due no sooner than the
/// receiver's deadline, waits in the inbox; when the last receiver then goes, it is taken in
/// first, so `sent` counts it, and it is lost with the other pending values.
#[test]
fn values_in_the_inbox_when_the_last_receiver_goes_are_sent_then_lost() {
    let stats = finishes_within(Duration::from_secs(10), || {
        paused_runtime().block_on(async {
            let (tx, mut rx) = timed::channel(Duration::from_secs(10));
            let receiver = tokio::spawn(async move { while rx.next().await.is_some() {} });
            tx.try_send(Hooked(1), 1).unwrap();
            // The receiver takes `Hooked(1)` at 10 s, then sleeps until its next value is
            // due, at 20 s.
            tokio::time::sleep(Duration::from_secs(10)).await;
            tokio::task::yield_now().await;
            tx.try_send(Hooked(1), 2).unwrap();
            tokio::task::yield_now().await;
            let kept = hook_sends(&tx, |tx| tx.try_send(Hooked(2), 20).unwrap());
            // Compares `Hooked(1)` with itself, under the lock: the hook's value, due at 20 s
            // too, waits in the inbox.
            tx.try_send(Hooked(1), 3).unwrap();
            receiver.abort();
            assert!(receiver.await.unwrap_err().is_cancelled());
            let stats = tx.stats();
            drop(kept);
            stats
        })
    });
    assert_eq!(
        (stats.sent, stats.delivered, stats.lost),
        (4, 1, 3),
        "{stats:?}"
    );
    assert_eq!(
        (stats.pending_values, stats.pending_keys),
        (0, 0),
        "{stats:?}"
    );
}
