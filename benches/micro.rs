//! Micro-benchmarks of the core paths, with criterion.
//!
//! ```text
//! cargo bench --bench micro
//! cargo bench --bench micro -- send/timed    # one group
//! ```
//!
//! - `send/{timed,ordered}/N`: one `try_send` of a new key while `N` keys are pending, for
//!   `N` from 10² to 10⁶. `timed` appends to its FIFO index, so it should stay flat (apart
//!   from cache misses in a bigger table); `ordered` with random sort keys goes through a
//!   binary heap, so it should grow with `log N`.
//! - `recv/{timed,ordered}/B`: one `try_recv` that takes a batch of `B` keys (one value each);
//!   criterion reports it per key as well.
//!
//! Runs are kept short (20 samples, 1 s each); pass `--measurement-time`/`--sample-size` for
//! tighter figures.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{
    criterion_group, criterion_main, BatchSize, Bencher, BenchmarkId, Criterion, Throughput,
};
use keyed_batch::{ordered, timed, Batch};

use common::mix;

mod common;

const PENDING: [u64; 5] = [100, 1_000, 10_000, 100_000, 1_000_000];
const BATCHES: [u64; 5] = [1, 10, 100, 1_000, 10_000];

/// How many keys a timed stretch sends before the extra keys are taken out again: pending
/// keys stay within `pending..pending + chunk`.
fn chunk(pending: u64) -> u64 {
    (pending / 4).clamp(16, 4096)
}

/// Sends `iters` new keys in stretches of `chunk` keys, timing only the sends. After each
/// stretch, `take` removes as many keys as it sent (the oldest, or the smallest), so the
/// channel keeps holding about `pending` keys.
fn rolling(
    iters: u64,
    chunk: u64,
    next: &mut u64,
    mut send: impl FnMut(u64),
    mut take: impl FnMut() -> usize,
) -> Duration {
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = left.min(chunk);
        let start = Instant::now();
        for _ in 0..n {
            send(*next);
            *next += 1;
        }
        total += start.elapsed();
        left -= n;
        // The takes remove `chunk` keys; top a short stretch up first, untimed.
        for _ in n..chunk {
            send(*next);
            *next += 1;
        }
        assert_eq!(take() as u64, chunk, "a stretch comes back out whole");
    }
    total
}

fn send(c: &mut Criterion) {
    let mut group = c.benchmark_group("send");
    group.throughput(Throughput::Elements(1));
    for pending in PENDING {
        let chunk = chunk(pending);
        // Window 0: every key is due at once and deadlines only grow, so the stretch that
        // follows goes to the back and `try_recv` takes the oldest `chunk` keys.
        let (tx, mut rx) = timed::Builder::new(Duration::ZERO)
            .max_batch(chunk as usize)
            .build::<u64, u64>();
        for i in 0..pending {
            tx.try_send(mix(i), i).expect("open");
        }
        let mut next = pending;
        group.bench_function(BenchmarkId::new("timed", pending), |b| {
            b.iter_custom(|iters| {
                rolling(
                    iters,
                    chunk,
                    &mut next,
                    |i| tx.try_send(black_box(mix(i)), i).expect("open"),
                    || rx.try_recv().expect("due").len(),
                )
            })
        });
        assert_eq!(rx.key_count() as u64, pending, "the channel held its size");
        drop((tx, rx));

        let (tx, mut rx) = ordered::Builder::new()
            .max_batch(chunk as usize)
            .build::<u32, u64, u64>();
        for i in 0..pending {
            tx.try_send(mix(!i) as u32, mix(i), i).expect("open");
        }
        let mut next = pending;
        group.bench_function(BenchmarkId::new("ordered", pending), |b| {
            b.iter_custom(|iters| {
                rolling(
                    iters,
                    chunk,
                    &mut next,
                    |i| {
                        tx.try_send(black_box(mix(!i) as u32), mix(i), i)
                            .expect("open")
                    },
                    || rx.try_recv().expect("due").len(),
                )
            })
        });
        assert_eq!(rx.key_count() as u64, pending, "the channel held its size");
    }
    group.finish();
}

fn recv(c: &mut Criterion) {
    let mut group = c.benchmark_group("recv");
    for keys in BATCHES {
        group.throughput(Throughput::Elements(keys));
        group.bench_function(BenchmarkId::new("timed", keys), |b| {
            take_all(
                b,
                keys,
                || {
                    let (tx, rx) = timed::channel::<u64, u64>(Duration::ZERO);
                    for i in 0..keys {
                        tx.try_send(mix(i), i).expect("open");
                    }
                    (tx, rx)
                },
                |(_, rx)| rx.try_recv().expect("due"),
            )
        });
        group.bench_function(BenchmarkId::new("ordered", keys), |b| {
            take_all(
                b,
                keys,
                || {
                    let (tx, rx) = ordered::channel::<u32, u64, u64>();
                    for i in 0..keys {
                        tx.try_send(mix(!i) as u32, mix(i), i).expect("open");
                    }
                    (tx, rx)
                },
                |(_, rx)| rx.try_recv().expect("due"),
            )
        });
    }
    group.finish();
}

/// Times one `try_recv` that takes all `keys` keys out of a channel `fill` makes afresh.
fn take_all<C>(
    b: &mut Bencher<'_>,
    keys: u64,
    fill: impl FnMut() -> C,
    mut try_recv: impl FnMut(&mut C) -> Batch<u64, u64>,
) {
    b.iter_batched(
        fill,
        |mut chan| {
            let batch = try_recv(&mut chan);
            assert_eq!(batch.len() as u64, keys);
            // Dropped outside the timing, with the channel.
            (batch, chan)
        },
        BatchSize::SmallInput,
    )
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20);
    targets = send, recv
}
criterion_main!(benches);
