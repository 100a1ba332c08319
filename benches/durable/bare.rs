//! The bare log figure 1 races a durable channel against: send records framed and encoded
//! as the durable log does them, written under the same policy by hand, with no channel.
//!
//! One writer is a plain thread that writes each record and syncs it itself. More are tasks
//! that append to a shared buffer and wait, while one committer thread writes all that is
//! pending in one `write`, syncs it as the policy says, and wakes them: the group commit a
//! careful hand-written log would do.

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use keyed_batch::durable::FsyncPolicy;
use tokio::sync::watch;

use crate::runtime;
use crate::sends::{key, value, Run};

/// A record as the durable log frames a send: length and CRC-32C, then a record type,
/// sequence number, wall-clock time, and three fields each with its length: the input (as
/// `timed` writes "due after the window", one byte), and the postcard key and value.
fn record(seq: u64, key: u64, value: &[u8]) -> Vec<u8> {
    let key = postcard::to_stdvec(&key).expect("a key encodes");
    let value = postcard::to_stdvec(value).expect("a value encodes");
    let wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut out = vec![0; 8];
    out.push(1);
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&wall.to_le_bytes());
    for field in [&[0][..], &key, &value] {
        out.extend_from_slice(&(field.len() as u32).to_le_bytes());
        out.extend_from_slice(field);
    }
    let len = (out.len() - 8) as u32;
    let crc = crc32c::crc32c(&out[8..]);
    out[..4].copy_from_slice(&len.to_le_bytes());
    out[4..8].copy_from_slice(&crc.to_le_bytes());
    out
}

fn create(dir: &Path) -> File {
    std::fs::create_dir_all(dir).expect("the run's folder");
    OpenOptions::new()
        .create_new(true)
        .append(true)
        .open(dir.join("bare.log"))
        .expect("the bare log")
}

/// Whether a policy syncs now: always, once its interval has passed, or never.
fn due(policy: FsyncPolicy, last_sync: Instant) -> bool {
    match policy {
        FsyncPolicy::Always => true,
        FsyncPolicy::Interval(every) => last_sync.elapsed() >= every,
        FsyncPolicy::Never => false,
    }
}

/// One run of the bare log for `run_for`: one writer writes and syncs each record itself;
/// more share a group commit.
pub(crate) fn run(dir: &Path, senders: usize, policy: FsyncPolicy, run_for: Duration) -> Run {
    let file = create(dir);
    match senders {
        1 => alone(file, policy, run_for),
        _ => group(file, senders, policy, run_for),
    }
}

/// One writer, on this thread (no runtime): write, then sync as the policy says.
fn alone(mut file: File, policy: FsyncPolicy, run_for: Duration) -> Run {
    let (mut sent, mut syncs, mut bytes) = (0, 0, 0);
    let start = Instant::now();
    let mut last_sync = start;
    while start.elapsed() < run_for {
        let rec = record(sent, key(0, sent), &value(sent));
        file.write_all(&rec).expect("written");
        bytes += rec.len();
        if due(policy, last_sync) {
            file.sync_data().expect("synced");
            last_sync = Instant::now();
            syncs += 1;
        }
        sent += 1;
    }
    Run {
        sends: sent,
        secs: start.elapsed().as_secs_f64(),
        bytes_per_send: bytes as f64 / sent.max(1) as f64,
        syncs,
    }
}

/// What the writers appended and the committer has not taken yet.
#[derive(Default)]
struct Buffered {
    buf: Vec<u8>,
    /// The number of the last record appended.
    last: u64,
    closing: bool,
}

struct Group {
    buffered: Mutex<Buffered>,
    work: Condvar,
    /// Records durable under the policy: synced for `Always`, written otherwise.
    durable: watch::Sender<u64>,
}

/// Writer tasks append to a shared buffer and wait; one committer thread writes all
/// that is pending, syncs as the policy says, and wakes them.
fn group(file: File, senders: usize, policy: FsyncPolicy, run_for: Duration) -> Run {
    let group = Arc::new(Group {
        buffered: Mutex::new(Buffered::default()),
        work: Condvar::new(),
        durable: watch::Sender::new(0),
    });
    let committer = {
        let group = Arc::clone(&group);
        std::thread::spawn(move || commit(&group, file, policy))
    };
    let (sent, secs, bytes) = runtime().block_on(async {
        let start = Instant::now();
        let until = start + run_for;
        let tasks: Vec<_> = (0..senders)
            .map(|s| {
                let group = Arc::clone(&group);
                tokio::spawn(async move {
                    let mut durable = group.durable.subscribe();
                    let (mut i, mut bytes) = (0, 0);
                    while Instant::now() < until {
                        let rec = record(i, key(s, i), &value(i));
                        bytes += rec.len();
                        let mine = {
                            let mut b = group.buffered.lock().expect("not poisoned");
                            b.buf.extend_from_slice(&rec);
                            b.last += 1;
                            b.last
                        };
                        group.work.notify_one();
                        durable.wait_for(|&d| d >= mine).await.expect("committing");
                        i += 1;
                    }
                    (i, bytes)
                })
            })
            .collect();
        let (mut sent, mut bytes) = (0, 0);
        for task in tasks {
            let (n, b) = task.await.expect("a writer");
            sent += n;
            bytes += b;
        }
        (sent, start.elapsed().as_secs_f64(), bytes)
    });
    group.buffered.lock().expect("not poisoned").closing = true;
    group.work.notify_one();
    let syncs = committer.join().expect("the committer");
    Run {
        sends: sent,
        secs,
        bytes_per_send: bytes as f64 / sent.max(1) as f64,
        syncs,
    }
}

/// The committer: takes the buffer, writes it in one go, syncs as the policy says (for
/// `Interval`, also once idle that long), and raises the mark. Returns its syncs.
fn commit(group: &Group, mut file: File, policy: FsyncPolicy) -> u64 {
    let (mut written, mut synced, mut syncs) = (0, 0, 0);
    let mut last_sync = Instant::now();
    loop {
        let (buf, last, closing) = {
            let mut b = group.buffered.lock().expect("not poisoned");
            while b.buf.is_empty() && !b.closing {
                let left = match policy {
                    FsyncPolicy::Interval(every) if synced < written => {
                        every.saturating_sub(last_sync.elapsed())
                    }
                    _ => Duration::MAX,
                };
                if left.is_zero() {
                    break;
                }
                b = match left {
                    Duration::MAX => group.work.wait(b).expect("not poisoned"),
                    left => group.work.wait_timeout(b, left).expect("not poisoned").0,
                };
            }
            (std::mem::take(&mut b.buf), b.last, b.closing)
        };
        if !buf.is_empty() {
            file.write_all(&buf).expect("written");
            written = last;
        }
        if synced < written && due(policy, last_sync) {
            file.sync_data().expect("synced");
            synced = written;
            last_sync = Instant::now();
            syncs += 1;
        }
        let mark = match policy {
            FsyncPolicy::Always => synced,
            _ => written,
        };
        group.durable.send_if_modified(|d| {
            let raised = *d < mark;
            *d = mark;
            raised
        });
        if closing && buf.is_empty() {
            return syncs;
        }
    }
}
