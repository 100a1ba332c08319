//! The Redis flavour against the in-memory acknowledging channel: each case of the semantics
//! they share is written once, over a small adapter, and runs on both, as `in_memory::*` and
//! `on_redis::*`. The cases only Redis has follow, in `redis_only`.
//!
//! Both run in real time (Redis keeps its own clock), so windows are tens of milliseconds:
//! lower bounds are asserted exactly, upper bounds loosely, for a loaded machine. Each Redis
//! test starts its own `redis-server`, and skips where there is none (see
//! `common/redis_server.rs`).

#[path = "common/redis_server.rs"]
mod redis_server;

use std::collections::BTreeMap;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use keyed_batch::ack::{self, DeadLetters, Delivery};
use keyed_batch::{redis, timed};
use tokio::time::{sleep, timeout};

use redis_server::RedisServer;

type Key = u32;
type Value = u32;
type Batch = Vec<Delivery<Key, Value>>;

/// Long enough for anything due to arrive on a loaded machine: waiting longer is a failure.
const PATIENCE: Duration = Duration::from_secs(5);
/// The most a consumer task may run: values that come back for ever never leave
/// [`PATIENCE`] without a batch.
const CONSUMER_LIMIT: Duration = Duration::from_secs(30);

const fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

// ===== the adapter =====

/// Which implementation a shared case runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// `timed::Builder::acked()`.
    Memory,
    /// `redis::Builder`, on a `redis-server` of the test's own.
    Redis,
}

/// The settings both modes take; [`open`](Self::open) makes the queue.
struct Setup {
    name: &'static str,
    window: Duration,
    max_batch: usize,
    max_attempts: Option<u32>,
}

fn setup(name: &'static str, window: Duration) -> Setup {
    Setup {
        name,
        window,
        // The Redis flavour's default, set on both.
        max_batch: 1000,
        max_attempts: None,
    }
}

impl Setup {
    fn max_batch(mut self, n: usize) -> Self {
        self.max_batch = n;
        self
    }

    fn max_attempts(mut self, n: u32) -> Self {
        self.max_attempts = Some(n);
        self
    }

    /// The queue; `None` where Redis is wanted and there is no `redis-server` (the harness
    /// has printed the skip line).
    async fn open(self, mode: Mode) -> Option<Queue> {
        match mode {
            Mode::Memory => {
                let mut builder = timed::Builder::new(self.window).max_batch(self.max_batch);
                if let Some(n) = self.max_attempts {
                    builder = builder.max_attempts(n);
                }
                let (tx, rx) = builder.acked();
                Some(Queue {
                    mode,
                    tx: Tx::Memory(tx),
                    rx: Rx::Memory(rx),
                    _server: None,
                })
            }
            Mode::Redis => {
                let server = RedisServer::start()?;
                let mut builder = redis::Builder::new(server.url(), self.name, self.window)
                    .max_batch(self.max_batch);
                if let Some(n) = self.max_attempts {
                    builder = builder.max_attempts(n);
                }
                let tx = builder.sender().await.expect("open the sender");
                let rx = builder.receiver().await.expect("open the receiver");
                Some(Queue {
                    mode,
                    tx: Tx::Redis(tx),
                    rx: Rx::Redis(rx),
                    _server: Some(server),
                })
            }
        }
    }
}

/// One queue of either mode: its sender, its receiver, and the server it lives on.
struct Queue {
    mode: Mode,
    tx: Tx,
    rx: Rx,
    /// Declared last, so dropped after the handles.
    _server: Option<RedisServer>,
}

impl Queue {
    /// How early a deadline may look, measured with `std::time::Instant` from before the
    /// send: tokio's timer counts whole milliseconds; Redis rounds deadlines up.
    fn early(&self) -> Duration {
        match self.mode {
            Mode::Memory => ms(1),
            Mode::Redis => Duration::ZERO,
        }
    }

    /// Closes the queue explicitly in both modes: dropping the senders closes an in-memory
    /// channel, but not a Redis queue.
    async fn close(&self) {
        self.rx.close().await;
    }
}

/// A sender of either mode.
#[derive(Clone)]
enum Tx {
    Memory(timed::Sender<Key, Value>),
    Redis(redis::Sender<Key, Value>),
}

/// A send refused because the queue is closed, with its key and value back.
#[derive(Debug, PartialEq, Eq)]
struct Closed(Key, Value);

impl Tx {
    async fn send(&self, key: Key, value: Value) -> Result<(), Closed> {
        match self {
            Tx::Memory(tx) => tx.send(key, value).await.map_err(memory_refusal),
            Tx::Redis(tx) => tx.send(key, value).await.map_err(redis_refusal),
        }
    }

    /// Sends a value due `within` from now at the latest.
    async fn send_by(&self, key: Key, value: Value, within: Duration) -> Result<(), Closed> {
        match self {
            Tx::Memory(tx) => {
                let deadline = tokio::time::Instant::now() + within;
                tx.send_by(key, value, deadline)
                    .await
                    .map_err(memory_refusal)
            }
            Tx::Redis(tx) => tx.send_by(key, value, within).await.map_err(redis_refusal),
        }
    }
}

fn memory_refusal(err: keyed_batch::error::SendError<(Key, Value)>) -> Closed {
    let (key, value) = err.into_inner();
    Closed(key, value)
}

/// A closed queue is the only refusal a case expects: a failed send fails the test.
fn redis_refusal(err: redis::SendError<(Key, Value)>) -> Closed {
    match err {
        redis::SendError::Closed((key, value)) => Closed(key, value),
        other => panic!("the send failed: {other}"),
    }
}

