//! The converter's output against the float64 reference run on the
//! ORIGINAL checkpoint weights (issue 37), for both families:
//! `ds4-quantize --hf` on the script's tame checkpoints
//! (`make_checkpoint.py --model v4 --tame --vocab 512`, and `--model v41`),
//! to `f32`, `q8` and `mxfp4`, each run by cpu-ref (plain numerics) over
//! the goldens' ids (80 for V4, 64 for V4.1) and compared at every
//! position:
//!
//! * `f32` with `tests/golden/checkpoint-{v4,v41}-tame.plain-f64.json` (the
//!   checkpoint's values, every logit) to the reference tests' 1e-5 in
//!   log-prob, over the whole vocabulary;
//! * `q8` and `mxfp4` with `checkpoint-{v4,v41}-tame-{q8,mxfp4}.plain-f64.json`
//!   (the same values rounded as the recipe stores them, by gguf-py's Q8_0
//!   and a nearest-even F16 cast, the classes of GGUF.md §5 / docs/V41.md)
//!   to the same 1e-5, and with the original weights' golden within the
//!   quantisation bound of tests/convert_write.rs.
//!
//! The goldens are written by `tools/reference/checkpoint_reference.py`
//! (V4) and `checkpoint_v41_reference.py` (V4.1, sharing the first's
//! reader and decoders), which read the checkpoint with their own
//! safetensors reader, FP8 / FP4 / E8M0 / BF16 decode and official-name map
//! (V4: checked against transformers' own loader renames; V4.1: written from
//! the official `inference/model.py`, with the Engram hashing constants
//! derived as the official `engram.py` does), and run transformers'
//! `deepseek_v4` (tools/reference/ds4_reference.py) or the torch port of
//! the official V4.1 code (tools/reference/v41_torch.py) in float64.
//! Nothing of ds4's converter is on that side, so a wrong name map, a
//! transposed tensor or a wrong scale decode — which an f32 conversion would
//! share with a q8 one (tests/convert_write.rs) — shows here.
//!
//! The goldens record the checkpoint's `config.json` and a sha256 of its
//! tensors (and for V4.1 of its `engram_tables.json`); the test recomputes
//! them from the checkpoint the script writes now, so a script that changed
//! (its random draws, a format) fails with that message instead of as a
//! logit mismatch.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::checkpoint::checkpoint_once;
use common::quantize::{converted_once, cpu_ref_logits};
use ds4::backend::BackendKind;
use ds4::model::forward::Numerics;
use ds4::model::ModelFile;
use ds4::session::{Session, SessionOptions};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// One family's goldens, from tools/reference/checkpoint_reference.py (V4)
/// or checkpoint_v41_reference.py (V4.1): the reference on the checkpoint's
/// own values (every logit), and on them rounded as each recipe stores them
/// (top 20); how cpu-ref is run on a converted file.
struct Family {
    name: &'static str,
    golden: &'static str,
    recipes: [(&'static str, &'static str); 2],
    /// The files the checkpoint folder holds besides the tensors whose
    /// sha256 the golden records (`checkpoint.<key>`).
    extra_files: &'static [(&'static str, &'static str)],
    logits: fn(&Path, &[u32]) -> Vec<Vec<f32>>,
}

const V4: Family = Family {
    name: "v4",
    golden: "checkpoint-v4-tame.plain-f64.json",
    recipes: [
        ("q8", "checkpoint-v4-tame-q8.plain-f64.json"),
        ("mxfp4", "checkpoint-v4-tame-mxfp4.plain-f64.json"),
    ],
    extra_files: &[],
    logits: engine_logits,
};

/// V4.1: cpu-ref token by token (the decode path: window ring, partial
/// compressor groups, index-key caches), against the reference's prefill.
const V41: Family = Family {
    name: "v41",
    golden: "checkpoint-v41-tame.plain-f64.json",
    recipes: [
        ("q8", "checkpoint-v41-tame-q8.plain-f64.json"),
        ("mxfp4", "checkpoint-v41-tame-mxfp4.plain-f64.json"),
    ],
    extra_files: &[("engram_tables.json", "engram_tables_sha256")],
    logits: cpu_ref_logits,
};

/// Max |Δ log-prob| against a reference on the very weights the file holds:
/// the cpu-ref bound of tests/reference_goldens.rs for f32 and for quantised
/// weights alike (f32 arithmetic against float64 measures ≤ 6.3e-7 there).
/// The f32 conversion holds the checkpoint's values exactly; q8 and mxfp4
/// hold them rounded as the recipe golden rounds them (gguf-py's Q8_0, F16
/// to nearest even), so again only the arithmetic differs.
const MAX_DLP: f64 = 1e-5;

