//! The `timed` flavour: aggregation, deadlines, batch order, splitting, requeue, wakeups,
//! cloned receivers, the stream, the counters and the builder's checks.
//!
//! Time is paused, so every timing claim is exact to the millisecond.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use futures::StreamExt;
use keyed_batch::error::TryRecvError;
use keyed_batch::timed::{self, Builder};
use tokio::time::{advance, Instant};
use tokio_test::task;
use tokio_test::{assert_pending, assert_ready};

use common::time::{ms, secs};

const WINDOW: Duration = secs(10);

// ===== aggregation and deadlines =====

/// What a batch holds: all pending values of a key come out together, in the order they were
/// sent.
#[tokio::test(start_paused = true)]
async fn aggregation() {
    let (tx, mut rx) = timed::channel(WINDOW);
    tx.send("a", 1).await.unwrap();
    tx.send("b", 10).await.unwrap();
    tx.send("a", 2).await.unwrap();
    tx.send("b", 20).await.unwrap();
    tx.send("a", 3).await.unwrap();

    let batch = rx.recv().await;
    assert_eq!(batch, Some(vec![("a", vec![1, 2, 3]), ("b", vec![10, 20])]));
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
}

/// When a key is due: `send` gives the deadline `now + window`: pending one millisecond before
/// it, ready exactly at it.
#[tokio::test(start_paused = true)]
async fn window_is_exact() {
    let (tx, mut rx) = timed::channel(WINDOW);
    let start = Instant::now();
    tx.send("a", 1).await.unwrap();
    assert_eq!(rx.next_deadline(), Some(start + WINDOW));

    let mut recv = task::spawn(rx.recv());
    assert_pending!(recv.poll());
    advance(WINDOW - ms(1)).await;
    assert!(!recv.is_woken());
    assert_pending!(recv.poll());
    advance(ms(1)).await;
    assert!(recv.is_woken());
    assert_eq!(assert_ready!(recv.poll()), Some(vec![("a", vec![1])]));
}

/// When a key is due: a key's deadline is the smallest among its values, so later values ride
/// along, and `now` is read when each value is sent.
#[tokio::test(start_paused = true)]
async fn first_value_sets_the_deadline() {
    let (tx, mut rx) = timed::channel(WINDOW);
    let start = Instant::now();
    tx.send("a", 1).await.unwrap();
    advance(secs(3)).await;
    tx.send("a", 2).await.unwrap();
    tx.send("b", 3).await.unwrap();
    assert_eq!(rx.next_deadline(), Some(start + WINDOW));

    assert_eq!(rx.recv().await, Some(vec![("a", vec![1, 2])]));
    assert_eq!(Instant::now(), start + WINDOW);
    assert_eq!(rx.next_deadline(), Some(start + secs(3) + WINDOW));
    assert_eq!(rx.recv().await, Some(vec![("b", vec![3])]));
    assert_eq!(Instant::now(), start + secs(3) + WINDOW);
}

/// When a key is due: a `by` before the channel was made counts as the moment it was made,
/// so two such keys tie, and go by arrival; `next_deadline` says so.
#[tokio::test(start_paused = true)]
async fn send_by_before_the_channel_was_made_counts_from_its_start() {
    let long_ago = Instant::now();
    advance(secs(10)).await;
    let made = Instant::now();
    let (tx, mut rx) = timed::channel(WINDOW);
    tx.send_by("late", 1, long_ago + secs(5)).await.unwrap();
    tx.send_by("early", 2, long_ago + secs(1)).await.unwrap();
    assert_eq!(rx.next_deadline(), Some(made));
    assert_eq!(
        rx.try_recv(),
        Ok(vec![("late", vec![1]), ("early", vec![2])])
    );
}

/// When a key is due: `send_by` tightens a key's deadline, and a later, looser `send_by` does
/// not move it back.
#[tokio::test(start_paused = true)]
async fn send_by_tightens_deadline() {
    let (tx, mut rx) = timed::channel(WINDOW);
    let start = Instant::now();
    tx.send("a", 1).await.unwrap();
    tx.send_by("a", 2, start + ms(300)).await.unwrap();
    assert_eq!(rx.next_deadline(), Some(start + ms(300)));
    tx.send_by("a", 3, start + secs(5)).await.unwrap();
    tx.try_send_by("a", 4, start + secs(6)).unwrap();
    assert_eq!(rx.next_deadline(), Some(start + ms(300)));

    let batch = rx.recv().await;
    assert_eq!(Instant::now(), start + ms(300));
    assert_eq!(batch, Some(vec![("a", vec![1, 2, 3, 4])]));
}

/// When a key is due: `send_by` with a deadline now or in the past makes the key due at once.
#[tokio::test(start_paused = true)]
async fn send_by_past_deadline_is_due_at_once() {
    let (tx, mut rx) = timed::channel(WINDOW);
    let start = Instant::now();
    advance(secs(1)).await;
    tx.send("a", 1).await.unwrap();
    tx.send_by("a", 2, start).await.unwrap();
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![1, 2])]));

    tx.try_send_by("b", 3, Instant::now()).unwrap();
    assert_eq!(rx.try_recv(), Ok(vec![("b", vec![3])]));
    assert_eq!(Instant::now(), start + secs(1));
}