/// A receiver of either mode; a `Stream` of batches, as each is.
#[derive(Clone)]
enum Rx {
    Memory(timed::AckReceiver<Key, Value>),
    Redis(redis::Receiver<Key, Value>),
}

impl Rx {
    /// The next batch; `None` once the queue is closed, empty, and nothing is in flight.
    ///
    /// Redis's `recv` is not cancel safe while a pull is on its way, but a pull takes only
    /// keys that are due: a timeout that drops it while it takes some has already failed
    /// the case that expected nothing.
    async fn recv(&mut self) -> Option<Batch> {
        match self {
            Rx::Memory(rx) => rx.recv().await,
            Rx::Redis(rx) => rx
                .recv()
                .await
                .unwrap_or_else(|err| panic!("recv failed: {err}")),
        }
    }

    fn dead_letters(&self) -> DeadLetters<Key, Value> {
        match self {
            Rx::Memory(rx) => rx.dead_letters(),
            Rx::Redis(rx) => rx.dead_letters(),
        }
    }

    async fn close(&self) {
        match self {
            Rx::Memory(rx) => rx.close(),
            Rx::Redis(rx) => rx.close().await.expect("close the queue"),
        }
    }
}

impl Stream for Rx {
    type Item = Batch;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Batch>> {
        match self.get_mut() {
            Rx::Memory(rx) => rx.poll_next_unpin(cx),
            Rx::Redis(rx) => rx.poll_next_unpin(cx),
        }
    }
}

// ===== helpers =====

/// Keys and values of deliveries, in their order.
fn contents<'a>(
    deliveries: impl IntoIterator<Item = &'a Delivery<Key, Value>>,
) -> Vec<(Key, Vec<Value>)> {
    deliveries
        .into_iter()
        .map(|d| (*d.key(), d.values().to_vec()))
        .collect()
}

/// The next batch, which must come within [`PATIENCE`].
async fn next_batch(rx: &mut Rx) -> Batch {
    match timeout(PATIENCE, rx.recv()).await {
        Ok(Some(batch)) => {
            assert!(!batch.is_empty(), "an empty batch");
            batch
        }
        Ok(None) => panic!("the stream ended"),
        Err(_) => panic!("no batch within {PATIENCE:?}"),
    }
}

/// Exactly `n` deliveries, from as many batches as it takes, each with the time its batch
/// came.
async fn deliveries(rx: &mut Rx, n: usize) -> Vec<(Instant, Delivery<Key, Value>)> {
    let mut out = Vec::new();
    while out.len() < n {
        let batch = next_batch(rx).await;
        let at = Instant::now();
        out.extend(batch.into_iter().map(|d| (at, d)));
    }
    assert_eq!(
        out.len(),
        n,
        "more deliveries than expected: {:?}",
        contents(out.iter().map(|(_, d)| d))
    );
    out
}

/// Asserts that no batch comes, and the stream does not end, for `d`.
async fn assert_quiet(rx: &mut Rx, d: Duration, why: &str) {
    if let Ok(batch) = timeout(d, rx.recv()).await {
        panic!("{why}, but got {:?}", batch.as_deref().map(contents));
    }
}

/// Asserts that the stream ends within [`PATIENCE`].
async fn assert_ends(rx: &mut Rx) {
    match timeout(PATIENCE, rx.recv()).await {
        Ok(None) => {}
        Ok(Some(batch)) => panic!("the stream goes on: {:?}", contents(&batch)),
        Err(_) => panic!("the stream did not end within {PATIENCE:?}"),
    }
}

async fn ack_each(deliveries: impl IntoIterator<Item = Delivery<Key, Value>>) {
    for delivery in deliveries {
        delivery.ack().await.expect("ack");
    }
}

// ===== the shared cases =====

/// Each case runs on both modes: `in_memory::case` and `on_redis::case`.
macro_rules! on_both {
    ($($case:ident),* $(,)?) => {
        mod in_memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(super::Mode::Memory).await;
                }
            )*
        }

        mod on_redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(super::Mode::Redis).await;
                }
            )*
        }
    };
}

on_both!(
    a_keys_values_come_together_after_the_window,
    keys_come_in_deadline_order,
    max_batch_splits_a_key,
    one_delivery_per_key_in_flight,
    retries_come_back_in_front,
    give_up_hands_the_values_back,
    the_last_attempt_makes_a_dead_letter,
    close_refuses_sends_and_drains,
    close_cuts_a_retry_delay_short,
    a_retry_delay_made_while_a_receiver_waits_ends_on_time,
    a_retried_key_keeps_its_rank,
    a_delayed_retry_keeps_its_rank,
    a_split_retry_keeps_its_attempt,
    attempts_are_counted_per_value,
    ack_all_then_the_stream_ends,
    a_stream_from_many_tasks,
);

/// The values of one key come in one delivery, in the order they were sent, not before
/// the window.
async fn a_keys_values_come_together_after_the_window(mode: Mode) {
    let window = ms(100);
    let Some(mut q) = setup("together", window).open(mode).await else {
        return;
    };
    let start = Instant::now();
    for (key, value) in [(1, 10), (2, 20), (1, 11), (2, 21), (1, 12)] {
        q.tx.send(key, value).await.unwrap();
    }
    let got = deliveries(&mut q.rx, 2).await;
    assert_eq!(
        contents(got.iter().map(|(_, d)| d)),
        [(1, vec![10, 11, 12]), (2, vec![20, 21])]
    );
    for (at, delivery) in &got {
        let waited = *at - start;
        assert!(waited + q.early() >= window, "early: {waited:?}");
        assert!(waited < window + ms(500), "late: {waited:?}");
        assert_eq!(delivery.attempt(), 1);
    }
    ack_each(got.into_iter().map(|(_, d)| d)).await;
}