/// Largest |Δlogit| allowed for `q8` and `mxfp4` against the reference on
/// the ORIGINAL weights, relative to the position's largest |logit|: the
/// quantisation bound of tests/convert_write.rs (`TOLERANCE`, justified
/// there: Q8_0 weights off by at most 1/254 of their block's largest value,
/// F16 by 2^-11; a wrong tensor moves the logits by their own order).
const QUANT_REL_LOGIT: f64 = 0.02;

fn load(name: &str) -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    serde_json::from_slice(&std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .unwrap()
}

/// The checkpoint family `f`'s golden names, written by the script once per
/// family and checked to be the golden's (config.json, tensors, and the
/// family's extra files).
fn checkpoint(f: &Family) -> PathBuf {
    let g = load(f.golden);
    let ck = &g["checkpoint"];
    let cmd = ck["command"].as_str().unwrap();
    let args: Vec<&str> = cmd.split_whitespace().skip(1).collect();
    let dir = checkpoint_once(
        "convert_reference",
        &format!("checkpoint-{}", f.name),
        &args,
    );
    let regen = "regenerate the golden (tools/reference/README.md, checkpoint_reference.py / \
                 checkpoint_v41_reference.py)";
    let config: Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(
        config, ck["config"],
        "`{cmd}` no longer writes the golden's config.json: {regen}"
    );
    let sha = tensors_sha256(&dir);
    assert_eq!(
        sha,
        ck["tensors_sha256"].as_str().unwrap(),
        "`{cmd}` no longer writes the golden's tensors (its random draws or storage \
         changed): {regen}"
    );
    for &(file, key) in f.extra_files {
        let sha = format!(
            "{:x}",
            Sha256::digest(std::fs::read(dir.join(file)).unwrap())
        );
        assert_eq!(
            sha,
            ck[key].as_str().unwrap(),
            "`{cmd}` no longer writes the golden's {file}: {regen}"
        );
    }
    dir
}

/// The script's `tensors_sha256`: over every tensor of the index in name
/// order, the line `NAME DTYPE D0,D1,… NBYTES\n` then its bytes, read from
/// the safetensors headers directly (not through the converter's reader).
fn tensors_sha256(dir: &Path) -> String {
    let index: Value =
        serde_json::from_slice(&std::fs::read(dir.join("model.safetensors.index.json")).unwrap())
            .unwrap();
    let map = index["weight_map"].as_object().unwrap();
    let mut shards = std::collections::HashMap::new();
    let mut names: Vec<&String> = map.keys().collect();
    names.sort();
    let mut h = Sha256::new();
    for name in names {
        let file = map[name].as_str().unwrap();
        let (header, data) = shards.entry(file).or_insert_with(|| {
            let raw = std::fs::read(dir.join(file)).unwrap();
            let n = u64::from_le_bytes(raw[..8].try_into().unwrap()) as usize;
            let header: Value = serde_json::from_slice(&raw[8..8 + n]).unwrap();
            (header, raw[8 + n..].to_vec())
        });
        let t = &header[name.as_str()];
        let shape: Vec<String> = common::json_uints(&t["shape"])
            .iter()
            .map(|d| d.to_string())
            .collect();
        let off = common::json_uints(&t["data_offsets"]);
        let bytes = &data[off[0]..off[1]];
        h.update(
            format!(
                "{name} {} {} {}\n",
                t["dtype"].as_str().unwrap(),
                shape.join(","),
                bytes.len()
            )
            .as_bytes(),
        );
        h.update(bytes);
    }
    format!("{:x}", h.finalize())
}

/// A golden's per-position values: ids, and for each position the
/// reference's log-probs of the ids it lists (`top_k` of them; the whole
/// vocabulary in the original weights' golden), its logsumexp, argmax and
/// top-2 margin.
struct Reference {
    ids: Vec<u32>,
    top: Vec<Vec<(usize, f64)>>,
    lse: Vec<f64>,
    argmax: Vec<usize>,
    margin: Vec<f64>,
}

impl Reference {
    fn read(g: &Value) -> Reference {
        let p = &g["prompts"][0];
        let floats = |v: &Value| -> Vec<f64> {
            v.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        };
        let top: Vec<Vec<(usize, f64)>> = p["top_ids"]
            .as_array()
            .unwrap()
            .iter()
            .zip(p["top_logprobs"].as_array().unwrap())
            .map(|(ids, lps)| {
                common::json_uints(ids)
                    .into_iter()
                    .zip(floats(lps))
                    .collect()
            })
            .collect();
        let ids: Vec<u32> = common::json_uints(&p["ids"])
            .iter()
            .map(|&x| x as u32)
            .collect();
        assert_eq!(top.len(), ids.len());
        Reference {
            ids,
            top,
            lse: floats(&p["logsumexp"]),
            argmax: common::json_uints(&p["argmax"]),
            margin: floats(&p["margin"]),
        }
    }

