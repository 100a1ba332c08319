//! Concurrency stress on the multi-thread runtime: many producers, several cloned
//! receivers, `recv` cancelled at random, random `requeue`, bounded channels whose senders
//! wait, and senders dropped in the middle of heavy traffic.
//!
//! Every run checks exactly-once delivery: the values taken out are exactly the values
//! sent, none lost, none twice. Runs without `requeue` also check order: within a batch, a
//! key's values from one producer are consecutive and ascending, which (with exactly-once)
//! means each producer's values of a key came out in order. A single receiver that
//! requeues must still process each producer's values of a key in order.
//!
//! The acknowledging runs decide each delivery at random, and check what their rules
//! promise: every value leaves exactly once (acknowledged, given up or dead-lettered), each
//! key's values leave in the order they went in, no key has two deliveries in flight, and
//! the stats agree.
//!
//! These tests use real time (short sleeps race `recv`), and each run is bounded by a
//! timeout, so a deadlock fails rather than hangs. Op counts are smaller in debug builds;
//! the figures are in `SCALE`.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use keyed_batch::ack::Delivery;
use keyed_batch::timed;
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout, Instant};

use common::flavour::{Due, Flavour, Limits, Ordered, Receiving, Timed};
use common::time::{ms, secs};

type Key = u16;

/// Values sent per producer: a run takes a few seconds either way.
const PER_PRODUCER: usize = if cfg!(debug_assertions) {
    50_000
} else {
    250_000
};

/// How long a run may take before it counts as a deadlock.
const LIMIT: Duration = secs(60);

/// One value: who sent it, its place in that producer's sends, and its place among that
/// producer's sends to the same key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Item {
    producer: u32,
    seq: u32,
    nth: u32,
}

/// A small, fast, seeded random number generator (SplitMix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The key a producer's `seq`-th value goes to: a fixed function, so checks can recompute it.
fn key_of(producer: u32, seq: u32, keys: Key) -> Key {
    let mut rng = Rng((u64::from(producer) << 32) | u64::from(seq));
    (rng.next() % u64::from(keys)) as Key
}

/// A channel flavour as the stress runs drive it: the rank of each send, from a random
/// number.
trait Stressed: Flavour<Key, Item> + Send + Sync + 'static {
    /// What a `send` ranks its value by, chosen from `r`.
    fn arg(r: u64) -> Self::Arg;
    /// What a requeued entry ranks by.
    const REQUEUE: Self::Arg;
    /// As `send`, blocking the thread. `false` if the channel is closed.
    fn blocking_send(tx: &Self::Tx, key: Key, item: Item, r: u64) -> bool;
}

/// `timed`: some values carry a tighter deadline.
impl Stressed for Timed {
    fn arg(r: u64) -> Due {
        match r % 4 {
            0 => Due::By(Instant::now()),
            _ => Due::Window,
        }
    }

    // Not used: a requeued key is due at once.
    const REQUEUE: Due = Due::Window;

    fn blocking_send(tx: &Self::Tx, key: Key, item: Item, _: u64) -> bool {
        tx.blocking_send(key, item).is_ok()
    }
}

/// `ordered`: random sort keys.
impl Stressed for Ordered {
    fn arg(r: u64) -> u8 {
        (r % 16) as u8
    }

    // Sort key 0: a failed delivery goes first.
    const REQUEUE: u8 = 0;

    fn blocking_send(tx: &Self::Tx, key: Key, item: Item, r: u64) -> bool {
        tx.blocking_send(Self::arg(r), key, item).is_ok()
    }
}

/// The shape of one stress run.
#[derive(Clone, Copy)]
struct Plan {
    producers: u32,
    per_producer: usize,
    receivers: usize,
    keys: Key,
    /// Percent of `recv` calls raced against a short sleep.
    cancel_pct: u64,
    /// Percent of batch entries handed back with `requeue`.
    requeue_pct: u64,
}

/// What one receiver took out and kept, entry by entry, in the order it processed them.
#[derive(Default)]
struct Taken {
    entries: Vec<(Key, Vec<Item>)>,
    batches: usize,
    cancelled: usize,
    requeued: usize,
}

/// The values a producer sends, in order, with their keys.
fn items(id: u32, plan: Plan) -> impl Iterator<Item = (Key, Item)> {
    let mut nth = vec![0u32; usize::from(plan.keys)];
    (0..plan.per_producer as u32).map(move |seq| {
        let key = key_of(id, seq, plan.keys);
        let item = Item {
            producer: id,
            seq,
            nth: nth[usize::from(key)],
        };
        nth[usize::from(key)] += 1;
        (key, item)
    })
}