/// When a key is due: a key that holds `max_values_per_key` values is due at once; other keys
/// keep their deadline, and the emptied key starts counting again.
#[tokio::test(start_paused = true)]
async fn max_values_per_key_makes_key_due() {
    let (tx, mut rx) = Builder::new(WINDOW).max_values_per_key(3).build();
    let start = Instant::now();
    tx.send("a", 1).await.unwrap();
    tx.send("a", 2).await.unwrap();
    tx.send("b", 9).await.unwrap();
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    assert_eq!(rx.next_deadline(), Some(start + WINDOW));

    advance(secs(1)).await;
    tx.send("a", 3).await.unwrap();
    assert_eq!(rx.next_deadline(), Some(start + secs(1)));
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![1, 2, 3])]));

    tx.send("a", 4).await.unwrap();
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    assert_eq!(rx.len(), 2);
}

/// When a key is due and No polling: a key that fills up while a receiver waits wakes it,
/// since the earliest deadline moved earlier.
#[tokio::test(start_paused = true)]
async fn full_key_wakes_receiver() {
    let (tx, mut rx) = Builder::new(WINDOW).max_values_per_key(2).build();
    tx.send("a", 1).await.unwrap();
    let mut recv = task::spawn(rx.recv());
    assert_pending!(recv.poll());
    tx.send("a", 2).await.unwrap();
    assert!(recv.is_woken());
    assert_eq!(assert_ready!(recv.poll()), Some(vec![("a", vec![1, 2])]));
}

/// When a key is due: a zero window is valid and makes every value due as soon as it is sent.
#[tokio::test(start_paused = true)]
async fn zero_window_is_due_at_once() {
    let (tx, mut rx) = timed::channel(Duration::ZERO);
    let start = Instant::now();
    tx.try_send("a", 1).unwrap();
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![1])]));
    tx.send("b", 2).await.unwrap();
    tx.send("b", 3).await.unwrap();
    assert_eq!(rx.recv().await, Some(vec![("b", vec![2, 3])]));
    assert_eq!(Instant::now(), start);
}

// ===== batch order =====

/// What a batch holds: a batch holds due keys in deadline order, not in the order they
/// arrived.
#[tokio::test(start_paused = true)]
async fn rank_order_across_keys() {
    let (tx, mut rx) = timed::channel(WINDOW);
    let start = Instant::now();
    tx.send("a", 1).await.unwrap(); // start + 10 s
    advance(secs(1)).await;
    tx.send("b", 2).await.unwrap(); // start + 11 s
    tx.send_by("c", 3, start + secs(5)).await.unwrap();
    tx.send_by("d", 4, start + secs(30)).await.unwrap(); // by the window: start + 11 s
    tx.send_by("e", 5, start + secs(8)).await.unwrap();

    advance(secs(8)).await;
    let batch = rx.try_recv();
    assert_eq!(batch, Ok(vec![("c", vec![3]), ("e", vec![5])]));
    advance(secs(2)).await;
    // "b" and "d" tie at start + 11 s: "b" arrived first.
    let batch = rx.try_recv();
    assert_eq!(
        batch,
        Ok(vec![("a", vec![1]), ("b", vec![2]), ("d", vec![4])])
    );
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    assert_eq!(rx.next_deadline(), None);
}

/// What a batch holds: equal deadlines go to the key whose pending run started first, even
/// when that key's deadline was lowered to the tie later.
#[tokio::test(start_paused = true)]
async fn ties_go_to_earlier_run() {
    let (tx, mut rx) = timed::channel(WINDOW);
    let start = Instant::now();
    let due = start + secs(1);
    tx.send_by("z", 1, start + secs(2)).await.unwrap();
    tx.send_by("y", 2, due).await.unwrap();
    tx.send_by("x", 3, due).await.unwrap();
    tx.send_by("z", 4, due).await.unwrap(); // z now ties, and its run is the oldest

    advance(secs(1)).await;
    let batch = rx.try_recv();
    assert_eq!(
        batch,
        Ok(vec![("z", vec![1, 4]), ("y", vec![2]), ("x", vec![3])])
    );
}

/// What a batch holds: a key that empties and refills is a new arrival: it loses ties to keys
/// that were pending before it came back.
#[tokio::test(start_paused = true)]
async fn refilled_key_is_new_arrival() {
    let (tx, mut rx) = timed::channel(WINDOW);
    let start = Instant::now();
    tx.send_by("a", 1, start + secs(1)).await.unwrap();
    tx.send_by("b", 2, start + secs(2)).await.unwrap();
    advance(secs(1)).await;
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![1])]));

    tx.send_by("a", 3, start + secs(2)).await.unwrap();
    advance(secs(1)).await;
    assert_eq!(rx.try_recv(), Ok(vec![("b", vec![2]), ("a", vec![3])]));
}

/// What a batch holds: `max_batch` is a hard cap; a split key's remainder keeps its place and
/// leads the next batch (splitting is not a new arrival).
#[tokio::test(start_paused = true)]
async fn split_remainder_leads_next_batch() {
    let (tx, mut rx) = Builder::new(Duration::ZERO).max_batch(2).build();
    for v in 1..=3 {
        tx.send("a", v).await.unwrap();
    }
    tx.send("b", 10).await.unwrap();

    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![1, 2])]));
    tx.send("c", 20).await.unwrap();
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![3]), ("b", vec![10])]));
    assert_eq!(rx.try_recv(), Ok(vec![("c", vec![20])]));
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
}

/// What a batch holds: a split key's remainder yields the front to a key of smaller rank that
/// became due meanwhile.
#[tokio::test(start_paused = true)]
async fn smaller_rank_overtakes_split_remainder() {
    let (tx, mut rx) = Builder::new(WINDOW).max_batch(2).build();
    let start = Instant::now();
    for v in 1..=3 {
        tx.send("a", v).await.unwrap(); // start + 10 s
    }
    advance(WINDOW).await;
    assert_eq!(rx.recv().await, Some(vec![("a", vec![1, 2])]));

    tx.send_by("c", 9, start + secs(5)).await.unwrap();
    assert_eq!(rx.try_recv(), Ok(vec![("c", vec![9]), ("a", vec![3])]));
}

