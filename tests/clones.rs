//! Cloned receivers (the crate docs' "No polling"): each waiting receiver sleeps on a timer of
//! its own and is woken for every event that can make a key due, so a clone that waits and is
//! then never polled again holds up no other. These drive the receivers as users do: spawned
//! tasks, `select!`, `take_until`, and `Stream::next`.

mod common;

use std::future::poll_fn;
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

use futures::StreamExt;
use keyed_batch::{ordered, timed};
use tokio::sync::oneshot;
use tokio::time::{advance, Instant};
use tokio_test::task;
use tokio_test::{assert_pending, assert_ready};

use common::time::{ms, secs};
use common::touchy::{arm, disarm, panics, Touchy, What};

const WINDOW: Duration = secs(1);

/// Polls `rx` once as a `Stream`, inside a task that is then never polled again, and keeps
/// both alive: the state a `next()` left behind in a `select!` leaves a receiver in.
fn leave_waiting<S: futures::Stream + Unpin>(rx: &mut S)
where
    S::Item: std::fmt::Debug,
{
    let mut next = task::spawn(rx.next());
    assert_pending!(next.poll());
    // The future is dropped, the receiver stays registered, and nobody polls it again.
}

/// A clone that waited through `Stream::next` and was then left unpolled used to keep the
/// timer to itself: the other clone, waiting in `recv`, never got its batch. Now the other
/// gets it on time.
#[tokio::test(start_paused = true)]
async fn unpolled_stream_clone_does_not_starve_timed() {
    let (tx, mut idle) = timed::channel(WINDOW);
    let mut busy = idle.clone();
    leave_waiting(&mut idle);
    let start = Instant::now();
    let consumer = tokio::spawn(async move {
        let batch = busy.recv().await;
        (batch, Instant::now())
    });
    tokio::task::yield_now().await;
    tx.send("k", 1).await.unwrap();
    let (batch, at) = tokio::time::timeout(secs(60), consumer)
        .await
        .expect("the waiting clone got no batch")
        .unwrap();
    assert_eq!(batch, Some(vec![("k", vec![1])]));
    assert_eq!(at, start + WINDOW);
    drop(idle);
}

/// In `ordered` a stale clone used to swallow the wakes for new sends too.
#[tokio::test(start_paused = true)]
async fn unpolled_stream_clone_does_not_starve_ordered() {
    let (tx, mut idle) = ordered::channel();
    let mut busy = idle.clone();
    leave_waiting(&mut idle);
    let consumer = tokio::spawn(async move { busy.recv().await });
    tokio::task::yield_now().await;
    tx.send(1, "k", 'v').await.unwrap();
    let batch = tokio::time::timeout(secs(60), consumer)
        .await
        .expect("the waiting clone got no batch")
        .unwrap();
    assert_eq!(batch, Some(vec![("k", vec!['v'])]));
    drop(idle);
}

/// A `select!` loop whose `next()` branch loses to a shutdown signal leaves its receiver
/// registered; a second consumer still gets every batch at its deadline.
#[tokio::test(start_paused = true)]
async fn select_loser_does_not_starve_the_others() {
    let (tx, mut first) = timed::channel::<&str, u32>(WINDOW);
    let mut second = first.clone();
    let (stop, mut stopped) = oneshot::channel::<()>();
    let quitter = tokio::spawn(async move {
        tokio::select! {
            batch = first.next() => panic!("got {batch:?}"),
            _ = &mut stopped => {}
        }
        // The receiver lives on, unpolled.
        std::future::pending::<()>().await;
        drop(first);
    });
    tokio::task::yield_now().await;
    stop.send(()).unwrap();
    tokio::task::yield_now().await;

    let start = Instant::now();
    let consumer = tokio::spawn(async move {
        let mut got = Vec::new();
        while let Some(batch) = second.next().await {
            got.push((batch, Instant::now()));
        }
        got
    });
    tx.send("a", 1).await.unwrap();
    // Sleeping lets paused time run to each timer in turn, so the consumer sees each
    // deadline as it passes.
    tokio::time::sleep(secs(3)).await;
    tx.send("b", 2).await.unwrap();
    drop(tx);
    let got = tokio::time::timeout(secs(60), consumer)
        .await
        .expect("the second consumer did not finish")
        .unwrap();
    assert_eq!(
        got,
        vec![
            (vec![("a", vec![1])], start + WINDOW),
            // Closed when the last sender went: due at once.
            (vec![("b", vec![2])], start + secs(3)),
        ]
    );
    quitter.abort();
}

/// `(&mut rx).take_until(shutdown)` that ended leaves the receiver registered; a clone in
/// another task still gets its batches.
#[tokio::test(start_paused = true)]
async fn take_until_that_ended_does_not_starve_the_others() {
    let (tx, mut rx) = timed::channel::<u32, u32>(WINDOW);
    let mut clone = rx.clone();
    let (stop, stopped) = oneshot::channel::<()>();
    let mut taken = task::spawn(async move {
        let mut stream = (&mut rx).take_until(stopped);
        while stream.next().await.is_some() {}
        rx
    });
    assert_pending!(taken.poll());
    stop.send(()).unwrap();
    let rx = assert_ready!(taken.poll());

    let start = Instant::now();
    tx.send(7, 70).await.unwrap();
    let batch = tokio::time::timeout(secs(60), clone.recv())
        .await
        .expect("the clone got no batch");
    assert_eq!(batch, Some(vec![(7, vec![70])]));
    assert_eq!(Instant::now(), start + WINDOW);
    drop(rx);
}

