//! What the figures ran on: cores, CPU, load, and the disk the logs are on; and CPU time.

use std::fmt::Write as _;
use std::path::Path;

use crate::plan::Plan;

pub(crate) use crate::common::cpu_secs;

/// What a reader needs to judge the figures: cores, CPU, load, and the disk the logs
/// are on.
pub(crate) fn header(plan: &Plan, dir: &Path) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "## keyed-batch durable ({}: {} send rounds of {} s)\n",
        plan.label,
        plan.rounds,
        plan.run_for.as_secs_f64()
    );
    let _ = writeln!(out, "{}", crate::common::machine_line());
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
