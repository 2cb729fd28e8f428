//! Measures the machine's memory read bandwidth: the ceiling that decode
//! speed is reported against (bytes moved per token ÷ bandwidth), and the
//! table and CSV lines every backend's `ds4-bench --bandwidth` prints (the
//! wgpu rows in backend/wgpu/bandwidth.rs, the CUDA rows in
//! backend/cuda/bandwidth.rs).

use rayon::prelude::*;
use std::time::Instant;

use crate::quant::{self, GgmlType};

/// Best-of-`reps` read bandwidth in bytes/s over a `bytes`-sized buffer,
/// read by every rayon thread in parallel (sum of u64 words, so the loads
/// cannot be elided).
pub fn read_bandwidth(bytes: usize, reps: usize) -> f64 {
    let words = bytes / 8;
    let buf: Vec<u64> = (0..words as u64)
        .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .collect();
    let mut best = 0f64;
    let mut sink = 0u64;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        let s: u64 = buf
            .par_chunks(1 << 16)
            .map(|c| c.iter().fold(0u64, |a, &x| a.wrapping_add(x)))
            .reduce(|| 0, |a, b| a.wrapping_add(b));
        let dt = t.elapsed().as_secs_f64();
        sink ^= s;
        best = best.max((words * 8) as f64 / dt);
    }
    std::hint::black_box(sink);
    best
}

/// One measured line of the table.
#[derive(Clone, Debug)]
pub struct Measure {
    /// What was measured ("device read", "matvec", ...).
    pub kind: String,
    /// The shape's name at Flash width ("q-lora", "head", ...), empty otherwise.
    pub name: String,
    /// Weight type of a matvec, empty otherwise.
    pub ty: String,
    pub n_in: u64,
    pub n_out: u64,
    /// Bytes read (for a copy: bytes copied) per run.
    pub bytes: u64,
    /// Seconds per run.
    pub seconds: f64,
    /// "timestamp" or "wall".
    pub timer: &'static str,
    /// Matvec: weight rows per workgroup of the kernel (0 otherwise).
    pub rows: u32,
    /// Matvec and decode step: the kernel variant (wgpu: `plain` or
    /// `subgroups`, see backend::wgpu::shaders::Variant); empty otherwise.
    pub kernels: String,
}

impl Measure {
    pub fn gb_per_s(&self) -> f64 {
        self.bytes as f64 / self.seconds / 1e9
    }
}

/// The matvec shapes of DeepSeek V4 Flash the benchmark runs:
/// (name, type, n_in, n_out).
pub const FLASH_MATVECS: &[(&str, GgmlType, u64, u64)] = &[
    ("q-lora (attn_q_a)", GgmlType::Q8_0, 4096, 1024),
    ("q-up (attn_q_b)", GgmlType::Q8_0, 1024, 32768),
    ("expert down", GgmlType::Iq2Xxs, 2048, 4096),
    ("expert down", GgmlType::Q2K, 2048, 4096),
    ("expert down", GgmlType::Q4K, 2048, 4096),
    ("expert down", GgmlType::Mxfp4, 2048, 4096),
    ("expert gate/up", GgmlType::Iq2Xxs, 4096, 2048),
    ("output head", GgmlType::Q8_0, 4096, 129280),
];

/// Weight bytes for a benchmark: a pool of rows made by the real quantizer,
/// repeated (decode speed does not depend on the values, only on them
/// being ordinary numbers).
pub fn bench_weights(ty: GgmlType, n_in: u64, n_out: u64) -> Result<Vec<u8>, String> {
    let rb = ty
        .row_bytes(n_in)
        .ok_or_else(|| format!("{n_in} is not a whole number of {ty} blocks"))?
        as usize;
    let pool_rows = 16usize.min(n_out as usize);
    let mut pool = vec![0u8; rb * pool_rows];
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    for r in 0..pool_rows {
        let v: Vec<f32> = (0..n_in)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect();
        quant::quantize_row(ty, &v, &mut pool[r * rb..(r + 1) * rb], None)
            .map_err(|e| e.to_string())?;
    }
    let mut out = Vec::with_capacity(rb * n_out as usize);
    for r in 0..n_out as usize {
        let p = (r * 7) % pool_rows;
        out.extend_from_slice(&pool[p * rb..(p + 1) * rb]);
    }
    Ok(out)
}

