//! What the benches share: process CPU time (usable ratios on a machine
//! shared with other jobs), best-of-N timing, the repetition count from
//! `DS4_BENCH_REPS`, and a session's timed greedy prefill and decode. Included with `#[path]` by each bench
//! (bench targets are separate crates).

#![allow(dead_code)]

/// Seconds of CPU this process has used, all threads together.
pub fn cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// The least CPU time of `reps` runs of `f`, after one warm-up run.
pub fn best(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..reps)
        .map(|_| {
            let t = cpu_seconds();
            f();
            cpu_seconds() - t
        })
        .fold(f64::INFINITY, f64::min)
}

/// Prints the thread count and the load average: what a CPU figure was
/// measured beside.
pub fn print_machine() {
    println!(
        "threads {}; load {}",
        rayon::current_num_threads(),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
}

/// `DS4_BENCH_REPS`, or `default` (at least 1).
pub fn reps(default: usize) -> usize {
    env_usize("DS4_BENCH_REPS", default).max(1)
}

/// The number in environment variable `name` (a bench's knob), or
/// `default` when it is unset or not a number.
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Wall seconds of `sess`'s prefill of `prompt`, then of `n_decode` greedy
/// decode steps after it.
pub fn time_greedy(
    sess: &mut ds4::session::Session,
    prompt: &[u32],
    n_decode: usize,
) -> (f64, f64) {
    let t = std::time::Instant::now();
    sess.sync(prompt, &mut |_, _| {}).expect("prefill");
    let prefill_s = t.elapsed().as_secs_f64();
    let t = std::time::Instant::now();
    for _ in 0..n_decode {
        let next = ds4::sampler::argmax(sess.logits()) as u32;
        sess.eval(next).expect("decode");
    }
    (prefill_s, t.elapsed().as_secs_f64())
}
