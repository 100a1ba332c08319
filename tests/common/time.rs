//! Durations, and a paused runtime for tests that build their own.

use std::time::Duration;

use tokio::runtime::Runtime;

/// `n` milliseconds.
pub(crate) const fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// `n` seconds.
pub(crate) const fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// An hour: a window that nothing reaches unless the test advances the clock to it.
pub(crate) const HOUR: Duration = secs(3600);

/// A current-thread runtime with time enabled and paused, for tests that build their own
/// (several runtimes in one test, or a runtime per proptest case).
pub(crate) fn paused_runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("runtime")
}