/// The host's read bandwidth (src/bandwidth.rs) as a table line: the ceiling
/// of the CPU backend.
pub fn host_read(bytes: u64, reps: usize) -> Measure {
    let bw = crate::backend::bandwidth::read_bandwidth(bytes as usize, reps);
    Measure {
        kind: "host read (CPU)".into(),
        name: String::new(),
        ty: String::new(),
        n_in: 0,
        n_out: 0,
        bytes,
        seconds: bytes as f64 / bw,
        timer: "wall",
        rows: 0,
        kernels: String::new(),
    }
}

/// Header of the terminal table.
pub fn table_header() -> String {
    format!(
        "{:<16} {:<20} {:<8} {:>13} {:>4} {:<9} {:>8} {:>10} {:>8} {:>8}  {}",
        "what",
        "shape",
        "type",
        "in x out",
        "rows",
        "kernels",
        "MiB",
        "ms",
        "GB/s",
        "of read",
        "timer"
    )
}

/// One line of the terminal table; `read_gbps` is the device read bandwidth
/// the fraction is taken of (None for the lines measured before it).
pub fn table_row(m: &Measure, read_gbps: Option<f64>) -> String {
    let dims = if m.n_in > 0 {
        format!("{}x{}", m.n_in, m.n_out)
    } else {
        String::new()
    };
    let frac = match read_gbps {
        Some(r) if m.kind != "host read (CPU)" => format!("{:.1} %", 100.0 * m.gb_per_s() / r),
        _ => String::new(),
    };
    let rows = if m.rows > 0 {
        m.rows.to_string()
    } else {
        String::new()
    };
    format!(
        "{:<16} {:<20} {:<8} {:>13} {:>4} {:<9} {:>8.1} {:>10.3} {:>8.2} {:>8}  {}",
        m.kind,
        m.name,
        m.ty,
        dims,
        rows,
        m.kernels,
        m.bytes as f64 / (1u64 << 20) as f64,
        m.seconds * 1e3,
        m.gb_per_s(),
        frac,
        m.timer
    )
}

pub const CSV_HEADER: &str =
    "device,what,shape,type,n_in,n_out,rows_per_workgroup,bytes,seconds,gb_per_s,fraction_of_device_read,timer,kernels";

pub fn csv_row(device: &str, m: &Measure, read_gbps: Option<f64>) -> String {
    let frac = match read_gbps {
        Some(r) if m.kind != "host read (CPU)" => format!("{:.4}", m.gb_per_s() / r),
        _ => String::new(),
    };
    let q = |s: &str| format!("\"{}\"", s.replace('"', "'"));
    format!(
        "{},{},{},{},{},{},{},{},{:.6e},{:.3},{},{},{}",
        q(device),
        q(&m.kind),
        q(&m.name),
        m.ty,
        m.n_in,
        m.n_out,
        m.rows,
        m.bytes,
        m.seconds,
        m.gb_per_s(),
        frac,
        m.timer,
        m.kernels
    )
}

/// Prints the whole `ds4-bench --bandwidth` report of one device (the
/// table on stdout line by line) and returns its CSV lines: the device
/// name, the header, the host's read bandwidth, then every line `measure`
/// produces, each taken as a fraction of the first "device read" line.
pub fn print_report<E>(
    device: &str,
    host_bytes: u64,
    trials: usize,
    measure: impl FnOnce(&mut dyn FnMut(&Measure)) -> Result<(), E>,
) -> Result<Vec<String>, E> {
    println!("device: {device}");
    println!("{}", table_header());
    let host = host_read(host_bytes, trials.max(3));
    println!("{}", table_row(&host, None));
    let mut csv = vec![CSV_HEADER.to_string(), csv_row(device, &host, None)];
    let mut read_gbps: Option<f64> = None;
    measure(&mut |m| {
        if m.kind == "device read" && read_gbps.is_none() {
            read_gbps = Some(m.gb_per_s());
        }
        println!("{}", table_row(m, read_gbps));
        csv.push(csv_row(device, m, read_gbps));
    })?;
    Ok(csv)
}
