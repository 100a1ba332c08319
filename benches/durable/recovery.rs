//! Figure 2: how long `open` takes on a log of values sent and never acked.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use keyed_batch::durable::FsyncPolicy;
use keyed_batch::timed;

use crate::common::mix;
use crate::disk::usage;
use crate::plan::{Plan, KEYS};
use crate::report::{median, mib, range, Target};
use crate::{machine, runtime};

const LIMIT_SECS: f64 = 0.5;

pub(crate) struct Figures {
    values: u64,
    fill_secs: f64,
    log_bytes: u64,
    segments: usize,
    opens: Vec<f64>,
    /// CPU time of each open, every thread: less hit by a busy machine than wall time.
    cpus: Vec<f64>,
}

async fn open(dir: &Path) -> (timed::Sender<u64, u64>, timed::AckReceiver<u64, u64>) {
    timed::Builder::new(Duration::from_secs(1))
        .durable(dir)
        .fsync(FsyncPolicy::Never)
        .open()
        .await
        .expect("the log opens")
}

/// Fills a log with values sent and never acked, then opens it a few times.
pub(crate) fn run(plan: &Plan, work: &Path) -> Figures {
    let dir = work.join("recovery");
    let values = plan.recovery_values;
    let rt = runtime();
    let fill_secs = rt.block_on(async {
        let (tx, rx) = open(&dir).await;
        let start = Instant::now();
        for i in 0..values {
            tx.try_send(mix(i) % KEYS, i).expect("room");
        }
        // The committer writes what is buffered before the journal goes.
        drop((tx, rx));
        start.elapsed().as_secs_f64()
    });
    let (mut opens, mut cpus) = (Vec::new(), Vec::new());
    let (mut log_bytes, mut segments) = (0, 0);
    for at in 0..plan.recovery_opens {
        let (took, cpu, stats) = rt.block_on(async {
            let (start, cpu) = (Instant::now(), machine::cpu_secs());
            let (_tx, rx) = open(&dir).await;
            let took = start.elapsed().as_secs_f64();
            (took, machine::cpu_secs() - cpu, rx.stats())
        });
        assert_eq!(stats.log_recovered, values, "every value came back");
        assert_eq!(stats.pending_values as u64, values);
        eprintln!(
            "  recovery open {}/{}: {took:.3} s, {cpu:.3} s CPU",
            at + 1,
            plan.recovery_opens
        );
        opens.push(took);
        cpus.push(cpu);
        (log_bytes, segments) = (stats.log_bytes, stats.log_segments);
    }
    let on_disk = usage(&dir);
    assert_eq!(on_disk.bytes, log_bytes, "the log's size is the folder's");
    std::fs::remove_dir_all(&dir).expect("the log removed");
    Figures {
        values,
        fill_secs,
        log_bytes,
        segments,
        opens,
        cpus,
    }
}

pub(crate) fn table(f: &Figures) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n### 2. Recovery: `open` of a log of values sent and never acked\n"
    );
    let _ = writeln!(
        out,
        "`timed`, `u64` keys ({KEYS}) and values, written with `try_send` under `Never` \
         (fill: {:.1} s). Warm page cache: a cold open reads the log from disk first.\n",
        f.fill_secs
    );
    let (lo, hi) = range(&f.opens);
    let _ = writeln!(
        out,
        "| values | log MiB | segments | opens | open median s | min–max s | CPU median s |"
    );
    let _ = writeln!(out, "|--:|--:|--:|--:|--:|--:|--:|");
    let _ = writeln!(
        out,
        "| {} | {:.1} | {} | {} | {:.3} | {:.3}–{:.3} | {:.3} |",
        f.values,
        mib(f.log_bytes),
        f.segments,
        f.opens.len(),
        median(&f.opens),
        lo,
        hi,
        median(&f.cpus)
    );
    out
}

pub(crate) fn targets(f: &Figures) -> Vec<Target> {
    let took = median(&f.opens);
    vec![Target {
        what: format!("recovery, open of {} pending values (s)", f.values),
        limit: format!("< {LIMIT_SECS}"),
        measured: format!("{took:.3}"),
        met: took < LIMIT_SECS,
    }]
}
