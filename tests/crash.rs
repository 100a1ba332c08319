//! The crash loop: a durable channel's process killed with `SIGKILL` at random moments, and
//! its log checked after every restart.
//!
//! `crash_loop` runs this test binary again as a child (the `crash_child` test, which does
//! nothing unless the loop starts it). The child opens the log in a directory the runs
//! share, takes and reports every value that came back, then sends, receives and decides
//! (acknowledges, retries, gives up, or holds) at random, until the parent kills it: 0 to
//! 60 ms after it has reported what came back, or, in some runs, earlier, while it starts
//! or recovers. The child reports each fact on its own line of a file, after the fact (a
//! send returned `Ok`, an acknowledgement resolved) or, for what may or may not take
//! effect, before it starts (a send, an acknowledgement). A kill leaves at most the last line
//! cut short, which the parent ignores. See `common/crash_child.rs` for the lines.
//!
//! From those facts the parent keeps a model of every value (`common/crash_model.rs`),
//! and checks at each restart:
//!
//! - every value whose send returned `Ok`, or that came back before, and that was not
//!   acknowledged or given up, comes back;
//! - no value whose acknowledgement (or give-up) resolved comes back, nor one that a
//!   recovery reported to its end did not have;
//! - no value comes back changed, under another key, or that was never sent;
//! - each key's values come back in the order they were sent (one task sends each key's
//!   values, one after another), and while the child runs, a key's values are delivered in
//!   that order, none skipped, none twice without a retry in between;
//! - attempts: a delivery's attempt is at most one more than its values were delivered
//!   before, and at least one more than a retry record known to be written counted (a send
//!   that returned, or an acknowledgement that resolved, after the retry was made, shows
//!   the log had written it);
//! - `log_truncated_bytes`, `log_recovered` and `log_segments` are exactly what the files
//!   left by the kill call for.
//!
//! The log uses 4 KiB segments, so that rotation, deletion by prefix, and copying forward
//! happen every few runs: one key's value is never acknowledged and pins the oldest segment,
//! and another key's values are held for whole runs.
//!
//! # Cuts
//!
//! A quarter of the runs end with a cut: the parent truncates the newest segment at a
//! random byte, as a write torn by a power cut would leave it. A power cut takes only what
//! was not synced, so the cut never goes below what is known to be synced: the end of the
//! last send record of a value known to have been in the log (its send returned, or it came
//! back), since under `FsyncPolicy::Always` that record and all before it were synced; and
//! the end of a copy-forward's write whose source segment is gone, since the journal syncs
//! that write (the moved values' retry record, then the copies) before it deletes the
//! source. (Under `Never`
//! and `Interval`, where a returned send may not be synced, the cut keeps it all the same:
//! the OS may have written it.) What lies above may go: sends that had not returned, and
//! done and retry records, which are not synced before their futures resolve. So a value
//! whose done record the cut took may come back (the at-least-once a power cut allows), and
//! a value whose retry record the cut took is counted as the retry records left say; every
//! other check stays whole. The next open must report the torn bytes, those after the last
//! whole record, exactly.
//!
//! # Running it
//!
//! `cargo test --features durable --test crash` runs 200 cycles;
//! `KEYED_BATCH_CRASH_CYCLES=2000` runs more, `KEYED_BATCH_CRASH_SEED` repeats a seed
//! (the kills still fall where the clock puts them). Add `-- --nocapture` for the figures.
//! A run that finds a violation keeps its directory and says where, with the log as each of
//! the last few children found it and their facts (`history/`).
//!
//! # Mutants
//!
//! With `--features fault-injection`, `KEYED_BATCH_MUTANT` breaks a rule of the log in the
//! child, and two ignored tests check that the loop catches each: see
//! `mutant_ack_before_durable` and `mutant_non_prefix_delete`. The children inherit the
//! environment, so `KEYED_BATCH_MUTANT=ack-before-durable` set for `crash_loop` makes it fail
//! too.

#[path = "common/crash_child.rs"]
mod crash_child;
#[path = "common/crash_log.rs"]
mod crash_log;
#[path = "common/crash_model.rs"]
mod crash_model;