async fn producer<C: Stressed>(tx: C::Tx, id: u32, plan: Plan) {
    let mut rng = Rng(u64::from(id) + 1);
    for (key, item) in items(id, plan) {
        let sent = C::send(&tx, C::arg(rng.next()), key, item).await.is_ok();
        assert!(sent, "send failed before the producer was done");
        if rng.below(64) == 0 {
            tokio::task::yield_now().await;
        }
    }
}

/// A producer on a plain thread, with `blocking_send`.
fn blocking_producer<C: Stressed>(tx: C::Tx, id: u32, plan: Plan) {
    let mut rng = Rng(u64::from(id) + 1);
    for (key, item) in items(id, plan) {
        let sent = C::blocking_send(&tx, key, item, rng.next());
        assert!(sent, "blocking_send failed before the producer was done");
    }
}

/// `recv`; if `raced`, raced against a nap, and cancelled either right after its first
/// poll or after a nap of up to 2 ms. `None` if it was cancelled.
async fn recv_raced<R: Receiving<Key, Item>>(
    rx: &mut R,
    rng: &mut Rng,
    raced: bool,
) -> Option<Option<R::Batch>> {
    if !raced {
        return Some(rx.recv().await);
    }
    let nap = match rng.below(2) {
        0 => None,
        _ => Some(Duration::from_micros(rng.below(2_000))),
    };
    tokio::select! {
        biased;
        batch = rx.recv() => Some(batch),
        () = async {
            if let Some(nap) = nap {
                sleep(nap).await;
            }
        } => None,
    }
}

async fn receiver<C: Stressed>(mut rx: C::Rx, seed: u64, plan: Plan, max_batch: usize) -> Taken {
    let mut rng = Rng(seed);
    let mut taken = Taken::default();
    loop {
        let raced = rng.below(100) < plan.cancel_pct;
        let Some(batch) = recv_raced(&mut rx, &mut rng, raced).await else {
            taken.cancelled += 1;
            continue;
        };
        let Some(batch) = batch else { break };
        taken.batches += 1;
        assert!(!batch.is_empty(), "empty batch");
        let values: usize = batch.iter().map(|(_, items)| items.len()).sum();
        assert!(
            values <= max_batch,
            "batch of {values} values over max_batch"
        );
        for (key, items) in batch {
            assert!(!items.is_empty(), "key {key} with no values");
            if rng.below(100) < plan.requeue_pct {
                match C::requeue(&rx, C::REQUEUE, key, items).map_err(|err| C::entry(err.0)) {
                    Ok(()) => taken.requeued += 1,
                    // The stream already ended for another receiver: keep them here.
                    Err((back, items)) => {
                        assert_eq!(back, key, "requeue handed back another key");
                        taken.entries.push((key, items));
                    }
                }
            } else {
                taken.entries.push((key, items));
            }
        }
        if rng.below(8) == 0 {
            tokio::task::yield_now().await;
        }
    }
    taken
}

/// Spawns the producers, each with a clone of `tx`: the first on a plain thread with
/// `blocking_send`, the others as tasks.
fn spawn_producers<C: Stressed>(tx: C::Tx, plan: Plan) -> Vec<JoinHandle<()>> {
    (0..plan.producers)
        .map(|id| {
            let tx = tx.clone();
            match id {
                0 => tokio::task::spawn_blocking(move || blocking_producer::<C>(tx, id, plan)),
                _ => tokio::spawn(producer::<C>(tx, id, plan)),
            }
        })
        .collect()
}