/// What a batch holds: a split key's remainder keeps its deadline, lowered by an earlier one
/// sent for it since: then it goes before a key whose deadline lies between the two.
#[tokio::test(start_paused = true)]
async fn split_remainder_is_lowered_by_an_earlier_deadline() {
    let (tx, mut rx) = Builder::new(WINDOW).max_batch(2).build();
    let start = Instant::now();
    for v in 1..=3 {
        tx.send("a", v).await.unwrap(); // start + 10 s
    }
    advance(WINDOW).await;
    assert_eq!(rx.recv().await, Some(vec![("a", vec![1, 2])]));

    tx.send_by("c", 9, start + secs(5)).await.unwrap();
    tx.send_by("a", 4, start + secs(1)).await.unwrap();
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![3, 4])]));
    assert_eq!(rx.try_recv(), Ok(vec![("c", vec![9])]));
}

/// What a batch holds: a batch never holds more than `max_batch` values, and is never empty.
#[tokio::test(start_paused = true)]
async fn batches_are_capped_and_never_empty() {
    let (tx, mut rx) = Builder::new(WINDOW).max_batch(2).build();
    for v in 0..5 {
        tx.send("a", v).await.unwrap();
    }
    tx.send("b", 5).await.unwrap();
    tx.send("c", 6).await.unwrap();

    // Pending but not due: no batch at all, not an empty one.
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    let mut recv = task::spawn(rx.recv());
    assert_pending!(recv.poll());
    drop(recv);

    advance(WINDOW).await;
    let mut seen = Vec::new();
    let mut sizes = Vec::new();
    while let Ok(batch) = rx.try_recv() {
        let size: usize = batch.iter().map(|(_, values)| values.len()).sum();
        assert!(batch.iter().all(|(_, values)| !values.is_empty()));
        sizes.push(size);
        seen.extend(batch.into_iter().flat_map(|(_, values)| values));
    }
    assert_eq!(sizes, vec![2, 2, 2, 1]);
    assert_eq!(seen, (0..7).collect::<Vec<_>>());
}

/// What a batch holds: every value is delivered exactly once, across cloned receivers on a
/// multi-threaded runtime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_across_receivers() {
    const N: u32 = 2_000;
    let (tx, rx) = Builder::new(Duration::ZERO).max_batch(7).build();
    let consumers: Vec<_> = (0..3)
        .map(|_| {
            let mut rx = rx.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                while let Some(batch) = rx.recv().await {
                    for (key, values) in batch {
                        got.extend(values.into_iter().map(|v| (key, v)));
                    }
                }
                got
            })
        })
        .collect();
    drop(rx);
    let producers: Vec<_> = (0..2u32)
        .map(|p| {
            let tx = tx.clone();
            tokio::spawn(async move {
                for i in 0..N / 2 {
                    let v = p * N + i;
                    tx.send(v % 13, v).await.unwrap();
                }
            })
        })
        .collect();
    drop(tx);
    for producer in producers {
        producer.await.unwrap();
    }

    let mut all = Vec::new();
    for consumer in consumers {
        all.extend(consumer.await.unwrap());
    }
    assert_eq!(all.len(), N as usize);
    let unique: HashSet<_> = all.iter().map(|&(_, v)| v).collect();
    assert_eq!(unique.len(), N as usize);
    assert!(all.iter().all(|&(key, v)| key == v % 13));
}

// ===== requeue =====

/// Failed deliveries: requeued values go in front of the key's newer values, and the key is
/// due at once.
#[tokio::test(start_paused = true)]
async fn requeue_goes_in_front_and_is_due() {
    let (tx, mut rx) = timed::channel(WINDOW);
    tx.send("a", 1).await.unwrap();
    advance(WINDOW).await;
    let (key, values) = rx.recv().await.unwrap().remove(0);

    tx.send("a", 2).await.unwrap(); // due in 10 s
    tx.send("c", 30).await.unwrap();
    rx.requeue(key, values).unwrap();
    assert_eq!(rx.next_deadline(), Some(Instant::now()));
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![1, 2])]));
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    assert_eq!(rx.len(), 1);
}

/// Failed deliveries: requeue lowers a key's deadline to now but never raises it; a key
/// already overdue keeps its earlier deadline and place.
#[tokio::test(start_paused = true)]
async fn requeue_keeps_earlier_deadline() {
    let (tx, mut rx) = timed::channel(WINDOW);
    let start = Instant::now();
    tx.send("a", 1).await.unwrap(); // start + 10 s
    tx.send_by("b", 2, start + secs(12)).await.unwrap();
    advance(secs(15)).await;
    rx.requeue("b", vec![0]).unwrap(); // b: min(start + 12 s, now)
    assert_eq!(rx.next_deadline(), Some(start + WINDOW));
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![1]), ("b", vec![0, 2])]));
}

/// No polling: a requeue that moves the earliest deadline earlier wakes a waiting receiver.
#[tokio::test(start_paused = true)]
async fn requeue_wakes_receiver() {
    let (tx, mut rx) = timed::channel(WINDOW);
    let handle = rx.clone();
    tx.send("b", 2).await.unwrap();
    let mut recv = task::spawn(rx.recv());
    assert_pending!(recv.poll());
    handle.requeue("a", vec![1]).unwrap();
    assert!(recv.is_woken());
    assert_eq!(assert_ready!(recv.poll()), Some(vec![("a", vec![1])]));
}

