//! The CUDA kernels' scalar building blocks, compiled for the host: the
//! weight decoders of cuda/quant.cuh (`decode32`, `decode1`, every weight
//! type) and the small-float rounding of cuda/common.cuh (E4M3, E2M1, f16,
//! power-of-two block scales) are built with the system C++ compiler
//! (tests/cuda_host/shim.h stands in for the CUDA keywords) and must equal
//! the CPU twins bit for bit on seeded random inputs: random bytes for the
//! block formats (every code and scale pattern, f16 scales kept finite),
//! random magnitudes, exact ties and subnormals for the rounding.
//! Needs no GPU and no CUDA; without a C++ compiler the test fails under
//! CI=true and is skipped with a message elsewhere.

mod common;
use common::rng::Rng;

use std::path::{Path, PathBuf};
use std::process::Command;

use ds4::quant::{self, small_float, GgmlType};

fn dir(test: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("cuda-host-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Builds the checker; `None` (skip) without a compiler outside CI.
fn build(d: &Path) -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut src = String::new();
    for f in [
        "tests/cuda_host/shim.h",
        "cuda/common.cuh",
        "cuda/iq2xxs_grid.inc",
        "cuda/quant.cuh",
        "tests/cuda_host/check.cpp",
    ] {
        src.push_str(&std::fs::read_to_string(root.join(f)).unwrap());
        src.push('\n');
    }
    let cpp = d.join("check.cpp");
    std::fs::write(&cpp, src).unwrap();
    let exe = d.join("check");
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    // No -ffast-math, no FMA contraction: the CPU twins round every step.
    let out = Command::new(&cxx)
        .args([
            "-std=c++17",
            "-O1",
            "-ffp-contract=off",
            "-Wall",
            "-Werror",
            "-Wno-unknown-pragmas",
            "-o",
        ])
        .arg(&exe)
        .arg(&cpp)
        .output();
    match out {
        Ok(o) if o.status.success() => Some(exe),
        Ok(o) => panic!("{cxx} failed:\n{}", String::from_utf8_lossy(&o.stderr)),
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("skipped: no C++ compiler ({cxx}: {e})");
            None
        }
        Err(e) => panic!("{cxx}: {e}"),
    }
}

