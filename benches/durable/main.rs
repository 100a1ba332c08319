//! Durable channels: send rates per fsync policy against a hand-written log, recovery time,
//! and disk use under a long-held delivery.
//!
//! ```text
//! cargo bench --bench durable --features durable -- --quick   # CI size, under a minute
//! cargo bench --bench durable --features durable              # the full figures, minutes
//! ```
//!
//! Sizes: `--quick` runs 3 send rounds of 0.25 s, recovers 200,000 values and sends 1,000,000
//! through 1 MiB segments; the full run, 11 rounds of 0.5 s, 1,000,000 and 10,000,000
//! through 8 MiB segments. Run without `--bench` or `--quick` (as `cargo test --benches`
//! does), the binary does a smoke check instead: every figure once, tiny.
//!
//! `--only sends,recovery,disk` picks figures; `--senders 1,64` and `--policy
//! always,interval,never` narrow figure 1; `--rounds N` and `--secs S` size its rounds;
//! `--opens N` and `--values N` size figures 2 and 3; `--dir PATH` puts the logs somewhere
//! else (by default a temporary folder in the target directory, removed after).
//!
//! # Figures
//!
//! 1. **Sends/s.** `S` sender tasks (1, 4, 64) each `send(key, value).await` in a loop for a
//!    fixed time into a `timed` durable channel (window 0), while one consumer task takes
//!    every batch and acks it with `ack_all`. Against it, in the same round, a *bare* log
//!    written by hand under the same policy: with one writer, a thread that writes each
//!    record and syncs it (`fdatasync`) itself; with more, writer tasks that append to a
//!    shared buffer and wait, and one committer thread that writes all that is pending in
//!    one `write`, syncs it, and wakes them (group commit). Its records are the durable
//!    log's send records, byte for byte in size and framing (length, CRC-32C, type,
//!    sequence, time, input, postcard key and value); it has no consumer and writes no done
//!    records, which the durable side does on the same cores. The cost ratio is bare
//!    sends/s over durable sends/s, taken within a round, median over rounds: the
//!    machine's noise hits both sides.
//! 2. **Recovery.** `open` of a directory holding values sent and never acked, on a warm
//!    page cache; median of a few opens, in wall time and in CPU time (every thread), which
//!    a busy machine bends less.
//! 3. **Disk use.** Values sent and acked under `FsyncPolicy::Never` while one delivery is
//!    held undecided the whole time: the log's figures (`stats()`) and the directory's
//!    bytes, sampled, at their peak and at the end. Then the directory is reopened: the held
//!    value alone comes back.

//! # Where things are
//!
//! [`plan`] reads the flags; [`sends`] (with the [`bare`] log it races), [`recovery`] and
//! [`disk`] each run one figure and write its table; [`machine`] says what the figures
//! ran on; [`report`] has the helpers the tables share and the targets table.

#![forbid(unsafe_code)]

use std::env;
use std::fs;
use std::time::Instant;

use common::{runtime, target_dir};
use plan::Plan;

#[path = "../common/mod.rs"]
mod common;

mod plan;
// One module a figure; the bare log figure 1 measures against.
mod bare;
mod disk;
mod recovery;
mod sends;
// The machine, and the tables.
mod machine;
mod report;

fn main() {
    let args: Vec<String> = env::args().skip(1).collect();
    let plan = Plan::from_args(&args);
    let base = plan.dir.clone().unwrap_or_else(target_dir);
    fs::create_dir_all(&base).expect("a folder for the logs");
    let work = tempfile::Builder::new()
        .prefix("kb-durable-bench-")
        .tempdir_in(&base)
        .expect("a temporary folder for the logs");
    let started = Instant::now();
    print!("{}", machine::header(&plan, work.path()));
    let mut targets = Vec::new();
    if plan.covers("sends") {
        let rows = sends::run(&plan, work.path());
        print!("{}", sends::table(&plan, &rows));
        targets.extend(sends::targets(&rows));
    }
    if plan.covers("recovery") {
        let figures = recovery::run(&plan, work.path());
        print!("{}", recovery::table(&figures));
        targets.extend(recovery::targets(&figures));
    }
    if plan.covers("disk") {
        let figures = disk::run(&plan, work.path());
        print!("{}", disk::table(&figures));
        targets.extend(disk::targets(&figures));
    }
    print!("{}", report::targets(&targets));
    println!("\nTime: {:.0} s in all.", started.elapsed().as_secs_f64());
}