/// Keys come in the order of their deadlines. `send_by` makes a key due before its window;
/// a later `send_by` with an earlier deadline moves the key earlier, and later sends with
/// later deadlines do not move it later.
async fn keys_come_in_deadline_order(mode: Mode) {
    let window = ms(1000);
    let Some(mut q) = setup("deadlines", window).open(mode).await else {
        return;
    };
    let start = Instant::now();
    q.tx.send_by(4, 40, ms(450)).await.unwrap();
    // Due within 300 ms: neither a later deadline nor the window moves it later, past 4.
    q.tx.send_by(3, 30, ms(300)).await.unwrap();
    q.tx.send_by(3, 31, ms(600)).await.unwrap();
    q.tx.send(3, 32).await.unwrap();
    // Due a window after, then within 50 ms: it moves to the front.
    q.tx.send(1, 10).await.unwrap();
    q.tx.send_by(1, 11, ms(50)).await.unwrap();
    q.tx.send_by(2, 20, ms(200)).await.unwrap();

    let got = deliveries(&mut q.rx, 4).await;
    assert_eq!(
        contents(got.iter().map(|(_, d)| d)),
        [
            (1, vec![10, 11]),
            (2, vec![20]),
            (3, vec![30, 31, 32]),
            (4, vec![40])
        ]
    );
    // Each was sent after `start`, so its deadline is no earlier than `start + within`.
    for ((at, delivery), within) in got.iter().zip([50, 200, 300, 450]) {
        let waited = *at - start;
        assert!(
            waited + q.early() >= ms(within),
            "key {} early: {waited:?}",
            delivery.key()
        );
    }
    let first = got[0].0 - start;
    assert!(first < window, "key 1 waited its window: {first:?}");
    ack_each(got.into_iter().map(|(_, d)| d)).await;
}

/// `max_batch` splits a key: the first delivery has that many values, and the rest go out
/// once it is acknowledged, in order.
async fn max_batch_splits_a_key(mode: Mode) {
    let window = ms(50);
    let Some(mut q) = setup("split", window).max_batch(3).open(mode).await else {
        return;
    };
    for value in 0..7 {
        q.tx.send(1, value).await.unwrap();
    }
    let first = next_batch(&mut q.rx).await;
    assert_eq!(contents(&first), [(1, vec![0, 1, 2])]);
    assert_quiet(
        &mut q.rx,
        window * 3,
        "the rest of a split key waits for the part before it",
    )
    .await;
    ack_each(first).await;
    let second = next_batch(&mut q.rx).await;
    assert_eq!(contents(&second), [(1, vec![3, 4, 5])]);
    assert_eq!(second[0].attempt(), 1);
    ack_each(second).await;
    let third = next_batch(&mut q.rx).await;
    assert_eq!(contents(&third), [(1, vec![6])]);
    assert_eq!(third[0].attempt(), 1);
    ack_each(third).await;
}

/// While a key has a delivery in flight, its newer values wait, and other keys go on; once
/// it is acknowledged, they come, as a first attempt.
async fn one_delivery_per_key_in_flight(mode: Mode) {
    let window = ms(50);
    let Some(mut q) = setup("in-flight", window).open(mode).await else {
        return;
    };
    q.tx.send(1, 1).await.unwrap();
    let first = next_batch(&mut q.rx).await;
    assert_eq!(contents(&first), [(1, vec![1])]);
    q.tx.send(1, 2).await.unwrap();
    q.tx.send(1, 3).await.unwrap();
    q.tx.send(2, 20).await.unwrap();
    let second = next_batch(&mut q.rx).await;
    assert_eq!(contents(&second), [(2, vec![20])], "key 2 is not held up");
    assert_quiet(&mut q.rx, window * 3, "key 1 is in flight").await;
    ack_each(first).await;
    let third = next_batch(&mut q.rx).await;
    assert_eq!(contents(&third), [(1, vec![2, 3])]);
    assert_eq!(third[0].attempt(), 1);
    ack_each(second.into_iter().chain(third)).await;
}

/// A retry brings the values back in front of the key's newer ones, as the next attempt;
/// dropping a delivery retries it; `retry_after(d)` holds the key for `d`.
async fn retries_come_back_in_front(mode: Mode) {
    let window = ms(50);
    let Some(mut q) = setup("retry", window).open(mode).await else {
        return;
    };
    q.tx.send(1, 1).await.unwrap();
    q.tx.send(1, 2).await.unwrap();
    let first = next_batch(&mut q.rx).await.remove(0);
    assert_eq!((first.values(), first.attempt()), (&[1, 2][..], 1));
    q.tx.send(1, 3).await.unwrap();
    first.retry().await.unwrap();

    let second = next_batch(&mut q.rx).await.remove(0);
    assert_eq!((second.values(), second.attempt()), (&[1, 2, 3][..], 2));
    q.tx.send(1, 4).await.unwrap();
    drop(second);

    let third = next_batch(&mut q.rx).await.remove(0);
    assert_eq!((third.values(), third.attempt()), (&[1, 2, 3, 4][..], 3));
    let delay = ms(200);
    let retried = Instant::now();
    third.retry_after(delay).await.unwrap();
    // It joins the held key, and does not cut the delay short.
    q.tx.send_by(1, 5, ms(10)).await.unwrap();

    let fourth = next_batch(&mut q.rx).await;
    let waited = retried.elapsed();
    assert_eq!(contents(&fourth), [(1, vec![1, 2, 3, 4, 5])]);
    assert_eq!(fourth[0].attempt(), 4);
    assert!(
        waited + q.early() >= delay,
        "retry_after was early: {waited:?}"
    );
    assert!(waited < delay + ms(500), "retry_after was late: {waited:?}");
    ack_each(fourth).await;
    assert_quiet(&mut q.rx, window * 3, "everything was acknowledged").await;
}

