//! What the figures ran on: cores, CPU, load, and the disk the logs are on; and CPU time.

use std::fmt::Write as _;
use std::path::Path;

use crate::plan::Plan;

pub(crate) fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// CPU time of every thread of this process so far (`/proc/self/task/*/schedstat`).
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

/// What a reader needs to judge the figures: cores, CPU, load, and the disk the logs
/// are on.
pub(crate) fn header(plan: &Plan, dir: &Path) -> String {
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
    let mut out = String::new();
    let _ = writeln!(
        out,
        "## keyed-batch durable ({}: {} send rounds of {} s)\n",
        plan.label,
        plan.rounds,
        plan.run_for.as_secs_f64()
    );
    let _ = writeln!(out, "- cores: {} ({cpu}); load average: {load}", cores());
    let _ = writeln!(out, "- logs in {}: {}", dir.display(), mount_of(dir));
    out
}

/// The `/proc/mounts` entry `path` lies under: device, file system, options.
fn mount_of(path: &Path) -> String {
    let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            (f.len() >= 4 && path.starts_with(f[1])).then(|| (f[1].len(), f))
        })
        .max_by_key(|(len, _)| *len)
        .map_or("mount unknown".to_string(), |(_, f)| {
            format!("{} ({}, {}) mounted on {}", f[0], f[2], f[3], f[1])
        })
}