    /// Every logit at position `t` (log-prob + logsumexp); the golden must
    /// list the whole vocabulary.
    fn logits(&self, t: usize, vocab: usize) -> Vec<f64> {
        let mut l = vec![f64::NAN; vocab];
        for &(i, lp) in &self.top[t] {
            l[i] = lp + self.lse[t];
        }
        assert!(
            l.iter().all(|x| x.is_finite()),
            "position {t}: not every id"
        );
        l
    }
}

/// cpu-ref's logits (plain numerics) at every position of `ids` on `path`.
fn engine_logits(path: &Path, ids: &[u32]) -> Vec<Vec<f32>> {
    let m = Arc::new(ModelFile::open(path).unwrap());
    let v = m.config.n_vocab;
    let opts = SessionOptions {
        ctx: 256,
        prefill_chunk: 128,
        numerics: Numerics::Plain,
        backend: BackendKind::CpuRef,
        ..Default::default()
    };
    let mut sess = Session::new(m, opts).unwrap();
    let all = sess.score(ids).unwrap();
    all.chunks_exact(v).map(|r| r.to_vec()).collect()
}

/// Family `f`'s checkpoint converted with `recipe`, once per both.
fn converted(f: &Family, recipe: &str) -> PathBuf {
    let file = format!("checkpoint-{}", f.name);
    converted_once("convert_reference", &checkpoint(f), f.name, &file, recipe)
}

/// Max |Δ log-prob| over the ids the golden lists at every position, and
/// the argmax agreement where the reference's top-2 margin is ≥ 1e-3
/// (agreeing, checked).
fn log_prob_figures(got: &[Vec<f32>], r: &Reference) -> (f64, usize, usize) {
    assert_eq!(got.len(), r.ids.len());
    let (mut max_dlp, mut agree, mut checked) = (0f64, 0, 0);
    for (t, row) in got.iter().enumerate() {
        assert!(row.iter().all(|x| x.is_finite()), "position {t}");
        let lse = common::log_sum_exp(row);
        for &(i, lp) in &r.top[t] {
            max_dlp = max_dlp.max((row[i] as f64 - lse - lp).abs());
        }
        if r.margin[t] >= 1e-3 {
            checked += 1;
            agree += (ds4::sampler::argmax(row) == r.argmax[t]) as usize;
        }
    }
    (max_dlp, agree, checked)
}

/// Per position max|Δlogit| / max|logit| against the original weights'
/// golden (which lists every logit), and the argmax agreement over all
/// positions.
fn relative_logit_diffs(got: &[Vec<f32>], r: &Reference) -> (Vec<f64>, usize) {
    let mut agree = 0;
    let rel = got
        .iter()
        .enumerate()
        .map(|(t, row)| {
            let want = r.logits(t, row.len());
            let scale = want.iter().fold(0f64, |m, x| m.max(x.abs()));
            let d = row
                .iter()
                .zip(&want)
                .fold(0f64, |m, (&a, b)| m.max((a as f64 - b).abs()));
            agree += (ds4::sampler::argmax(row) == r.argmax[t]) as usize;
            d / scale
        })
        .collect();
    (rel, agree)
}

/// The largest of `rel` over the positions `keep` marks, and where it is.
fn worst_where(rel: &[f64], keep: &[bool]) -> (f64, usize) {
    rel.iter()
        .zip(keep)
        .enumerate()
        .filter(|(_, (_, &k))| k)
        .fold(
            (0f64, 0),
            |(w, at), (t, (&r, _))| {
                if r > w {
                    (r, t)
                } else {
                    (w, at)
                }
            },
        )
}

/// A recipe golden's `selection_as_original` (V4.1): per position, whether
/// the reference on the rounded weights made every discrete choice
/// (experts, indexer rows, candidate blocks) as on the original weights.
/// Where the rounding tipped a near-tie the logits move by more than the
/// smooth quantisation error, so the bound against the original weights
/// holds where the choices are the same; the 1e-5 against the rounded
/// weights' reference holds everywhere. A golden without it (V4): every
/// position.
fn selection_as_original(g: &Value, n: usize) -> Vec<bool> {
    match g["prompts"][0].get("selection_as_original") {
        Some(v) => v
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_bool().unwrap())
            .collect(),
        None => vec![true; n],
    }
}

/// The golden is worth comparing with: the run is far from uniform and its
/// argmax moves with the input (the scripts refuse to write one that is
/// not; this says so where the test runs).
fn assert_golden_is_not_trivial(f: &Family) {
    let r = Reference::read(&load(f.golden));
    let v = r.top[0].len() as f64;
    let mut top1: Vec<f64> = r.top.iter().map(|lps| lps[0].1).collect();
    top1.sort_by(f64::total_cmp);
    let median = top1[top1.len() / 2];
    let mut distinct = r.argmax.clone();
    distinct.sort();
    distinct.dedup();
    eprintln!(
        "{}: golden top-1 log-prob median {median:.3} (uniform {:.3}), {} distinct argmax of {}",
        f.name,
        -v.ln(),
        distinct.len(),
        r.argmax.len()
    );
    assert!(median > -v.ln() + 1.0);
    assert!(distinct.len() * 2 > r.argmax.len());
}