/// `give_up` hands the key and its values back, and they leave the queue.
async fn give_up_hands_the_values_back(mode: Mode) {
    let window = ms(50);
    let Some(mut q) = setup("give-up", window).open(mode).await else {
        return;
    };
    q.tx.send(1, 1).await.unwrap();
    q.tx.send(1, 2).await.unwrap();
    q.tx.send(2, 20).await.unwrap();
    let mut got = deliveries(&mut q.rx, 2).await.into_iter().map(|(_, d)| d);
    let one = got.next().unwrap();
    let two = got.next().unwrap();
    q.tx.send(1, 3).await.unwrap();
    assert_eq!(one.give_up().await.unwrap(), (1, vec![1, 2]));
    assert_eq!(*two.key(), 2);
    two.ack().await.unwrap();

    // The key goes on, without the values given up: the value sent meanwhile is new.
    let next = next_batch(&mut q.rx).await;
    assert_eq!(contents(&next), [(1, vec![3])]);
    assert_eq!(next[0].attempt(), 1);
    ack_each(next).await;
    q.close().await;
    assert_ends(&mut q.rx).await;
}

/// With `max_attempts(n)`, retrying attempt `n` makes a dead letter with `attempts == n`,
/// which a waiting `dead_letters()` stream gets at once; the values leave the queue.
async fn the_last_attempt_makes_a_dead_letter(mode: Mode) {
    let window = ms(50);
    let Some(mut q) = setup("dead", window).max_attempts(2).open(mode).await else {
        return;
    };
    let mut dead = q.rx.dead_letters();
    q.tx.send(1, 1).await.unwrap();
    q.tx.send(2, 20).await.unwrap();
    let mut got = deliveries(&mut q.rx, 2).await.into_iter().map(|(_, d)| d);
    let one = got.next().unwrap();
    got.next().unwrap().ack().await.unwrap();
    assert_eq!((*one.key(), one.attempt()), (1, 1));
    one.retry().await.unwrap();
    let last = next_batch(&mut q.rx).await.remove(0);
    assert_eq!((*last.key(), last.attempt()), (1, 2));

    // Waiting already (so Redis's first fetch found nothing) when the dead letter is made.
    let waiter = tokio::spawn(async move {
        let letter = timeout(ms(3000), dead.next()).await;
        (letter, Instant::now())
    });
    sleep(ms(50)).await;
    let retried = Instant::now();
    last.retry().await.unwrap();
    let (letter, at) = waiter.await.unwrap();
    let letter = letter
        .expect("no dead letter within 3 s")
        .expect("the dead letters ended");
    assert_eq!(
        (letter.key, letter.values, letter.attempts),
        (1, vec![1], 2)
    );
    // Redis looks for dead letters once a second, and at once when this process makes one.
    let took = at - retried;
    assert!(took < ms(900), "the dead letter took {took:?}");

    assert_quiet(&mut q.rx, window * 3, "the dead letter left the queue").await;
    q.close().await;
    assert_ends(&mut q.rx).await;
    // Closed, empty, and no dead letter left: the dead letters end too.
    let mut dead = q.rx.dead_letters();
    match timeout(ms(3000), dead.next()).await {
        Ok(None) => {}
        Ok(Some(letter)) => panic!("another dead letter: {letter:?}"),
        Err(_) => panic!("the dead letters did not end"),
    }
}

/// After `close`, sends fail and hand the value back, the waiting keys are due at once,
/// and the stream ends once every delivery is decided.
async fn close_refuses_sends_and_drains(mode: Mode) {
    let window = ms(10_000);
    let Some(mut q) = setup("close", window).open(mode).await else {
        return;
    };
    q.tx.send(1, 1).await.unwrap();
    q.tx.send(2, 2).await.unwrap();
    q.tx.send(1, 11).await.unwrap();
    q.close().await;
    assert_eq!(q.tx.send(1, 3).await, Err(Closed(1, 3)));
    assert_eq!(q.tx.send_by(3, 30, ms(10)).await, Err(Closed(3, 30)));

    let start = Instant::now();
    let got = deliveries(&mut q.rx, 2).await;
    let waited = got[1].0 - start;
    assert!(waited < ms(2000), "not due at once after close: {waited:?}");
    assert_eq!(
        contents(got.iter().map(|(_, d)| d)),
        [(1, vec![1, 11]), (2, vec![2])]
    );
    assert_quiet(&mut q.rx, ms(200), "two deliveries are in flight").await;
    ack_each(got.into_iter().map(|(_, d)| d)).await;
    assert_ends(&mut q.rx).await;
}

/// A retry delay is not waited for once the queue is closed.
async fn close_cuts_a_retry_delay_short(mode: Mode) {
    let window = ms(50);
    let Some(mut q) = setup("close-delay", window).open(mode).await else {
        return;
    };
    q.tx.send(1, 1).await.unwrap();
    let first = next_batch(&mut q.rx).await.remove(0);
    first.retry_after(ms(10_000)).await.unwrap();
    assert_quiet(&mut q.rx, window * 3, "the key is held").await;
    let closed = Instant::now();
    q.close().await;
    let again = next_batch(&mut q.rx).await;
    let waited = closed.elapsed();
    assert!(waited < ms(2000), "the delay was waited for: {waited:?}");
    assert_eq!(contents(&again), [(1, vec![1])]);
    assert_eq!(again[0].attempt(), 2);
    ack_each(again).await;
    assert_ends(&mut q.rx).await;
}

