//! Small helpers the rest share: the Ctrl-C stop flag, the clock for event times, and a
//! seeded generator.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Set once Ctrl-C is pressed; a second Ctrl-C quits at once.
#[derive(Clone)]
pub struct Stop(Arc<AtomicBool>);

impl Stop {
    pub fn on_ctrl_c() -> Stop {
        let stop = Stop(Arc::new(AtomicBool::new(false)));
        let flag = stop.0.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!("\nCtrl-C: stopping the producers and delivering what is pending");
                flag.store(true, Ordering::Relaxed);
                if tokio::signal::ctrl_c().await.is_ok() {
                    std::process::exit(130);
                }
            }
        });
        stop
    }

    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// The events' clock: an instant, and its reading then in microseconds.
static CLOCK: OnceLock<(Instant, u64)> = OnceLock::new();

/// Microseconds on the events' clock: the clock for creation and receipt times, shared by
/// producers and server since both live in this process. It counts from the program's
/// first reading, or, after [`clock_from_epoch`], from the Unix epoch; a `--redis` worker's
/// counts from its parent's zero ([`clock_from`]).
pub fn now_us() -> u64 {
    let (start, at_start) = CLOCK.get_or_init(|| (Instant::now(), 0));
    at_start + start.elapsed().as_micros() as u64
}

/// Makes the events' clock count from the Unix epoch, if it was not read yet: a `--durable`
/// run delivers events that an earlier run made, and needs their times and ids on its clock.
pub fn clock_from_epoch() {
    clock_from(0);
}

/// Makes the events' clock count from `zero`, in µs since the Unix epoch, if it was not read
/// yet; false if it was. A `--redis` worker takes its parent's [`clock_zero`], so that the
/// creation times its events carry are on the clock of the server that receives them.
pub fn clock_from(zero: u64) -> bool {
    CLOCK
        .set((Instant::now(), epoch_us().saturating_sub(zero)))
        .is_ok()
}

/// When the events' clock read 0, in µs since the Unix epoch.
#[cfg(feature = "redis")]
pub fn clock_zero() -> u64 {
    epoch_us().saturating_sub(now_us())
}

/// Now, in µs since the Unix epoch; 0 on a clock set before it.
fn epoch_us() -> u64 {
    let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH);
    since_epoch.map_or(0, |d| d.as_micros() as u64)
}

/// A small seeded generator (splitmix64): the same seed, the same customers.
pub struct Random(u64);

impl Random {
    pub fn new(seed: u64) -> Random {
        Random(seed)
    }

    pub fn below(&mut self, n: u32) -> u32 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        (((mix(self.0) >> 32) * u64::from(n)) >> 32) as u32
    }
}

/// splitmix64's finaliser: scrambles the bits of a counter.
pub fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}
