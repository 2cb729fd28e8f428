//! `cargo bench --bench gpu_bandwidth`: the same report as
//! `ds4-bench --bandwidth` (host read, wgpu device read and copy, each matvec
//! kernel at the Flash shapes as GB/s and as a fraction of the device read
//! bandwidth). `DS4_WGPU_ADAPTER` picks the adapter; CPU emulators are
//! allowed. With no adapter it says so and exits successfully (a benchmark,
//! not a test).

use ds4::backend::wgpu::{bandwidth, Gpu};
use ds4::backend::BackendOptions;

fn main() {
    let gpu = match Gpu::open(&BackendOptions::from_env(), true) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("gpu_bandwidth: no wgpu adapter: {e}");
            return;
        }
    };
    if let Err(e) = bandwidth::report(&[&gpu], 256 << 20, 3, &[]) {
        eprintln!("gpu_bandwidth: {e}");
        std::process::exit(1);
    }
}
