//! What each layer of a `timed` send costs, on one thread: the keyed work alone, then the
//! queue, the queue behind a mutex, the queue with a clock read per value, and the channel.
//!
//! ```text
//! taskset -c 0 cargo bench --bench layers            # 4,000,000 values a row
//! taskset -c 0 cargo bench --bench layers -- --quick # 1,000,000
//! ```
//!
//! Every row pushes values under keys drawn evenly from `keys`, and takes out, every 128
//! values, what is due. In the first four, a value is due once 33,000 more values have come
//! after it; the channel's window is in time, so its row says how many values were pending
//! at the end: compare rows with about as many pending. `floor` is a `hashbrown` map of `Vec`s with a `VecDeque` of runs in
//! arrival order, which is what the keyed work costs with nothing else around it. The rows
//! between it and `channel` show where a send's time goes; pin the run to one CPU, since
//! the figures are per value on one thread.

use std::collections::VecDeque;
use std::hint::black_box;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hashbrown::hash_map::Entry;
use hashbrown::HashMap;
use keyed_batch::queue::SortedQueue;
use keyed_batch::timed;

use common::{mix, Flags, Size};

mod common;

/// Values between two looks for what is due.
const EVERY: u64 = 128;

/// A row of the table: runs its layer, and returns what it took out, so that nothing is
/// optimized away.
type Row = Box<dyn Fn() -> u64>;

fn floor(n: u64, keys: u64, pending: u64) -> u64 {
    let mut map: HashMap<u64, Vec<u64>> = HashMap::new();
    let mut runs: VecDeque<(u64, u64)> = VecDeque::new();
    let mut sink = 0;
    for i in 0..n {
        let key = mix(i) % keys;
        match map.entry(key) {
            Entry::Occupied(mut e) => e.get_mut().push(i),
            Entry::Vacant(e) => {
                e.insert(vec![i]);
                runs.push_back((i + pending, key));
            }
        }
        if i % EVERY == 0 {
            while let Some(&(due, key)) = runs.front().filter(|(due, _)| *due <= i) {
                runs.pop_front();
                let values = map.remove(&key).expect("a run's key is pending");
                sink += black_box(values).len() as u64 + due;
            }
        }
    }
    sink
}

/// The queue, with `lock` and `clock` saying whether each push takes a mutex and reads the
/// clock (the reading is not used: the rank stays a count, so every row does the same work).
fn queue(n: u64, keys: u64, pending: u64, lock: bool, clock: bool) -> u64 {
    let q = Mutex::new(SortedQueue::<u64, u64, u64>::new());
    let mut bare = SortedQueue::<u64, u64, u64>::new();
    let mut sink = 0;
    for i in 0..n {
        if clock {
            black_box(Instant::now());
        }
        let key = mix(i) % keys;
        match lock {
            true => q.lock().unwrap().push(key, i, i + pending),
            false => bare.push(key, i, i + pending),
        };
        if i % EVERY == 0 {
            let mut take = |q: &mut SortedQueue<u64, u64, u64>| loop {
                let batch = q.pop_batch(usize::MAX, |due| *due <= i);
                if batch.is_empty() {
                    break;
                }
                sink += black_box(batch).len() as u64;
            };
            match lock {
                true => take(&mut q.lock().unwrap()),
                false => take(&mut bare),
            }
        }
    }
    sink
}

/// The channel, on a current-thread runtime: `try_send`, and `try_recv` until empty every
/// `EVERY` values. Returns the sink and the values pending at the end.
fn channel(n: u64, keys: u64, window: Duration) -> (u64, usize) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let (tx, mut rx) = timed::channel::<u64, u64>(window);
        let mut sink = 0;
        for i in 0..n {
            tx.try_send(mix(i) % keys, i).expect("an open channel");
            if i % EVERY == 0 {
                while let Ok(batch) = rx.try_recv() {
                    sink += black_box(batch).len() as u64;
                }
            }
        }
        (sink, rx.len())
    })
}

fn ns_per_value(n: u64, run: impl FnOnce()) -> f64 {
    let start = Instant::now();
    run();
    start.elapsed().as_nanos() as f64 / n as f64
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let size = Flags(&args).size();
    let n: u64 = match size {
        Size::Smoke => 20_000,
        Size::Quick => 1_000_000,
        Size::Full => 4_000_000,
    };
    const PENDING: u64 = 33_000;
    println!(
        "One thread, {n} values a row, ns per value ({} run).\n",
        size.label()
    );
    println!("| keys | layer | pending | ns/value |");
    println!("|--:|---|--:|--:|");
    for keys in [1_000, 1_000_000] {
        let pending = PENDING;
        let rows: [(&str, Row); 4] = [
            (
                "floor: hashbrown + VecDeque",
                Box::new(move || floor(n, keys, pending)),
            ),
            (
                "queue",
                Box::new(move || queue(n, keys, pending, false, false)),
            ),
            (
                "queue behind a mutex",
                Box::new(move || queue(n, keys, pending, true, false)),
            ),
            (
                "queue behind a mutex, a clock read a value",
                Box::new(move || queue(n, keys, pending, true, true)),
            ),
        ];
        for (name, run) in rows {
            let ns = ns_per_value(n, || {
                black_box(run());
            });
            println!("| {keys} | {name} | {pending} | {ns:.0} |");
        }
        for window_ms in [1, 10, 50] {
            let mut left = 0;
            let ns = ns_per_value(n, || {
                let (sink, pending) = channel(n, keys, Duration::from_millis(window_ms));
                black_box(sink);
                left = pending;
            });
            println!("| {keys} | channel, window {window_ms} ms | {left} at the end | {ns:.0} |");
        }
    }
}
