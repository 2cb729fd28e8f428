//! Reading DeepSeek's official safetensors checkpoints (issue 37's first
//! step): a tiny checkpoint written by `tools/checkpoint/make_checkpoint.py`
//! in the release's layout (FP8 E4M3 with E8M0 block scales, packed FP4
//! experts with E8M0 scales per 32, BF16/F16/F32, I64 `tid2eid`; two shards
//! and an index) decodes bit for bit to the values the script computes from
//! the spec on its own; the FP4 experts repack into MXFP4 that decodes to
//! the same values; broken checkpoints give errors naming file and tensor.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use common::checkpoint::make_checkpoint;
use common::fresh_dir;
use ds4::convert::decode::{to_i32, Weight};
use ds4::convert::safetensors::{Checkpoint, Shard, INDEX_FILE};
use ds4::quant::mxfp4;
use serde_json::{json, Value};

const SHARD1: &str = "model-00001-of-00002.safetensors";
const SHARD2: &str = "model-00002-of-00002.safetensors";

fn tmp(name: &str) -> PathBuf {
    fresh_dir("convert_checkpoint", name)
}

/// The script's checkpoint with FP8 blocks of `block` (128: V4 Flash, 32:
/// V4.1), written once per test run.
fn base(block: usize) -> &'static Path {
    static B128: OnceLock<PathBuf> = OnceLock::new();
    static B32: OnceLock<PathBuf> = OnceLock::new();
    let cell = if block == 128 { &B128 } else { &B32 };
    cell.get_or_init(|| {
        let dir = tmp(&format!("base-{block}"));
        make_checkpoint(&dir, &["--block", &block.to_string()]);
        dir
    })
}

/// A copy of the 128-block checkpoint to break.
fn copy(name: &str) -> PathBuf {
    let d = tmp(name);
    for e in std::fs::read_dir(base(128)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), d.join(e.file_name())).unwrap();
    }
    d
}

/// One expected tensor: its logical shape and its values (f32 bits or i32).
struct Expected {
    shape: Vec<usize>,
    kind: String,
    words: Vec<u32>,
}

fn expected(dir: &Path) -> Vec<(String, Expected)> {
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(dir.join("expected.json")).unwrap()).unwrap();
    let blob = std::fs::read(dir.join("expected.bin")).unwrap();
    manifest
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, m)| {
            let off = m["offset"].as_u64().unwrap() as usize;
            let n = m["count"].as_u64().unwrap() as usize;
            let words = blob[off..off + 4 * n]
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            let shape = common::json_uints(&m["shape"]);
            let kind = m["kind"].as_str().unwrap().to_string();
            (name.clone(), Expected { shape, kind, words })
        })
        .collect()
}

fn open_err(dir: &Path) -> String {
    match Checkpoint::open(dir) {
        Ok(_) => panic!("{} opened", dir.display()),
        Err(e) => e.to_string(),
    }
}

fn assert_names(msg: &str, parts: &[&str]) {
    for p in parts {
        assert!(msg.contains(p), "{msg:?} does not name {p:?}");
    }
}