use std::collections::HashMap;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use keyed_batch::durable::FsyncPolicy;

use crash_child::{Orders, Rng, CHILD_ENV, HELD, ORDERS_ENV, READY};
use crash_log::Body;
use crash_model::{Figures, Model};

/// How many kills a loop makes; 200 unless set.
const CYCLES_ENV: &str = "KEYED_BATCH_CRASH_CYCLES";
/// The loop's seed; from the clock unless set.
const SEED_ENV: &str = "KEYED_BATCH_CRASH_SEED";
/// The longest a child may take to report what came back, or to exit when told to.
const PATIENCE: Duration = Duration::from_secs(20);
/// Cycles whose log (as the child found it) and facts the work directory keeps, so that a
/// violation can be traced.
const HISTORY: u64 = 8;

#[test]
fn crash_loop() {
    let plan = Plan::from_env(None);
    let outcome = crash(&plan);
    println!("{outcome}");
    if !outcome.violations.is_empty() {
        panic!(
            "the crash loop found violations (seed {}, directory kept at {}):\n{}",
            plan.seed,
            outcome
                .kept
                .as_ref()
                .map_or("?".into(), |p| p.display().to_string()),
            outcome.violations.join("\n")
        );
    }
    // A long enough loop must have done what it is for, not passed by doing nothing.
    if plan.cycles >= 100 {
        let f = &outcome.figures;
        assert!(f.full_checks > plan.cycles / 2, "{outcome}");
        assert!(
            f.recovered > 0 && f.delivered > 0 && f.acked > 0,
            "{outcome}"
        );
        assert!(outcome.torn_cuts > 0 && f.truncations > 0, "{outcome}");
        assert!(outcome.deleted > 0 && outcome.copies > 0, "{outcome}");
    }
}

/// The crash loop's child process: `crash_loop` starts it with `KEYED_BATCH_CRASH_CHILD`
/// naming its work directory, and kills it.
#[test]
#[ignore = "the crash loop's child process: crash_loop runs it"]
fn crash_child() {
    let work = std::env::var_os(CHILD_ENV).unwrap_or_else(|| {
        panic!("crash_child is the crash loop's child: crash_loop runs it with {CHILD_ENV} set")
    });
    crash_child::run(Path::new(&work));
}

/// The loop catches decisions that resolve before their done record is written: a kill
/// just after an acknowledgement resolved brings the value back.
///
/// Run it with
/// `cargo test --features fault-injection --test crash -- --ignored --nocapture mutant_ack_before_durable`.
/// It passes when the loop fails, and only for what the mutant breaks.
#[cfg(feature = "fault-injection")]
#[test]
#[ignore = "a mutant of the log: run it by name (see its docs)"]
fn mutant_ack_before_durable() {
    assert_caught("ack-before-durable");
}

/// The loop catches a log that deletes a segment that is not the oldest: the done records
/// in it go, and the values they named come back from an older segment.
///
/// Run it with
/// `cargo test --features fault-injection --test crash -- --ignored --nocapture mutant_non_prefix_delete`.
/// It passes when the loop fails, and only for what the mutant breaks.
#[cfg(feature = "fault-injection")]
#[test]
#[ignore = "a mutant of the log: run it by name (see its docs)"]
fn mutant_non_prefix_delete() {
    assert_caught("non-prefix-delete");
}