/// Runs producers and receivers to the end of the stream and returns what each receiver
/// took, after checking exactly-once delivery.
async fn run<C: Stressed>(chan: C, limits: Limits, plan: Plan) -> Vec<Taken> {
    let (tx, rx) = chan.build(&limits, None);
    let max_batch = limits.max_batch();
    let producers = spawn_producers::<C>(tx, plan);
    let receivers: Vec<JoinHandle<Taken>> = (0..plan.receivers)
        .map(|i| tokio::spawn(receiver::<C>(rx.clone(), 1_000 + i as u64, plan, max_batch)))
        .collect();
    drop(rx);
    let work = async {
        for p in producers {
            p.await.expect("producer panicked");
        }
        let mut all = Vec::new();
        for r in receivers {
            all.push(r.await.expect("receiver panicked"));
        }
        all
    };
    let start = std::time::Instant::now();
    let taken = timeout(LIMIT, work)
        .await
        .expect("stress run did not finish: deadlock or lost wake-up");
    let entries = taken.iter().flat_map(|t| &t.entries);
    check_exactly_once(entries.map(|(key, items)| (*key, items)), plan);
    eprintln!(
        "{} values, {} batches, {} recv cancelled, {} entries requeued, {:?}",
        plan.producers as usize * plan.per_producer,
        total(&taken, |t| t.batches),
        total(&taken, |t| t.cancelled),
        total(&taken, |t| t.requeued),
        start.elapsed(),
    );
    taken
}

/// Every value sent came `out` exactly once, under the key it was sent to.
fn check_exactly_once<'a>(out: impl IntoIterator<Item = (Key, &'a Vec<Item>)>, plan: Plan) {
    let mut seen = vec![vec![false; plan.per_producer]; plan.producers as usize];
    let mut count = 0;
    for (key, item) in out
        .into_iter()
        .flat_map(|(key, items)| items.iter().map(move |item| (key, *item)))
    {
        assert_eq!(
            key,
            key_of(item.producer, item.seq, plan.keys),
            "{item:?} came out under the wrong key"
        );
        let slot = &mut seen[item.producer as usize][item.seq as usize];
        assert!(!*slot, "{item:?} delivered twice");
        *slot = true;
        count += 1;
    }
    let total = plan.producers as usize * plan.per_producer;
    assert_eq!(count, total, "values lost");
}

/// Within each batch entry, each producer's values are consecutive and ascending.
fn check_runs(taken: &[Taken]) {
    for (key, items) in taken.iter().flat_map(|t| &t.entries) {
        let mut last: Vec<(u32, u32)> = Vec::new();
        for item in items {
            match last.iter_mut().find(|(p, _)| *p == item.producer) {
                Some((_, nth)) => {
                    assert_eq!(item.nth, *nth + 1, "key {key}: {item:?} out of order");
                    *nth = item.nth;
                }
                None => last.push((item.producer, item.nth)),
            }
        }
    }
}

/// Sums a counter over all receivers.
fn total(taken: &[Taken], f: impl Fn(&Taken) -> usize) -> usize {
    taken.iter().map(f).sum()
}

/// Many producers into a bounded `timed` channel (senders wait for room), four receivers
/// with `recv` cancelled at random: every value once, each producer's values of a key in
/// order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn timed_exactly_once_in_order() {
    let limits = Limits {
        capacity: Some(512),
        max_batch: Some(100),
        per_key: Some(4),
        ..Limits::default()
    };
    let plan = Plan {
        producers: 8,
        per_producer: PER_PRODUCER,
        receivers: 4,
        keys: 64,
        cancel_pct: 30,
        requeue_pct: 0,
    };
    let taken = run(Timed { window: ms(1) }, limits, plan).await;
    check_runs(&taken);
    assert!(total(&taken, |t| t.cancelled) > 0, "no recv was cancelled");
}

/// As `timed_exactly_once_in_order`, on an `ordered` channel with random sort keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ordered_exactly_once_in_order() {
    let limits = Limits {
        capacity: Some(64),
        max_batch: Some(50),
        ..Limits::default()
    };
    let plan = Plan {
        producers: 8,
        per_producer: PER_PRODUCER,
        receivers: 4,
        keys: 64,
        cancel_pct: 30,
        requeue_pct: 0,
    };
    let taken = run(Ordered, limits, plan).await;
    check_runs(&taken);
    assert!(total(&taken, |t| t.cancelled) > 0, "no recv was cancelled");
}

/// Four receivers that cancel `recv` and requeue one batch entry in ten: every value is
/// still processed exactly once, including entries whose requeue was refused because the
/// stream had ended for another receiver.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn timed_requeue_exactly_once() {
    let limits = Limits {
        capacity: Some(512),
        max_batch: Some(64),
        per_key: Some(8),
        ..Limits::default()
    };
    let plan = Plan {
        producers: 8,
        per_producer: PER_PRODUCER,
        receivers: 4,
        keys: 32,
        cancel_pct: 20,
        requeue_pct: 10,
    };
    let taken = run(Timed { window: ms(1) }, limits, plan).await;
    assert!(total(&taken, |t| t.requeued) > 0, "nothing was requeued");
}