/// A retry delay that a delivery asks for while a receiver already waits ends on time: the
/// waiting receiver learns of it. In Redis it used to learn only at its once-a-second look.
async fn a_retry_delay_made_while_a_receiver_waits_ends_on_time(mode: Mode) {
    let delay = ms(50);
    let Some(mut q) = setup("retry-while-waiting", ms(10)).open(mode).await else {
        return;
    };
    q.tx.send(1, 1).await.unwrap();
    let first = next_batch(&mut q.rx).await.remove(0);
    let retry = tokio::spawn(async move {
        // Made once the receiver below is asleep.
        sleep(ms(150)).await;
        let start = Instant::now();
        first.retry_after(delay).await.unwrap();
        start
    });
    let again = next_batch(&mut q.rx).await;
    let came = Instant::now();
    let start = retry.await.unwrap();
    assert!(came >= start + delay, "the delay was cut short");
    let waited = came - start;
    assert!(
        waited < delay + ms(400),
        "came back {waited:?} after the retry"
    );
    assert_eq!(
        (contents(&again), again[0].attempt()),
        (vec![(1, vec![1])], 2)
    );
    ack_each(again).await;
}

/// A key retried at once keeps the rank it had: it goes ahead of a key that came due
/// while it was in flight.
async fn a_retried_key_keeps_its_rank(mode: Mode) {
    let window = ms(50);
    let Some(mut q) = setup("retry-rank", window).open(mode).await else {
        return;
    };
    q.tx.send(2, 20).await.unwrap();
    let two = next_batch(&mut q.rx).await.remove(0);
    q.tx.send(1, 10).await.unwrap();
    tokio::time::sleep(window * 2).await;
    two.retry().await.unwrap();
    let batch = next_batch(&mut q.rx).await;
    assert_eq!(contents(&batch), [(2, vec![20]), (1, vec![10])]);
    assert_eq!(batch[0].attempt(), 2);
    ack_each(batch).await;
}

/// A key retried after a delay is not taken before it, and then still goes ahead of a key
/// that came due meanwhile.
async fn a_delayed_retry_keeps_its_rank(mode: Mode) {
    let window = ms(50);
    let Some(mut q) = setup("retry-delay-rank", window).open(mode).await else {
        return;
    };
    q.tx.send(2, 20).await.unwrap();
    let two = next_batch(&mut q.rx).await.remove(0);
    let retried = Instant::now();
    two.retry_after(ms(200)).await.unwrap();
    q.tx.send(1, 10).await.unwrap();
    let first = next_batch(&mut q.rx).await;
    assert_eq!(contents(&first), [(1, vec![10])]);
    q.tx.send(1, 11).await.unwrap();
    // Key 1 is due again at about 50 + 50 ms, key 2 at 200 ms: hold key 1 in flight past
    // both, so that both are due when the next batch is taken.
    tokio::time::sleep(ms(300)).await;
    ack_each(first).await;
    let batch = next_batch(&mut q.rx).await;
    assert!(retried.elapsed() >= ms(200));
    assert_eq!(contents(&batch), [(2, vec![20]), (1, vec![11])]);
    ack_each(batch).await;
}

/// A retried delivery that a batch cap then splits: the part split off was handed out
/// before, so it keeps the retry's attempt, not 1.
async fn a_split_retry_keeps_its_attempt(mode: Mode) {
    let window = ms(50);
    let Some(mut q) = setup("split-retry", window).max_batch(3).open(mode).await else {
        return;
    };
    // Key 1 goes out alone, then key 2 fills a batch: each in flight, key 1 due first.
    q.tx.send(1, 10).await.unwrap();
    let one = next_batch(&mut q.rx).await.remove(0);
    for value in 1..=3 {
        q.tx.send(2, value).await.unwrap();
    }
    let two = next_batch(&mut q.rx).await.remove(0);
    assert_eq!(
        (*two.key(), two.values(), two.attempt()),
        (2, &[1, 2, 3][..], 1)
    );
    // Key 1 comes back first, by either its first deadline or its retry, and takes a
    // share of the next batch.
    one.retry().await.unwrap();
    two.retry().await.unwrap();
    let second = next_batch(&mut q.rx).await;
    assert_eq!(contents(&second), [(1, vec![10]), (2, vec![1, 2])]);
    assert_eq!((second[0].attempt(), second[1].attempt()), (2, 2));
    ack_each(second).await;
    let third = next_batch(&mut q.rx).await;
    assert_eq!(contents(&third), [(2, vec![3])]);
    assert_eq!(third[0].attempt(), 2, "value 3 comes back");
    ack_each(third).await;
}

