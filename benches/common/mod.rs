//! Code every benchmark shares: the hash that spreads keys, the flags, medians, what the
//! figures ran on, the runtime, and where results are written.

// Each benchmark includes this file as its own module, and not every one uses every helper.
#![allow(dead_code)]

use std::str::FromStr;

/// A cheap, well-mixed hash (splitmix64's finalizer).
pub(crate) fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The median of `xs`; NaN if there are none.
pub(crate) fn median(xs: &[f64]) -> f64 {
    let mut xs = xs.to_vec();
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => xs[n / 2],
        _ => (xs[n / 2 - 1] + xs[n / 2]) / 2.0,
    }
}

/// How big a run is: `--quick`, `--bench` (which `cargo bench` passes) or `--full`, and
/// otherwise a smoke check (as `cargo test --benches` runs it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Size {
    Smoke,
    Quick,
    Full,
}

impl Size {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Size::Smoke => "smoke",
            Size::Quick => "quick",
            Size::Full => "full",
        }
    }
}

/// A benchmark's command line: flags alone (`--quick`) and flags with a value
/// (`--rounds 5`).
pub(crate) struct Flags<'a>(pub(crate) &'a [String]);

impl Flags<'_> {
    /// Whether `flag` is there.
    pub(crate) fn has(&self, flag: &str) -> bool {
        self.0.iter().any(|a| a == flag)
    }

    /// The size the flags pick.
    pub(crate) fn size(&self) -> Size {
        match () {
            _ if self.has("--quick") => Size::Quick,
            _ if self.has("--bench") || self.has("--full") => Size::Full,
            _ => Size::Smoke,
        }
    }

    /// The word after `flag`, if `flag` is there.
    pub(crate) fn value(&self, flag: &str) -> Option<String> {
        let at = self.0.iter().position(|a| a == flag)?;
        self.0.get(at + 1).cloned()
    }

    /// The word after `flag`, parsed; `None` if it is not there or does not parse.
    pub(crate) fn parsed<T: FromStr>(&self, flag: &str) -> Option<T> {
        self.value(flag)?.parse().ok()
    }

    /// The comma-separated words after `flag`.
    pub(crate) fn list(&self, flag: &str) -> Option<Vec<String>> {
        Some(self.value(flag)?.split(',').map(str::to_string).collect())
    }
}

/// How many cores this process may use.
pub(crate) fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// CPU time of every thread of this process so far, in seconds
/// (`/proc/self/task/*/schedstat`).
pub(crate) fn cpu_secs() -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    let ns: u64 = tasks
        .filter_map(|task| {
            let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
            stat.split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum();
    ns as f64 / 1e9
}

/// A line for a report's header: the cores, the CPU's model, and the load average.
pub(crate) fn machine_line() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
        .map_or("unknown", |(_, name)| name.trim());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load = load
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ");
    format!("- cores: {} ({cpu}); load average: {load}", cores())
}

/// Where a benchmark writes its results: `CARGO_TARGET_DIR`, or the package's `target/`.
pub(crate) fn target_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"))
}

/// A multi-thread runtime with one worker per core, as a service would run.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores())
        .enable_all()
        .build()
        .expect("a runtime")
}