/// As `timed_requeue_exactly_once`, on an `ordered` channel.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ordered_requeue_exactly_once() {
    let limits = Limits {
        capacity: Some(128),
        max_batch: Some(64),
        ..Limits::default()
    };
    let plan = Plan {
        producers: 8,
        per_producer: PER_PRODUCER,
        receivers: 4,
        keys: 32,
        cancel_pct: 20,
        requeue_pct: 10,
    };
    let taken = run(Ordered, limits, plan).await;
    assert!(total(&taken, |t| t.requeued) > 0, "nothing was requeued");
}

/// One receiver that cancels and requeues, against many producers: requeued values go in
/// front of newer ones, so each producer's values of a key are processed exactly in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requeue_keeps_order_for_one_receiver() {
    let limits = Limits {
        capacity: Some(256),
        max_batch: Some(32),
        per_key: Some(8),
        ..Limits::default()
    };
    let plan = Plan {
        producers: 6,
        per_producer: PER_PRODUCER,
        receivers: 1,
        keys: 16,
        cancel_pct: 20,
        requeue_pct: 10,
    };
    let taken = run(Timed { window: ms(1) }, limits, plan).await;
    assert!(total(&taken, |t| t.requeued) > 0, "nothing was requeued");
    let mut next = vec![vec![0u32; 16]; 6];
    for (key, items) in &taken[0].entries {
        for item in items {
            let want = &mut next[item.producer as usize][usize::from(*key)];
            assert_eq!(item.nth, *want, "key {key}: {item:?} out of order");
            *want += 1;
        }
    }
}

/// How a producer stops in `senders_dropped_mid_traffic`.
#[derive(Clone, Copy, PartialEq)]
enum Stop {
    /// It sees the flag, returns and drops its sender.
    Flag,
    /// Its task is aborted, dropping its sender (and any `send` in flight) on the spot.
    Abort,
}

/// Producers that send until stopped, recording how far they got: `confirmed` counts the
/// values whose `send` returned.
async fn endless_producer(
    tx: timed::Sender<Key, Item>,
    id: u32,
    stop: Arc<AtomicBool>,
    confirmed: Arc<AtomicU32>,
    sent: Arc<AtomicUsize>,
) {
    let mut rng = Rng(u64::from(id) + 77);
    let mut seq = 0u32;
    while !stop.load(Ordering::Relaxed) {
        let key = key_of(id, seq, 64);
        let item = Item {
            producer: id,
            seq,
            nth: 0,
        };
        tx.send(key, item).await.expect("closed while sending");
        seq += 1;
        confirmed.store(seq, Ordering::Relaxed);
        sent.fetch_add(1, Ordering::Relaxed);
        if rng.below(32) == 0 {
            tokio::task::yield_now().await;
        }
    }
}

