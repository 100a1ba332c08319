//! Figure 3: disk use while values are sent and acked and one delivery is held
//! throughout; then a reopen, which brings back the held value alone.

use std::fmt::Write as _;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use keyed_batch::ack::ack_all;
use keyed_batch::durable::FsyncPolicy;
use keyed_batch::timed;

use crate::common::mix;
use crate::plan::{Plan, KEYS};
use crate::report::{mib, size, Target};
use crate::runtime;

const SENDERS: u64 = 64;
/// The held delivery's key: no other value is sent to it.
const HELD: u64 = u64::MAX;
/// How often the folder is measured.
const SAMPLE: Duration = Duration::from_millis(50);

/// The files in a folder: their length, and the space they take on the disk.
#[derive(Clone, Copy, Default)]
pub(crate) struct Usage {
    pub(crate) bytes: u64,
    pub(crate) allocated: u64,
}

pub(crate) fn usage(dir: &Path) -> Usage {
    let mut usage = Usage::default();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        // A segment deleted between the listing and this is not counted.
        if let Ok(meta) = entry.metadata() {
            usage.bytes += meta.len();
            usage.allocated += meta.blocks() * 512;
        }
    }
    usage
}

/// The index of the newest segment in `dir` (`<20 digits>.kblog`).
fn newest_segment(dir: &Path) -> Option<u64> {
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_suffix(".kblog")?.parse().ok())
        .max()
}

/// The log's figures at one moment.
#[derive(Clone, Copy, Default)]
struct Log {
    segments: usize,
    bytes: u64,
}

pub(crate) struct Figures {
    values: u64,
    segment: u64,
    secs: f64,
    peak: Log,
    end: Log,
    peak_dir: Usage,
    end_dir: Usage,
    samples: u64,
    /// Segments made over the run (the newest's index, plus one).
    made: u64,
    recovered: u64,
}

async fn open(dir: &Path, segment: u64) -> (timed::Sender<u64, u64>, timed::AckReceiver<u64, u64>) {
    timed::Builder::new(Duration::ZERO)
        .capacity(1 << 16)
        .durable(dir)
        .fsync(FsyncPolicy::Never)
        .segment_size(segment)
        .open()
        .await
        .expect("the log opens")
}