/// A value copied forward keeps its attempts when the copy-forward's write is torn after
/// the copy of its send record (a full disk, a failed sync, or a crash before the sync can
/// leave that): the next open takes the copy as its place, the segments that held its retry
/// records go by prefix, and its count must not go with them.
///
/// The crash loop found this; here it is step by step. Under `FsyncPolicy::Never` the only
/// sync is the copy-forward's, so `fail_syncs_after(0)` stops the log right after the copy is
/// written, before its source segment is deleted.
#[cfg(feature = "fault-injection")]
#[tokio::test]
async fn a_torn_copy_forward_keeps_attempts() {
    let dir = tempfile::tempdir().expect("a directory");
    let builder = || {
        keyed_batch::timed::Builder::new(Duration::ZERO)
            .durable(dir.path())
            .fsync(FsyncPolicy::Never)
            .segment_size(100)
    };
    // `h` (key 0) is handed out once and retried: a retry record counts it. Then traffic on
    // key 1 until the log has three segments and copies `h` forward; that copy's sync fails.
    let (tx, mut rx) = builder()
        .fail_syncs_after(0)
        .open::<u32, u64>()
        .await
        .expect("open");
    tx.send(0, 0).await.expect("h sent");
    let h = rx.recv().await.expect("h").remove(0);
    assert_eq!(h.attempt(), 1);
    h.retry_after(Duration::from_secs(3600))
        .await
        .expect("retried");
    for value in 1..100 {
        if tx.send(1, value).await.is_err() {
            break;
        }
        let delivery = rx.recv().await.expect("a delivery").remove(0);
        if delivery.ack().await.is_err() {
            break;
        }
    }
    assert!(tx.log_error().is_some(), "the copy-forward's sync failed");
    drop((tx, rx));

    // The copy was never synced: a power cut may leave the segment cut anywhere after the
    // copy of `h`'s send record. Cut it just after.
    let segments = crash_log::read(dir.path());
    let (newest, older) = segments.split_last().expect("segments");
    let is_h = |r: &&crash_log::Record| matches!(r.body, Body::Send { id: 0, .. });
    assert!(
        older.iter().flat_map(|s| &s.records).any(|r| is_h(&r)),
        "h's source segment is still there"
    );
    let copy = newest.records.iter().find(is_h).expect("h copied forward");
    let newest_index = newest.index;
    let at = (copy.end + 5).min(newest.len);
    let file = OpenOptions::new()
        .write(true)
        .open(&newest.path)
        .expect("open");
    file.set_len(at).expect("cut");

    // Reopened: `h` is pending, counted once. A send makes the journal commit and trim: the
    // older segments go, since `h`'s place is now the copy.
    // The crash loop, in this binary's other test, forks children: between a fork and its
    // exec, a child holds a copy of every descriptor, this directory's lock included, so a
    // reopen may find the lock held for that moment.
    let mut tries = 0;
    let (tx, rx) = loop {
        match builder().open::<u32, u64>().await {
            Err(keyed_batch::durable::OpenError::Locked { .. }) if tries < 100 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            opened => break opened.expect("reopen"),
        }
    };
    tx.send(1, 100).await.expect("sent");
    drop((tx, rx));
    let segments = crash_log::read(dir.path());
    let gone = segments.iter().all(|s| s.index >= newest_index);
    assert!(
        gone,
        "the segments before the copy's are gone: {segments:?}"
    );

    // Reopened again: `h` was handed out once, as the log wrote before any fault.
    let (tx, mut rx) = builder().open::<u32, u64>().await.expect("reopen");
    drop(tx);
    let h = rx.drain_now().into_iter().flatten().find(|d| *d.key() == 0);
    let h = h.expect("h comes back");
    assert_eq!(h.attempt(), 2, "h's retry record was lost with its segment");
}

/// What the model says when a decision resolved, or a record was known to be written, and
/// the log lost it: the only violations that the two mutants' broken rules explain (a
/// resolved acknowledgement, or a retry's count, gone with its record).
#[cfg(feature = "fault-injection")]
const LOST_RECORD: [&str; 2] = [
    "came back, but its acknowledgement had resolved",
    "as a retry record known to be written says",
];

/// Runs the loop with `mutant` and asserts that it fails, and only with violations the
/// mutant explains (`LOST_RECORD`): a loop that fails for another reason, such as a child
/// that would not start, has not caught it.
#[cfg(feature = "fault-injection")]
fn assert_caught(mutant: &'static str) {
    let plan = Plan::from_env(Some(mutant));
    let outcome = crash(&plan);
    println!("{outcome}");
    assert!(
        !outcome.violations.is_empty(),
        "the crash loop missed the {mutant} mutant in {} cycles (seed {})",
        plan.cycles,
        plan.seed
    );
    let unexplained: Vec<&String> = outcome
        .violations
        .iter()
        .filter(|v| !LOST_RECORD.iter().any(|kind| v.contains(kind)))
        .collect();
    assert!(
        unexplained.is_empty(),
        "the crash loop failed with the {mutant} mutant (seed {}), but not only for a lost \
         record:\n{unexplained:#?}",
        plan.seed,
    );
    println!(
        "caught {mutant} in cycle {} of {} (seed {}): {}",
        outcome.cycles - 1,
        plan.cycles,
        plan.seed,
        outcome.violations[0]
    );
}

