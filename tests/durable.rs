//! Durable channels (`durable` feature): what a reopened directory hands back, and every
//! error the module docs name (a held lock, a torn tail, corruption, a value that does not
//! decode, a full disk, a failed sync), each checked from the outside.
//!
//! These tests do real file I/O in temporary directories, so they run on real time; none
//! of them measures it. The crash loop, with real kills, is `tests/crash.rs`.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use keyed_batch::ack::{ack_all, Delivery};
use keyed_batch::durable::{FsyncPolicy, OpenError};
use keyed_batch::error::{TryRecvError, TrySendError};
use keyed_batch::{ordered, timed};
use tempfile::TempDir;
use tokio::time::Instant;

const HOUR: Duration = Duration::from_secs(3600);

type Tx = timed::Sender<String, u32>;
type Rx = timed::AckReceiver<String, u32>;

/// A `timed` builder for `dir` whose keys are due an hour after their first value, so that
/// nothing is due unless a test says so. It does not sync: what these tests check holds
/// for every policy once a write completes, and syncs would only make them slow. The tests
/// of syncing ask for it.
fn hourly(dir: &Path) -> keyed_batch::durable::DurableBuilder<keyed_batch::builder::Timed> {
    timed::Builder::new(HOUR)
        .durable(dir)
        .fsync(FsyncPolicy::Never)
}

async fn open(dir: &Path) -> (Tx, Rx) {
    hourly(dir).open().await.expect("the log opens")
}

/// [`hourly`] with segments of 256 bytes: a few values fill several.
fn small_segments(dir: &Path) -> keyed_batch::durable::DurableBuilder<keyed_batch::builder::Timed> {
    hourly(dir).segment_size(256)
}

/// A channel of `max_keys(1)` whose sends wait for a sync, so that a `send` polled once has
/// its record written and waits for the log's thread.
async fn one_key_synced(dir: &Path) -> (Tx, Rx) {
    let builder = timed::Builder::new(HOUR).max_keys(1).durable(dir);
    builder.fsync(FsyncPolicy::Always).open().await.unwrap()
}

/// Writes `n` values of key "a" to a log of [`small_segments`], and closes it.
async fn fill_small_segments(dir: &Path, n: u32) {
    let (tx, rx) = small_segments(dir).open::<String, u32>().await.unwrap();
    for v in 0..n {
        tx.send(k("a"), v).await.unwrap();
    }
    drop((tx, rx));
}

/// Every delivery pending now, deadlines ignored, as `(key, values, attempt)`, in the order
/// they came out; the deliveries are kept undecided in `held`.
fn take_all(rx: &mut Rx, held: &mut Vec<Delivery<String, u32>>) -> Vec<(String, Vec<u32>, u32)> {
    let mut seen = Vec::new();
    for delivery in rx.drain_now().into_iter().flatten() {
        seen.push((
            delivery.key().clone(),
            delivery.values().to_vec(),
            delivery.attempt(),
        ));
        held.push(delivery);
    }
    seen
}

/// Sorted by key, for comparing sets of deliveries.
fn sorted(mut seen: Vec<(String, Vec<u32>, u32)>) -> Vec<(String, Vec<u32>, u32)> {
    seen.sort();
    seen
}

fn k(name: &str) -> String {
    name.to_string()
}

/// The log's segments, oldest first.
fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "kblog"))
        .collect();
    found.sort();
    found
}

/// The offsets of a segment's records (after its header), read from their frames: a
/// `u32` length, a `u32` checksum, then the body.
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

// ===== what comes back =====

/// Values sent and not decided come back, under their keys, in the order they were sent,
/// each key as one delivery on its first attempt; `log_recovered` counts them.
#[tokio::test]
async fn sent_values_come_back_in_order() {
    let dir = TempDir::new().unwrap();
    let (tx, rx) = open(dir.path()).await;
    for v in 0..30 {
        tx.send(format!("k{}", v % 3), v).await.unwrap();
    }
    drop((tx, rx));
    let (_tx, mut rx) = open(dir.path()).await;
    assert_eq!(rx.stats().log_recovered, 30);
    assert_eq!(rx.len(), 30);
    let seen = sorted(take_all(&mut rx, &mut Vec::new()));
    let want: Vec<_> = (0..3)
        .map(|i| (format!("k{i}"), (0..30).filter(|v| v % 3 == i).collect(), 1))
        .collect();
    assert_eq!(seen, want);
}

/// Acknowledged and given-up values never come back; retried ones do, in front of their
/// key's newer values, with their attempts counted; a delivery dropped undecided is a retry.
#[tokio::test]
async fn decisions_survive_a_reopen() {
    let dir = TempDir::new().unwrap();
    let (tx, mut rx) = open(dir.path()).await;
    for (key, v) in [("acked", 1), ("given", 2), ("retried", 3), ("dropped", 4)] {
        tx.send(k(key), v).await.unwrap();
    }
    let mut held = Vec::new();
    take_all(&mut rx, &mut held);
    tx.send(k("retried"), 5).await.unwrap(); // newer than the retried value
    for delivery in held {
        match delivery.key().as_str() {
            "acked" => delivery.ack().await.unwrap(),
            "given" => assert_eq!(delivery.give_up().await.unwrap(), (k("given"), vec![2])),
            "retried" => delivery.retry().await.unwrap(),
            _ => drop(delivery),
        }
    }
    drop((tx, rx));
    let (_tx, mut rx) = open(dir.path()).await;
    let seen = sorted(take_all(&mut rx, &mut Vec::new()));
    assert_eq!(
        seen,
        vec![(k("dropped"), vec![4], 2), (k("retried"), vec![3, 5], 2)]
    );
}

/// `ack_all` writes one record for a whole batch: none of it comes back.
#[tokio::test]
async fn ack_all_survives_a_reopen() {
    let dir = TempDir::new().unwrap();
    let (tx, mut rx) = open(dir.path()).await;
    for v in 0..10 {
        tx.send(format!("k{v}"), v).await.unwrap();
    }
    let batch = rx.drain_now().into_iter().flatten().collect::<Vec<_>>();
    assert_eq!(batch.len(), 10);
    ack_all(batch).await.unwrap();
    tx.send(k("late"), 10).await.unwrap();
    drop((tx, rx));
    let (_tx, mut rx) = open(dir.path()).await;
    assert_eq!(
        take_all(&mut rx, &mut Vec::new()),
        vec![(k("late"), vec![10], 1)]
    );
}

