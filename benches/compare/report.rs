//! The figures (medians over rounds, ratios within a round) and the report they make:
//! the markdown on stdout and what `compare.json` holds.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::child::RunResult;
pub(crate) use crate::common::median;
use crate::plan::{Plan, Scenario, Workload, LATENESS_RATE, LATENESS_WINDOW_MS};
use crate::variants::ALL;

/// `x` rounded to two decimal places.
pub(crate) fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Every run of one scenario: variant -> one result per round.
pub(crate) type Runs = BTreeMap<&'static str, Vec<RunResult>>;

/// One scenario and every run of it so far.
pub(crate) struct ScenarioRuns {
    pub(crate) scenario: Scenario,
    pub(crate) runs: Runs,
}

impl ScenarioRuns {
    pub(crate) fn has(&self, variant: &str) -> bool {
        self.runs.contains_key(variant)
    }

    /// The median over rounds of one figure of `variant`'s runs.
    pub(crate) fn figure(&self, variant: &str, f: impl Fn(&RunResult) -> f64) -> f64 {
        median(&self.runs[variant].iter().map(f).collect::<Vec<_>>())
    }

    /// The median over rounds of `a`'s ns/value over `b`'s in the same round.
    pub(crate) fn ratio(&self, a: &str, b: &str) -> Option<f64> {
        let (ra, rb) = (self.runs.get(a)?, self.runs.get(b)?);
        let per_round: Vec<f64> = ra
            .iter()
            .zip(rb)
            .map(|(x, y)| x.ns_per_value / y.ns_per_value)
            .collect();
        Some(median(&per_round))
    }

    /// The ratios `compare.json` gives for this scenario, each rounded to two places.
    fn ratios(&self) -> BTreeMap<String, f64> {
        let pairs = [
            ("timed", "mpsc"),
            ("timed", "diy_delayqueue"),
            ("timed_acked", "timed"),
            ("diy_delayqueue", "mpsc"),
            ("origin_port", "mpsc"),
            ("origin_port", "diy_delayqueue"),
            ("ordered", "mpsc"),
            ("ordered", "diy_binaryheap"),
            ("diy_binaryheap", "mpsc"),
        ];
        pairs
            .iter()
            .filter_map(|&(a, b)| Some((format!("{a}/{b}"), round2(self.ratio(a, b)?))))
            .collect()
    }
}

/// What `compare.json` holds.
#[derive(Serialize)]
pub(crate) struct Report {
    scenarios: Vec<ScenarioOut>,
    pub(crate) lateness: Vec<LatenessOut>,
}

impl Report {
    /// The medians and ratios of every scenario that ran, and the lateness figures.
    pub(crate) fn new(scenarios: &[ScenarioRuns], lateness: Vec<LatenessOut>) -> Report {
        Report {
            scenarios: scenarios
                .iter()
                .filter(|s| !s.runs.is_empty())
                .map(|s| ScenarioOut {
                    name: s.scenario.name(),
                    window_ms: s.scenario.window_ms,
                    producers: s.scenario.producers,
                    keys: s.scenario.keys,
                    results: s
                        .runs
                        .keys()
                        .map(|v| {
                            let out = VariantOut {
                                ns_per_value: round2(s.figure(v, |r| r.ns_per_value)),
                                cpu_ns_per_value: round2(s.figure(v, |r| r.cpu_ns_per_value)),
                                peak_rss_mb: round2(s.figure(v, |r| r.peak_rss_mb)),
                                allocs_per_value: round2(s.figure(v, |r| r.allocs_per_value)),
                            };
                            (v.to_string(), out)
                        })
                        .collect(),
                    ratios: s.ratios(),
                })
                .collect(),
            lateness,
        }
    }
}

#[derive(Serialize)]
struct ScenarioOut {
    name: String,
    window_ms: u64,
    producers: u64,
    keys: u64,
    results: BTreeMap<String, VariantOut>,
    ratios: BTreeMap<String, f64>,
}

#[derive(Serialize)]
struct VariantOut {
    ns_per_value: f64,
    cpu_ns_per_value: f64,
    peak_rss_mb: f64,
    allocs_per_value: f64,
}

