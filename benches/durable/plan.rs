//! What a run covers: the size the flags pick, and what they narrow it to.

use std::path::PathBuf;
use std::time::Duration;

use keyed_batch::durable::FsyncPolicy;

use crate::common::{Flags, Size};

/// The keys every figure spreads its values over.
pub(crate) const KEYS: u64 = 1_000;

/// How much a run does.
pub(crate) struct Plan {
    pub(crate) label: &'static str,
    /// Send rounds, and how long each send run lasts.
    pub(crate) rounds: usize,
    pub(crate) run_for: Duration,
    /// Figure 2: values in the log, and how many times it is opened.
    pub(crate) recovery_values: u64,
    pub(crate) recovery_opens: usize,
    /// Figure 3: values sent and acked, and the segment size.
    pub(crate) disk_values: u64,
    pub(crate) disk_segment: u64,
    pub(crate) only: Option<Vec<String>>,
    /// Figure 1 narrowed to these sender counts and policies (`always`, `interval`, `never`).
    pub(crate) senders: Option<Vec<usize>>,
    pub(crate) policies: Option<Vec<String>>,
    pub(crate) dir: Option<PathBuf>,
}

impl Plan {
    /// Reads the flags: `--quick`, `--bench` or `--full` pick the size, the rest adjust it.
    pub(crate) fn from_args(args: &[String]) -> Plan {
        let flags = Flags(args);
        let size = flags.size();
        let ms = Duration::from_millis;
        // Send rounds and how long each lasts; values recovered and opens; values sent
        // for the disk figure and its segment size.
        let (rounds, run_for, recovery_values, recovery_opens, disk_values, disk_segment) =
            match size {
                Size::Quick => (3, ms(250), 200_000, 3, 1_000_000, 1 << 20),
                Size::Full => (11, ms(500), 1_000_000, 5, 10_000_000, 8 << 20),
                Size::Smoke => (1, ms(50), 10_000, 1, 100_000, 64 << 10),
            };
        let mut plan = Plan {
            label: size.label(),
            rounds,
            run_for,
            recovery_values,
            recovery_opens,
            disk_values,
            disk_segment,
            only: flags.list("--only"),
            senders: flags.list("--senders").map(|v| {
                v.iter()
                    .map(|n| n.parse().expect("--senders takes numbers"))
                    .collect()
            }),
            policies: flags.list("--policy"),
            dir: flags.value("--dir").map(PathBuf::from),
        };
        if let Some(n) = flags.parsed("--rounds") {
            plan.rounds = n;
        }
        if let Some(s) = flags.parsed("--secs") {
            plan.run_for = Duration::from_secs_f64(s);
        }
        if let Some(n) = flags.parsed("--opens") {
            plan.recovery_opens = n;
        }
        if let Some(n) = flags.parsed("--values") {
            plan.recovery_values = n;
            plan.disk_values = n;
        }
        plan
    }

    /// Whether `--senders` and `--policy` leave this send run in.
    pub(crate) fn runs(&self, senders: usize, policy: FsyncPolicy) -> bool {
        let name = match policy {
            FsyncPolicy::Always => "always",
            FsyncPolicy::Interval(_) => "interval",
            FsyncPolicy::Never => "never",
        };
        self.senders.as_ref().is_none_or(|s| s.contains(&senders))
            && self
                .policies
                .as_ref()
                .is_none_or(|p| p.iter().any(|p| p == name))
    }

    /// Whether `--only` leaves figure `name` in.
    pub(crate) fn covers(&self, name: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|only| only.iter().any(|o| o == name))
    }
}