/// A dead letter taken never comes back. One not taken comes back as pending, with every
/// attempt counted: its next retry makes it a dead letter again.
#[tokio::test]
async fn dead_letters_survive_a_reopen() {
    let dir = TempDir::new().unwrap();
    let builder = || {
        timed::Builder::new(HOUR)
            .max_attempts(1)
            .durable(dir.path())
    };
    let (tx, mut rx) = builder().open::<String, u32>().await.unwrap();
    tx.send(k("taken"), 1).await.unwrap();
    tx.send(k("left"), 2).await.unwrap();
    for delivery in rx.drain_now().into_iter().flatten() {
        delivery.retry().await.unwrap();
    }
    let mut dead = rx.dead_letters();
    let letter = dead.try_recv().unwrap();
    assert_eq!(
        (letter.key.as_str(), letter.values.clone()),
        ("taken", vec![1])
    );
    drop((tx, rx, dead));
    let (_tx, mut rx) = builder().open::<String, u32>().await.unwrap();
    let mut held = Vec::new();
    assert_eq!(take_all(&mut rx, &mut held), vec![(k("left"), vec![2], 2)]);
    held.pop().unwrap().retry().await.unwrap();
    let letter = rx.dead_letters().try_recv().unwrap();
    assert_eq!((letter.key.as_str(), letter.attempts), ("left", 2));
}

/// `Delivery::attempt`: a value that comes back never has attempt 1 again, not even in the
/// part of a key that a batch cap split off: here a value that joined a retry, went to the
/// dead letters with it, and came back pending after a reopen (`durable`, *Recovery*).
#[tokio::test]
async fn a_value_that_joined_a_dead_letter_keeps_its_attempts_when_split_off_after_a_reopen() {
    let dir = TempDir::new().unwrap();
    let builder = || timed::Builder::new(HOUR).max_attempts(2);
    let (tx, mut rx) = builder()
        .durable(dir.path())
        .open::<String, u32>()
        .await
        .unwrap();
    tx.send(k("k"), 1).await.unwrap();
    let mut held = Vec::new();
    assert_eq!(take_all(&mut rx, &mut held), vec![(k("k"), vec![1], 1)]);
    tx.send(k("k"), 2).await.unwrap(); // joins the retry
    held.pop().unwrap().retry().await.unwrap();
    assert_eq!(take_all(&mut rx, &mut held), vec![(k("k"), vec![1, 2], 2)]);
    held.pop().unwrap().retry().await.unwrap(); // the last attempt: a dead letter, not taken
    drop((tx, rx));
    let reopened = builder().max_batch(1).durable(dir.path());
    let (_tx, mut rx) = reopened.open::<String, u32>().await.unwrap();
    assert_eq!(take_all(&mut rx, &mut held), vec![(k("k"), vec![1], 3)]);
    held.pop().unwrap().ack().await.unwrap();
    assert_eq!(take_all(&mut rx, &mut held), vec![(k("k"), vec![2], 2)]);
}

/// `try_send` puts the value in at once; its record is written a moment later, and a clean
/// close writes it: it comes back.
#[tokio::test]
async fn try_send_is_written_by_close() {
    let dir = TempDir::new().unwrap();
    let (tx, rx) = open(dir.path()).await;
    tx.try_send(k("a"), 1).unwrap();
    assert_eq!(rx.len(), 1, "in at once");
    drop((tx, rx));
    let (_tx, mut rx) = open(dir.path()).await;
    assert_eq!(
        take_all(&mut rx, &mut Vec::new()),
        vec![(k("a"), vec![1], 1)]
    );
}

/// `Stats::log_bytes` and `log_segments` count the write a `send` waited for, once it
/// returns: they are what the log's files hold. They used to be set a moment after the
/// `send` resolved, and were often a record behind.
#[tokio::test]
async fn log_figures_count_the_write_a_send_waited_for() {
    let dir = TempDir::new().unwrap();
    let (tx, rx) = timed::Builder::new(HOUR)
        .durable(dir.path())
        .fsync(FsyncPolicy::Always)
        .segment_size(4096)
        .open::<String, u32>()
        .await
        .unwrap();
    for v in 0..500 {
        tx.send(k("a"), v).await.unwrap();
        let stats = rx.stats();
        let files = segments(dir.path());
        let bytes: u64 = files.iter().map(|p| fs::metadata(p).unwrap().len()).sum();
        assert_eq!(
            (stats.log_bytes, stats.log_segments),
            (bytes, files.len()),
            "value {v}"
        );
    }
}

/// A `send` dropped while it waits for its record to be durable was not sent: its room
/// comes back, and the value does not come back after a reopen.
#[tokio::test]
async fn cancelled_send_does_not_come_back() {
    let dir = TempDir::new().unwrap();
    let (tx, rx) = open(dir.path()).await;
    // The committer may be quick enough to finish a send on its first poll; then that value
    // was sent, and comes back. Try until one is caught waiting.
    let mut sent = Vec::new();
    let cancelled = (0..1000)
        .find(|&v| {
            let mut send = tokio_test::task::spawn(tx.send(k("a"), v));
            let waiting = send.poll().is_pending();
            if !waiting {
                sent.push(v);
            }
            waiting
        })
        .expect("every send finished on its first poll: nothing was cancelled");
    assert_eq!(tx.len(), sent.len(), "the cancelled value is not pending");
    drop((tx, rx));
    let (_tx, mut rx) = open(dir.path()).await;
    let seen = take_all(&mut rx, &mut Vec::new());
    let want: Vec<_> = match sent.is_empty() {
        true => Vec::new(),
        false => vec![(k("a"), sent, 1)],
    };
    assert_eq!(seen, want, "value {cancelled} was cancelled");
}