/// Sends and acks `disk_values` values while one delivery is held; measures the log
/// all along; then reopens it.
pub(crate) fn run(plan: &Plan, work: &Path) -> Figures {
    let dir = work.join("disk");
    let (values, segment) = (plan.disk_values, plan.disk_segment);
    let rt = runtime();
    let figures = rt.block_on(async {
        let (tx, mut rx) = open(&dir, segment).await;
        tx.send(HELD, 0).await.expect("sent");
        let held = {
            let mut batch = rx.recv().await.expect("the held value");
            assert_eq!(batch.len(), 1);
            batch.pop().expect("one delivery")
        };
        assert_eq!(*held.key(), HELD);

        // The folder, measured every `SAMPLE` until the run ends.
        let done = Arc::new(AtomicBool::new(false));
        let (peak_bytes, peak_alloc, samples) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicU64::new(0)),
        );
        let sampler = {
            let (dir, done) = (dir.clone(), Arc::clone(&done));
            let (peak_bytes, peak_alloc, samples) = (
                Arc::clone(&peak_bytes),
                Arc::clone(&peak_alloc),
                Arc::clone(&samples),
            );
            std::thread::spawn(move || {
                while !done.load(Relaxed) {
                    let u = usage(&dir);
                    peak_bytes.fetch_max(u.bytes, Relaxed);
                    peak_alloc.fetch_max(u.allocated, Relaxed);
                    samples.fetch_add(1, Relaxed);
                    std::thread::sleep(SAMPLE);
                }
            })
        };

        // The consumer acks everything else, and reads the log's figures after each batch.
        let consumer = tokio::spawn(async move {
            let (mut acked, mut peak) = (0, Log::default());
            while acked < values {
                let batch = rx.recv().await.expect("open");
                acked += batch.iter().map(|d| d.values().len() as u64).sum::<u64>();
                ack_all(batch).await.expect("acked");
                let s = rx.stats();
                peak.segments = peak.segments.max(s.log_segments);
                peak.bytes = peak.bytes.max(s.log_bytes);
            }
            (rx, peak)
        });
        let start = Instant::now();
        let senders: Vec<_> = (0..SENDERS)
            .map(|s| {
                let tx = tx.clone();
                let (from, to) = (values * s / SENDERS, values * (s + 1) / SENDERS);
                tokio::spawn(async move {
                    for i in from..to {
                        tx.send(mix(i) % KEYS, i).await.expect("sent");
                    }
                })
            })
            .collect();
        for sender in senders {
            sender.await.expect("a sender");
        }
        let (rx, peak) = consumer.await.expect("the consumer");
        let secs = start.elapsed().as_secs_f64();
        done.store(true, Relaxed);
        sampler.join().expect("the sampler");
        let s = rx.stats();
        assert_eq!(s.acked, values, "everything but the held value was acked");
        let end = Log {
            segments: s.log_segments,
            bytes: s.log_bytes,
        };
        let end_dir = usage(&dir);
        let made = newest_segment(&dir).map_or(0, |i| i + 1);
        let mut peak_dir = Usage {
            bytes: peak_bytes.load(Relaxed),
            allocated: peak_alloc.load(Relaxed),
        };
        peak_dir.bytes = peak_dir.bytes.max(end_dir.bytes);
        peak_dir.allocated = peak_dir.allocated.max(end_dir.allocated);
        // As a crash would: the held value is still undecided.
        drop((held, tx, rx));
        Figures {
            values,
            segment,
            secs,
            peak,
            end,
            peak_dir,
            end_dir,
            samples: samples.load(Relaxed),
            made,
            recovered: 0,
        }
    });
    let recovered = rt.block_on(async {
        let (tx, mut rx) = open(&dir, segment).await;
        let recovered = rx.stats().log_recovered;
        drop(tx);
        let batch = rx.recv().await.expect("the held value came back");
        assert_eq!(batch.len(), 1);
        assert_eq!(*batch[0].key(), HELD, "the held value came back");
        assert_eq!(batch[0].values(), &[0]);
        ack_all(batch).await.expect("acked");
        recovered
    });
    assert_eq!(recovered, 1, "only the held value comes back");
    std::fs::remove_dir_all(&dir).expect("the log removed");
    Figures {
        recovered,
        ..figures
    }
}

pub(crate) fn table(f: &Figures) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n### 3. Disk use: {} values sent and acked, one delivery held throughout\n",
        f.values
    );
    let _ = writeln!(
        out,
        "`timed` window 0, `FsyncPolicy::Never`, segment size {}, {SENDERS} sender \
         tasks, `u64` keys ({KEYS}) and values, one consumer acking each batch: {:.1} s, \
         {:.0} values/s; {} segments made in all. Log: `stats()` after every ack; folder: \
         every file's length and allocated blocks, sampled every {} ms ({} samples), and at \
         the end. Reopened after: {} value(s) came back (the held one).\n",
        size(f.segment),
        f.secs,
        f.values as f64 / f.secs,
        f.made,
        SAMPLE.as_millis(),
        f.samples,
        f.recovered
    );
    let _ = writeln!(
        out,
        "| | log_segments | log_bytes MiB | folder MiB | folder allocated MiB | ×segment size |"
    );
    let _ = writeln!(out, "|---|--:|--:|--:|--:|--:|");
    for (what, log, dir) in [("peak", f.peak, f.peak_dir), ("end", f.end, f.end_dir)] {
        let _ = writeln!(
            out,
            "| {what} | {} | {:.2} | {:.2} | {:.2} | {:.2} |",
            log.segments,
            mib(log.bytes),
            mib(dir.bytes),
            mib(dir.allocated),
            dir.bytes.max(dir.allocated) as f64 / f.segment as f64
        );
    }
    out
}

pub(crate) fn targets(f: &Figures) -> Vec<Target> {
    let peak = f.peak_dir.bytes.max(f.peak_dir.allocated);
    let segments = peak as f64 / f.segment as f64;
    vec![Target {
        what: format!(
            "disk, peak folder size over segment size, {} values, one held",
            f.values
        ),
        limit: "about 2 (≤ 2.5)".into(),
        measured: format!("{segments:.2}"),
        met: segments <= 2.5,
    }]
}