/// Every sender is dropped in the middle of heavy traffic (half by returning, half by
/// having their tasks aborted mid-`send`): the receivers still drain everything that was
/// sent, exactly once, and every receiver's stream ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn senders_dropped_mid_traffic() {
    const PRODUCERS: u32 = 8;
    let target = PRODUCERS as usize * PER_PRODUCER / 4;
    let (tx, rx) = timed::Builder::new(ms(2))
        .capacity(1_024)
        .max_batch(64)
        .build::<Key, Item>();
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    let confirmed: Vec<Arc<AtomicU32>> = (0..PRODUCERS).map(|_| Arc::default()).collect();
    let producers: Vec<(Stop, JoinHandle<()>)> = (0..PRODUCERS)
        .map(|id| {
            let how = if id % 2 == 0 { Stop::Flag } else { Stop::Abort };
            let task = endless_producer(
                tx.clone(),
                id,
                Arc::clone(&stop),
                Arc::clone(&confirmed[id as usize]),
                Arc::clone(&sent),
            );
            (how, tokio::spawn(task))
        })
        .collect();
    drop(tx);
    let plan = Plan {
        producers: PRODUCERS,
        per_producer: 0,
        receivers: 3,
        keys: 64,
        cancel_pct: 10,
        requeue_pct: 0,
    };
    let receivers: Vec<JoinHandle<Taken>> = (0..3)
        .map(|i| tokio::spawn(receiver::<Timed>(rx.clone(), 50 + i, plan, 64)))
        .collect();
    drop(rx);

    let work = async {
        while sent.load(Ordering::Relaxed) < target {
            tokio::task::yield_now().await;
        }
        // Abort half while the traffic is at full speed, then flag the rest.
        for (how, task) in &producers {
            if *how == Stop::Abort {
                task.abort();
            }
        }
        stop.store(true, Ordering::Relaxed);
        for (how, task) in producers {
            match (how, task.await) {
                (_, Ok(())) => {}
                (Stop::Abort, Err(err)) if err.is_cancelled() => {}
                (_, Err(err)) => panic!("producer failed: {err}"),
            }
        }
        let mut all = Vec::new();
        for r in receivers {
            // Each receiver returns only once its stream has ended.
            all.push(r.await.expect("receiver panicked"));
        }
        all
    };
    let start = std::time::Instant::now();
    let taken = timeout(LIMIT, work)
        .await
        .expect("the stream did not end after every sender was dropped");
    eprintln!(
        "{} values sent, {} batches, {} recv cancelled, {:?}",
        sent.load(Ordering::Relaxed),
        total(&taken, |t| t.batches),
        total(&taken, |t| t.cancelled),
        start.elapsed(),
    );

    // Delivered: exactly the values whose `send` returned, no more (an aborted `send` was
    // never in), no fewer, none twice.
    let mut delivered: Vec<Vec<u32>> = vec![Vec::new(); PRODUCERS as usize];
    for item in taken
        .iter()
        .flat_map(|t| &t.entries)
        .flat_map(|(_, items)| items)
    {
        delivered[item.producer as usize].push(item.seq);
    }
    for (id, mut seqs) in delivered.into_iter().enumerate() {
        seqs.sort_unstable();
        let confirmed = confirmed[id].load(Ordering::Relaxed);
        let want: Vec<u32> = (0..confirmed).collect();
        assert!(
            seqs == want,
            "producer {id}: {} delivered, {confirmed} sent",
            seqs.len()
        );
    }
    assert!(sent.load(Ordering::Relaxed) >= target);
}

/// Rounds of the closing races: debug builds run fewer.
const ROUNDS: usize = if cfg!(debug_assertions) { 1_000 } else { 5_000 };

/// Real races between sends, `close()` or the last sender's drop, and receivers taking the
/// last due key and registering their wakers, round after round on four worker threads.
/// Each round: a send that returned `Ok` is delivered exactly once, one that failed
/// handed its value back and is not delivered, a sender never succeeds after failing, and
/// every receiver's stream ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn close_races() {
    let work = async {
        let (mut delivered, mut refused) = (0, 0);
        for round in 0..ROUNDS {
            let by_close = round % 2 == 0;
            let (tx, rx) = timed::Builder::new(Duration::ZERO)
                .capacity(4)
                .max_batch(3)
                .build::<u8, u32>();
            let senders: Vec<JoinHandle<Vec<u32>>> = (0..2u32)
                .map(|id| {
                    let tx = tx.clone();
                    tokio::spawn(async move {
                        let mut sent = Vec::new();
                        for n in 0..20 {
                            let value = id * 100 + n;
                            match tx.send((n % 3) as u8, value).await {
                                Ok(()) => sent.push(value),
                                Err(err) => {
                                    assert_eq!(err.0, ((n % 3) as u8, value), "wrong value back");
                                    assert!(tx.is_closed());
                                    break;
                                }
                            }
                        }
                        sent
                    })
                })
                .collect();
            let receivers: Vec<JoinHandle<Vec<u32>>> = (0..2)
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
            let mut rng = Rng(round as u64);
            for _ in 0..rng.below(20) {
                tokio::task::yield_now().await;
            }
            if by_close {
                rx.close();
            }
            drop(rx);
            drop(tx);
            let mut sent = Vec::new();
            for s in senders {
                sent.extend(s.await.expect("sender panicked"));
            }
            let mut got = Vec::new();
            for r in receivers {
                got.extend(r.await.expect("receiver panicked"));
            }
            sent.sort_unstable();
            got.sort_unstable();
            assert_eq!(got, sent, "round {round}: delivered differs from sent");
            delivered += got.len();
            refused += usize::from(got.len() < 40);
        }
        eprintln!("{ROUNDS} rounds, {delivered} values delivered, {refused} rounds cut short");
        assert!(refused > 0, "close never raced a send");
    };
    timeout(LIMIT, work)
        .await
        .expect("a closing race deadlocked or lost a wake-up");
}

// ===== acknowledging receivers =====

/// Deliveries are retried at most this many times, then dead-lettered.
const MAX_ATTEMPTS: u32 = 3;

