//! `keyed_batch` side by side with what a user would pick instead.
//!
//! ```text
//! cargo bench --bench compare -- --quick   # 3 rounds, 400,000 values a run, about a minute
//! cargo bench --bench compare              # 5 rounds, 2,000,000 values a run
//! ```
//!
//! Run without `--bench` or `--quick` (as `cargo test --benches` does), the binary does a
//! smoke check instead: one short, verified run of every variant, and it writes no files.
//! `--rounds N`, `--values N`, `--only a,b` (variants) and `--scenario w0-p1` (names that
//! contain it) narrow a run down; a narrowed run writes no files. To profile one variant,
//! run a child directly: `compare-<hash> --child timed 0 1 1000 2000000` (variant, window
//! ms, producers, keys, values, and optionally the workload: `uniform` or `zipf`, as in
//! `--child timed 1000 4 100000 400000 zipf`) or `--lateness-child timed 1000000 200000 2000 20`.
//!
//! # Variants
//!
//! | name | what |
//! |---|---|
//! | `mpsc` | `tokio::sync::mpsc::unbounded_channel`, the consumer only checks and counts: the floor |
//! | `diy_delayqueue` | mpsc into a consumer task holding `HashMap<K, Vec<V>>` and a `tokio_util::time::DelayQueue<K>` |
//! | `diy_exact` | `timed`'s promise by hand: mpsc of `(key, value, when sent)` into a `HashMap<K, Vec<V>>` and a FIFO of exact deadlines, every due key out at once |
//! | `origin_port` | the origin's design: one `Mutex<(BTreeMap<Instant, Vec<K>>, HashMap<K, Vec<V>>)>`, pulled, 100 ms naps |
//! | `timed` | `keyed_batch::timed` |
//! | `timed_acked` | `keyed_batch::timed` acknowledged (`Builder::acked`): the consumer acks the batch once its values are checked |
//! | `ordered` | `keyed_batch::ordered` with random `u32` sort keys (window 0 scenarios only) |
//! | `diy_binaryheap` | mpsc into a consumer task holding `HashMap` + `BinaryHeap`: what `ordered` replaces |
//!
//! # Scenarios
//!
//! `wW-pP-mM`: `(u64, u64)` values, a window of W ms, P producers, M distinct keys, each
//! equally likely; every window (0, 50) with every producer count (1, 4) and key count (1k,
//! 1M). Windowed scenarios run the variants that take a window.
//!
//! `zipf`, a workload like the main job's (a webhook per customer): 100,000 customers with
//! Zipf(1.1) traffic (customer `k` sends in proportion to `1/(k+1)^1.1`, drawn from a hash of
//! the value's index with alias tables built before the clock starts), `String` events of 100
//! to 400 bytes made by the producers, a window of 1 s, 4 producers, and a consumer that
//! serializes each delivered key's events to a JSON body (`serde_json::to_vec`; no network).
//! Allocation counts here: the events', the bodies', the channel's.
//!
//! # How a run goes
//!
//! Each run is a child process (this binary, re-invoked with `--child`), so that peak RSS
//! (`VmHWM`) and the allocation count belong to one variant alone. In each round every
//! variant runs once per scenario, in an order rotated from round to round, and ratios are
//! taken within a round before their median is taken: the machine's noise hits both sides.
//!
//! - A multi-thread tokio runtime with one worker per core.
//! - `P` producer *tasks*. Producer `p` sends a contiguous range of value indices, so the
//!   value (its index, or for `zipf` an event that starts with it) encodes the producer and
//!   its sequence number. The key is a hash of the index modulo `M` (for `zipf`, a Zipf
//!   draw from that hash). A producer yields to the scheduler every 256 values, as a task that
//!   does some I/O would; otherwise four producers on two workers starve the consumer.
//! - Every variant's channel is unbounded, and producers send with its call that never
//!   waits: `UnboundedSender::send` for the mpsc-based ones, `try_send` for `keyed_batch`'s.
//!   `send().await` would also spend tokio's task budget, as the crate docs say, and yield
//!   every 128 values besides the 256 above; side by side, `try_send` took 8–25% less
//!   time per value at 1,000 keys (CHANGELOG).
//! - One consumer task. A run ends when it has seen every value; nothing is closed early, so
//!   a windowed run includes waiting out the last window.
//! - Verification: every delivered value must be an index that was sent, under the key that
//!   index maps to, and not seen before (a bitmap); the run fails unless every index arrived,
//!   and the channel must be empty afterwards.
//! - mpsc-based consumers read with `recv_many(.., 128)`; `origin_port` pulls at most 100
//!   values at a time, as the origin's own demo does, and naps 100 ms when nothing is due.
//!
//! # Figures
//!
//! ns per value: wall time from the first send to the last value checked, less the time the
//! consumer sat suspended after the last send (waiting out the last windows, or the origin's
//! naps), over values; CPU ns per value (every thread, from `/proc/self/task/*/schedstat`);
//! values per delivery (how well values batch up per key; 1 for `mpsc`); peak RSS (`VmHWM`),
//! and RSS once everything drained (`VmRSS`, channel still alive). Allocations are not
//! counted: a counting allocator adds atomic operations to every `alloc` and `free`, and so
//! charges each variant by how much it allocates (it made `timed` about a tenth slower at
//! w0-p1-m1k, and `mpsc`, which allocates little, no slower).
//!
//! Lateness: one producer paces 200,000 values/s for 2 s into a 20 ms window; for each
//! delivered key, delivery time minus its deadline (the send time of the oldest value
//! in that delivery plus the window). A negative figure is an early delivery.
//!
//! Output: a markdown report on stdout, `target/compare.json` and `target/compare.svg`.
//!
//! # Where things are
//!
//! - [`variants`]: the variant lists, and how each variant is wired up for a run. A new
//!   variant starts here.
//! - [`plan`]: the sizes the flags pick, and the scenario lists. A new scenario starts here.
//! - In a child ([`child`]): the [`workload`] producers send through the variant, one of the
//!   [`consumers`] (for `origin_port`, over the [`origin`] port) takes what is due,
//!   [`verify`] checks it, and [`measure`] reads the figures.
//! - In the parent: the [`rounds`] start the children, then [`report`] and [`chart`] turn
//!   their runs into figures, the markdown and the files.