// ===== wakeups =====

/// No polling: a waiting receiver is woken when the first value arrives (none to some), and
/// not by sends that leave the earliest deadline where it is, nor by time passing before it.
#[tokio::test(start_paused = true)]
async fn no_polling() {
    let (tx, mut rx) = timed::channel(WINDOW);
    let mut recv = task::spawn(rx.recv());
    assert_pending!(recv.poll());
    advance(secs(60)).await;
    assert!(!recv.is_woken());

    tx.send("a", 1).await.unwrap();
    assert!(recv.is_woken());
    assert_pending!(recv.poll());

    tx.send("a", 2).await.unwrap(); // same key
    tx.send("b", 3).await.unwrap(); // same deadline, later run
    advance(secs(1)).await;
    tx.send("c", 4).await.unwrap(); // later deadline
    tx.try_send_by("d", 5, Instant::now() + secs(30)).unwrap();
    assert!(!recv.is_woken());

    advance(WINDOW - secs(1) - ms(1)).await;
    assert!(!recv.is_woken());
    advance(ms(1)).await;
    assert!(recv.is_woken());
    let batch = assert_ready!(recv.poll());
    assert_eq!(batch, Some(vec![("a", vec![1, 2]), ("b", vec![3])]));
}

/// No polling: a receiver sleeping until deadline D is woken by a `send_by` for an earlier D',
/// and then wakes exactly at D' (its timer moved), and the rest still comes at D.
#[tokio::test(start_paused = true)]
async fn earlier_deadline_wakes_receiver() {
    let (tx, mut rx) = timed::channel(WINDOW);
    let start = Instant::now();
    tx.send("a", 1).await.unwrap();

    let mut recv = task::spawn(rx.recv());
    assert_pending!(recv.poll());
    tx.send_by("b", 2, start + secs(3)).await.unwrap();
    assert!(recv.is_woken());
    assert_pending!(recv.poll());

    advance(secs(3) - ms(1)).await;
    assert!(!recv.is_woken());
    advance(ms(1)).await;
    assert!(recv.is_woken());
    assert_eq!(assert_ready!(recv.poll()), Some(vec![("b", vec![2])]));
    drop(recv);

    assert_eq!(rx.next_deadline(), Some(start + WINDOW));
    assert_eq!(rx.recv().await, Some(vec![("a", vec![1])]));
    assert_eq!(Instant::now(), start + WINDOW);
}

/// No polling: a receiver whose timer was set for a deadline that went away (the key became
/// due early and was taken) is not woken when that old deadline passes with nothing pending.
#[tokio::test(start_paused = true)]
async fn stale_deadline_does_not_wake() {
    let (tx, mut rx) = Builder::new(WINDOW).max_values_per_key(2).build();
    tx.send("a", 1).await.unwrap();
    let mut consumer = task::spawn(async move {
        let mut batches = Vec::new();
        while let Some(batch) = rx.recv().await {
            batches.push(batch);
        }
        batches
    });
    assert_pending!(consumer.poll()); // sleeps until the window ends
    tx.send("a", 2).await.unwrap(); // the key is full: due now
    assert!(consumer.is_woken());
    assert_pending!(consumer.poll()); // took the batch; waits on an empty channel

    advance(WINDOW).await;
    assert!(!consumer.is_woken());
    drop(tx);
    assert!(consumer.is_woken());
    assert_eq!(
        assert_ready!(consumer.poll()),
        vec![vec![("a", vec![1, 2])]]
    );
}

// ===== cloned receivers =====

/// No polling and What a batch holds: with two waiting receivers, a send that makes a key due wakes both, and
/// each batch goes to one of them.
#[tokio::test(start_paused = true)]
async fn receivers_share_work() {
    let (tx, mut rx1) = Builder::new(Duration::ZERO).max_batch(1).build();
    let mut rx2 = rx1.clone();
    let mut r1 = task::spawn(rx1.recv());
    let mut r2 = task::spawn(rx2.recv());
    assert_pending!(r1.poll());
    assert_pending!(r2.poll());

    tx.send("a", 1).await.unwrap();
    tx.send("b", 2).await.unwrap();
    assert!(r1.is_woken());
    assert!(r2.is_woken());

    assert_eq!(assert_ready!(r1.poll()), Some(vec![("a", vec![1])]));
    assert_eq!(assert_ready!(r2.poll()), Some(vec![("b", vec![2])]));
    drop((r1, r2));

    assert_eq!(rx1.try_recv(), Err(TryRecvError::Empty));
    assert_eq!(rx2.try_recv(), Err(TryRecvError::Empty));
}

/// No polling: every waiting receiver sleeps on its own timer: at a deadline both wake, one
/// takes the batch, and the other sleeps again until the next deadline.
#[tokio::test(start_paused = true)]
async fn timer_passes_to_next_receiver() {
    let (tx, mut rx1) = timed::channel(WINDOW);
    let mut rx2 = rx1.clone();
    let start = Instant::now();
    tx.send_by("a", 1, start + secs(1)).await.unwrap();
    tx.send_by("b", 2, start + secs(2)).await.unwrap();

    let mut r1 = task::spawn(rx1.recv());
    let mut r2 = task::spawn(rx2.recv());
    assert_pending!(r1.poll());
    assert_pending!(r2.poll());

    advance(secs(1)).await;
    assert!(r1.is_woken());
    assert!(r2.is_woken());
    assert_eq!(assert_ready!(r1.poll()), Some(vec![("a", vec![1])]));
    assert_pending!(r2.poll());

    advance(secs(1) - ms(1)).await;
    assert!(!r2.is_woken());
    advance(ms(1)).await;
    assert!(r2.is_woken());
    assert_eq!(assert_ready!(r2.poll()), Some(vec![("b", vec![2])]));
}

