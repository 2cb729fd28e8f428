//! The CPU thread count: `-t N` if given, else the number of physical cores
//! this process may run on. Decode streams weights from memory; a second
//! hyper-thread on a core shares that core's load ports and caches and adds
//! little, while it competes for the core with its sibling, so the default
//! is one thread per physical core (as llama.cpp does).
//!
//! Linux: the CPUs in this process's affinity mask (`Cpus_allowed_list` of
//! /proc/self/status), grouped by `(physical_package_id, core_id)` from
//! /sys/devices/system/cpu/cpuN/topology; macOS: `sysctl hw.physicalcpu`.
//! The result is capped by `std::thread::available_parallelism` (which also
//! honours cgroup CPU quotas) and falls back to it when the topology cannot
//! be read. One place, used by ds4, ds4-server and ds4-bench.

use std::collections::BTreeSet;

/// Parses a Linux CPU list such as `0-3,8,10-11` into CPU numbers; `None`
/// if malformed (or absurdly large).
pub fn parse_cpu_list(s: &str) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (
                a.trim().parse::<usize>().ok()?,
                b.trim().parse::<usize>().ok()?,
            ),
            None => {
                let v = part.trim().parse::<usize>().ok()?;
                (v, v)
            }
        };
        if b < a || b - a > 1 << 16 || out.len() > 1 << 16 {
            return None;
        }
        out.extend(a..=b);
    }
    Some(out)
}

/// The number of distinct physical cores among `(package id, core id)`
/// strings as read from sysfs, one pair per logical CPU; `None` if any is
/// unreadable or the list is empty.
pub fn count_cores<'a>(topology: impl IntoIterator<Item = (&'a str, &'a str)>) -> Option<usize> {
    let mut cores = BTreeSet::new();
    for (pkg, core) in topology {
        let pkg: i64 = pkg.trim().parse().ok()?;
        let core: i64 = core.trim().parse().ok()?;
        cores.insert((pkg, core));
    }
    (!cores.is_empty()).then_some(cores.len())
}

#[cfg(target_os = "linux")]
fn physical_cores_os() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let allowed = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .and_then(parse_cpu_list)?;
    let mut pairs = Vec::with_capacity(allowed.len());
    for cpu in allowed {
        let dir = format!("/sys/devices/system/cpu/cpu{cpu}/topology");
        let pkg = std::fs::read_to_string(format!("{dir}/physical_package_id")).ok()?;
        let core = std::fs::read_to_string(format!("{dir}/core_id")).ok()?;
        pairs.push((pkg, core));
    }
    count_cores(pairs.iter().map(|(p, c)| (p.as_str(), c.as_str())))
}

#[cfg(target_os = "macos")]
fn physical_cores_os() -> Option<usize> {
    let out = std::process::Command::new("sysctl")
        .args(["-n", "hw.physicalcpu"])
        .output()
        .ok()?;
    String::from_utf8(out.stdout).ok()?.trim().parse().ok()
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
fn physical_cores_os() -> Option<usize> {
    None
}

/// Physical cores this process may use (at least 1).
pub fn physical_cores() -> usize {
    let logical = std::thread::available_parallelism().map_or(1, |n| n.get());
    match physical_cores_os() {
        Some(p) if p > 0 => p.min(logical),
        _ => logical,
    }
}

/// Sizes the global rayon pool: `requested` threads (`-t`), else
/// [`physical_cores`]. Returns the pool's thread count. Only the first call
/// in a process configures the pool; later ones report its size.
pub fn init_global_pool(requested: Option<usize>) -> usize {
    let n = requested.unwrap_or_else(physical_cores).max(1);
    let _ = rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build_global();
    rayon::current_num_threads()
}
