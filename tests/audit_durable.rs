#![cfg(feature = "durable")]
//! An audit of the durable API's documented promises, checked from the outside.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use keyed_batch::ack::Delivery;
use keyed_batch::durable::{DurableBuilder, FsyncPolicy, OpenError};
use keyed_batch::{builder::Timed, timed};
use tempfile::TempDir;

const HOUR: Duration = Duration::from_secs(3600);

fn hourly(dir: &Path) -> DurableBuilder<Timed> {
    timed::Builder::new(HOUR)
        .durable(dir)
        .fsync(FsyncPolicy::Never)
}

fn k(s: &str) -> String {
    s.to_string()
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "kblog"))
        .collect();
    found.sort();
    found
}

fn record_offsets(bytes: &[u8]) -> Vec<usize> {
    let header = 8 + 2 + 1 + bytes[10] as usize;
    let mut offsets = Vec::new();
    let mut at = header;
    while at + 8 <= bytes.len() {
        offsets.push(at);
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        at += 8 + len;
    }
    offsets
}

fn take_all<K: Clone + std::hash::Hash + Eq + Send + 'static, V: Clone + Send + 'static>(
    rx: &mut timed::AckReceiver<K, V>,
    held: &mut Vec<Delivery<K, V>>,
) -> Vec<(K, Vec<V>, u32)> {
    let mut seen = Vec::new();
    for d in rx.drain_now().into_iter().flatten() {
        seen.push((d.key().clone(), d.values().to_vec(), d.attempt()));
        held.push(d);
    }
    seen
}

// ===== stats =====

/// `Stats::log_bytes`/`log_segments` (src/stats.rs:92-95): "the bytes in the log's
/// segments, as of its last write". Once `send` has returned, its record was written: the
/// figures should include it.
#[tokio::test]
async fn log_figures_include_the_write_a_send_waited_for() {
    let dir = TempDir::new().unwrap();
    let (tx, rx) = timed::Builder::new(HOUR)
        .durable(dir.path())
        .fsync(FsyncPolicy::Always)
        .segment_size(4096)
        .open::<String, u32>()
        .await
        .unwrap();
    let mut stale = Vec::new();
    for v in 0..2000 {
        tx.send(k("a"), v).await.unwrap();
        let stats = rx.stats();
        let files = segments(dir.path());
        let bytes: u64 = files.iter().map(|p| fs::metadata(p).unwrap().len()).sum();
        if (stats.log_bytes, stats.log_segments) != (bytes, files.len()) {
            stale.push((v, stats.log_bytes, bytes, stats.log_segments, files.len()));
        }
    }
    assert!(
        stale.is_empty(),
        "{} stale of 2000: {:?}",
        stale.len(),
        &stale[..stale.len().min(5)]
    );
}

// ===== salvage =====

/// A segment written by another format version is `OpenError::Header` (src/error.rs:291).
/// `salvage` is documented for a segment "corrupt before its end" (src/durable/mod.rs:210;
/// `Corrupt`: "salvage() opens with what comes before it"), not for a log of another
/// format, which it should not erase.
#[tokio::test]
async fn salvage_does_not_erase_a_log_of_another_format() {
    let dir = TempDir::new().unwrap();
    let (tx, rx) = hourly(dir.path()).open::<String, u32>().await.unwrap();
    tx.send(k("a"), 1).await.unwrap();
    drop((tx, rx));
    let seg = segments(dir.path()).pop().unwrap();
    let mut bytes = fs::read(&seg).unwrap();
    bytes[8] = 2; // a later format version
    fs::write(&seg, &bytes).unwrap();
    let opened = hourly(dir.path()).salvage().open::<String, u32>().await;
    let kept = fs::read(&seg).map(|b| b.len()).unwrap_or(0);
    assert!(
        matches!(opened, Err(OpenError::Header { .. })),
        "salvage opened a log of another format: {:?}; segment now {kept} of {} bytes",
        opened
            .as_ref()
            .map(|(_, rx)| rx.stats().log_truncated_bytes),
        bytes.len()
    );
}

// ===== torn tails =====

/// "A torn record at the end of the newest segment (a write cut short by a crash) is cut
/// off" (src/durable/mod.rs:77). A value whose bytes hold a whole log frame (a queue of
/// raw records, say), cut short after that frame, is a torn tail all the same.
#[tokio::test]
async fn torn_tail_whose_value_holds_a_frame_is_cut_off() {
    // A whole, valid record frame, taken from a real log: a done record.
    let scratch = TempDir::new().unwrap();
    let (tx, mut rx) = hourly(scratch.path())
        .open::<String, Vec<u8>>()
        .await
        .unwrap();
    tx.send(k("x"), vec![0]).await.unwrap();
    let d = rx.drain_now().into_iter().flatten().next().unwrap();
    d.ack().await.unwrap();
    drop((tx, rx));
    let seg = segments(scratch.path()).pop().unwrap();
    let bytes = fs::read(&seg).unwrap();
    let done_at = *record_offsets(&bytes).last().unwrap();
    let frame = bytes[done_at..].to_vec();

    let dir = TempDir::new().unwrap();
    let (tx, rx) = hourly(dir.path()).open::<String, Vec<u8>>().await.unwrap();
    tx.send(k("a"), vec![1]).await.unwrap();
    let mut payload = frame.clone();
    payload.extend_from_slice(&[7; 64]);
    tx.send(k("a"), payload).await.unwrap();
    drop((tx, rx));
    let seg = segments(dir.path()).pop().unwrap();
    let bytes = fs::read(&seg).unwrap();
    let last = *record_offsets(&bytes).last().unwrap();
    // Cut inside the last record's value, after the frame it holds.
    let cut = bytes.len() - 10;
    fs::write(&seg, &bytes[..cut]).unwrap();
    let opened = hourly(dir.path()).open::<String, Vec<u8>>().await;
    let (_tx, mut rx) = opened.expect("a torn tail opens");
    assert_eq!(rx.stats().log_truncated_bytes, (cut - last) as u64);
    assert_eq!(
        take_all(&mut rx, &mut Vec::new()),
        vec![(k("a"), vec![vec![1]], 1)]
    );
}
