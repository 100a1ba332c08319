//! What a run covers: the size the flags pick, and what they narrow it to.

use std::time::Duration;

use crate::common::{Flags, Size};

/// How much a run does.
pub(crate) struct Plan {
    pub(crate) label: &'static str,
    /// Figures 1 and 2: rounds, each with every row and both sides.
    pub(crate) rounds: usize,
    /// Figure 1: how long each publish run lasts.
    pub(crate) run_for: Duration,
    /// Figure 2: values in the queue before the consumers start, and over how many keys;
    /// and the values of its last row, each under a key of its own.
    pub(crate) pull_values: u64,
    pub(crate) pull_keys: u64,
    pub(crate) pull_single: u64,
    /// Figure 3: how long values are sent, at [`lateness::RATE`](crate::lateness::RATE).
    pub(crate) lateness_for: Duration,
    /// Figure 4: pending keys, and values per key, of each case.
    pub(crate) memory_cases: Vec<(u64, u64)>,
    pub(crate) only: Option<Vec<String>>,
    /// A server to use instead of one of our own.
    pub(crate) url: Option<String>,
}

impl Plan {
    /// Reads the flags: `--quick`, `--bench` or `--full` pick the size, the rest adjust it.
    pub(crate) fn from_args(args: &[String]) -> Plan {
        let flags = Flags(args);
        let size = flags.size();
        let ms = Duration::from_millis;
        let (rounds, run_for, pull_values, pull_keys, pull_single, lateness_for) = match size {
            Size::Quick => (3, ms(400), 50_000, 2_500, 10_000, ms(2_000)),
            Size::Full => (5, ms(1_000), 200_000, 10_000, 40_000, ms(5_000)),
            Size::Smoke => (1, ms(100), 2_000, 100, 500, ms(300)),
        };
        let memory_cases = match size {
            Size::Smoke => vec![(1_000, 1), (1_000, 10)],
            Size::Quick | Size::Full => vec![(10_000, 1), (10_000, 10)],
        };
        let mut plan = Plan {
            label: size.label(),
            rounds,
            run_for,
            pull_values,
            pull_keys,
            pull_single,
            lateness_for,
            memory_cases,
            only: flags.list("--only"),
            url: flags.value("--url"),
        };
        if let Some(n) = flags.parsed("--rounds") {
            plan.rounds = n;
        }
        if let Some(s) = flags.parsed("--secs") {
            plan.run_for = Duration::from_secs_f64(s);
        }
        if let Some(n) = flags.parsed("--values") {
            plan.pull_values = n;
            // 20 values a key, as in the default sizes.
            plan.pull_keys = (n / 20).max(1);
        }
        if let Some(n) = flags.parsed("--keys") {
            plan.pull_keys = n;
        }
        plan
    }

    /// Whether `--only` leaves figure `name` in.
    pub(crate) fn covers(&self, name: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|only| only.iter().any(|o| o == name))
    }
}