/// A delivery's attempt is its first value's own count, even when the values behind it
/// were handed out fewer times, and `max_attempts` counts by it too: a value handed out
/// once, behind one handed out twice, gets two more attempts once the older one is gone.
async fn attempts_are_counted_per_value(mode: Mode) {
    let window = ms(40);
    let setup = setup("attempts-per-value", window).max_batch(2);
    let Some(mut q) = setup.max_attempts(3).open(mode).await else {
        return;
    };
    let attempts = |batch: &Batch| batch.iter().map(Delivery::attempt).collect::<Vec<_>>();
    q.tx.send(1, 10).await.unwrap(); // due first
    q.tx.send(2, 1).await.unwrap();
    q.tx.send(2, 2).await.unwrap();
    sleep(window * 3).await;
    let mut first = next_batch(&mut q.rx).await;
    assert_eq!(contents(&first), [(1, vec![10]), (2, vec![1])]);
    let (two, one) = (first.pop().unwrap(), first.pop().unwrap());
    two.retry().await.unwrap();
    // Value 1 goes out a second time, value 2 a first.
    let second = next_batch(&mut q.rx).await;
    assert_eq!(
        (contents(&second), attempts(&second)),
        (vec![(2, vec![1, 2])], vec![2])
    );
    for delivery in second {
        delivery.retry().await.unwrap();
    }
    one.retry().await.unwrap();
    // Key 1 goes first by its rank, and key 2 is split again: value 1 alone, a third time.
    let mut third = next_batch(&mut q.rx).await;
    if third.len() == 1 {
        // A Redis pull may take key 1 before key 2's retry is back in line.
        third.extend(next_batch(&mut q.rx).await);
    }
    assert_eq!(contents(&third), [(1, vec![10]), (2, vec![1])]);
    assert_eq!(attempts(&third), [2, 3]);
    ack_each(third).await;
    // Value 2 was handed out once before: this is its second attempt, and not its last.
    for attempt in [2, 3] {
        let batch = next_batch(&mut q.rx).await;
        assert_eq!(
            (contents(&batch), attempts(&batch)),
            (vec![(2, vec![2])], vec![attempt])
        );
        for delivery in batch {
            delivery.retry().await.unwrap();
        }
    }
    assert_quiet(&mut q.rx, window * 3, "value 2 had its last attempt").await;
}

/// `ack::ack_all` of a whole batch acknowledges every delivery: after `close` the stream
/// ends, with nothing retried.
async fn ack_all_then_the_stream_ends(mode: Mode) {
    let window = ms(50);
    let Some(mut q) = setup("ack-all", window).open(mode).await else {
        return;
    };
    for key in 1..=5 {
        q.tx.send(key, key * 10).await.unwrap();
        q.tx.send(key, key * 10 + 1).await.unwrap();
    }
    // Every key is due by then, so one batch takes them all.
    sleep(window + ms(100)).await;
    let batch = next_batch(&mut q.rx).await;
    let want: Vec<_> = (1..=5).map(|k| (k, vec![k * 10, k * 10 + 1])).collect();
    assert_eq!(contents(&batch), want);
    ack::ack_all(batch).await.unwrap();
    q.close().await;
    assert_ends(&mut q.rx).await;
}

/// The receiver as a `Stream`, from a consumer task, while four producer tasks send 20
/// values to each of 50 keys: every value comes exactly once, each key's in order.
async fn a_stream_from_many_tasks(mode: Mode) {
    const KEYS: Key = 50;
    const VALUES: Value = 20;
    const PRODUCERS: Key = 4;
    let Some(q) = setup("stream", ms(50)).open(mode).await else {
        return;
    };
    let rx = q.rx.clone();
    let consumer = collect(rx);
    // Each key has one producer, so its order is the order that producer sent in.
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let tx = q.tx.clone();
            tokio::spawn(async move {
                for value in 0..VALUES {
                    for key in (p..KEYS).step_by(PRODUCERS as usize) {
                        tx.send(key, value).await.unwrap();
                    }
                }
            })
        })
        .collect();
    for producer in producers {
        producer.await.unwrap();
    }
    q.close().await;
    let got = timeout(CONSUMER_LIMIT, consumer)
        .await
        .expect("the stream did not end")
        .unwrap();
    let want: BTreeMap<Key, Vec<Value>> = (0..KEYS).map(|k| (k, (0..VALUES).collect())).collect();
    assert_eq!(got, want);
}

// ===== only Redis =====

mod redis_only {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use super::*;