/// `recv` is cancel safe: dropping a waiting `recv` loses nothing, and another waiting
/// receiver, not woken by it, gets the batch exactly at the deadline.
#[tokio::test(start_paused = true)]
async fn recv_cancel_safety() {
    let (tx, mut rx1) = timed::channel(WINDOW);
    let mut rx2 = rx1.clone();
    let start = Instant::now();
    tx.send("a", 1).await.unwrap();

    let mut r1 = task::spawn(rx1.recv());
    let mut r2 = task::spawn(rx2.recv());
    assert_pending!(r1.poll());
    assert_pending!(r2.poll());
    advance(secs(4)).await;
    drop(r1);
    assert_eq!(rx1.len(), 1);
    assert!(!r2.is_woken());

    advance(secs(6) - ms(1)).await;
    assert!(!r2.is_woken());
    advance(ms(1)).await;
    assert!(r2.is_woken());
    assert_eq!(assert_ready!(r2.poll()), Some(vec![("a", vec![1])]));
    assert_eq!(Instant::now(), start + WINDOW);
}

/// `recv` is cancel safe: a `recv` dropped after its deadline fired, before it was polled,
/// takes nothing out.
#[tokio::test(start_paused = true)]
async fn recv_dropped_after_wake_loses_nothing() {
    let (tx, mut rx) = timed::channel(WINDOW);
    tx.send("a", 1).await.unwrap();
    let mut recv = task::spawn(rx.recv());
    assert_pending!(recv.poll());
    advance(WINDOW).await;
    assert!(recv.is_woken());
    drop(recv);
    assert_eq!(rx.len(), 1);
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![1])]));
}

// ===== timers and paused time =====

/// Waits, with no timer of its own, for a plain thread to answer after `real` real time:
/// an idle wait like a socket read. Under paused time the runtime advances the clock only
/// to timers that are set, so this returns how far a stray timer moved the clock.
async fn idle_wait(real: Duration) -> Duration {
    let start = Instant::now();
    let (done, wait) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        std::thread::sleep(real);
        done.send(()).unwrap();
    });
    wait.await.unwrap();
    Instant::now() - start
}

/// No polling: a receiver that got its batch before its deadline (here by a flush) holds no
/// timer. It used to park its timer 30 years ahead, which made an idle wait on anything
/// else jump the paused clock 30 years.
#[tokio::test(start_paused = true)]
async fn early_batch_leaves_no_timer() {
    let (tx, mut rx) = timed::channel(common::time::HOUR);
    tx.send("k", 1).await.unwrap();
    let mut recv = task::spawn(rx.recv());
    assert_pending!(recv.poll());
    tx.flush(&"k");
    assert_eq!(assert_ready!(recv.poll()), Some(vec![("k", vec![1])]));
    drop(recv);
    assert!(
        idle_wait(ms(20)).await < secs(1),
        "a stray timer moved the clock"
    );
}

/// No polling: a cancelled `recv` drops its timer. It used to stay armed for the old
/// deadline, so an idle wait let a 1-hour window expire during a 20 ms wait.
#[tokio::test(start_paused = true)]
async fn cancelled_recv_leaves_no_timer() {
    let (tx, mut rx) = timed::channel(common::time::HOUR);
    tx.send("k", 1).await.unwrap();
    let cancelled = tokio::time::timeout(ms(10), rx.recv()).await;
    assert!(cancelled.is_err());
    assert!(
        idle_wait(ms(20)).await < secs(1),
        "a stray timer moved the clock"
    );
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
}

/// No polling: after a close delivered everything early, the receiver holds no timer.
#[tokio::test(start_paused = true)]
async fn close_leaves_no_timer() {
    let (tx, mut rx) = timed::channel(common::time::HOUR);
    tx.send("k", 1).await.unwrap();
    let mut recv = task::spawn(rx.recv());
    assert_pending!(recv.poll());
    drop(tx);
    assert_eq!(assert_ready!(recv.poll()), Some(vec![("k", vec![1])]));
    drop(recv);
    assert!(
        idle_wait(ms(20)).await < secs(1),
        "a stray timer moved the clock"
    );
    assert_eq!(rx.recv().await, None);
}

/// No polling: a `next()` that lost a `select!`, then `drain_now` on the shutdown path: the
/// receiver stops waiting, and its timer goes. It used to stay set for the drained key.
#[tokio::test(start_paused = true)]
async fn drain_after_an_abandoned_next_leaves_no_timer() {
    let (tx, mut rx) = timed::channel(common::time::HOUR);
    tx.send("k", 1).await.unwrap();
    {
        let mut next = task::spawn(rx.next());
        assert_pending!(next.poll());
    }
    assert_eq!(rx.drain_now(), vec![vec![("k", vec![1])]]);
    assert!(
        idle_wait(ms(20)).await < secs(1),
        "a stray timer moved the clock"
    );
    drop(tx);
}