/// What a loop runs.
struct Plan {
    cycles: u64,
    seed: u64,
    /// `KEYED_BATCH_MUTANT` for the children; otherwise they inherit the environment.
    mutant: Option<&'static str>,
}

impl Plan {
    fn from_env(mutant: Option<&'static str>) -> Self {
        let number = |name: &str| {
            let text = std::env::var(name).ok()?;
            Some(
                text.parse()
                    .unwrap_or_else(|_| panic!("{name}={text:?}: not a number")),
            )
        };
        let clock = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_nanos() as u64;
        Plan {
            cycles: number(CYCLES_ENV).unwrap_or(200),
            seed: number(SEED_ENV).unwrap_or(clock),
            mutant,
        }
    }
}

/// What a loop found.
struct Outcome {
    /// Kills made, and the last check's run if the loop got that far.
    cycles: u64,
    elapsed: Duration,
    seed: u64,
    figures: Figures,
    violations: Vec<String>,
    /// Kills made before the child had reported what came back.
    early_kills: u64,
    /// Cuts made, and those that left a torn record (the rest fell between records).
    cuts: u64,
    torn_cuts: u64,
    /// Segments the log made and deleted.
    made: u64,
    deleted: u64,
    /// Send records seen in a later segment than before: copied forward.
    copies: u64,
    /// The directory, kept when there were violations.
    kept: Option<PathBuf>,
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fig = &self.figures;
        writeln!(
            f,
            "crash loop: {} cycles in {:.1} s (seed {}), violations: {}",
            self.cycles,
            self.elapsed.as_secs_f64(),
            self.seed,
            self.violations.len()
        )?;
        writeln!(
            f,
            "  recoveries checked: {} complete, {} partial ({} kills before the child was ready)",
            fig.full_checks, fig.partial_checks, self.early_kills
        )?;
        writeln!(
            f,
            "  values: {} sent, {} acknowledged; checked: {} that came back, {} delivered while running",
            fig.sent, fig.acked, fig.recovered, fig.delivered
        )?;
        write!(
            f,
            "  cuts: {} ({} torn, {} opens reported a torn tail); segments: {} made, {} deleted, \
             at most {} at an open; {} records seen copied forward",
            self.cuts,
            self.torn_cuts,
            fig.truncations,
            self.made,
            self.deleted,
            fig.max_segments,
            self.copies
        )
    }
}