fn check_all_tensors(block: usize) {
    let dir = base(block);
    let ck = Checkpoint::open(dir).unwrap();
    assert_eq!(ck.weight_block_size().unwrap(), [block, block]);
    assert_eq!(ck.shards().len(), 2);
    let want = expected(dir);
    let names: BTreeSet<&str> = ck.names().collect();
    assert_eq!(names, want.iter().map(|(n, _)| n.as_str()).collect());
    let (mut fp8, mut fp4, mut inf, mut neg_zero) = (0, 0, 0, 0);
    for (name, e) in &want {
        if e.kind == "i32" {
            let got = to_i32(&ck.tensor(name).unwrap()).unwrap();
            assert_eq!(
                got,
                e.words.iter().map(|&w| w as i32).collect::<Vec<_>>(),
                "{name}"
            );
            continue;
        }
        let w = Weight::open(&ck, name).unwrap();
        assert_eq!(w.rows * w.cols, e.words.len(), "{name}");
        assert_eq!(w.cols, *e.shape.last().unwrap(), "{name}");
        let got = w.to_f32();
        for (i, (g, &x)) in got.iter().zip(&e.words).enumerate() {
            assert_eq!(
                g.to_bits(),
                x,
                "{name}[{i}]: {g} vs {} (block {block})",
                f32::from_bits(x)
            );
        }
        // A range of rows decodes to the same values as the whole.
        if w.rows >= 3 {
            let mut part = vec![0f32; 2 * w.cols];
            w.rows_f32(1, &mut part);
            assert_eq!(
                part.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                e.words[w.cols..3 * w.cols],
                "{name} rows 1..3"
            );
        }
        match w.tensor.dtype.name() {
            "F8_E4M3" => fp8 += 1,
            "I8" => fp4 += 1,
            _ => {}
        }
        inf += got.iter().filter(|v| v.is_infinite()).count();
        neg_zero += got.iter().filter(|v| v.to_bits() == 0x8000_0000).count();
    }
    // The edges the script puts in are there: overflowing scale 254, −0.
    assert!(fp8 == 8 && fp4 == 12, "{fp8} FP8, {fp4} FP4 weights");
    assert!(inf > 0 && neg_zero > 0, "{inf} inf, {neg_zero} -0");
}

#[test]
fn every_tensor_decodes_to_the_scripts_values_v4_blocks() {
    check_all_tensors(128);
}

#[test]
fn every_tensor_decodes_to_the_scripts_values_v41_blocks() {
    check_all_tensors(32);
}

/// MXFP4 holds the FP4 codes and scale bytes as they are: decoded by the
/// engine's MXFP4 decoder it gives the script's values (−0 as +0).
#[test]
fn fp4_experts_repack_to_mxfp4_without_loss() {
    let dir = base(128);
    let ck = Checkpoint::open(dir).unwrap();
    let mut n = 0;
    for (name, e) in expected(dir) {
        let w = match Weight::open(&ck, &name) {
            Ok(w) if w.is_fp4() => w,
            _ => continue,
        };
        let blocks = w.rows_mxfp4(0, w.rows).unwrap();
        assert_eq!(blocks.len(), w.rows * w.cols / 32);
        let bytes: &[u8] = bytemuck::cast_slice(&blocks);
        let mut got = vec![0f32; w.rows * w.cols];
        for (row, out) in bytes
            .chunks_exact(w.cols / 32 * mxfp4::BLOCK_BYTES)
            .zip(got.chunks_exact_mut(w.cols))
        {
            mxfp4::dequantize_row(row, out);
        }
        for (i, (g, &x)) in got.iter().zip(&e.words).enumerate() {
            let x = f32::from_bits(x);
            assert!(
                g.to_bits() == x.to_bits() || (*g == 0.0 && x == 0.0),
                "{name}[{i}]: {g} vs {x}"
            );
        }
        // Rows 1..3 alone are the same blocks.
        let part = w.rows_mxfp4(1, 2).unwrap();
        let per_row = w.cols / 32;
        assert_eq!(
            bytemuck::cast_slice::<_, u8>(&part),
            &bytes[per_row * mxfp4::BLOCK_BYTES..3 * per_row * mxfp4::BLOCK_BYTES]
        );
        n += 1;
    }
    assert_eq!(n, 12);
    let fp8 = Weight::open(&ck, "layers.0.attn.wq_a.weight").unwrap();
    let msg = fp8.rows_mxfp4(0, 1).unwrap_err().to_string();
    assert_names(
        &msg,
        &[SHARD1, "layers.0.attn.wq_a.weight", "only packed FP4"],
    );
}

/// Rewrites a shard's JSON header with `f`, keeping its data.
fn edit_header(path: &Path, f: impl FnOnce(&mut serde_json::Map<String, Value>)) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut h: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    f(h.as_object_mut().unwrap());
    let text = serde_json::to_vec(&h).unwrap();
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(path, out).unwrap();
}

/// Opening a copy of the base checkpoint, named `name`, whose `shard`'s
/// header `f` rewrites fails, naming each of `parts`.
fn refused_with_header(
    name: &str,
    shard: &str,
    f: impl FnOnce(&mut serde_json::Map<String, Value>),
    parts: &[&str],
) {
    let d = copy(name);
    edit_header(&d.join(shard), f);
    assert_names(&open_err(&d), parts);
}