/// A receiver whose `poll_next` panicked (here a key's `Clone` panics when a batch splits
/// it) stays registered, unpolled, behind a supervisor that caught the panic. The other
/// receiver still wakes at the deadline and gets the key, whole.
#[tokio::test(start_paused = true)]
async fn panic_in_poll_next_does_not_starve_the_others() {
    let (tx, mut first) = timed::Builder::new(WINDOW)
        .max_batch(2)
        .build::<Touchy, u32>();
    let mut second = first.clone();
    for v in 0..3 {
        tx.send(Touchy(7), v).await.unwrap();
    }
    let mut poisoned = task::spawn(first.next());
    let mut other = task::spawn(second.recv());
    assert_pending!(poisoned.poll());
    assert_pending!(other.poll());
    advance(WINDOW).await;
    arm(7, &[What::Clone]);
    assert!(panics(|| poisoned.poll()));
    disarm();
    assert!(other.is_woken(), "the other receiver was not woken");
    let batch = assert_ready!(other.poll());
    assert_eq!(batch, Some(vec![(Touchy(7), vec![0, 1, 2])]));
    drop(poisoned);
}

/// The documented bound, counted for 1, 4 and 16 idle clones: with `n` receivers waiting, a
/// deadline wakes each of them once (one takes the batch, the rest find nothing and wait
/// again), and so does a send that moves the earliest deadline (here, into an empty
/// channel), since each receiver re-arms its own timer.
#[tokio::test(start_paused = true)]
async fn wakes_per_batch_with_idle_clones() {
    for n in [1usize, 4, 16] {
        let (tx, rx) = timed::channel::<u32, u32>(WINDOW);
        let mut receivers: Vec<_> = (0..n).map(|_| rx.clone()).collect();
        drop(rx);
        let mut waiting: Vec<_> = receivers
            .iter_mut()
            .map(|rx| task::spawn(poll_fn(move |cx| rx.poll_recv(cx))))
            .collect();
        let (mut wakes, mut batches) = (0, 0);
        for round in 0..10u32 {
            for w in waiting.iter_mut() {
                if let Poll::Ready(batch) = w.poll() {
                    panic!("round {round}: a batch before any send: {batch:?}");
                }
            }
            // A send into an empty channel moves the earliest deadline: every receiver
            // re-arms its timer. Not counted: it is a wake per send burst, not per batch.
            tx.send(round, round).await.unwrap();
            let rearm = waiting.iter().filter(|w| w.is_woken()).count();
            assert_eq!(rearm, n, "round {round}: a new deadline wakes every waiter");
            for w in waiting.iter_mut() {
                assert!(w.poll().is_pending());
            }
            advance(WINDOW - ms(1)).await;
            assert!(waiting.iter().all(|w| !w.is_woken()), "woken early");
            advance(ms(1)).await;
            wakes += waiting.iter().filter(|w| w.is_woken()).count();
            let mut got = 0;
            for w in waiting.iter_mut() {
                if w.is_woken() {
                    if let Poll::Ready(batch) = w.poll() {
                        assert_eq!(batch, Some(vec![(round, vec![round])]));
                        got += 1;
                    }
                }
            }
            assert_eq!(got, 1, "round {round}: one receiver takes the batch");
            batches += 1;
        }
        assert_eq!(wakes, n * batches, "{n} idle clones: wakes per batch");
    }
}

/// A single receiver waiting on a quiet channel is not woken at all, and once a value is
/// sent it is woken exactly when the key is due.
#[tokio::test(start_paused = true)]
async fn single_receiver_has_no_spurious_wakes() {
    let (tx, mut rx) = timed::channel::<u32, u32>(WINDOW);
    let mut recv = task::spawn(rx.recv());
    assert_pending!(recv.poll());
    advance(secs(3600)).await;
    assert!(!recv.is_woken());
    tx.send(1, 1).await.unwrap();
    assert!(recv.is_woken(), "a new deadline: the receiver re-arms");
    assert_pending!(recv.poll());
    tx.send(1, 2).await.unwrap();
    tx.send(2, 3).await.unwrap();
    assert!(!recv.is_woken(), "later deadlines wake no one");
    advance(WINDOW - ms(1)).await;
    assert!(!recv.is_woken());
    advance(ms(1)).await;
    assert!(recv.is_woken());
    let batch = assert_ready!(recv.poll());
    assert_eq!(batch, Some(vec![(1, vec![1, 2]), (2, vec![3])]));
}

/// Two consumers, each a spawned task looping on `recv`, on a busy channel: every value is
/// delivered exactly once, each batch at its deadline.
#[tokio::test(start_paused = true)]
async fn spawned_consumers_share_every_batch_once() {
    let (tx, rx) = timed::channel::<u32, u32>(ms(50));
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
    for i in 0..1_000 {
        tx.send(i % 17, i).await.unwrap();
        if i % 10 == 0 {
            advance(ms(7)).await;
        }
    }
    drop(tx);
    let mut all = Vec::new();
    for consumer in consumers {
        all.extend(consumer.await.unwrap());
    }
    all.sort_unstable();
    assert_eq!(all, (0..1_000).collect::<Vec<_>>());
}

/// A `recv` pinned in a `select!` loop and polled again after another branch won keeps
/// working: it gets the batch at the deadline.
#[tokio::test(start_paused = true)]
async fn recv_in_a_select_loop() {
    let (tx, mut rx) = timed::channel::<u32, u32>(WINDOW);
    let start = Instant::now();
    tx.send(1, 1).await.unwrap();
    let mut ticks = 0;
    let mut recv = pin!(rx.recv());
    let batch = loop {
        tokio::select! {
            batch = &mut recv => break batch,
            _ = tokio::time::sleep(ms(300)) => ticks += 1,
        }
    };
    assert_eq!(batch, Some(vec![(1, vec![1])]));
    assert_eq!(Instant::now(), start + WINDOW);
    assert_eq!(ticks, 3);
}