/// The lateness figures of one variant at one key count: medians over rounds, the worst
/// max, and every early delivery.
#[derive(Serialize, Clone)]
pub(crate) struct LatenessOut {
    pub(crate) keys: u64,
    pub(crate) variant: String,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) max_us: f64,
    pub(crate) early: u64,
}

fn fmt_ratio(x: Option<f64>) -> String {
    x.map_or_else(|| "".to_string(), |x| format!("{x:.2}"))
}

/// The report on stdout: every figure, the README table, lateness, and the targets.
pub(crate) fn markdown(md: &mut String, plan: &Plan, scenarios: &[ScenarioRuns], report: &Report) {
    let _ = writeln!(
        md,
        "## keyed-batch compare ({}: {} rounds, {} values a run, medians)\n",
        plan.label, plan.rounds, plan.values
    );
    let _ = writeln!(
        md,
        "| scenario | variant | ns/value | min–max | CPU ns/value | values/delivery | peak RSS MB | RSS end MB | allocs/value | ×mpsc | ×diy |"
    );
    let _ = writeln!(md, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    for s in scenarios.iter().filter(|s| !s.runs.is_empty()) {
        for (variant, runs) in &s.runs {
            let ns: Vec<f64> = runs.iter().map(|r| r.ns_per_value).collect();
            let (lo, hi) = ns
                .iter()
                .fold((f64::MAX, f64::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
            // `ordered` against its hand-written twin; the rest against the DelayQueue one.
            let diy = match *variant {
                "ordered" => s.ratio(variant, "diy_binaryheap"),
                "timed" | "timed_acked" | "origin_port" => s.ratio(variant, "diy_delayqueue"),
                _ => None,
            };
            let vs_mpsc = (*variant != "mpsc")
                .then(|| s.ratio(variant, "mpsc"))
                .flatten();
            let _ = writeln!(
                md,
                "| {} | {} | {:.0} | {:.0}–{:.0} | {:.0} | {:.1} | {:.1} | {:.1} | {:.2} | {} | {} |",
                s.scenario.name(),
                variant,
                median(&ns),
                lo,
                hi,
                s.figure(variant, |r| r.cpu_ns_per_value),
                s.figure(variant, |r| r.values_per_delivery),
                s.figure(variant, |r| r.peak_rss_mb),
                s.figure(variant, |r| r.rss_end_mb),
                s.figure(variant, |r| r.allocs_per_value),
                fmt_ratio(vs_mpsc),
                fmt_ratio(diy),
            );
        }
    }
    let _ = writeln!(
        md,
        "\n×mpsc, ×diy: medians of per-round ratios of ns/value; ×diy is against \
         `diy_delayqueue` (`diy_binaryheap` for `ordered`)."
    );

    // The compact table the README shows.
    let cols = ALL;
    let _ = writeln!(md, "\n### README table: ns per value (medians)\n");
    let _ = writeln!(
        md,
        "| scenario | {} | timed/mpsc | timed/diy_delayqueue | timed_acked/timed | ordered/diy_binaryheap |",
        cols.join(" | ")
    );
    let _ = writeln!(md, "|---|{}--:|--:|--:|--:|", "--:|".repeat(cols.len()));
    for s in scenarios.iter().filter(|s| !s.runs.is_empty()) {
        let mut row = format!("| {} |", s.scenario.name());
        for v in cols {
            if s.has(v) {
                let _ = write!(row, " {:.0} |", s.figure(v, |r| r.ns_per_value));
            } else {
                row.push_str(" – |");
            }
        }
        let _ = writeln!(
            md,
            "{row} {} | {} | {} | {} |",
            fmt_ratio(s.ratio("timed", "mpsc")),
            fmt_ratio(s.ratio("timed", "diy_delayqueue")),
            fmt_ratio(s.ratio("timed_acked", "timed")),
            fmt_ratio(s.ratio("ordered", "diy_binaryheap")),
        );
    }

    if !report.lateness.is_empty() {
        let _ = writeln!(
            md,
            "\n### Lateness: window {LATENESS_WINDOW_MS} ms, {LATENESS_RATE} values/s for {:.1} s, one producer (µs, per delivered key)\n",
            plan.lateness_millis as f64 / 1000.0
        );
        let _ = writeln!(md, "| keys | variant | p50 | p99 | max | early |");
        let _ = writeln!(md, "|--:|---|--:|--:|--:|--:|");
        for l in &report.lateness {
            let _ = writeln!(
                md,
                "| {} | {} | {:.0} | {:.0} | {:.0} | {} |",
                l.keys, l.variant, l.p50_us, l.p99_us, l.max_us, l.early
            );
        }
    }

    targets(md, scenarios, &report.lateness);
}

/// Checks the targets against this run.
fn targets(md: &mut String, scenarios: &[ScenarioRuns], lateness: &[LatenessOut]) {
    let mut rows: Vec<(String, String, Option<f64>, bool)> = Vec::new();
    let worst = |pick: &dyn Fn(&ScenarioRuns) -> Option<f64>| {
        scenarios
            .iter()
            .filter_map(|s| pick(s).map(|x| (x, s.scenario.name())))
            .max_by(|a, b| a.0.total_cmp(&b.0))
    };
    let mut ratio_row = |label: &str, limit: f64, pick: &dyn Fn(&ScenarioRuns) -> Option<f64>| {
        if let Some((x, name)) = worst(pick) {
            rows.push((
                format!("{label} (worst: {name})"),
                format!("≤ {limit}"),
                Some(x),
                x <= limit,
            ));
        }
    };
    // `zipf` has a target of its own, against an earlier run: within 5% of it.
    ratio_row("timed/diy_delayqueue, every scenario but zipf", 0.5, &|s| {
        (s.scenario.workload == Workload::Uniform)
            .then(|| s.ratio("timed", "diy_delayqueue"))
            .flatten()
    });
    ratio_row("timed/mpsc at 1,000 keys", 1.5, &|s| {
        (s.scenario.keys == 1_000)
            .then(|| s.ratio("timed", "mpsc"))
            .flatten()
    });
    ratio_row("timed/mpsc at 1,000,000 keys", 3.0, &|s| {
        (s.scenario.keys == 1_000_000)
            .then(|| s.ratio("timed", "mpsc"))
            .flatten()
    });
    ratio_row("timed_acked/timed at 1,000 keys", 1.3, &|s| {
        (s.scenario.keys == 1_000)
            .then(|| s.ratio("timed_acked", "timed"))
            .flatten()
    });
    ratio_row("ordered/diy_binaryheap", 0.7, &|s| {
        s.ratio("ordered", "diy_binaryheap")
    });
    ratio_row("peak RSS timed/mpsc, 1,000,000 keys, window 0", 2.0, &|s| {
        (s.scenario.keys == 1_000_000 && s.scenario.window_ms == 0 && s.has("timed"))
            .then(|| {
                s.has("mpsc").then(|| {
                    s.figure("timed", |r| r.peak_rss_mb) / s.figure("mpsc", |r| r.peak_rss_mb)
                })
            })
            .flatten()
    });
    for l in lateness.iter().filter(|l| l.variant == "timed") {
        if l.keys == 1_000_000 {
            rows.push((
                "timed lateness p99, 1,000,000 keys (µs)".into(),
                "≤ 2500".into(),
                Some(l.p99_us),
                l.p99_us <= 2500.0,
            ));
            rows.push((
                "timed lateness max, 1,000,000 keys (µs)".into(),
                "≤ 5000".into(),
                Some(l.max_us),
                l.max_us <= 5000.0,
            ));
        }
        rows.push((
            format!("timed early deliveries, {} keys", l.keys),
            "0".into(),
            Some(l.early as f64),
            l.early == 0,
        ));
    }
    let _ = writeln!(md, "\n### Targets\n");
    let _ = writeln!(md, "| target | limit | measured | met |");
    let _ = writeln!(md, "|---|--:|--:|:-:|");
    for (label, limit, x, ok) in rows {
        let _ = writeln!(
            md,
            "| {label} | {limit} | {} | {} |",
            x.map_or_else(String::new, |x| format!("{x:.2}")),
            if ok { "yes" } else { "**no**" }
        );
    }
}