/// Rewrites the bytes of the file at `path` with `f`.
fn edit_bytes(path: &Path, f: impl FnOnce(&mut Vec<u8>)) {
    let mut b = std::fs::read(path).unwrap();
    f(&mut b);
    std::fs::write(path, &b).unwrap();
}

/// The checkpoint in `dir` opens, and weight `name` in it is refused: why.
fn weight_err(dir: &Path, name: &str) -> String {
    let ck = Checkpoint::open(dir).unwrap();
    Weight::open(&ck, name).unwrap_err().to_string()
}

fn edit_json(path: &Path, f: impl FnOnce(&mut Value)) {
    let mut v: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(path, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
}

/// The absolute file offset of `tensor`'s first byte in `shard`.
fn data_offset(shard: &Path, tensor: &str) -> usize {
    let bytes = std::fs::read(shard).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let h: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    8 + n + h[tensor]["data_offsets"][0].as_u64().unwrap() as usize
}

#[test]
fn a_shard_missing_from_disk_names_it_and_a_tensor() {
    let d = copy("missing-shard");
    std::fs::remove_file(d.join(SHARD2)).unwrap();
    assert_names(&open_err(&d), &[SHARD2, "layers.1.", "shard missing"]);
}

#[test]
fn a_tensor_the_index_names_but_the_shard_lacks() {
    let d = copy("index-extra");
    edit_json(&d.join(INDEX_FILE), |v| {
        v["weight_map"]["layers.0.attn.wkv.weight"] = json!(SHARD1);
    });
    assert_names(
        &open_err(&d),
        &[SHARD1, "layers.0.attn.wkv.weight", "does not hold it"],
    );
    // An index that points outside the folder.
    let d = copy("index-escape");
    edit_json(&d.join(INDEX_FILE), |v| {
        v["weight_map"]["norm.weight"] = json!("../model-00001-of-00002.safetensors");
    });
    assert_names(
        &open_err(&d),
        &[INDEX_FILE, "norm.weight", "not a file in the folder"],
    );
    // A tensor nobody names.
    let ck = Checkpoint::open(base(128)).unwrap();
    let msg = ck.tensor("layers.7.nope").unwrap_err().to_string();
    assert_names(
        &msg,
        &[INDEX_FILE, "layers.7.nope", "not in the checkpoint"],
    );
}

#[test]
fn an_unknown_dtype_names_file_tensor_and_dtype() {
    refused_with_header(
        "dtype",
        SHARD1,
        |h| h["norm.weight"]["dtype"] = json!("F4_E2M1"),
        &[SHARD1, "norm.weight", "unknown dtype \"F4_E2M1\""],
    );
    // A known dtype that is no weight format: refused when read as a weight.
    let d = copy("dtype-i32");
    edit_header(&d.join(SHARD1), |h| {
        h["hc_head_base"]["dtype"] = json!("I32");
    });
    assert_names(
        &weight_err(&d, "hc_head_base"),
        &[SHARD1, "hc_head_base", "dtype I32 is not a weight format"],
    );
}

#[test]
fn a_header_that_lies_about_sizes_or_offsets() {
    /// (case, shard, tensor, its header field, the lie, what the error names)
    type Lie = (
        &'static str,
        &'static str,
        &'static str,
        &'static str,
        Value,
        &'static [&'static str],
    );
    let lies: [Lie; 4] = [
        // A shape that needs more bytes than the offsets hold.
        (
            "shape",
            SHARD1,
            "head.weight",
            "shape",
            json!([51, 96]),
            &[SHARD1, "head.weight", "needs 9792"],
        ),
        // Offsets past the end of the file.
        (
            "offsets",
            SHARD2,
            "layers.1.attn.attn_sink",
            "data_offsets",
            json!([1_000_000, 1_000_016]),
            &[SHARD2, "layers.1.attn.attn_sink", "truncated?"],
        ),
        // Offsets reversed, and one tensor's bytes inside another's.
        (
            "reversed",
            SHARD1,
            "hc_head_base",
            "data_offsets",
            json!([16, 0]),
            &[SHARD1, "hc_head_base", "not an ordered pair"],
        ),
        (
            "overlap",
            SHARD1,
            "hc_head_base",
            "data_offsets",
            json!([8, 24]),
            &[SHARD1, "overlaps"],
        ),
    ];
    for (case, shard, tensor, field, lie, names) in lies {
        refused_with_header(case, shard, |h| h[tensor][field] = lie, names);
    }
    // A header length past the end of the file, and a header that is not JSON.
    let d = copy("header-len");
    edit_bytes(&d.join(SHARD1), |b| {
        let len = b.len() as u64;
        b[..8].copy_from_slice(&len.to_le_bytes());
    });
    assert_names(
        &open_err(&d),
        &[SHARD1, "header length", "exceeds the file"],
    );
    let d = copy("header-json");
    edit_bytes(&d.join(SHARD1), |b| b[8] = b'[');
    assert_names(&open_err(&d), &[SHARD1, "not JSON"]);
}

