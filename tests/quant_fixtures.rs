//! Bit-exact dequantisation against gguf-py 0.19.0.
//!
//! The fixtures in `tests/data/quant/` hold raw blocks and the f32 values
//! gguf-py decodes them to (see that folder's README for the format and how to
//! regenerate). Every value must match bit for bit, through the generic
//! `dequantize_row` dispatch, both block by block and as whole rows.

use ds4::quant::{dequantize_row, quantize_row, GgmlType};
use std::path::Path;

struct Fixture {
    ty: GgmlType,
    n: usize,
    block_bytes: usize,
    block_elems: usize,
    raw: Vec<u8>,
    expected: Vec<u32>,
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().unwrap())
}

fn load(name: &str) -> Fixture {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/quant")
        .join(format!("{name}.bin"));
    let b = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&b[..8], b"DS4QFX01", "{name}: bad magic");
    let ty = GgmlType::from_id(u32_at(&b, 8)).expect("known type id");
    let (n, block_bytes, block_elems) = (
        u32_at(&b, 12) as usize,
        u32_at(&b, 16) as usize,
        u32_at(&b, 20) as usize,
    );
    assert_eq!(ty.name(), name);
    assert_eq!(
        ty.block_layout(),
        (block_elems, block_bytes),
        "{name}: layout"
    );
    let raw_end = 24 + n * block_bytes;
    assert_eq!(b.len(), raw_end + 4 * n * block_elems, "{name}: file size");
    let expected = b[raw_end..]
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    Fixture {
        ty,
        n,
        block_bytes,
        block_elems,
        raw: b[24..raw_end].to_vec(),
        expected,
    }
}

fn check(name: &str, min_blocks: usize) {
    let f = load(name);
    assert!(f.n >= min_blocks, "{name}: only {} blocks", f.n);
    // Block by block, into a NaN-poisoned buffer.
    let mut out = vec![f32::NAN; f.block_elems];
    let mut mismatches = 0;
    for i in 0..f.n {
        out.fill(f32::NAN);
        dequantize_row(
            f.ty,
            &f.raw[i * f.block_bytes..(i + 1) * f.block_bytes],
            &mut out,
        )
        .unwrap();
        for (j, v) in out.iter().enumerate() {
            let want = f.expected[i * f.block_elems + j];
            if v.to_bits() != want {
                mismatches += 1;
                if mismatches <= 10 {
                    eprintln!(
                        "{name} block {i} elem {j}: got {v:e} ({:#010x}), want {:e} ({want:#010x})",
                        v.to_bits(),
                        f32::from_bits(want)
                    );
                }
            }
        }
    }
    assert_eq!(
        mismatches, 0,
        "{name}: {mismatches} values differ from gguf-py"
    );
    // The whole fixture as one long row.
    let mut all = vec![f32::NAN; f.n * f.block_elems];
    dequantize_row(f.ty, &f.raw, &mut all).unwrap();
    assert!(
        all.iter().zip(&f.expected).all(|(v, w)| v.to_bits() == *w),
        "{name}: whole-row decode differs"
    );
}

#[test]
fn f16_matches_gguf_py() {
    check("F16", 4096);
}

#[test]
fn bf16_matches_gguf_py() {
    check("BF16", 4096);
}

#[test]
fn q8_0_matches_gguf_py() {
    check("Q8_0", 512);
}

#[test]
fn q2_k_matches_gguf_py() {
    check("Q2_K", 256);
}

#[test]
fn q4_k_matches_gguf_py() {
    check("Q4_K", 256);
}

#[test]
fn iq2_xxs_matches_gguf_py() {
    check("IQ2_XXS", 256);
}

#[test]
fn mxfp4_matches_gguf_py() {
    check("MXFP4", 1024);
    // The fixture covers the edge scale bytes with every nibble value in both
    // halves of a byte (see tools/gen_quant_fixtures.py); make sure it does.
    let f = load("MXFP4");
    for e in [0u8, 1, 2, 127, 253, 254, 255] {
        let mut lo = [false; 16];
        let mut hi = [false; 16];
        for b in f.raw.chunks_exact(17).filter(|b| b[0] == e) {
            for &q in &b[1..] {
                lo[(q & 15) as usize] = true;
                hi[(q >> 4) as usize] = true;
            }
        }
        assert!(
            lo.iter().chain(&hi).all(|&s| s),
            "scale byte {e}: not every nibble"
        );
    }
    // Scale bytes 253..255 overflow to inf with large codes (gguf-py does too).
    assert!(f.expected.iter().any(|&w| f32::from_bits(w).is_infinite()));
}

/// gguf-py's MXFP4 quantizer, byte for byte, on f32 blocks from the fixture
/// script (Gaussian, exact table values, ties, amax at and just below powers
/// of two, zeros and −0).
#[test]
fn mxfp4_quantizer_matches_gguf_py() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/quant/MXFP4_quantize.bin");
    let b = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&b[..8], b"DS4QQZ01");
    assert_eq!(GgmlType::from_id(u32_at(&b, 8)), Some(GgmlType::Mxfp4));
    let (n, bb, be) = (
        u32_at(&b, 12) as usize,
        u32_at(&b, 16) as usize,
        u32_at(&b, 20) as usize,
    );
    assert_eq!((be, bb), GgmlType::Mxfp4.block_layout());
    assert!(n >= 1000);
    let x_end = 24 + 4 * n * be;
    assert_eq!(b.len(), x_end + n * bb);
    let x: Vec<f32> = b[24..x_end]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let want = &b[x_end..];
    let mut got = vec![0xA5u8; bb];
    let mut bad = 0;
    for i in 0..n {
        quantize_row(GgmlType::Mxfp4, &x[i * be..(i + 1) * be], &mut got, None).unwrap();
        if got != want[i * bb..(i + 1) * bb] {
            bad += 1;
            if bad <= 5 {
                eprintln!(
                    "block {i}: got {got:02x?}, want {:02x?}",
                    &want[i * bb..(i + 1) * bb]
                );
            }
        }
    }
    assert_eq!(bad, 0, "{bad} of {n} blocks differ from gguf-py");
    // As one long row too.
    let mut all = vec![0xA5u8; n * bb];
    quantize_row(GgmlType::Mxfp4, &x, &mut all, None).unwrap();
    assert_eq!(all, want);
}