/// What became of a delivery's values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Acked,
    GivenUp,
    /// Retried (by `retry`, `retry_after` or a drop): they come back.
    Retried,
    /// Retried once too often: they went to the dead letters.
    Dead,
}

/// One delivery and its decision, as an acknowledging receiver saw them.
#[derive(Debug)]
struct Decision {
    /// Its place among all decisions. A key's deliveries are decided one at a time, each
    /// before the next goes out, so this orders each key's.
    order: u64,
    key: Key,
    items: Vec<Item>,
    attempt: u32,
    fate: Fate,
}

/// What every acknowledging receiver shares: what they watch across tasks.
struct Watch {
    /// Per key: a delivery of it is out, from its receipt until its decision.
    flying: Vec<AtomicBool>,
    /// Per value (`producer * per_producer + seq`): how many times it was handed out.
    handed: Vec<AtomicU32>,
    /// The next decision's order.
    order: AtomicU64,
    plan: Plan,
}

impl Watch {
    fn new(plan: Plan) -> Self {
        let values = plan.producers as usize * plan.per_producer;
        Watch {
            flying: (0..plan.keys).map(|_| AtomicBool::new(false)).collect(),
            handed: (0..values).map(|_| AtomicU32::new(0)).collect(),
            order: AtomicU64::new(0),
            plan,
        }
    }

    fn handed(&self, item: &Item) -> &AtomicU32 {
        &self.handed[item.producer as usize * self.plan.per_producer + item.seq as usize]
    }