    /// `entered` is the server's time in whole milliseconds, as a local `Instant`: off by
    /// up to the pull's round trip and a millisecond. The value entered between the start
    /// of its `send` and its return; the whole `recv` stands in for the round trip.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn entered_is_off_by_the_round_trip_and_a_millisecond() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let queue = redis::Builder::new(server.url(), "entered", ms(5));
        let tx = queue.sender::<Key, Value>().await.unwrap();
        let mut rx = Rx::Redis(queue.receiver().await.unwrap());
        let mut off = Vec::new();
        for key in 0..40 {
            let before = Instant::now();
            tx.send(key, 0).await.unwrap();
            let after = Instant::now();
            sleep(ms(20)).await;
            let pull = Instant::now();
            let batch = next_batch(&mut rx).await;
            let allowed = pull.elapsed() + ms(1);
            let entered = batch[0].entered().into_std();
            ack_each(batch).await;
            if entered + allowed < before || entered > after + allowed {
                off.push((key, entered.checked_duration_since(after), allowed));
            }
        }
        assert!(off.is_empty(), "entered outside its bounds: {off:?}");
    }

    /// Two receivers of one queue, each from its own `receiver()`, share the work: each
    /// value goes to exactly one of them, and each key's values stay in order.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_receivers_share_the_work() {
        const KEYS: Key = 20;
        const VALUES: Value = 5;
        let Some(server) = RedisServer::start() else {
            return;
        };
        // One value a delivery, held a while: neither receiver can take it all.
        let queue = redis::Builder::new(server.url(), "shared", ms(50)).max_batch(1);
        let tx = queue.sender::<Key, Value>().await.unwrap();
        let seq = Arc::new(AtomicU64::new(0));
        let mut consumers = Vec::new();
        for _ in 0..2 {
            let mut rx = queue.receiver::<Key, Value>().await.unwrap();
            let seq = Arc::clone(&seq);
            consumers.push(tokio::spawn(async move {
                let mut got = Vec::new();
                while let Some(batch) = timeout(PATIENCE, rx.recv())
                    .await
                    .expect("no batch within PATIENCE")
                    .unwrap()
                {
                    for delivery in batch {
                        // Numbered when taken: a key's next delivery is taken after this
                        // one is acknowledged.
                        let n = seq.fetch_add(1, Ordering::SeqCst);
                        assert_eq!(delivery.attempt(), 1, "key {}", delivery.key());
                        got.push((n, *delivery.key(), delivery.values().to_vec()));
                        sleep(ms(5)).await;
                        delivery.ack().await.unwrap();
                    }
                }
                got
            }));
        }
        for value in 0..VALUES {
            for key in 0..KEYS {
                tx.send(key, value).await.unwrap();
            }
        }
        tx.close().await.unwrap();
        let mut all = Vec::new();
        for consumer in consumers {
            let got = timeout(CONSUMER_LIMIT, consumer)
                .await
                .expect("the stream did not end")
                .unwrap();
            assert!(!got.is_empty(), "a receiver got nothing");
            all.extend(got);
        }
        all.sort_unstable();
        let mut by_key: BTreeMap<Key, Vec<Value>> = BTreeMap::new();
        for (_, key, values) in all {
            by_key.entry(key).or_default().extend(values);
        }
        let want: BTreeMap<Key, Vec<Value>> =
            (0..KEYS).map(|k| (k, (0..VALUES).collect())).collect();
        assert_eq!(by_key, want);
    }

    /// `entered()` is when the key's oldest waiting value was sent, by the server's clock,
    /// within a few milliseconds of this process's.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn entered_is_the_first_send() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let window = ms(200);
        let queue = redis::Builder::new(server.url(), "entered", window);
        let tx = queue.sender::<Key, Value>().await.unwrap();
        let mut rx = Rx::Redis(queue.receiver().await.unwrap());
        let before = Instant::now();
        tx.send(1, 1).await.unwrap();
        let after = Instant::now();
        sleep(ms(100)).await;
        tx.send(1, 2).await.unwrap();
        let batch = next_batch(&mut rx).await;
        assert_eq!(contents(&batch), [(1, vec![1, 2])]);
        let entered = batch[0].entered().into_std();
        // Whole milliseconds on the server: up to 1 ms early; the pull's reply time late.
        assert!(
            entered + ms(2) >= before,
            "entered {:?} before the send",
            before - entered
        );
        assert!(
            entered <= after + ms(50),
            "entered {:?} after the send",
            entered - after
        );
        assert!(batch[0].entered().elapsed() >= window);
        ack_each(batch).await;
    }

    /// `len()` counts the values in the queue, those in flight included.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn len_counts_pending_and_in_flight() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let queue = redis::Builder::new(server.url(), "len", ms(50));
        let tx = queue.sender::<Key, Value>().await.unwrap();
        let raw = queue.receiver::<Key, Value>().await.unwrap();
        let mut rx = Rx::Redis(raw.clone());
        assert_eq!(raw.len().await.unwrap(), 0);
        for (key, value) in [(1, 1), (1, 2), (1, 3), (2, 1), (2, 2)] {
            tx.send(key, value).await.unwrap();
        }
        assert_eq!(raw.len().await.unwrap(), 5);
        let mut got = deliveries(&mut rx, 2).await.into_iter().map(|(_, d)| d);
        assert_eq!(raw.len().await.unwrap(), 5, "in flight counts");
        got.next().unwrap().ack().await.unwrap();
        assert_eq!(raw.len().await.unwrap(), 2);
        tx.send(3, 1).await.unwrap();
        assert_eq!(raw.len().await.unwrap(), 3);
        got.next().unwrap().give_up().await.unwrap();
        assert_eq!(raw.len().await.unwrap(), 1);
    }

    fn assert_mismatch<T: std::fmt::Debug>(
        opened: Result<T, redis::Error>,
        queue: &str,
        what: &str,
    ) {
        match opened {
            Err(redis::Error::Mismatch {
                queue: name,
                detail,
            }) => {
                assert_eq!(name, queue);
                assert!(detail.contains(what), "{what} not in {detail:?}");
            }
            other => panic!("not a mismatch of {what}: {other:?}"),
        }
    }

    /// Opening a queue with another window or another number of shards than it was created
    /// with is refused, for senders and receivers, both ways round.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn other_settings_are_a_mismatch() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let url = server.url();
        let one = redis::Builder::new(&url, "one", ms(100));
        let _tx = one.sender::<Key, Value>().await.unwrap();
        let again = redis::Builder::new(&url, "one", ms(100));
        again.receiver::<Key, Value>().await.expect("same settings");

        let longer = redis::Builder::new(&url, "one", ms(200));
        assert_mismatch(longer.sender::<Key, Value>().await, "one", "window");
        assert_mismatch(longer.receiver::<Key, Value>().await, "one", "window");
        let sharded = redis::Builder::new(&url, "one", ms(100)).shards(4);
        assert_mismatch(sharded.sender::<Key, Value>().await, "one", "shards");
        assert_mismatch(sharded.receiver::<Key, Value>().await, "one", "shards");

        let four = redis::Builder::new(&url, "four", ms(100)).shards(4);
        let _tx = four.sender::<Key, Value>().await.unwrap();
        for shards in [1, 2, 8] {
            let other = redis::Builder::new(&url, "four", ms(100)).shards(shards);
            assert_mismatch(other.sender::<Key, Value>().await, "four", "shards");
        }
    }

    /// With `shards(4)` the keys spread over the shards, and every value arrives, each
    /// key's in order.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shards_keep_each_keys_order() {
        const KEYS: Key = 40;
        const VALUES: Value = 10;
        let Some(server) = RedisServer::start() else {
            return;
        };
        let queue = redis::Builder::new(server.url(), "sharded", ms(50)).shards(4);
        let tx = queue.sender::<Key, Value>().await.unwrap();
        let rx = queue.receiver::<Key, Value>().await.unwrap();
        for value in 0..VALUES {
            for key in 0..KEYS {
                tx.send(key, value).await.unwrap();
            }
        }
        // Nothing is pulled yet: every shard holds some of the keys.
        for shard in 0..4 {
            let reply = server.command(&["ZCARD", &format!("{{sharded:{shard}}}:due")]);
            let n: u32 = reply.trim().trim_start_matches(':').parse().unwrap();
            assert!(n > 0, "shard {shard} holds no key");
        }
        let consumer = collect(rx);
        // Some keys go out before the close, the rest at it.
        sleep(ms(100)).await;
        for key in 0..KEYS {
            tx.send(key, VALUES).await.unwrap();
        }
        tx.close().await.unwrap();
        let got = timeout(CONSUMER_LIMIT, consumer)
            .await
            .expect("the stream did not end")
            .unwrap();
        let want: BTreeMap<Key, Vec<Value>> =
            (0..KEYS).map(|k| (k, (0..=VALUES).collect())).collect();
        assert_eq!(got, want);
    }

    /// A window is recorded in whole microseconds, rounded up: a window a nanosecond short
    /// of the queue's opens it, one a microsecond longer is refused.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn windows_are_compared_to_the_microsecond() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let open = |window| redis::Builder::new(server.url(), "micros", window);
        let _tx = open(ms(10)).sender::<Key, Value>().await.unwrap();
        let short = ms(10) - Duration::from_nanos(1);
        open(short).sender::<Key, Value>().await.unwrap();
        let long = ms(10) + Duration::from_micros(1);
        assert_mismatch(open(long).sender::<Key, Value>().await, "micros", "window");
    }

    /// A close makes every held key due at once; a pull moves 1,000 of them back into line,
    /// and the next pull, made at once, the rest.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_close_releases_held_keys_a_thousand_a_pull() {
        const KEYS: Key = 1_050;
        let Some(server) = RedisServer::start() else {
            return;
        };
        let queue = redis::Builder::new(server.url(), "held", ms(5)).max_batch(5_000);
        let tx = queue.sender::<Key, Value>().await.unwrap();
        let mut rx = Rx::Redis(queue.receiver().await.unwrap());
        for k in 0..KEYS {
            tx.send(k, k).await.unwrap();
        }
        for (_, delivery) in deliveries(&mut rx, KEYS as usize).await {
            delivery
                .retry_after(Duration::from_secs(3600))
                .await
                .unwrap();
        }
        tx.close().await.unwrap();
        let mut sizes = Vec::new();
        while sizes.iter().sum::<usize>() < KEYS as usize {
            let batch = next_batch(&mut rx).await;
            sizes.push(batch.len());
            ack_each(batch).await;
        }
        assert_eq!(sizes, [1_000, 50]);
    }

    /// Dead letters are fetched for the tasks that await them, no more: one task that
    /// awaits one letter takes one out of Redis, and the rest stay there, where a crash of
    /// this process cannot lose them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dead_letters_are_fetched_only_for_waiting_tasks() {
        const KEYS: Key = 8;
        let Some(server) = RedisServer::start() else {
            return;
        };
        let queue = redis::Builder::new(server.url(), "deadfetch", ms(5)).max_attempts(1);
        let tx = queue.sender::<Key, Value>().await.unwrap();
        let mut rx = Rx::Redis(queue.receiver().await.unwrap());
        for k in 0..KEYS {
            tx.send(k, k).await.unwrap();
        }
        for (_, delivery) in deliveries(&mut rx, KEYS as usize).await {
            delivery.retry().await.unwrap(); // the last attempt: a dead letter
        }
        // A letter is three entries in the list: its key, its header and its value.
        let entries = |n: Key| format!(":{}\r\n", 3 * n);
        assert_eq!(server.command(&["LLEN", "{deadfetch}:dead"]), entries(KEYS));
        let mut dead = rx.dead_letters();
        timeout(PATIENCE, dead.next()).await.unwrap().unwrap();
        // Time for a fetcher that ran ahead of its waiters to show.
        sleep(ms(300)).await;
        assert_eq!(
            server.command(&["LLEN", "{deadfetch}:dead"]),
            entries(KEYS - 1),
            "letters fetched with no task awaiting them"
        );
    }
}

/// Spawns a consumer that drives `rx` as a stream, acks every batch, and returns each key's
/// values in the order they came; every delivery must be a first attempt, and a batch must
/// come within [`PATIENCE`] of the last.
fn collect<S>(mut rx: S) -> tokio::task::JoinHandle<BTreeMap<Key, Vec<Value>>>
where
    S: futures::Stream<Item = Vec<ack::Delivery<Key, Value>>> + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let mut got: BTreeMap<Key, Vec<Value>> = BTreeMap::new();
        loop {
            tokio::select! {
                batch = rx.next() => {
                    let Some(batch) = batch else { return got };
                    for delivery in &batch {
                        assert_eq!(delivery.attempt(), 1, "key {}", delivery.key());
                        got.entry(*delivery.key())
                            .or_default()
                            .extend_from_slice(delivery.values());
                    }
                    ack::ack_all(batch).await.unwrap();
                }
                () = sleep(PATIENCE) => panic!("no batch within {PATIENCE:?}; got {got:?}"),
            }
        }
    })
}