fn assert_f32_matches_the_original_weights(f: &Family) {
    let g = load(f.golden);
    let r = Reference::read(&g);
    let config = &g["checkpoint"]["config"];
    let vocab = config
        .get("text_config")
        .unwrap_or(config)
        .get("vocab_size")
        .and_then(Value::as_u64)
        .unwrap() as usize;
    assert_eq!(g["top_k"].as_u64().unwrap() as usize, vocab, "every logit");
    let got = (f.logits)(&converted(f, "f32"), &r.ids);
    let (max_dlp, agree, checked) = log_prob_figures(&got, &r);
    let (diffs, agree_all) = relative_logit_diffs(&got, &r);
    let (rel, at) = worst_where(&diffs, &vec![true; r.ids.len()]);
    eprintln!(
        "{} f32: max |Δ log-prob| {max_dlp:.2e} (whole vocabulary, {} positions), \
         max|Δlogit|/max|logit| {rel:.2e} (position {at}), argmax {agree}/{checked} \
         (margin ≥ 1e-3), {agree_all}/{} (all)",
        f.name,
        r.ids.len(),
        r.ids.len()
    );
    assert!(
        max_dlp <= MAX_DLP,
        "{} f32: max |Δ log-prob| {max_dlp:.2e}",
        f.name
    );
    assert_eq!(agree, checked, "{} f32: argmax agreement", f.name);
}

fn assert_recipes_match_the_rounded_and_the_original_weights(f: &Family) {
    let golden = load(f.golden);
    let original = Reference::read(&golden);
    for (recipe, file) in f.recipes {
        let g = load(file);
        assert_eq!(
            g["checkpoint"], golden["checkpoint"],
            "{file} and {} name the same checkpoint",
            f.golden
        );
        let r = Reference::read(&g);
        assert_eq!(r.ids, original.ids);
        let got = (f.logits)(&converted(f, recipe), &r.ids);
        let (max_dlp, agree, checked) = log_prob_figures(&got, &r);
        let (diffs, agree_all) = relative_logit_diffs(&got, &original);
        let same = selection_as_original(&g, r.ids.len());
        assert_eq!(same.len(), r.ids.len());
        let (rel, at) = worst_where(&diffs, &same);
        let (rel_all, at_all) = worst_where(&diffs, &vec![true; r.ids.len()]);
        let changed: Vec<usize> = (0..same.len()).filter(|&t| !same[t]).collect();
        let (dlp_orig, _, _) = log_prob_figures(&got, &original);
        eprintln!(
            "{} {recipe}: against the rounded weights max |Δ log-prob| {max_dlp:.2e} (top 20), \
             argmax {agree}/{checked}; against the original weights max|Δlogit|/max|logit| \
             {rel:.2e} (position {at}) where the reference makes the same choices, {rel_all:.2e} \
             (position {at_all}) with the positions {changed:?} where the rounding changes one, \
             max |Δ log-prob| {dlp_orig:.2e}, argmax {agree_all}/{}",
            f.name,
            r.ids.len()
        );
        assert!(
            max_dlp <= MAX_DLP,
            "{} {recipe}: max |Δ log-prob| {max_dlp:.2e} against the reference on the weights \
             rounded as the recipe stores them",
            f.name
        );
        assert_eq!(agree, checked, "{} {recipe}: argmax agreement", f.name);
        assert!(
            rel < QUANT_REL_LOGIT,
            "{} {recipe}: max|Δlogit| / max|logit| {rel:.3e} at position {at} against the \
             original weights (positions where the reference makes the original's choices)",
            f.name
        );
    }
}

#[test]
fn the_golden_is_not_trivial() {
    assert_golden_is_not_trivial(&V4);
}

#[test]
fn f32_conversion_matches_the_reference_on_the_original_weights() {
    assert_f32_matches_the_original_weights(&V4);
}

#[test]
fn q8_and_mxfp4_conversions_match_the_reference_on_the_rounded_and_the_original_weights() {
    assert_recipes_match_the_rounded_and_the_original_weights(&V4);
}

#[test]
fn v41_golden_is_not_trivial() {
    assert_golden_is_not_trivial(&V41);
}

#[test]
fn v41_f32_conversion_matches_the_reference_on_the_original_weights() {
    assert_f32_matches_the_original_weights(&V41);
}

#[test]
fn v41_q8_and_mxfp4_conversions_match_the_reference_on_the_rounded_and_the_original_weights() {
    assert_recipes_match_the_rounded_and_the_original_weights(&V41);
}