#![forbid(unsafe_code)]

use std::env;
use std::fmt::Write as _;
use std::time::Instant;

use common::target_dir;
use plan::Plan;
use report::Report;

#[path = "../common/mod.rs"]
mod common;

// What runs in a child: one variant through one scenario.
mod child;
mod consumers;
mod measure;
mod origin;
mod variants;
mod verify;
mod workload;

// What the parent does: the rounds, the figures, the output.
mod chart;
mod plan;
mod report;
mod rounds;

fn main() {
    let args: Vec<String> = env::args().skip(1).collect();
    let after = |flag: &str| Some(&args[args.iter().position(|a| a == flag)? + 1..]);
    if let Some(rest) = after(child::THROUGHPUT_FLAG) {
        child::reply(&child::throughput(rest));
    } else if let Some(rest) = after(child::LATENESS_FLAG) {
        child::reply(&child::lateness(rest));
    } else {
        parent(&args);
    }
}

/// Runs every round, prints the report, and writes the files if the run is a whole one.
fn parent(args: &[String]) {
    let plan = Plan::from_args(args);
    let started = Instant::now();
    let scenarios = rounds::throughput(&plan);
    let throughput_secs = started.elapsed().as_secs_f64();
    let lateness_started = Instant::now();
    let lateness = rounds::lateness(&plan);
    let lateness_secs = lateness_started.elapsed().as_secs_f64();

    let report = Report::new(&scenarios, lateness);
    let mut md = String::new();
    report::markdown(&mut md, &plan, &scenarios, &report);
    let _ = writeln!(
        md,
        "\nTime: {:.0} s throughput, {:.0} s lateness, {:.0} s in all.",
        throughput_secs,
        lateness_secs,
        started.elapsed().as_secs_f64()
    );
    print!("{md}");

    if plan.writes_files() {
        let dir = target_dir();
        std::fs::create_dir_all(&dir).expect("target directory");
        let json = serde_json::to_string_pretty(&report).expect("serializable");
        std::fs::write(dir.join("compare.json"), json + "\n").expect("compare.json written");
        match chart::chart(&dir.join("compare.svg"), &scenarios) {
            Ok(()) => eprintln!("wrote {0}/compare.json and {0}/compare.svg", dir.display()),
            Err(e) => eprintln!("chart not drawn: {e}"),
        }
    }
}