/// No polling: a clone drains early; the other clone, still waiting, is woken to re-arm,
/// instead of keeping a timer for a deadline that is gone.
#[tokio::test(start_paused = true)]
async fn a_clone_draining_early_leaves_no_stale_timer() {
    let (tx, mut a) = timed::channel::<&str, i32>(common::time::HOUR);
    let mut b = a.clone();
    tx.send("k", 1).await.unwrap();
    let mut wait = task::spawn(a.recv());
    assert_pending!(wait.poll());
    assert_eq!(b.drain_now(), vec![vec![("k", vec![1])]]);
    assert!(wait.is_woken());
    assert_pending!(wait.poll());
    assert!(
        idle_wait(ms(20)).await < secs(1),
        "a stray timer moved the clock"
    );
    drop(tx);
}

// ===== extreme times =====

/// Past about 146 years from the channel's start, a deadline in nanoseconds no longer fits.
const CENTURY_AND_A_HALF: Duration = secs(150 * 365 * 24 * 3600);

/// Far past the 30 years windows used to be cut to, and within the range the clock keeps.
const CENTURY: Duration = secs(100 * 365 * 24 * 3600);

/// When a key is due: a window too long to represent means "not before a flush or a close",
/// never early. Windows used to be cut to 30 years.
#[tokio::test(start_paused = true)]
async fn unreachable_window_never_comes_due() {
    let (tx, mut rx) = timed::channel(CENTURY_AND_A_HALF * 2);
    tx.send("k", 1).await.unwrap();
    assert_eq!(rx.next_deadline(), None);
    advance(CENTURY).await;
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    tx.flush(&"k");
    assert_eq!(rx.try_recv(), Ok(vec![("k", vec![1])]));
}

/// When a key is due: in a channel older than about 146 years no deadline can be reached,
/// so a send's value waits; a flush, `flush_all`, `drain_now` and a close still take values
/// out. A flush did nothing there: it gave the key the deadline "never" too.
#[tokio::test(start_paused = true)]
async fn a_channel_past_its_range_delivers_what_is_made_due() {
    let (tx, mut rx) = timed::channel(Duration::ZERO);
    advance(CENTURY_AND_A_HALF).await;
    tx.send("k", 1).await.unwrap();
    assert_eq!(rx.next_deadline(), None);
    advance(secs(1)).await;
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    tx.flush(&"k");
    assert_eq!(rx.try_recv(), Ok(vec![("k", vec![1])]));
    tx.send("k", 2).await.unwrap();
    tx.flush_all();
    assert_eq!(rx.try_recv(), Ok(vec![("k", vec![2])]));
    tx.send("k", 3).await.unwrap();
    assert_eq!(rx.drain_now(), vec![vec![("k", vec![3])]]);
    tx.send("k", 4).await.unwrap();
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    drop(tx);
    assert_eq!(rx.try_recv(), Ok(vec![("k", vec![4])]));
}

/// When a key is due: past the range, a key full by `max_values_per_key` is due at once,
/// and a requeued one too; and a receiver waiting in a task is woken by a flush there. Each
/// counts by its reason in `Deliveries` (the full key was counted as `due`, as if the
/// deadline it never reaches had passed).
#[tokio::test(start_paused = true)]
async fn a_channel_past_its_range_delivers_full_requeued_and_flushed_keys() {
    let (tx, mut rx) = Builder::new(WINDOW).max_values_per_key(2).build();
    advance(CENTURY_AND_A_HALF).await;
    tx.send("k", 1).await.unwrap();
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    tx.send("k", 2).await.unwrap();
    let (key, values) = rx.try_recv().unwrap().remove(0);
    assert_eq!((key, &values[..]), ("k", &[1, 2][..]));
    rx.requeue(key, values).unwrap();
    assert_eq!(rx.try_recv(), Ok(vec![("k", vec![1, 2])]));

    let waiting = tokio::spawn(async move { rx.recv().await });
    tx.send("j", 3).await.unwrap();
    tokio::task::yield_now().await;
    assert!(
        !waiting.is_finished(),
        "a deadline past the range is not reached"
    );
    tx.flush(&"j");
    assert_eq!(waiting.await.unwrap(), Some(vec![("j", vec![3])]));
    let by = tx.stats().delivered_by;
    assert_eq!((by.full_key, by.due, by.flush), (1, 1, 1), "{by:?}");
}

/// When a key is due: past the range, a retried delivery comes back at once.
#[tokio::test(start_paused = true)]
async fn a_channel_past_its_range_delivers_a_retry() {
    let (tx, mut rx) = Builder::new(WINDOW).acked();
    advance(CENTURY_AND_A_HALF).await;
    tx.send("k", 1).await.unwrap();
    let delivery = rx.drain_now().remove(0).remove(0);
    delivery.retry().await.unwrap();
    let again = rx.try_recv().expect("a retry is due at once");
    assert_eq!((again[0].values(), again[0].attempt()), (&[1][..], 2));
}

/// When a key is due: a window of 40 years is kept, not cut to 30.
#[tokio::test(start_paused = true)]
async fn long_window_is_kept() {
    let forty_years = secs(40 * 365 * 24 * 3600);
    let (tx, mut rx) = timed::channel(forty_years);
    let start = Instant::now();
    tx.send("k", 1).await.unwrap();
    assert_eq!(rx.next_deadline(), Some(start + forty_years));
    advance(forty_years - secs(1)).await;
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    advance(secs(1)).await;
    assert_eq!(rx.try_recv(), Ok(vec![("k", vec![1])]));
}

/// When a key is due: a `send_by` deadline past the representable range used to be cut
/// short and came decades early; now it waits for a flush or a close.
#[tokio::test(start_paused = true)]
async fn unreachable_send_by_is_never_early() {
    let (tx, mut rx) = timed::channel(CENTURY_AND_A_HALF * 3);
    let far = Instant::now() + CENTURY_AND_A_HALF * 2;
    tx.send_by("k", 1, far).await.unwrap();
    assert_eq!(rx.next_deadline(), None);
    advance(CENTURY).await;
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    rx.close();
    assert_eq!(rx.try_recv(), Ok(vec![("k", vec![1])]));
}