/// Runs a crash loop.
fn crash(plan: &Plan) -> Outcome {
    let started = Instant::now();
    let work = tempfile::Builder::new()
        .prefix("crash-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("a work directory");
    let (log, facts) = crash_child::paths(work.path());
    let mut rng = Rng::new(plan.seed);
    let mut model = Model::default();
    let mut outcome = Outcome {
        cycles: 0,
        elapsed: Duration::ZERO,
        seed: plan.seed,
        figures: Figures::default(),
        violations: Vec::new(),
        early_kills: 0,
        cuts: 0,
        torn_cuts: 0,
        made: 0,
        deleted: 0,
        copies: 0,
        kept: None,
    };
    let mut seen_in: HashMap<u64, u64> = HashMap::new();
    // How long a child takes to be ready, smoothed: early kills fall within it.
    let mut ready_ms = 20.0;
    for cycle in 0..=plan.cycles {
        let verify_only = cycle == plan.cycles;
        let segments = crash_log::read(&log);
        let mut problems = Vec::new();
        for (at, seg) in segments.iter().enumerate() {
            let newest = at + 1 == segments.len();
            if seg.bad.is_some() || (!newest && seg.whole != seg.len) {
                problems.push(format!(
                    "cycle {cycle}: segment {} is torn or bad before the newest: {:?}, {} of {} bytes whole",
                    seg.index, seg.bad, seg.whole, seg.len
                ));
            }
            for record in &seg.records {
                if let Body::Send { id, .. } = record.body {
                    let before = seen_in.insert(id, seg.index);
                    outcome.copies += u64::from(before.is_some_and(|b| b < seg.index));
                }
            }
        }
        if let (Some(first), Some(last)) = (segments.first(), segments.last()) {
            outcome.deleted = first.index;
            outcome.made = last.index + 1;
        }
        let truncated = segments.last().map_or(0, |s| s.len - s.whole);
        model.start_run(cycle, truncated, segments.len().max(1));
        let history = work.path().join("history");
        keep_history(&history, cycle, &segments);
        model.violations.extend(problems);

        File::create(&facts).expect("a facts file");
        let orders = Orders {
            first_id: (cycle + 1) << 24,
            seed: rng.next(),
            policy: match rng.below(100) {
                0..70 => FsyncPolicy::Always,
                70..85 => FsyncPolicy::Interval(Duration::from_millis(2)),
                _ => FsyncPolicy::Never,
            },
            send_held: model.needs(HELD),
            verify_only,
        };
        let mut child = Running::start(work.path(), &orders, plan.mutant);
        let failed = match verify_only {
            true => child.finish(),
            false => {
                let early = rng.below(100) < 15;
                let failed = match early {
                    true => {
                        let ms = rng.below((ready_ms * 1.2) as u64 + 1);
                        thread::sleep(Duration::from_millis(ms));
                        outcome.early_kills += u64::from(!child.is_ready());
                        child.exited()
                    }
                    false => match child.ready() {
                        Ok(took) => {
                            ready_ms = 0.9 * ready_ms + 0.1 * took.as_secs_f64() * 1e3;
                            thread::sleep(Duration::from_millis(rng.below(61)));
                            child.exited()
                        }
                        Err(failed) => Some(failed),
                    },
                };
                child.kill();
                failed
            }
        };
        if let Some(failed) = failed {
            model
                .violations
                .push(format!("cycle {cycle}: the child {failed}"));
        }
        let text = fs::read(&facts).expect("the facts file reads");
        let text = String::from_utf8_lossy(&text);
        for (at, line) in text.split_inclusive('\n').enumerate() {
            if let Some(line) = line.strip_suffix('\n') {
                model.fact(at, line);
            }
        }
        model.end_run();
        fs::copy(&facts, history.join(format!("{cycle}/facts"))).expect("facts kept");
        outcome.cycles = cycle + 1;
        if !model.violations.is_empty() {
            break;
        }
        if !verify_only && rng.below(100) < 25 {
            if let Some(torn) = cut(&log, &mut model, &mut rng, &history.join(cycle.to_string())) {
                outcome.cuts += 1;
                outcome.torn_cuts += u64::from(torn);
            }
        }
    }
    outcome.elapsed = started.elapsed();
    outcome.figures = model.figures.clone();
    outcome.violations = model.violations;
    if !outcome.violations.is_empty() && plan.mutant.is_none() {
        outcome.kept = Some(work.keep());
    }
    outcome
}

/// Cuts the newest segment at a random byte above the floor the model allows, and tells
/// the model what went. Returns whether the cut tore a record, or `None` if no byte could
/// go.
fn cut(log: &Path, model: &mut Model, rng: &mut Rng, note: &Path) -> Option<bool> {
    let segments = crash_log::read(log);
    let newest = segments.last()?;
    let floor = model.cut_floor(&segments);
    if floor >= newest.len {
        return None;
    }
    let at = floor + rng.below(newest.len - floor);
    let gone: Vec<Body> = newest
        .records
        .iter()
        .filter(|r| r.end > at)
        .map(|r| r.body.clone())
        .collect();
    let id_of: HashMap<u64, u64> = segments
        .iter()
        .flat_map(|s| &s.records)
        .filter_map(|r| match r.body {
            Body::Send { seq, id } => Some((seq, id)),
            _ => None,
        })
        .collect();
    let what = format!(
        "cut {} at {at} (floor {floor}, len {}): {gone:?}\n",
        newest.index, newest.len
    );
    fs::write(note.join("cut"), what).expect("the cut noted");
    let file = OpenOptions::new()
        .write(true)
        .open(&newest.path)
        .expect("the newest segment opens");
    file.set_len(at).expect("the newest segment is cut");
    let after = crash_log::read(log);
    model.cut(&gone, &id_of, &after);
    let newest = after.last().expect("the cut segment");
    Some(newest.whole < newest.len)
}

/// Copies the log as cycle `cycle`'s child will find it into `history`, and forgets the
/// cycles before the last `HISTORY`.
fn keep_history(history: &Path, cycle: u64, segments: &[crash_log::Segment]) {
    let dir = history.join(cycle.to_string());
    fs::create_dir_all(&dir).expect("a history directory");
    for seg in segments {
        let name = seg.path.file_name().expect("a segment name");
        fs::copy(&seg.path, dir.join(name)).expect("a segment copied");
    }
    if let Some(old) = cycle.checked_sub(HISTORY) {
        let _ = fs::remove_dir_all(history.join(old.to_string()));
    }
}

/// A running child: killed when dropped, if it still runs.
struct Running {
    child: Child,
    started: Instant,
    ready: mpsc::Receiver<()>,
    is_ready: bool,
    stderr: PathBuf,
}

impl Running {
    fn start(work: &Path, orders: &Orders, mutant: Option<&str>) -> Self {
        let stderr = work.join("stderr");
        let exe = std::env::current_exe().expect("the test binary's path");
        let mut command = Command::new(exe);
        command
            .args(["crash_child", "--exact", "--ignored", "--nocapture"])
            .args(["--test-threads=1", "--quiet"])
            .env(CHILD_ENV, work)
            .env(ORDERS_ENV, orders.to_env())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(File::create(&stderr).expect("a stderr file"));
        if let Some(mutant) = mutant {
            command.env("KEYED_BATCH_MUTANT", mutant);
        }
        let mut child = command.spawn().expect("the child starts");
        let stdout = child.stdout.take().expect("piped");
        let (tx, ready) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                match line {
                    Ok(line) if line.contains(READY) => {
                        let _ = tx.send(());
                    }
                    Ok(_) => {}
                    Err(_) => return,
                }
            }
        });
        Running {
            child,
            started: Instant::now(),
            ready,
            is_ready: false,
            stderr,
        }
    }

    /// Waits until the child has reported what came back: how long it took since it
    /// started, or how it failed.
    fn ready(&mut self) -> Result<Duration, String> {
        match self.ready.recv_timeout(PATIENCE) {
            Ok(()) => {
                self.is_ready = true;
                Ok(self.started.elapsed())
            }
            Err(_) => Err(self.exited().unwrap_or_else(|| {
                format!("was not ready after {PATIENCE:?}: {}", self.stderr_tail())
            })),
        }
    }

    fn is_ready(&mut self) -> bool {
        self.is_ready |= self.ready.try_recv().is_ok();
        self.is_ready
    }

    /// How the child failed, if it exited by itself.
    fn exited(&mut self) -> Option<String> {
        let status = self.child.try_wait().expect("the child's status")?;
        Some(self.failure(status))
    }

    fn failure(&self, status: ExitStatus) -> String {
        format!("exited by itself ({status}): {}", self.stderr_tail())
    }

    /// Waits for a child that verifies only to exit: how it failed, if it did.
    fn finish(&mut self) -> Option<String> {
        let deadline = Instant::now() + PATIENCE;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().expect("the child's status") {
                return (!status.success()).then(|| self.failure(status));
            }
            thread::sleep(Duration::from_millis(5));
        }
        Some(format!("did not exit within {PATIENCE:?}"))
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        self.child.wait().expect("the killed child is reaped");
    }

    fn stderr_tail(&self) -> String {
        let text = fs::read_to_string(&self.stderr).unwrap_or_default();
        let start = text.len().saturating_sub(2000);
        let start = (start..text.len())
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(text.len());
        text[start..].to_string()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}