fn run(exe: &Path, args: &[String]) {
    let o = Command::new(exe).args(args).output().unwrap();
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn read_f32(p: &Path) -> Vec<f32> {
    std::fs::read(p)
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// A finite random f16 (exponent field below 31).
fn finite_f16(r: &mut Rng) -> u16 {
    let h = r.next_u64() as u16;
    if (h >> 10) & 31 == 31 {
        h & !(1 << 14)
    } else {
        h
    }
}

/// Random stored bytes for `rows` rows of `n_in` values with every f16
/// field finite (NaN payloads are not part of the contract).
fn random_rows(ty: GgmlType, n_in: usize, rows: usize, r: &mut Rng) -> Vec<u8> {
    let rb = ty.row_bytes(n_in as u64).unwrap() as usize;
    let mut b: Vec<u8> = (0..rb * rows).map(|_| r.next_u64() as u8).collect();
    let put16 = |b: &mut [u8], at: usize, r: &mut Rng| {
        let h = finite_f16(r).to_le_bytes();
        b[at..at + 2].copy_from_slice(&h);
    };
    match ty {
        GgmlType::F16 => (0..b.len()).step_by(2).for_each(|i| put16(&mut b, i, r)),
        GgmlType::Bf16 => {
            for i in (0..b.len()).step_by(2) {
                let v = u16::from_le_bytes([b[i], b[i + 1]]);
                let v = if (v >> 7) & 0xff == 0xff {
                    v & !(1 << 14)
                } else {
                    v
                };
                b[i..i + 2].copy_from_slice(&v.to_le_bytes());
            }
        }
        GgmlType::F32 => {
            for i in (0..b.len()).step_by(4) {
                let v = u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
                let v = if (v >> 23) & 0xff == 0xff {
                    v & !(1 << 30)
                } else {
                    v
                };
                b[i..i + 4].copy_from_slice(&v.to_le_bytes());
            }
        }
        GgmlType::Q8_0 => (0..b.len()).step_by(34).for_each(|i| put16(&mut b, i, r)),
        GgmlType::Q2K => (0..b.len()).step_by(84).for_each(|i| {
            put16(&mut b, i + 80, r);
            put16(&mut b, i + 82, r);
        }),
        GgmlType::Q4K => (0..b.len()).step_by(144).for_each(|i| {
            put16(&mut b, i, r);
            put16(&mut b, i + 2, r);
        }),
        GgmlType::Iq2Xxs => (0..b.len()).step_by(66).for_each(|i| put16(&mut b, i, r)),
        _ => {}
    }
    b
}

fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

#[test]
fn cuda_weight_decoders_equal_the_cpu_twins_bit_for_bit() {
    let d = dir("decode");
    let Some(exe) = build(&d) else { return };
    let mut r = Rng(0xC0DA_5EED);
    let cases: &[(GgmlType, u32, &[usize])] = &[
        (GgmlType::F32, 0, &[32, 64, 7, 33]),
        (GgmlType::F16, 1, &[32, 96, 5, 258]),
        (GgmlType::Bf16, 30, &[64, 300]),
        (GgmlType::Q8_0, 8, &[32, 96, 4096]),
        (GgmlType::Q2K, 10, &[256, 512]),
        (GgmlType::Q4K, 12, &[256, 768]),
        (GgmlType::Iq2Xxs, 16, &[256, 512]),
        (GgmlType::Mxfp4, 39, &[32, 160]),
    ];
    for &(ty, id, widths) in cases {
        for &n_in in widths {
            let rows = 3;
            let bytes = random_rows(ty, n_in, rows, &mut r);
            let (inp, outp) = (d.join("rows.bin"), d.join("rows.f32"));
            std::fs::write(&inp, &bytes).unwrap();
            run(
                &exe,
                &[
                    "decode".into(),
                    id.to_string(),
                    n_in.to_string(),
                    rows.to_string(),
                    inp.display().to_string(),
                    outp.display().to_string(),
                ],
            );
            let got = read_f32(&outp);
            assert_eq!(got.len(), 2 * rows * n_in);
            let rb = bytes.len() / rows;
            for row in 0..rows {
                let mut want = vec![f32::NAN; n_in];
                quant::dequantize_row(ty, &bytes[row * rb..(row + 1) * rb], &mut want).unwrap();
                for (path, base) in [("decode32", row * n_in), ("decode1", (rows + row) * n_in)] {
                    for (i, &w) in want.iter().enumerate() {
                        let g = got[base + i];
                        assert!(
                            same(g, w),
                            "{ty:?} n_in {n_in} row {row} {path} [{i}]: cuda {g:e} vs cpu {w:e}"
                        );
                    }
                }
            }
        }
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn cuda_small_float_rounding_equals_the_cpu_twins_bit_for_bit() {
    let d = dir("round");
    let Some(exe) = build(&d) else { return };
    let mut r = Rng(0x5_F10A7);
    let mut xs: Vec<f32> = Vec::new();
    // Random magnitudes over the whole range of interest, both signs.
    for _ in 0..20000 {
        let e = (r.next_u64() % 60) as i32 - 40;
        let m = 1.0 + (r.next_u64() % (1 << 23)) as f32 / (1 << 23) as f32;
        let s = if r.next_u64() & 1 == 0 { 1.0 } else { -1.0 };
        xs.push(s * m * 2f32.powi(e));
    }
    // Exact midpoints between neighbouring E4M3 and E2M1 values (ties).
    for c in 0..126u8 {
        let (lo, hi) = (small_float::e4m3_decode(c), small_float::e4m3_decode(c + 1));
        xs.extend([0.5 * (lo + hi), -0.5 * (lo + hi)]);
    }
    for w in small_float::E2M1_VALUES.windows(2) {
        xs.extend([0.5 * (w[0] + w[1]), -0.5 * (w[0] + w[1])]);
    }
    // Powers of two and their neighbours (the block-scale edges),
    // subnormals, zero, the clamps and beyond.
    for e in -140..20 {
        let p = 2f32.powi(e);
        xs.extend([
            p,
            f32::from_bits(p.to_bits() + 1),
            f32::from_bits(p.to_bits() - 1),
            448.0 * p,
            6.0 * p,
        ]);
    }
    xs.extend([
        0.0,
        -0.0,
        448.0,
        449.0,
        1e6,
        6.0,
        7.0,
        f32::MIN_POSITIVE,
        1e-45,
    ]);
    let (inp, outp) = (d.join("x.bin"), d.join("x.f32"));
    std::fs::write(
        &inp,
        xs.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>(),
    )
    .unwrap();
    run(
        &exe,
        &[
            "round".into(),
            inp.display().to_string(),
            outp.display().to_string(),
        ],
    );
    let got = read_f32(&outp);
    assert_eq!(got.len(), 5 * xs.len());
    // The CPU twins' block scale (private in small_float): 2^ceil(log2(amax/fmax)).
    let pow2 = |amax: f32, fmax: f32| (amax / fmax).log2().ceil().exp2();
    for (i, &x) in xs.iter().enumerate() {
        let f16 = quant::f16::f16_bits_to_f32(quant::f16::f32_to_f16_bits(x));
        let want = [
            small_float::round_e4m3(x),
            small_float::round_e2m1(x),
            f16,
            pow2(x.abs(), 448.0),
            pow2(x.abs(), 6.0),
        ];
        for (k, (&g, &w)) in got[5 * i..5 * i + 5].iter().zip(&want).enumerate() {
            // A zero or NaN amax never reaches pow2_scale (both sides take
            // the maximum with a positive floor first).
            if k >= 3 && (x == 0.0 || x.is_nan()) {
                continue;
            }
            let name = [
                "round_e4m3",
                "round_e2m1",
                "round_f16",
                "pow2_scale 448",
                "pow2_scale 6",
            ][k];
            assert!(same(g, w), "{name}({x:e}): cuda {g:e} vs cpu {w:e}");
        }
    }
    std::fs::remove_dir_all(&d).unwrap();
}
