//! What a run covers: the size the flags pick, the throughput scenarios and the lateness
//! scenario.

use crate::common::{Flags, Size};
use crate::variants::{ALL, WINDOWED};

/// How much a run does, and what it is narrowed to.
pub(crate) struct Plan {
    pub(crate) label: &'static str,
    pub(crate) rounds: usize,
    pub(crate) values: u64,
    pub(crate) lateness_rounds: usize,
    pub(crate) lateness_millis: u64,
    write_files: bool,
    only: Option<Vec<String>>,
    pub(crate) scenario_filter: Option<String>,
}

impl Plan {
    /// Reads the flags: `--quick`, `--bench` or `--full` pick the size, the rest narrow it.
    pub(crate) fn from_args(args: &[String]) -> Plan {
        let flags = Flags(args);
        let mut plan = match flags.size() {
            Size::Quick => Plan {
                label: "quick",
                rounds: 3,
                values: 400_000,
                lateness_rounds: 1,
                lateness_millis: 2_000,
                write_files: true,
                only: None,
                scenario_filter: None,
            },
            Size::Full => Plan {
                label: "full",
                rounds: 5,
                values: 2_000_000,
                lateness_rounds: 3,
                lateness_millis: 2_000,
                write_files: true,
                only: None,
                scenario_filter: None,
            },
            Size::Smoke => Plan {
                label: "smoke",
                rounds: 1,
                values: 20_000,
                lateness_rounds: 1,
                lateness_millis: 100,
                write_files: false,
                only: None,
                scenario_filter: None,
            },
        };
        if let Some(n) = flags.parsed("--rounds") {
            plan.rounds = n;
        }
        if let Some(n) = flags.parsed("--values") {
            plan.values = n;
        }
        plan.only = flags.list("--only");
        plan.scenario_filter = flags.value("--scenario");
        plan
    }

    /// Those of `variants` that `--only` leaves in, in their order.
    pub(crate) fn wanted(&self, variants: &[&'static str]) -> Vec<&'static str> {
        variants
            .iter()
            .copied()
            .filter(|v| self.only.as_ref().is_none_or(|o| o.iter().any(|x| x == v)))
            .collect()
    }

    /// Whether `--scenario` leaves `scenario` in.
    pub(crate) fn covers(&self, scenario: &Scenario) -> bool {
        self.scenario_filter
            .as_ref()
            .is_none_or(|f| scenario.name().contains(f))
    }

    /// Whether this run writes `compare.json` and `compare.svg`. A narrowed run would leave
    /// a partial report behind: only whole runs write files.
    pub(crate) fn writes_files(&self) -> bool {
        self.write_files && self.only.is_none() && self.scenario_filter.is_none()
    }
}

/// One throughput scenario: `producers` tasks send to `keys` keys through a `window_ms`
/// window, values and keys as `workload` makes them.
#[derive(Clone, Copy)]
pub(crate) struct Scenario {
    pub(crate) window_ms: u64,
    pub(crate) producers: u64,
    pub(crate) keys: u64,
    pub(crate) workload: Workload,
}

/// What a scenario's values are, how they pick their keys, and what the consumer does.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Workload {
    /// `u64` values, every key equally likely; the consumer only checks them.
    Uniform,
    /// The main job's shape: `String` events of 100 to 400 bytes from customers drawn from
    /// Zipf([`ZIPF_EXPONENT`]); the consumer serializes each key's values to JSON.
    Zipf,
}

/// The exponent of the `zipf` scenario's Zipf distribution.
pub(crate) const ZIPF_EXPONENT: f64 = 1.1;

impl Workload {
    /// How a child's command line names it.
    pub(crate) fn arg(self) -> &'static str {
        match self {
            Workload::Uniform => "uniform",
            Workload::Zipf => "zipf",
        }
    }

    /// The workload `arg` names.
    pub(crate) fn from_arg(arg: &str) -> Option<Workload> {
        [Workload::Uniform, Workload::Zipf]
            .into_iter()
            .find(|w| w.arg() == arg)
    }
}

/// Every throughput scenario: each window, with each producer count, with each key count;
/// then `zipf`, a workload like the main job's (a webhook per customer, batched for a second).
pub(crate) fn scenarios() -> Vec<Scenario> {
    let mut all = Vec::new();
    for window_ms in [0, 50] {
        for producers in [1, 4] {
            for keys in [1_000, 1_000_000] {
                all.push(Scenario {
                    window_ms,
                    producers,
                    keys,
                    workload: Workload::Uniform,
                });
            }
        }
    }
    all.push(Scenario {
        window_ms: 1_000,
        producers: 4,
        keys: 100_000,
        workload: Workload::Zipf,
    });
    all
}

impl Scenario {
    pub(crate) fn name(&self) -> String {
        if self.workload == Workload::Zipf {
            return "zipf".to_string();
        }
        let keys = match self.keys {
            1_000_000 => "1m".to_string(),
            1_000 => "1k".to_string(),
            n => n.to_string(),
        };
        format!("w{}-p{}-m{keys}", self.window_ms, self.producers)
    }

    /// The variants this scenario runs: every one at window 0, the windowed ones otherwise
    /// (`ordered` and `diy_binaryheap` take no window).
    pub(crate) fn variants(&self) -> &'static [&'static str] {
        if self.window_ms == 0 {
            &ALL
        } else {
            &WINDOWED
        }
    }
}

/// The lateness scenario: one producer paces `LATENESS_RATE` values a second into a
/// `LATENESS_WINDOW_MS` window, once for each of `LATENESS_KEYS`.
pub(crate) const LATENESS_KEYS: [u64; 2] = [1_000, 1_000_000];
pub(crate) const LATENESS_WINDOW_MS: u64 = 20;
pub(crate) const LATENESS_RATE: u64 = 200_000;