/// When a key is due: "by" means "at the latest". A `send_by` deadline later than the window
/// does not hold a new key back past the window.
#[tokio::test(start_paused = true)]
async fn send_by_later_than_the_window_is_due_at_the_window() {
    let (tx, mut rx) = timed::channel(WINDOW);
    let start = Instant::now();
    tx.send_by("k", 1, start + WINDOW * 6).await.unwrap();
    assert_eq!(rx.next_deadline(), Some(start + WINDOW));
    advance(WINDOW - ms(1)).await;
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    advance(ms(1)).await;
    assert_eq!(rx.try_recv(), Ok(vec![("k", vec![1])]));
}

/// `next_deadline` after a close: everything is due at once, so it is the close time, not
/// `now + window`.
#[tokio::test(start_paused = true)]
async fn next_deadline_after_close() {
    let (tx, rx) = timed::channel(WINDOW);
    tx.send("k", 1).await.unwrap();
    advance(secs(2)).await;
    let closed_at = Instant::now();
    rx.close();
    advance(secs(1)).await;
    assert_eq!(rx.next_deadline(), Some(closed_at));
    let (tx, rx) = timed::channel::<&str, u32>(WINDOW);
    drop(tx);
    assert_eq!(rx.next_deadline(), None, "nothing pending");

    // A key past its deadline when the channel closed: the earlier of the two.
    let (tx, rx) = timed::channel(secs(1));
    let start = Instant::now();
    tx.send("k", 1).await.unwrap();
    advance(secs(2)).await;
    rx.close();
    assert_eq!(rx.next_deadline(), Some(start + secs(1)));
}

// ===== stream, counters, errors =====

/// The receiver is a `Stream` of batches that composes with `StreamExt`, each batch arriving
/// at its deadline, and the stream ends when the channel closes.
#[tokio::test(start_paused = true)]
async fn stream_composition() {
    let (tx, mut rx) = timed::channel(WINDOW);
    let start = Instant::now();
    tokio::spawn(async move {
        tx.send("a", 1).await.unwrap();
        tokio::time::sleep(secs(1)).await;
        tx.send("b", 2).await.unwrap();
        tx.send("a", 3).await.unwrap();
        tokio::time::sleep(secs(30)).await;
    });

    let timed: Vec<_> = rx
        .by_ref()
        .map(|batch| (start.elapsed(), batch))
        .take(2)
        .collect()
        .await;
    assert_eq!(
        timed,
        vec![
            (secs(10), vec![("a", vec![1, 3])]),
            (secs(11), vec![("b", vec![2])]),
        ]
    );
    assert_eq!(rx.next().await, None);
    assert_eq!(start.elapsed(), secs(31));
}

/// `try_recv` says `Empty` while nothing is due (even with values pending) and
/// `Disconnected` once closed and drained.
#[tokio::test(start_paused = true)]
async fn try_recv_empty_and_disconnected() {
    let (tx, mut rx) = timed::channel(WINDOW);
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    tx.try_send("a", 1).unwrap();
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    advance(WINDOW).await;
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![1])]));
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    drop(tx);
    assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
}

/// `next_deadline` is the earliest deadline among pending keys, and `None` when empty.
#[tokio::test(start_paused = true)]
async fn next_deadline() {
    let (tx, mut rx) = timed::channel(WINDOW);
    let start = Instant::now();
    assert_eq!(rx.next_deadline(), None);
    tx.send("a", 1).await.unwrap();
    assert_eq!(rx.next_deadline(), Some(start + WINDOW));
    advance(secs(2)).await;
    tx.send("b", 2).await.unwrap();
    assert_eq!(rx.next_deadline(), Some(start + WINDOW));
    tx.send_by("c", 3, start + secs(4)).await.unwrap();
    assert_eq!(rx.next_deadline(), Some(start + secs(4)));

    advance(secs(2)).await;
    assert_eq!(rx.try_recv(), Ok(vec![("c", vec![3])]));
    assert_eq!(rx.next_deadline(), Some(start + WINDOW));
    advance(secs(10)).await;
    assert_eq!(rx.try_recv(), Ok(vec![("a", vec![1]), ("b", vec![2])]));
    assert_eq!(rx.next_deadline(), None);
}

/// `len` counts pending values, `key_count` pending keys; `Sender::len` is the same count as
/// `Receiver::len`.
#[tokio::test(start_paused = true)]
async fn counters() {
    let (tx, mut rx) = Builder::new(WINDOW).max_batch(2).build();
    assert!(rx.is_empty());
    assert!(tx.is_empty());
    assert_eq!((rx.len(), rx.key_count(), tx.len()), (0, 0, 0));

    for v in 0..3 {
        tx.send("a", v).await.unwrap();
    }
    tx.send("b", 3).await.unwrap();
    assert_eq!((rx.len(), rx.key_count(), tx.len()), (4, 2, 4));
    assert!(!rx.is_empty());
    assert!(!tx.is_empty());

    advance(WINDOW).await;
    rx.try_recv().unwrap(); // a: 0, 1
    assert_eq!((rx.len(), rx.key_count(), tx.len()), (2, 2, 2));
    rx.requeue("c", vec![7, 8]).unwrap();
    assert_eq!((rx.len(), rx.key_count(), tx.len()), (4, 3, 4));
    while rx.try_recv().is_ok() {}
    assert!(rx.is_empty());
    assert!(tx.is_empty());
    assert_eq!(rx.key_count(), 0);
}