#[test]
fn a_truncated_shard_names_the_tensor_it_cuts() {
    let d = copy("truncated");
    let p = d.join(SHARD2);
    let len = std::fs::metadata(&p).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(len - 100).unwrap();
    // The shard's last tensor is layer 1's last expert's down scale.
    assert_names(
        &open_err(&d),
        &[SHARD2, "layers.1.ffn.experts.1.w2.scale", "truncated?"],
    );
    f.set_len(5).unwrap();
    let msg = Shard::open(&p).err().unwrap().to_string();
    assert_names(&msg, &[SHARD2, "too short"]);
}

#[test]
fn scales_that_do_not_fit_their_weight() {
    // The block of config.json disagrees with the stored scale grid.
    let d = copy("block");
    edit_json(&d.join("config.json"), |v| {
        v["quantization_config"]["weight_block_size"] = json!([64, 64]);
    });
    assert_names(
        &weight_err(&d, "layers.0.attn.wq_b.weight"),
        &[
            SHARD1,
            "layers.0.attn.wq_b.weight",
            "layers.0.attn.wq_b.scale",
            "[4, 1]",
        ],
    );
    // A scale tensor missing from the checkpoint.
    let d = copy("no-scale");
    edit_header(&d.join(SHARD2), |h| {
        let s = h.remove("layers.1.ffn.experts.0.w3.scale").unwrap();
        h.insert("layers.1.ffn.experts.0.w3.scales".into(), s);
    });
    edit_json(&d.join(INDEX_FILE), |v| {
        let m = v["weight_map"].as_object_mut().unwrap();
        m.remove("layers.1.ffn.experts.0.w3.scale");
        m.insert("layers.1.ffn.experts.0.w3.scales".into(), json!(SHARD2));
    });
    assert_names(
        &weight_err(&d, "layers.1.ffn.experts.0.w3.weight"),
        &[
            SHARD2,
            "layers.1.ffn.experts.0.w3.weight",
            "without its scale tensor",
        ],
    );
    // The E8M0 NaN byte in a scale.
    let d = copy("nan-scale");
    let p = d.join(SHARD1);
    let off = data_offset(&p, "layers.0.ffn.experts.1.w2.scale");
    edit_bytes(&p, |b| b[off + 5] = 0xff);
    assert_names(
        &weight_err(&d, "layers.0.ffn.experts.1.w2.weight"),
        &[
            SHARD1,
            "layers.0.ffn.experts.1.w2.scale",
            "E8M0 NaN",
            "[2, 1]",
        ],
    );
}

#[test]
fn an_integer_table_out_of_i32_range() {
    let d = copy("tid2eid");
    let p = d.join(SHARD1);
    let off = data_offset(&p, "layers.0.ffn.gate.tid2eid");
    edit_bytes(&p, |b| {
        b[off + 8 * 7..off + 8 * 8].copy_from_slice(&(1i64 << 40).to_le_bytes())
    });
    let ck = Checkpoint::open(&d).unwrap();
    let msg = to_i32(&ck.tensor("layers.0.ffn.gate.tid2eid").unwrap())
        .unwrap_err()
        .to_string();
    assert_names(
        &msg,
        &[
            SHARD1,
            "layers.0.ffn.gate.tid2eid",
            "element 7 = 1099511627776",
        ],
    );
}
