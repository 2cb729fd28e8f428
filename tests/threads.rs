//! The thread-count default (`src/threads.rs`): the CPU-list and topology
//! parsers on fixture strings as sysfs and /proc write them, and the
//! detected count against what the OS reports.

use ds4::app::threads::{count_cores, init_global_pool, parse_cpu_list, physical_cores};

#[test]
fn cpu_lists() {
    assert_eq!(
        parse_cpu_list("0-3,8,10-11\n"),
        Some(vec![0, 1, 2, 3, 8, 10, 11])
    );
    assert_eq!(parse_cpu_list("5"), Some(vec![5]));
    assert_eq!(parse_cpu_list("3-1"), None);
    assert_eq!(parse_cpu_list("x"), None);
    assert_eq!(parse_cpu_list("0-99999999999"), None);
}

#[test]
fn cores_from_topology() {
    // 2 packages x 2 cores x 2 hyper-threads, siblings listed last (Linux order).
    let t = [
        ("0", "0"),
        ("0", "1"),
        ("1", "0"),
        ("1", "1"),
        ("0", "0"),
        ("0", "1"),
        ("1", "0"),
        ("1", "1"),
    ];
    assert_eq!(count_cores(t), Some(4));
    // sysfs values end in a newline; core ids need not be dense.
    assert_eq!(count_cores([("0\n", "0\n"), ("0\n", "4\n")]), Some(2));
    assert_eq!(count_cores([("0", "x")]), None);
    assert_eq!(count_cores(std::iter::empty()), None);
}

#[test]
fn default_is_physical_cores_within_the_allowed_cpus() {
    let logical = std::thread::available_parallelism().map_or(1, |n| n.get());
    let p = physical_cores();
    assert!(p >= 1 && p <= logical, "{p} physical of {logical} logical");
    if cfg!(target_os = "linux") {
        // This machine's own topology, read the same way.
        let mut pairs = Vec::new();
        for cpu in 0..logical {
            let d = format!("/sys/devices/system/cpu/cpu{cpu}/topology");
            if let (Ok(a), Ok(b)) = (
                std::fs::read_to_string(format!("{d}/physical_package_id")),
                std::fs::read_to_string(format!("{d}/core_id")),
            ) {
                pairs.push((a, b));
            }
        }
        eprintln!("physical cores {p}, logical {logical}");
        if pairs.len() == logical {
            let c = count_cores(pairs.iter().map(|(a, b)| (a.as_str(), b.as_str())));
            assert!(c.is_some_and(|c| c >= p));
        }
    }
    assert_eq!(init_global_pool(Some(3)), 3);
    assert_eq!(
        init_global_pool(None),
        3,
        "a second call keeps the first pool"
    );
}