/// Only a `None` from the stream (or `recv`) terminates it: `try_recv` returning
/// `Disconnected` does not, and the stream then ends at its next poll.
#[tokio::test(start_paused = true)]
async fn try_recv_disconnected_does_not_terminate_the_stream() {
    use futures::stream::FusedStream;

    let (tx, mut rx) = timed::channel::<&str, u32>(WINDOW);
    drop(tx);
    assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
    assert!(!rx.is_terminated());
    assert_eq!(rx.next().await, None);
    assert!(rx.is_terminated());
}

/// Receivers are `FusedStream`s: `futures::select!` with `select_next_some()` compiles, and
/// `is_terminated` is true once the stream has ended.
#[tokio::test(start_paused = true)]
async fn fused_stream_in_futures_select() {
    use futures::stream::FusedStream;

    let (tx, mut rx) = timed::channel(WINDOW);
    tx.send("k", 1).await.unwrap();
    drop(tx);
    let mut got = Vec::new();
    let mut ticks = futures::stream::repeat(()).take(3).fuse();
    loop {
        futures::select! {
            batch = rx.select_next_some() => got.push(batch),
            () = ticks.select_next_some() => {}
            complete => break,
        }
    }
    assert_eq!(got, vec![vec![("k", vec![1])]]);
    assert!(rx.is_terminated());
    assert_eq!(rx.next().await, None);
}

// ===== builder =====

/// Limits: `max_batch(0)` panics with a clear message.
#[test]
#[should_panic(expected = "max_batch must be at least 1")]
fn zero_max_batch_panics() {
    let _ = Builder::new(WINDOW).max_batch(0);
}

/// Limits: `max_values_per_key(0)` panics with a clear message.
#[test]
#[should_panic(expected = "max_values_per_key must be at least 1")]
fn zero_max_values_per_key_panics() {
    let _ = Builder::new(WINDOW).max_values_per_key(0);
}

/// Limits: `capacity(0)` panics with a clear message.
#[test]
#[should_panic(expected = "capacity must be at least 1")]
fn zero_capacity_panics() {
    let _ = Builder::new(WINDOW).capacity(0);
}

/// A requeue goes in front of every pending value of its key, those handed back before
/// included: two failed parts of a split key keep their order when handed back newest
/// first, and swap when handed back as they came out. A batch split by `max_batch` then
/// takes the key's first values in that order, not the oldest.
#[tokio::test(start_paused = true)]
async fn requeues_go_in_front_of_earlier_requeues() {
    let order = |newest_first: bool| async move {
        let (tx, mut rx) = Builder::new(secs(10)).max_batch(2).build();
        for v in 1..=3u32 {
            tx.send("a", v).await.unwrap();
        }
        advance(secs(10)).await;
        let mut parts = vec![rx.try_recv().unwrap(), rx.try_recv().unwrap()];
        assert_eq!(parts, [vec![("a", vec![1, 2])], vec![("a", vec![3])]]);
        tx.send("a", 4).await.unwrap();
        if newest_first {
            parts.reverse();
        }
        for (key, values) in parts.into_iter().flatten() {
            rx.requeue(key, values).unwrap();
        }
        let drained = rx.drain_now().into_iter();
        drained
            .map(|batch| {
                batch
                    .into_iter()
                    .flat_map(|(_, values)| values)
                    .collect::<Vec<_>>()
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(order(true).await, [[1, 2], [3, 4]]);
    assert_eq!(order(false).await, [[3, 1], [2, 4]]);
}

/// A value whose deadline is never reached moves no deadline: sent into an empty channel,
/// it does not wake a waiting receiver.
#[tokio::test(start_paused = true)]
async fn a_send_that_never_comes_due_wakes_no_one() {
    let two_centuries = Duration::from_secs(200 * 365 * 24 * 3600);
    let (tx, mut rx) = timed::channel::<u32, u32>(two_centuries);
    let mut recv = task::spawn(rx.recv());
    assert_pending!(recv.poll());
    tx.try_send(1, 1).unwrap();
    assert!(!recv.is_woken(), "woken for a value that never comes due");
    // A value that does come due still wakes it.
    tx.try_send_by(2, 2, Instant::now() + secs(1)).unwrap();
    assert!(recv.is_woken());
}

/// When a key is due: past the range a deadline in the past is not reached either (the
/// `send_by` docs say so); a flush takes it out.
#[tokio::test(start_paused = true)]
async fn a_channel_past_its_range_does_not_reach_a_past_deadline() {
    let (tx, mut rx) = timed::channel(WINDOW);
    advance(CENTURY_AND_A_HALF).await;
    tx.send_by("k", 1, Instant::now() - secs(1)).await.unwrap();
    tx.try_send_by("j", 2, Instant::now()).unwrap();
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    tx.flush_all();
    assert_eq!(rx.try_recv(), Ok(vec![("k", vec![1]), ("j", vec![2])]));
}

/// Requeue: an empty `Vec` changes nothing; the key keeps its deadline.
#[tokio::test(start_paused = true)]
async fn requeue_of_nothing_changes_nothing() {
    let (tx, mut rx) = timed::channel(WINDOW);
    tx.send("k", 1).await.unwrap();
    rx.requeue("k", Vec::new()).unwrap();
    rx.requeue("j", Vec::new()).unwrap();
    assert_eq!(
        (rx.len(), rx.next_deadline()),
        (1, Some(Instant::now() + WINDOW))
    );
    assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
}
