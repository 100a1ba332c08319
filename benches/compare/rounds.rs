//! The rounds: every variant of every scenario runs in a child process of its own, in an
//! order rotated from round to round.

use std::collections::BTreeMap;

use crate::child::{self, LatenessResult, RunResult};
use crate::plan::{self, Plan, LATENESS_KEYS, LATENESS_RATE, LATENESS_WINDOW_MS};
use crate::report::{median, round2, LatenessOut, ScenarioRuns};
use crate::variants::LATENESS;

/// Runs every round of the throughput scenarios the plan covers.
pub(crate) fn throughput(plan: &Plan) -> Vec<ScenarioRuns> {
    let mut scenarios: Vec<ScenarioRuns> = plan::scenarios()
        .into_iter()
        .filter(|scenario| plan.covers(scenario))
        .map(|scenario| ScenarioRuns {
            scenario,
            runs: BTreeMap::new(),
        })
        .collect();

    eprintln!(
        "compare ({}): {} rounds, {} values a run, {} scenarios",
        plan.label,
        plan.rounds,
        plan.values,
        scenarios.len()
    );
    for round in 0..plan.rounds {
        for s in &mut scenarios {
            let sc = s.scenario;
            for variant in rotated(plan.wanted(sc.variants()), round) {
                let child_args = [
                    variant.to_string(),
                    sc.window_ms.to_string(),
                    sc.producers.to_string(),
                    sc.keys.to_string(),
                    plan.values.to_string(),
                    sc.workload.arg().to_string(),
                ];
                let result: RunResult = child::run(child::THROUGHPUT_FLAG, &child_args);
                eprintln!(
                    "  round {}/{} {:<12} {:<15} {:>9.1} ns/value {:>8.1} MB peak",
                    round + 1,
                    plan.rounds,
                    sc.name(),
                    variant,
                    result.ns_per_value,
                    result.peak_rss_mb,
                );
                s.runs.entry(variant).or_default().push(result);
            }
        }
    }
    scenarios
}

/// Runs every round of the lateness scenario, unless the plan narrows the scenarios down,
/// and returns each variant's figures at each key count.
pub(crate) fn lateness(plan: &Plan) -> Vec<LatenessOut> {
    let mut lateness = Vec::new();
    if plan.scenario_filter.is_some() {
        return lateness;
    }
    let variants = plan.wanted(&LATENESS);
    for keys in LATENESS_KEYS {
        let mut per_variant: BTreeMap<&str, Vec<LatenessResult>> = BTreeMap::new();
        for round in 0..plan.lateness_rounds {
            for variant in rotated(variants.clone(), round) {
                let child_args = [
                    variant.to_string(),
                    keys.to_string(),
                    LATENESS_RATE.to_string(),
                    plan.lateness_millis.to_string(),
                    LATENESS_WINDOW_MS.to_string(),
                ];
                let r: LatenessResult = child::run(child::LATENESS_FLAG, &child_args);
                eprintln!(
                    "  lateness m={keys:<8} {variant:<15} p50 {:>9.0} us  p99 {:>9.0} us  max {:>9.0} us  early {}",
                    r.p50_us, r.p99_us, r.max_us, r.early
                );
                per_variant.entry(variant).or_default().push(r);
            }
        }
        for variant in &variants {
            let rs = &per_variant[variant];
            lateness.push(LatenessOut {
                keys,
                variant: variant.to_string(),
                p50_us: round2(median(&rs.iter().map(|r| r.p50_us).collect::<Vec<_>>())),
                p99_us: round2(median(&rs.iter().map(|r| r.p99_us).collect::<Vec<_>>())),
                max_us: round2(rs.iter().map(|r| r.max_us).fold(f64::MIN, f64::max)),
                early: rs.iter().map(|r| r.early).sum(),
            });
        }
    }
    lateness
}

/// `variants` rotated left by `round`, so that each takes every place in turn.
fn rotated(mut variants: Vec<&'static str>, round: usize) -> Vec<&'static str> {
    if !variants.is_empty() {
        let shift = round % variants.len();
        variants.rotate_left(shift);
    }
    variants
}