    /// A delivery came out: no other delivery of its key may be out, and its attempt is one
    /// more than the times its first value was handed out before.
    fn receipt(&self, delivery: &Delivery<Key, Item>) {
        let key = *delivery.key();
        let twice = self.flying[usize::from(key)].swap(true, Ordering::SeqCst);
        assert!(!twice, "key {key}: two deliveries in flight at once");
        let first = &delivery.values()[0];
        let before = self.handed(first).load(Ordering::SeqCst);
        assert_eq!(
            delivery.attempt(),
            before + 1,
            "key {key}: attempt of {first:?}"
        );
        for item in delivery.values() {
            self.handed(item).fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// What one acknowledging receiver did.
#[derive(Default)]
struct Acks {
    decisions: Vec<Decision>,
    batches: usize,
    cancelled: usize,
}

impl Acks {
    /// Decides `delivery` at random, recording the decision first, while its key is still in
    /// flight.
    fn decide(&mut self, delivery: Delivery<Key, Item>, rng: &mut Rng, watch: &Watch) {
        let (key, attempt) = (*delivery.key(), delivery.attempt());
        let r = rng.below(20);
        let fate = match r {
            0..=11 => Fate::Acked,
            12 | 13 => Fate::GivenUp,
            _ if attempt >= MAX_ATTEMPTS => Fate::Dead,
            _ => Fate::Retried,
        };
        let items = delivery.values().to_vec();
        self.decisions.push(Decision {
            order: watch.order.fetch_add(1, Ordering::SeqCst),
            key,
            items: items.clone(),
            attempt,
            fate,
        });
        // The key's next delivery goes out only once this one is decided, below.
        watch.flying[usize::from(key)].store(false, Ordering::SeqCst);
        // Each decision resolves at once in memory.
        let decided = match r {
            0..=11 => delivery.ack().now_or_never(),
            12 | 13 => {
                let back = delivery.give_up().now_or_never();
                back.map(|back| back.map(|back| assert_eq!(back, (key, items), "given up")))
            }
            14 | 15 => delivery.retry().now_or_never(),
            16 | 17 => {
                let delay = Duration::from_micros(rng.below(2_000));
                delivery.retry_after(delay).now_or_never()
            }
            _ => {
                drop(delivery);
                Some(Ok(()))
            }
        };
        assert!(
            matches!(decided, Some(Ok(()))),
            "key {key}: a decision did not take effect at once: {decided:?}"
        );
    }
}

/// An acknowledging receiver that cancels `recv` at random, decides each delivery at
/// random, and keeps one delivery in eight undecided over its next `recv` if that is
/// raced, so that its key stays in flight meanwhile.
async fn acker<C: Stressed>(mut rx: C::AckRx, seed: u64, watch: Arc<Watch>) -> Acks {
    let mut rng = Rng(seed);
    let mut acks = Acks::default();
    let mut kept: Vec<Delivery<Key, Item>> = Vec::new();
    loop {
        let raced = rng.below(100) < watch.plan.cancel_pct;
        if !raced {
            // A `recv` that is not cancelled may wait for the keys kept in flight here.
            kept.drain(..)
                .for_each(|d| acks.decide(d, &mut rng, &watch));
        }
        let got = recv_raced(&mut rx, &mut rng, raced).await;
        kept.drain(..)
            .for_each(|d| acks.decide(d, &mut rng, &watch));
        let Some(batch) = got else {
            acks.cancelled += 1;
            continue;
        };
        let Some(batch) = batch else { break };
        acks.batches += 1;
        assert!(!batch.is_empty(), "empty batch");
        batch.iter().for_each(|delivery| watch.receipt(delivery));
        for delivery in batch {
            match raced && rng.below(8) == 0 {
                true => kept.push(delivery),
                false => acks.decide(delivery, &mut rng, &watch),
            }
        }
        if rng.below(8) == 0 {
            tokio::task::yield_now().await;
        }
    }
    acks
}

/// Producers into an acknowledging channel, acknowledging receivers that cancel and decide
/// at random, and a task that takes the dead letters, to the end of the stream; then checks
/// what the rules promise (see `check_decisions`) and the stats.
async fn run_acked<C: Stressed>(chan: C, limits: Limits, plan: Plan) {
    let (tx, rx) = chan.build_acked(&limits, None);
    let watch = Arc::new(Watch::new(plan));
    let producers = spawn_producers::<C>(tx, plan);
    let mut dead = C::dead_letters(&rx);
    let dead = tokio::spawn(async move {
        let mut letters = Vec::new();
        while let Some(letter) = dead.recv().await {
            letters.push(letter);
        }
        letters
    });
    let ackers: Vec<JoinHandle<Acks>> = (0..plan.receivers)
        .map(|i| tokio::spawn(acker::<C>(rx.clone(), 2_000 + i as u64, Arc::clone(&watch))))
        .collect();
    // `rx` stays, never polled, for the stats at the end.
    let work = async {
        for p in producers {
            p.await.expect("producer panicked");
        }
        let mut all = Vec::new();
        for a in ackers {
            all.push(a.await.expect("receiver panicked"));
        }
        (all, dead.await.expect("dead-letter task panicked"))
    };
    let start = std::time::Instant::now();
    let (acks, letters) = timeout(LIMIT, work)
        .await
        .expect("stress run did not finish: deadlock or lost wake-up");
    let batches = acks.iter().map(|a| a.batches).sum::<usize>();
    let cancelled = acks.iter().map(|a| a.cancelled).sum::<usize>();
    let mut decisions: Vec<Decision> = acks.into_iter().flat_map(|a| a.decisions).collect();
    decisions.sort_unstable_by_key(|d| d.order);
    let count = |fate: Fate| -> u64 {
        let decided = decisions.iter().filter(|d| d.fate == fate);
        decided.map(|d| d.items.len() as u64).sum()
    };
    eprintln!(
        "{} values: {} batches, {} deliveries, {} recv cancelled; values acked {}, \
         given up {}, retried {}, dead {}; {:?}",
        plan.producers as usize * plan.per_producer,
        batches,
        decisions.len(),
        cancelled,
        count(Fate::Acked),
        count(Fate::GivenUp),
        count(Fate::Retried),
        count(Fate::Dead),
        start.elapsed(),
    );
    for fate in [Fate::GivenUp, Fate::Retried, Fate::Dead] {
        assert!(count(fate) > 0, "no value was {fate:?}");
    }
    assert!(cancelled > 0, "no recv was cancelled");

    let stats = rx.stats();
    let mut attempts = [0u64; 8];
    for d in &decisions {
        attempts[(d.attempt as usize - 1).min(7)] += 1;
    }
    let delivered = decisions.iter().map(|d| d.items.len() as u64).sum::<u64>();
    let total = (plan.producers as usize * plan.per_producer) as u64;
    let got = (
        stats.sent,
        stats.delivered,
        stats.batches as usize,
        stats.attempts,
    );
    assert_eq!(
        got,
        (total, delivered, batches, attempts),
        "stats: sent, delivered, ..."
    );
    let got = (
        stats.acked,
        stats.given_up,
        stats.retried,
        stats.dead_lettered,
    );
    let want = (
        count(Fate::Acked),
        count(Fate::GivenUp),
        count(Fate::Retried),
        count(Fate::Dead),
    );
    assert_eq!(got, want, "stats: acked, given_up, retried, dead_lettered");
    let left = (
        stats.in_flight_keys,
        stats.in_flight_values,
        stats.dead_letters,
        stats.pending_values,
        stats.lost,
    );
    assert_eq!(left, (0, 0, 0, 0, 0), "stats: something left, or lost");

    check_decisions(&decisions, plan);
    // The dead letters are the values decided to die, each taken once.
    let mut letters: Vec<_> = letters
        .into_iter()
        .map(|l| (l.key, l.values, l.attempts))
        .collect();
    let mut died: Vec<_> = decisions
        .into_iter()
        .filter(|d| d.fate == Fate::Dead)
        .map(|d| (d.key, d.items, d.attempt))
        .collect();
    letters.sort_unstable();
    died.sort_unstable();
    assert!(
        letters == died,
        "the dead letters are not the values retried too often"
    );
}

/// Checks the decisions, sorted by order, against what the rules promise:
///
/// - Each value leaves exactly once (acknowledged, given up or dead-lettered), under its key.
/// - A delivery is the front of its key's values: values retried come back in front, so a
///   key's next delivery starts with them, or with the front of them if a batch cap split
///   them.
/// - So each key's values leave in the order they went in: each producer's values of a key
///   in the order it sent them, whatever leaves between them. (Acknowledged values alone
///   are in order, with gaps where values were given up or dead-lettered.)
fn check_decisions(decisions: &[Decision], plan: Plan) {
    let left = decisions.iter().filter(|d| d.fate != Fate::Retried);
    check_exactly_once(left.map(|d| (d.key, &d.items)), plan);
    // Per key: the values known to stand at its front, and how far each producer's got.
    let mut front: Vec<Vec<Item>> = vec![Vec::new(); usize::from(plan.keys)];
    let mut next = vec![vec![0u32; plan.producers as usize]; usize::from(plan.keys)];
    for d in decisions {
        let k = usize::from(d.key);
        let known = &front[k];
        let common = known.len().min(d.items.len());
        assert!(
            known[..common] == d.items[..common],
            "key {}: a delivery is not the front of its values: {:?}, front {:?}",
            d.key,
            d.items,
            known
        );
        let rest = known[common..].to_vec();
        if d.fate == Fate::Retried {
            front[k] = [d.items.clone(), rest].concat();
            continue;
        }
        front[k] = rest;
        for item in &d.items {
            let want = &mut next[k][item.producer as usize];
            assert_eq!(item.nth, *want, "key {}: {item:?} left out of order", d.key);
            *want += 1;
        }
    }
}

/// Values sent per producer in the acknowledging runs: their receivers do more per value.
const ACKED_PER_PRODUCER: usize = PER_PRODUCER / 2;

/// Many producers into a bounded acknowledging `timed` channel, four receivers that cancel
/// `recv`, keep keys in flight over a `recv`, and ack, give up, retry (at once, after a
/// delay, or by dropping) at random, with `max_attempts`, and a task taking the dead
/// letters: each value leaves exactly once, each key's values in the order they went in,
/// no key has two deliveries in flight, attempts count right, and the stats agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn timed_acked_exactly_once_in_order() {
    let limits = Limits {
        capacity: Some(512),
        max_batch: Some(64),
        per_key: Some(8),
        max_attempts: Some(MAX_ATTEMPTS),
        ..Limits::default()
    };
    let plan = Plan {
        producers: 8,
        per_producer: ACKED_PER_PRODUCER,
        receivers: 4,
        keys: 64,
        cancel_pct: 20,
        requeue_pct: 0,
    };
    run_acked(Timed { window: ms(1) }, limits, plan).await;
}

/// As `timed_acked_exactly_once_in_order`, on an `ordered` channel with random sort keys,
/// and `max_keys` under the number of keys, so that keys in flight hold the slots that
/// senders wait for.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ordered_acked_exactly_once_in_order() {
    let limits = Limits {
        capacity: Some(128),
        max_batch: Some(32),
        max_keys: Some(24),
        max_attempts: Some(MAX_ATTEMPTS),
        ..Limits::default()
    };
    let plan = Plan {
        producers: 8,
        per_producer: ACKED_PER_PRODUCER,
        receivers: 4,
        keys: 32,
        cancel_pct: 20,
        requeue_pct: 0,
    };
    run_acked(Ordered, limits, plan).await;
}