/// Values sent from many tasks at once are committed in groups, and all come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_sends_all_come_back() {
    let dir = TempDir::new().unwrap();
    let (tx, rx) = open(dir.path()).await;
    let tasks: Vec<_> = (0..16)
        .map(|t| {
            let tx = tx.clone();
            tokio::spawn(async move {
                for v in 0..50 {
                    tx.send(format!("k{t}"), t * 100 + v).await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    drop((tx, rx));
    let (_tx, mut rx) = open(dir.path()).await;
    let seen = sorted(take_all(&mut rx, &mut Vec::new()));
    let mut want: Vec<_> = (0..16)
        .map(|t| (format!("k{t}"), (0..50).map(|v| t * 100 + v).collect(), 1))
        .collect();
    want.sort();
    assert_eq!(seen, want);
}

/// Every policy keeps what was sent across a clean close.
#[tokio::test]
async fn every_policy_keeps_values_across_a_close() {
    for policy in [
        FsyncPolicy::Always,
        FsyncPolicy::Interval(Duration::from_millis(5)),
        FsyncPolicy::Never,
    ] {
        let dir = TempDir::new().unwrap();
        let builder = || hourly(dir.path()).fsync(policy);
        let (tx, rx) = builder().open::<String, u32>().await.unwrap();
        tx.send(k("a"), 1).await.unwrap();
        tx.send(k("a"), 2).await.unwrap();
        drop((tx, rx));
        let (_tx, mut rx) = builder().open::<String, u32>().await.unwrap();
        let seen = take_all(&mut rx, &mut Vec::new());
        assert_eq!(seen, vec![(k("a"), vec![1, 2], 1)], "{policy:?}");
    }
}

// ===== deadlines and sort keys =====

/// A `timed` value's deadline is its wall-clock arrival plus the window: after a reopen it
/// is not due sooner, nor later.
#[tokio::test]
async fn deadline_is_kept_across_a_reopen() {
    let dir = TempDir::new().unwrap();
    let (tx, rx) = open(dir.path()).await;
    let sent = Instant::now();
    tx.send(k("a"), 1).await.unwrap();
    drop((tx, rx));
    let (_tx, mut rx) = open(dir.path()).await;
    let reopened = Instant::now();
    let deadline = rx.next_deadline().expect("a pending key");
    assert!(
        deadline <= reopened + HOUR,
        "not later than an hour after it was sent"
    );
    assert!(
        deadline >= sent + HOUR - Duration::from_secs(1),
        "nor much sooner"
    );
    assert_eq!(rx.try_recv().unwrap_err(), TryRecvError::Empty);
}

/// A value whose deadline passed while the channel was closed is due at once.
#[tokio::test]
async fn deadline_passed_while_down_is_due_at_once() {
    let dir = TempDir::new().unwrap();
    let builder = || timed::Builder::new(Duration::from_millis(20)).durable(dir.path());
    let (tx, rx) = builder().open::<String, u32>().await.unwrap();
    tx.send(k("a"), 1).await.unwrap();
    drop((tx, rx));
    std::thread::sleep(Duration::from_millis(50));
    let (_tx, mut rx) = builder().open::<String, u32>().await.unwrap();
    let batch = rx.try_recv().expect("due at once");
    assert_eq!(batch[0].values(), [1]);
}

/// An `ordered` channel keeps sort keys: after a reopen, keys come out by them.
#[tokio::test]
async fn ordered_keeps_sort_keys() {
    let dir = TempDir::new().unwrap();
    let builder = || ordered::Builder::new().durable(dir.path());
    let (tx, rx) = builder().open::<u32, String, u32>().await.unwrap();
    tx.send(3, k("c"), 30).await.unwrap();
    tx.send(1, k("a"), 10).await.unwrap();
    tx.send(2, k("b"), 20).await.unwrap();
    tx.send(0, k("c"), 31).await.unwrap(); // lowers c's rank
    drop((tx, rx));
    let (_tx, mut rx) = builder().open::<u32, String, u32>().await.unwrap();
    let batch = rx.try_recv().unwrap();
    let order: Vec<_> = batch
        .iter()
        .map(|delivery| (delivery.key().clone(), delivery.values().to_vec()))
        .collect();
    assert_eq!(
        order,
        vec![
            (k("c"), vec![30, 31]),
            (k("a"), vec![10]),
            (k("b"), vec![20])
        ]
    );
}

// ===== the log on disk =====

/// Once every value is done, old segments go: by prefix, down to the newest.
#[tokio::test]
async fn done_segments_are_deleted() {
    let dir = TempDir::new().unwrap();
    let builder = || hourly(dir.path()).segment_size(1024);
    let (tx, mut rx) = builder().open::<String, u32>().await.unwrap();
    for v in 0..200 {
        tx.send(format!("k{}", v % 10), v).await.unwrap();
    }
    assert!(
        segments(dir.path()).len() > 3,
        "the sends filled several segments"
    );
    let batch = rx.drain_now().into_iter().flatten().collect::<Vec<_>>();
    ack_all(batch).await.unwrap();
    // The committer trims after it writes; closing waits for it.
    drop((tx, rx));
    assert_eq!(segments(dir.path()).len(), 1, "{:?}", segments(dir.path()));
    let (_tx, rx) = builder().open::<String, u32>().await.unwrap();
    assert_eq!((rx.len(), rx.stats().log_segments), (0, 1));
}

/// A delivery held for a long time pins nothing: its record is copied forward, and the log
/// stays about two segments long while many more values are sent and acknowledged. After a
/// reopen, the held value comes back, with the attempts its retries counted.
#[tokio::test]
async fn disk_use_stays_bounded_with_a_held_delivery() {
    let dir = TempDir::new().unwrap();
    let builder = || hourly(dir.path()).segment_size(4096);
    let (tx, mut rx) = builder().open::<String, u32>().await.unwrap();
    tx.send(k("held"), 0).await.unwrap();
    // Two retries: attempt 3 is the one held.
    for _ in 0..2 {
        let delivery = rx.drain_now().into_iter().flatten().next().unwrap();
        delivery.retry().await.unwrap();
    }
    let held = rx.drain_now().into_iter().flatten().next().unwrap();
    assert_eq!(held.attempt(), 3);
    let mut most = 0;
    for round in 0..200u32 {
        for v in 0..20 {
            tx.send(format!("k{v}"), round * 100 + v).await.unwrap();
        }
        let batch = rx.drain_now().into_iter().flatten().collect::<Vec<_>>();
        ack_all(batch).await.unwrap();
        most = most.max(segments(dir.path()).len());
    }
    assert!(rx.stats().log_bytes > 0);
    assert!(most <= 4, "the log grew to {most} segments");
    drop(held); // a retry, with every receiver still here
    drop((tx, rx));
    let (_tx, mut rx) = builder().open::<String, u32>().await.unwrap();
    assert_eq!(
        take_all(&mut rx, &mut Vec::new()),
        vec![(k("held"), vec![0], 4)]
    );
}

/// A value held while its segment goes is copied forward, and comes back with its attempts
/// counted.
#[tokio::test]
async fn attempts_are_copied_forward() {
    let dir = TempDir::new().unwrap();
    let builder = || hourly(dir.path()).segment_size(2048);
    let (tx, mut rx) = builder().open::<String, u32>().await.unwrap();
    tx.send(k("held"), 0).await.unwrap();
    let delivery = rx.drain_now().into_iter().flatten().next().unwrap();
    delivery.retry().await.unwrap();
    let held = rx.drain_now().into_iter().flatten().next().unwrap();
    let first = segments(dir.path())[0].clone();
    let mut round = 0;
    while segments(dir.path()).contains(&first) {
        round += 1;
        assert!(round < 1000, "the first segment never went");
        tx.send(k("other"), round).await.unwrap();
        let batch = rx.drain_now().into_iter().flatten().collect::<Vec<_>>();
        ack_all(batch).await.unwrap();
    }
    assert_eq!(held.attempt(), 2);
    drop((tx, rx));
    // Dropped undecided, it is retried, and its count (2 handed out) is written in the
    // newest segment. Counts only grow, so this reopen cannot tell whether the copy carried
    // the earlier count too; the crash loop checks that, where no later record follows
    // (`a_torn_copy_forward_keeps_attempts`).
    drop(held);
    let (_tx, mut rx) = builder().open::<String, u32>().await.unwrap();
    assert_eq!(
        take_all(&mut rx, &mut Vec::new()),
        vec![(k("held"), vec![0], 3)]
    );
}

/// A retry made after the last receiver went is still recorded: the value comes back at
/// the next open with that attempt counted.
#[tokio::test]
async fn retry_after_the_last_receiver_is_counted() {
    let dir = TempDir::new().unwrap();
    let (tx, mut rx) = open(dir.path()).await;
    tx.send(k("a"), 1).await.unwrap();
    let delivery = rx.drain_now().into_iter().flatten().next().unwrap();
    assert_eq!(delivery.attempt(), 1);
    drop(rx);
    delivery.retry().await.unwrap();
    drop(tx);
    let (_tx, mut rx) = open(dir.path()).await;
    assert_eq!(
        take_all(&mut rx, &mut Vec::new()),
        vec![(k("a"), vec![1], 2)]
    );
}

// ===== errors at open =====

/// A second open of a directory that is open fails, naming it; once the first channel is
/// gone, the directory opens again.
#[tokio::test]
async fn second_open_is_locked() {
    let dir = TempDir::new().unwrap();
    let first = open(dir.path()).await;
    let err = hourly(dir.path()).open::<String, u32>().await.unwrap_err();
    assert!(matches!(&err, OpenError::Locked { dir: locked } if locked == dir.path()));
    assert!(
        err.to_string().contains(&dir.path().display().to_string()),
        "{err}"
    );
    drop(first);
    open(dir.path()).await;
}

/// A record cut short at the end of the newest segment, as by a crash in mid-write, is cut
/// off; `log_truncated_bytes` says how many bytes went, and what came before is kept.
#[tokio::test]
async fn torn_tail_is_cut_off_and_counted() {
    let dir = TempDir::new().unwrap();
    let (tx, rx) = open(dir.path()).await;
    tx.send(k("a"), 1).await.unwrap();
    tx.send(k("a"), 2).await.unwrap();
    drop((tx, rx));
    let segment = segments(dir.path()).pop().unwrap();
    let bytes = fs::read(&segment).unwrap();
    let last = *record_offsets(&bytes).last().unwrap();
    let cut = last + 5; // in the middle of the last record's frame
    fs::write(&segment, &bytes[..cut]).unwrap();
    let (_tx, mut rx) = open(dir.path()).await;
    assert_eq!(
        fs::read(&segment).unwrap().len(),
        last,
        "cut in the file too"
    );
    assert_eq!(rx.stats().log_truncated_bytes, (cut - last) as u64);
    assert_eq!(
        take_all(&mut rx, &mut Vec::new()),
        vec![(k("a"), vec![1], 1)]
    );
}

/// A bad record with good ones after it is corruption, not a torn tail: `open` fails,
/// naming the segment and the offset. `salvage()` opens with what came before it, and
/// counts what went.
#[tokio::test]
async fn corruption_is_an_error_unless_salvaged() {
    let dir = TempDir::new().unwrap();
    let (tx, rx) = open(dir.path()).await;
    for v in 1..=3 {
        tx.send(k("a"), v).await.unwrap();
    }
    drop((tx, rx));
    let segment = segments(dir.path()).pop().unwrap();
    let mut bytes = fs::read(&segment).unwrap();
    let second = record_offsets(&bytes)[1];
    bytes[second + 9] ^= 0xff; // a body byte: the checksum no longer matches
    fs::write(&segment, &bytes).unwrap();

    let err = hourly(dir.path()).open::<String, u32>().await.unwrap_err();
    match &err {
        OpenError::Corrupt {
            segment: named,
            offset,
        } => {
            assert_eq!((named, *offset), (&segment, second as u64));
        }
        other => panic!("not a corruption error: {other:?}"),
    }
    let text = err.to_string();
    assert!(text.contains(&segment.display().to_string()) && text.contains(&second.to_string()));
    assert_eq!(
        fs::read(&segment).unwrap(),
        bytes,
        "a failed open changes nothing"
    );

    let (_tx, mut rx) = hourly(dir.path())
        .salvage()
        .open::<String, u32>()
        .await
        .unwrap();
    assert_eq!(
        rx.stats().log_truncated_bytes,
        (bytes.len() - second) as u64
    );
    assert_eq!(
        take_all(&mut rx, &mut Vec::new()),
        vec![(k("a"), vec![1], 1)]
    );
}

/// A bad record at the end of a segment that is not the newest is corruption too: only the
/// newest segment can have been cut short by a crash.
#[tokio::test]
async fn bad_end_of_an_older_segment_is_corruption() {
    let dir = TempDir::new().unwrap();
    fill_small_segments(dir.path(), 20).await;
    let oldest = segments(dir.path()).remove(0);
    let bytes = fs::read(&oldest).unwrap();
    let last = *record_offsets(&bytes).last().unwrap();
    fs::write(&oldest, &bytes[..last + 3]).unwrap();
    let err = small_segments(dir.path())
        .open::<String, u32>()
        .await
        .unwrap_err();
    assert!(
        matches!(&err, OpenError::Corrupt { segment, offset } if *segment == oldest && *offset == last as u64),
        "{err:?}"
    );
}

/// A segment whose header is another format's fails to open, naming it.
#[tokio::test]
async fn foreign_header_is_an_error() {
    let dir = TempDir::new().unwrap();
    drop(open(dir.path()).await);
    let segment = segments(dir.path()).pop().unwrap();
    let mut bytes = fs::read(&segment).unwrap();
    bytes[8] = 99; // the format version
    fs::write(&segment, &bytes).unwrap();
    let err = hourly(dir.path()).open::<String, u32>().await.unwrap_err();
    assert!(
        matches!(&err, OpenError::Header { segment: named, .. } if *named == segment),
        "{err:?}"
    );
    assert!(err.to_string().contains(&segment.display().to_string()));
}

/// A send whose weight, with the weight in flight, would overflow a `usize` panics before
/// its record is written: it takes no room, and does not come back at the next open. It
/// used to write its record, then panic with a place in `capacity` taken for good.
#[tokio::test]
async fn a_send_that_overflows_the_weight_panics_before_its_record() {
    use futures::FutureExt;
    use std::panic::AssertUnwindSafe;

    let dir = TempDir::new().unwrap();
    let builder = || {
        timed::Builder::new(HOUR)
            .weigher(|v: &usize| *v)
            .capacity(2)
            .durable(dir.path())
            .fsync(FsyncPolicy::Never)
    };
    let (tx, mut rx) = builder().open::<String, usize>().await.unwrap();
    tx.send(k("a"), usize::MAX).await.unwrap();
    let in_flight = rx.drain_now();
    let sent = AssertUnwindSafe(tx.send(k("b"), 1)).catch_unwind().await;
    assert!(sent.is_err(), "the send did not panic");
    // Room for one more: "a" in flight, and this.
    tx.try_send(k("c"), 0).unwrap();
    assert_eq!(rx.stats().sent, 2);
    drop((tx, rx, in_flight));
    let (_tx, mut rx) = builder().open::<String, usize>().await.unwrap();
    let mut back: Vec<_> = (rx.drain_now().into_iter().flatten())
        .map(|d| (d.key().clone(), d.values().to_vec()))
        .collect();
    back.sort();
    assert_eq!(back, vec![(k("a"), vec![usize::MAX]), (k("c"), vec![0])]);
}

/// `salvage` does not open past a segment of another format: it used to cut the segment to
/// a bare header, deleting the values in it (and every later segment, had there been any).
#[tokio::test]
async fn salvage_leaves_a_foreign_header_alone() {
    let dir = TempDir::new().unwrap();
    let (tx, rx) = open(dir.path()).await;
    tx.send(k("a"), 1).await.unwrap();
    drop((tx, rx));
    let segment = segments(dir.path()).pop().unwrap();
    let mut bytes = fs::read(&segment).unwrap();
    bytes[8] = 99; // the format version
    fs::write(&segment, &bytes).unwrap();
    let opened = hourly(dir.path()).salvage().open::<String, u32>().await;
    assert!(
        matches!(opened, Err(OpenError::Header { .. })),
        "{opened:?}"
    );
    assert_eq!(
        fs::read(&segment).unwrap(),
        bytes,
        "the segment is untouched"
    );
}

/// A foreign header later in the log is found before `salvage` cuts anything for a bad
/// record earlier on: nothing is cut or deleted.
#[tokio::test]
async fn salvage_cuts_nothing_while_a_later_header_is_foreign() {
    let dir = TempDir::new().unwrap();
    fill_small_segments(dir.path(), 40).await;
    let segments = segments(dir.path());
    assert!(segments.len() >= 3, "{segments:?}");
    let mut oldest = fs::read(&segments[0]).unwrap();
    let second = record_offsets(&oldest)[1];
    oldest[second + 9] ^= 0xff; // a bad record in the oldest segment
    fs::write(&segments[0], &oldest).unwrap();
    let newest = segments.last().unwrap();
    let mut foreign = fs::read(newest).unwrap();
    foreign[8] = 99; // the format version
    fs::write(newest, &foreign).unwrap();
    let opened = small_segments(dir.path())
        .salvage()
        .open::<String, u32>()
        .await;
    assert!(
        matches!(opened, Err(OpenError::Header { .. })),
        "{opened:?}"
    );
    for (path, bytes) in [(&segments[0], &oldest), (newest, &foreign)] {
        assert_eq!(&fs::read(path).unwrap(), bytes, "{path:?} is untouched");
    }
    assert_eq!(self::segments(dir.path()), segments, "no segment deleted");
}

/// Only the start of this format's own header counts as a header torn by a crash: a
/// shorter header of another codec, or a few bytes of something else, is a header error,
/// and the file is left as it was.
#[tokio::test]
async fn a_short_foreign_segment_is_a_header_error() {
    let mut codec = b"KBATCHLG".to_vec();
    codec.extend_from_slice(&1u16.to_le_bytes());
    codec.push(4);
    codec.extend_from_slice(b"json");
    for bytes in [codec, b"hello".to_vec()] {
        let dir = TempDir::new().unwrap();
        let segment = dir.path().join(format!("{:020}.kblog", 0));
        fs::write(&segment, &bytes).unwrap();
        let opened = hourly(dir.path()).open::<String, u32>().await;
        assert!(
            matches!(opened, Err(OpenError::Header { .. })),
            "{opened:?}"
        );
        assert_eq!(fs::read(&segment).unwrap(), bytes, "the file is untouched");
    }

    // The start of this format's own header, from a real segment, is a torn one.
    let dir = TempDir::new().unwrap();
    drop(open(dir.path()).await);
    let segment = segments(dir.path()).pop().unwrap();
    let header = fs::read(&segment).unwrap();
    fs::write(&segment, &header[..7]).unwrap();
    let (_tx, rx) = open(dir.path()).await;
    assert_eq!(rx.len(), 0);
    assert_eq!(rx.stats().log_truncated_bytes, 7);
}

/// A durable `send` of a new key holds its key slot while its record becomes durable:
/// under `max_keys(1)`, other new keys wait (`send`) or are refused (`try_send`) until
/// that key's delivery is acknowledged, and no more than one key is ever pending.
#[tokio::test]
async fn a_send_holds_its_key_slot_while_its_record_is_written() {
    let dir = TempDir::new().unwrap();
    let (tx, mut rx) = one_key_synced(dir.path()).await;
    let mut a = Box::pin(tx.send(k("a"), 1));
    let mut b = Box::pin(tx.send(k("b"), 2));
    // Polled once, "a" has its record appended and waits for the sync (the log thread's).
    assert!(futures::poll!(&mut a).is_pending());
    assert!(futures::poll!(&mut b).is_pending());
    assert!(tx.try_send(k("c"), 3).unwrap_err().is_full());
    tokio::time::timeout(Duration::from_secs(5), &mut a)
        .await
        .unwrap()
        .unwrap();
    // "b" waits for "a" to be decided, however long its own sync would take.
    let early = tokio::time::timeout(Duration::from_millis(200), &mut b).await;
    assert!(early.is_err(), "a second key went in: {early:?}");
    assert_eq!(tx.stats().pending_keys, 1);
    let delivery = rx.drain_now().remove(0).remove(0);
    assert_eq!(delivery.key(), "a");
    delivery.ack().await.unwrap(); // in flight, it kept its slot until now
    tokio::time::timeout(Duration::from_secs(5), b)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(tx.stats().pending_keys, 1);
}

/// A durable `send` dropped while its record becomes durable gives its key slot back.
#[tokio::test]
async fn a_dropped_send_gives_its_key_slot_back() {
    let dir = TempDir::new().unwrap();
    let (tx, rx) = one_key_synced(dir.path()).await;
    let mut a = Box::pin(tx.send(k("a"), 1));
    assert!(futures::poll!(&mut a).is_pending());
    assert!(tx.try_send(k("b"), 2).unwrap_err().is_full());
    drop(a);
    tx.try_send(k("b"), 2).unwrap();
    assert_eq!(rx.len(), 1);
}

/// An `open` dropped before it resolves goes on reading the log on its blocking thread, and
/// holds the directory's lock until that read ends: an `open` meanwhile fails with
/// `Locked`, and one after it opens everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_open_holds_the_lock_until_its_read_ends() {
    let dir = TempDir::new().unwrap();
    let (tx, rx) = open(dir.path()).await;
    for v in 0..100_000 {
        tx.try_send(format!("k{}", v % 1000), v).unwrap();
    }
    drop((tx, rx));
    let mut dropped = Box::pin(hourly(dir.path()).open::<String, u32>());
    assert!(
        futures::poll!(&mut dropped).is_pending(),
        "read on a thread"
    );
    drop(dropped);
    let deadline = Instant::now() + Duration::from_secs(30);
    let rx = loop {
        match hourly(dir.path()).open::<String, u32>().await {
            Ok((_, rx)) => break rx,
            Err(OpenError::Locked { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(err) => panic!("{err}"),
        }
    };
    assert_eq!(rx.len(), 100_000);
}

/// Postcard does not describe what it encodes: a value type whose `Deserialize` needs a
/// format that does, such as an internally tagged enum, is written without error, and its
/// records then fail to open with `OpenError::Decode`, as the module docs say.
#[tokio::test]
async fn a_type_that_needs_a_self_describing_format_fails_to_open() {
    #[derive(serde::Serialize, serde::Deserialize)]
    #[serde(tag = "kind")]
    enum Event {
        Created { id: u32 },
    }
    let dir = TempDir::new().unwrap();
    let open = || hourly(dir.path()).open::<String, Event>();
    let (tx, rx) = open().await.unwrap();
    tx.send(k("a"), Event::Created { id: 1 }).await.unwrap();
    drop((tx, rx));
    let Err(err) = open().await else {
        panic!("the value decoded");
    };
    assert!(
        matches!(err, OpenError::Decode { what: "value", .. }),
        "{err}"
    );
}

/// A record over the log's limit of 1 GiB would be taken for a damaged one when the log is
/// read: a send of one panics before anything is written, and the channel goes on.
#[tokio::test]
async fn a_send_over_the_record_limit_panics_and_writes_nothing() {
    let dir = TempDir::new().unwrap();
    let open = || hourly(dir.path()).open::<String, String>();
    let (tx, rx) = open().await.unwrap();
    let big = "x".repeat(1 << 30);
    let sent = tokio::spawn(async move {
        let _ = tx.send(k("big"), big).await;
    });
    let panic = sent.await.unwrap_err().into_panic();
    let message = panic.downcast_ref::<String>().expect("a message");
    assert!(message.contains("over the log's limit"), "{message}");
    drop(rx);
    let (tx, mut rx) = open().await.unwrap();
    let stats = rx.stats();
    assert_eq!((rx.len(), stats.log_truncated_bytes), (0, 0));
    tx.send(k("small"), "x".to_string()).await.unwrap();
    drop(tx);
    let delivery = rx.recv().await.unwrap().remove(0);
    assert_eq!(delivery.key(), "small");
}

/// A durable `send` of a pending key keeps that key's slot while its record becomes
/// durable: should the key be taken and acknowledged meanwhile, no other new key takes the
/// slot, and the value goes in, alone, when its send resolves.
#[tokio::test]
async fn a_send_of_a_pending_key_keeps_its_slot_if_the_key_leaves() {
    let dir = TempDir::new().unwrap();
    let (tx, mut rx) = one_key_synced(dir.path()).await;
    tx.try_send(k("a"), 1).unwrap();
    let mut again = Box::pin(tx.send(k("a"), 2));
    // Polled once, it has its record appended and waits for the sync; "a" is pending, so it
    // needs no slot of its own.
    assert!(futures::poll!(&mut again).is_pending());
    let delivery = rx.drain_now().remove(0).remove(0);
    assert_eq!(delivery.values(), [1]);
    delivery.ack().await.unwrap(); // "a" leaves the queue
    assert!(tx.try_send(k("b"), 3).unwrap_err().is_full());
    tokio::time::timeout(Duration::from_secs(5), again)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(tx.stats().pending_keys, 1);
    assert!(tx.try_send(k("b"), 3).unwrap_err().is_full());
    let delivery = rx.drain_now().remove(0).remove(0);
    assert_eq!(
        (delivery.key().as_str(), delivery.values()),
        ("a", &[2][..])
    );
    delivery.ack().await.unwrap();
    tx.try_send(k("b"), 3).unwrap();
}

/// `max_keys` holds as users meet it: eight tasks send to six keys of a durable channel
/// under `max_keys(2)`, and a consumer acknowledges each batch; no more than two keys are
/// ever pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn max_keys_holds_with_many_tasks_and_acks() {
    let dir = TempDir::new().unwrap();
    let (tx, mut rx) = timed::Builder::new(Duration::ZERO)
        .max_keys(2)
        .durable(dir.path())
        .fsync(FsyncPolicy::Always)
        .open::<String, u32>()
        .await
        .unwrap();
    let tasks: Vec<_> = (0..8u32)
        .map(|t| {
            let tx = tx.clone();
            tokio::spawn(async move {
                for i in 0..200u32 {
                    tx.send(format!("k{}", (t + i) % 6), i).await.unwrap();
                }
            })
        })
        .collect();
    drop(tx);
    let (mut worst, mut values) = (0, 0);
    while let Some(batch) = tokio::time::timeout(Duration::from_secs(30), rx.recv())
        .await
        .unwrap()
    {
        worst = worst.max(rx.stats().pending_keys);
        values += batch.iter().map(|d| d.values().len()).sum::<usize>();
        ack_all(batch).await.unwrap();
        worst = worst.max(rx.stats().pending_keys);
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert!(worst <= 2, "max_keys(2) but {worst} keys pending at once");
    assert_eq!(values, 8 * 200);
}

/// A channel that closes while a `send`'s record is made durable fails that send and hands
/// its value back, as any send to a closed channel: the value does not go in after the
/// stream has ended, nor come back at the next open.
#[tokio::test]
async fn a_close_while_a_record_is_made_durable_fails_the_send() {
    for how in ["close", "drop the receiver"] {
        let dir = TempDir::new().unwrap();
        let (tx, mut rx) = hourly(dir.path())
            .fsync(FsyncPolicy::Always)
            .open::<String, u32>()
            .await
            .unwrap();
        let mut send = Box::pin(tx.send(k("a"), 1));
        // Polled once, its record is appended and it waits for the sync.
        assert!(futures::poll!(&mut send).is_pending());
        match how {
            "close" => {
                rx.close();
                assert!(rx.recv().await.is_none(), "nothing was pending");
                drop(rx); // the directory stays locked while it lives
            }
            _ => drop(rx),
        }
        let sent = tokio::time::timeout(Duration::from_secs(5), send)
            .await
            .unwrap();
        assert_eq!(sent.unwrap_err().into_inner(), (k("a"), 1), "{how}");
        assert_eq!(tx.stats().pending_values, 0, "{how}");
        drop(tx);
        let (_tx, rx) = open(dir.path()).await;
        assert_eq!(rx.len(), 0, "{how}: the value came back after a reopen");
    }
}

/// A value that does not decode as the type the channel is opened with is an error naming
/// where it is, not a value skipped.
#[tokio::test]
async fn value_that_does_not_decode_is_an_error() {
    let dir = TempDir::new().unwrap();
    let (tx, rx) = open(dir.path()).await;
    tx.send(k("a"), 7).await.unwrap();
    tx.send(k("b"), 300).await.unwrap(); // more than a `u8` holds
    drop((tx, rx));
    let err = hourly(dir.path()).open::<String, u8>().await.unwrap_err();
    let segment = segments(dir.path()).pop().unwrap();
    let second = record_offsets(&fs::read(&segment).unwrap())[1];
    match &err {
        OpenError::Decode {
            segment: named,
            offset,
            what,
            ..
        } => assert_eq!((named, *offset, *what), (&segment, second as u64, "value")),
        other => panic!("not a decode error: {other:?}"),
    }
    // Opened with the right types, nothing was lost.
    let (_tx, mut rx) = open(dir.path()).await;
    assert_eq!(rx.len(), 2);
    assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)));
}

// ===== a failing disk =====

/// A full disk poisons the log: the send that hit it and every later one fail and hand the
/// value back, the channel closes, `log_error` says why, and decisions fail with the error.
/// What was durable before comes back after a reopen.
#[cfg(feature = "fault-injection")]
#[tokio::test]
async fn full_disk_poisons_the_log() {
    use keyed_batch::error::DeliveryError;

    let dir = TempDir::new().unwrap();
    let (tx, mut rx) = hourly(dir.path())
        .fail_writes_after(200)
        .open::<String, u32>()
        .await
        .unwrap();
    let mut sent = Vec::new();
    let failed = loop {
        let v = sent.len() as u32;
        match tx.send(k("a"), v).await {
            Ok(()) => sent.push(v),
            Err(err) => break err.into_inner(),
        }
        assert!(sent.len() < 100, "the disk never filled");
    };
    assert_eq!(
        failed,
        (k("a"), sent.len() as u32),
        "the value is handed back"
    );
    let err = tx.log_error().expect("the log failed");
    assert_eq!(err.raw_os_error(), Some(28), "ENOSPC: {err}");
    assert!(tx.is_closed());
    assert!(matches!(
        tx.try_send(k("b"), 1),
        Err(TrySendError::Closed(_))
    ));
    assert!(tx.send(k("b"), 1).await.is_err());
    // What is pending still goes out; its decision cannot be recorded.
    let delivery = rx.drain_now().into_iter().flatten().next().unwrap();
    assert_eq!(delivery.values(), sent.as_slice());
    assert!(matches!(delivery.ack().await, Err(DeliveryError::Io(_))));
    drop((tx, rx));
    let (_tx, mut rx) = open(dir.path()).await;
    assert_eq!(take_all(&mut rx, &mut Vec::new()), vec![(k("a"), sent, 1)]);
}

/// A failed fsync poisons the log for good: it is never retried, so the next send fails
/// too, with the same error.
#[cfg(feature = "fault-injection")]
#[tokio::test]
async fn failed_sync_is_not_retried() {
    let dir = TempDir::new().unwrap();
    let (tx, _rx) = hourly(dir.path())
        .fsync(FsyncPolicy::Always)
        .fail_syncs_after(1)
        .open::<String, u32>()
        .await
        .unwrap();
    tx.send(k("a"), 1).await.unwrap();
    assert_eq!(
        tx.send(k("a"), 2).await.unwrap_err().into_inner(),
        (k("a"), 2)
    );
    assert_eq!(tx.log_error().unwrap().raw_os_error(), Some(5), "EIO");
    assert_eq!(
        tx.send(k("a"), 3).await.unwrap_err().into_inner(),
        (k("a"), 3)
    );
}

/// Under `Always`, sends wait for a sync and decisions do not: a batch of decisions alone
/// is written and not synced (the next send's sync takes it), so a consumer acking as fast
/// as values come does not double the syncs. Here the one sync allowed goes to the send,
/// and the acknowledgement still succeeds.
#[cfg(feature = "fault-injection")]
#[tokio::test]
async fn decisions_alone_are_not_synced() {
    let dir = TempDir::new().unwrap();
    let (tx, mut rx) = hourly(dir.path())
        .fsync(FsyncPolicy::Always)
        .fail_syncs_after(1)
        .open::<String, u32>()
        .await
        .unwrap();
    tx.send(k("a"), 1).await.unwrap();
    let delivery = rx.drain_now().into_iter().flatten().next().unwrap();
    delivery.ack().await.unwrap();
    assert!(tx.log_error().is_none(), "{:?}", tx.log_error());
    // The next send needs a sync, and that one fails.
    assert!(tx.send(k("b"), 2).await.is_err());
    assert_eq!(tx.log_error().unwrap().raw_os_error(), Some(5), "EIO");
}

/// A decision resolves once its record is written: under `Interval(d)`, one made `d` after
/// the last sync shares its commit with the sync then due, and resolves before that sync,
/// though the sync fails. It used to wait for the sync, and fail with it.
#[cfg(feature = "fault-injection")]
#[tokio::test]
async fn an_interval_decision_does_not_wait_for_the_sync_that_is_due() {
    const INTERVAL: Duration = Duration::from_millis(100);
    let dir = TempDir::new().unwrap();
    let (tx, mut rx) = hourly(dir.path())
        .fsync(FsyncPolicy::Interval(INTERVAL))
        .fail_syncs_after(1)
        .open::<String, u32>()
        .await
        .unwrap();
    tx.send(k("a"), 1).await.unwrap(); // written; synced up to `d` later
    std::thread::sleep(3 * INTERVAL); // that sync ran, and `d` has passed since
    assert!(tx.log_error().is_none(), "the first sync succeeded");
    let delivery = rx.drain_now().remove(0).remove(0);
    delivery.ack().await.unwrap();
    while tx.log_error().is_none() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    drop((tx, rx));
    let (_tx, rx) = open(dir.path()).await;
    assert!(rx.is_empty(), "the acknowledgement was written");
}

/// A channel on `dir` whose log failed on the record of its one value, `key`: `value`,
/// which went in at once.
#[cfg(feature = "fault-injection")]
async fn failed_log(
    dir: &Path,
    key: &str,
    value: u32,
) -> (timed::Sender<String, u32>, timed::AckReceiver<String, u32>) {
    let (tx, rx) = hourly(dir)
        .fail_writes_after(0)
        .open::<String, u32>()
        .await
        .unwrap();
    tx.try_send(k(key), value).unwrap();
    while tx.log_error().is_none() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    (tx, rx)
}

/// A failed log lets go of the directory at once: it can be opened again while the failed
/// channel's handles live, and the reopened channel has what was written before.
#[cfg(feature = "fault-injection")]
#[tokio::test]
async fn a_failed_log_lets_go_of_the_directory() {
    let dir = TempDir::new().unwrap();
    let (tx, rx) = hourly(dir.path()).open::<String, u32>().await.unwrap();
    tx.send(k("a"), 1).await.unwrap();
    assert!(matches!(
        hourly(dir.path()).open::<String, u32>().await,
        Err(OpenError::Locked { .. })
    ));
    drop((tx, rx));
    let (tx, rx) = failed_log(dir.path(), "b", 2).await;
    let (_, mut again) = hourly(dir.path()).open::<String, u32>().await.unwrap();
    let values: Vec<u32> = again
        .drain_now()
        .into_iter()
        .flatten()
        .flat_map(|delivery| delivery.values().to_vec())
        .collect();
    assert_eq!(values, [1]);
    drop((tx, rx));
}

/// A retry on a failed log resolves with the error, as other decisions do: its record,
/// which counts the attempt, could not be written.
#[cfg(feature = "fault-injection")]
#[tokio::test]
async fn retry_on_a_failed_log_is_an_error() {
    use keyed_batch::error::DeliveryError;

    let dir = TempDir::new().unwrap();
    let (_tx, mut rx) = failed_log(dir.path(), "a", 1).await;
    let delivery = rx.drain_now().into_iter().flatten().next().unwrap();
    assert!(matches!(delivery.retry().await, Err(DeliveryError::Io(_))));
}

/// A failed log closes the channel at once: a send waiting for room, which touches no
/// file, is woken and fails with its value too.
#[cfg(feature = "fault-injection")]
#[tokio::test]
async fn waiting_sends_fail_when_the_log_does() {
    let log = |dir: &std::path::Path, budget| {
        timed::Builder::new(HOUR)
            .capacity(2)
            .durable(dir)
            .fail_writes_after(budget)
            .open::<String, u32>()
    };
    // The bytes that two sends write, so that the disk fills on the next record.
    let scratch = TempDir::new().unwrap();
    let (tx, rx) = log(scratch.path(), u64::MAX).await.unwrap();
    let empty = rx.stats().log_bytes;
    tx.send(k("a"), 1).await.unwrap();
    tx.send(k("b"), 2).await.unwrap();
    drop((tx, rx));
    // Reopened, the figures are the files' sizes, not the committer's latest word.
    let (_tx, rx) = log(scratch.path(), u64::MAX).await.unwrap();
    let two_sends = rx.stats().log_bytes - empty;
    assert!(two_sends > 0);

    let dir = TempDir::new().unwrap();
    let (tx, mut rx) = log(dir.path(), two_sends).await.unwrap();
    tx.send(k("a"), 1).await.unwrap();
    tx.send(k("b"), 2).await.unwrap();
    let mut waiting = tokio_test::task::spawn(tx.send(k("c"), 3));
    assert!(waiting.poll().is_pending(), "no room");
    // A retry writes a record, and the disk is full: the retry reports it.
    let delivery = rx.drain_now().into_iter().flatten().next().unwrap();
    assert!(delivery.retry().await.is_err());
    tx.closed().await;
    assert!(waiting.is_woken());
    match waiting.poll() {
        std::task::Poll::Ready(Err(err)) => assert_eq!(err.into_inner(), (k("c"), 3)),
        other => panic!("the waiting send did not fail: {other:?}"),
    }
}

/// `max_weight`: a `send` whose record is being written counts as pending weight, though
/// `Stats` shows nothing pending, so a value heavier than what is left waits (or is `Full`).
#[tokio::test]
async fn a_send_being_written_holds_its_weight() {
    let dir = TempDir::new().unwrap();
    let (tx, rx) = timed::Builder::new(Duration::from_secs(1))
        .weigher(|v: &u32| *v as usize)
        .max_weight(10)
        .durable(dir.path())
        .open::<String, u32>()
        .await
        .unwrap();
    let mut first = Box::pin(tx.send("a".to_string(), 8));
    assert!(futures::poll!(&mut first).is_pending());
    let stats = rx.stats();
    assert_eq!((stats.pending_values, stats.pending_weight), (0, 0));
    let refused = tx.try_send("b".to_string(), 20);
    assert!(matches!(refused, Err(TrySendError::Full(_))), "{refused:?}");
    let mut light = Box::pin(tx.send("c".to_string(), 2));
    assert!(futures::poll!(&mut light).is_pending());
    first.await.unwrap();
    light.await.unwrap();
    assert_eq!(rx.stats().pending_weight, 10);
}
