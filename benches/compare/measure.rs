//! What a child measures about itself: CPU time, memory, and how long the consumer sat idle
//! after the last send.

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::Instant;

/// When the last producer of this process's run finished sending.
pub(crate) static SENT_ALL: OnceLock<Instant> = OnceLock::new();
/// How long the consumer sat suspended after that, in ns.
pub(crate) static IDLE_AFTER_SENT_NS: AtomicU64 = AtomicU64::new(0);

/// Awaits `fut` for a consumer, adding the time it sits suspended after the last send to
/// [`IDLE_AFTER_SENT_NS`]. Time spent polling it (taking a batch) still counts as work.
pub(crate) async fn waiting<F: Future>(fut: F) -> F::Output {
    let mut fut = pin!(fut);
    let mut since: Option<Instant> = None;
    poll_fn(|cx| {
        if let (Some(since), Some(&sent)) = (since.take(), SENT_ALL.get()) {
            let idle = Instant::now().saturating_duration_since(since.max(sent));
            IDLE_AFTER_SENT_NS.fetch_add(idle.as_nanos() as u64, Relaxed);
        }
        let poll = fut.as_mut().poll(cx);
        if poll.is_pending() {
            since = Some(Instant::now());
        }
        poll
    })
    .await
}

/// CPU time of every thread of this process so far, in ns (`/proc/self/task/*/schedstat`).
pub(crate) fn cpu_ns() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(|task| {
            let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
            stat.split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum()
}

/// A field of `/proc/self/status` (`VmRSS`, `VmHWM`), in kB; 0 where it is missing.
pub(crate) fn proc_status_kb(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}
