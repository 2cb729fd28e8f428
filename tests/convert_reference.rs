//! The converter's output against the float64 reference run on the
//! ORIGINAL checkpoint weights (issue 37): `ds4-quantize --hf` on the
//! script's tame V4 checkpoint (`make_checkpoint.py --model v4 --tame
//! --vocab 512`), to `f32`, `q8` and `mxfp4`, each run by cpu-ref (plain
//! numerics) over the goldens' 80 ids and compared at every position:
//!
//! * `f32` with `tests/golden/checkpoint-v4-tame.plain-f64.json` (the
//!   checkpoint's values, every logit) to the reference tests' 1e-5 in
//!   log-prob, over the whole vocabulary;
//! * `q8` and `mxfp4` with `checkpoint-v4-tame-{q8,mxfp4}.plain-f64.json`
//!   (the same values rounded as the recipe stores them, by gguf-py's Q8_0
//!   and a nearest-even F16 cast, the classes of GGUF.md §5) to the same
//!   1e-5, and with the original weights' golden within the quantisation
//!   bound of tests/convert_write.rs.
//!
//! The goldens are written by `tools/reference/checkpoint_reference.py`,
//! which reads the checkpoint with its own safetensors reader, its own FP8 /
//! FP4 / E8M0 / BF16 decode and its own official-name → transformers-name map
//! (checked against transformers' own loader renames), and runs
//! transformers' `deepseek_v4` in float64 (tools/reference/ds4_reference.py).
//! Nothing of ds4's converter is on that side, so a wrong name map, a
//! transposed tensor or a wrong scale decode — which an f32 conversion would
//! share with a q8 one (tests/convert_write.rs) — shows here.
//!
//! The goldens record the checkpoint's `config.json` and a sha256 of its
//! tensors; the test recomputes both from the checkpoint the script writes
//! now, so a script that changed (its random draws, a format) fails with
//! that message instead of as a logit mismatch.

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use common::checkpoint::make_checkpoint;
use common::fresh_dir;
use common::quantize::convert;
use ds4::backend::BackendKind;
use ds4::model::forward::Numerics;
use ds4::model::ModelFile;
use ds4::session::{Session, SessionOptions};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The reference on the checkpoint's own values (every logit), and on them
/// rounded as each recipe stores them (top 20), from
/// tools/reference/checkpoint_reference.py.
const GOLDEN: &str = "checkpoint-v4-tame.plain-f64.json";
const RECIPE_GOLDENS: [(&str, &str); 2] = [
    ("q8", "checkpoint-v4-tame-q8.plain-f64.json"),
    ("mxfp4", "checkpoint-v4-tame-mxfp4.plain-f64.json"),
];

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

fn golden() -> &'static Value {
    static G: OnceLock<Value> = OnceLock::new();
    G.get_or_init(|| load(GOLDEN))
}

/// The checkpoint the golden names, written by the script once for the file
/// and checked to be the golden's (config.json and tensors).
fn checkpoint() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let ck = &golden()["checkpoint"];
        let cmd = ck["command"].as_str().unwrap();
        let args: Vec<&str> = cmd.split_whitespace().skip(1).collect();
        let dir = fresh_dir("convert_reference", "checkpoint");
        make_checkpoint(&dir, &args);
        let regen = "regenerate the golden (tools/reference/README.md, checkpoint_reference.py)";
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
        dir
    })
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

fn converted(recipe: &str) -> PathBuf {
    let dir = fresh_dir("convert_reference", recipe);
    let out = dir.join(format!("checkpoint-{recipe}.gguf"));
    let o = convert(checkpoint(), recipe, &[], &out);
    assert!(
        o.status.success(),
        "--recipe {recipe}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
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

/// The worst max|Δlogit| / max|logit| over positions against the original
/// weights' golden (which lists every logit), where it is, and the argmax
/// agreement over all positions.
fn relative_logit_figures(got: &[Vec<f32>], r: &Reference) -> (f64, usize, usize) {
    let (mut worst, mut at, mut agree) = (0f64, 0, 0);
    for (t, row) in got.iter().enumerate() {
        let want = r.logits(t, row.len());
        let scale = want.iter().fold(0f64, |m, x| m.max(x.abs()));
        let d = row
            .iter()
            .zip(&want)
            .fold(0f64, |m, (&a, b)| m.max((a as f64 - b).abs()));
        if d / scale > worst {
            (worst, at) = (d / scale, t);
        }
        agree += (ds4::sampler::argmax(row) == r.argmax[t]) as usize;
    }
    (worst, at, agree)
}

/// The golden is worth comparing with: the run is far from uniform and its
/// argmax moves with the input (the script refuses to write one that is not;
/// this says so where the test runs).
#[test]
fn the_golden_is_not_trivial() {
    let r = Reference::read(golden());
    let v = r.top[0].len() as f64;
    let mut top1: Vec<f64> = r.top.iter().map(|lps| lps[0].1).collect();
    top1.sort_by(f64::total_cmp);
    let median = top1[top1.len() / 2];
    let mut distinct = r.argmax.clone();
    distinct.sort();
    distinct.dedup();
    eprintln!(
        "golden: top-1 log-prob median {median:.3} (uniform {:.3}), {} distinct argmax of {}",
        -v.ln(),
        distinct.len(),
        r.argmax.len()
    );
    assert!(median > -v.ln() + 1.0);
    assert!(distinct.len() * 2 > r.argmax.len());
}

#[test]
fn f32_conversion_matches_the_reference_on_the_original_weights() {
    let g = golden();
    let r = Reference::read(g);
    let vocab = g["checkpoint"]["config"]["vocab_size"].as_u64().unwrap() as usize;
    assert_eq!(g["top_k"].as_u64().unwrap() as usize, vocab, "every logit");
    let got = engine_logits(&converted("f32"), &r.ids);
    let (max_dlp, agree, checked) = log_prob_figures(&got, &r);
    let (rel, at, _) = relative_logit_figures(&got, &r);
    eprintln!(
        "f32: max |Δ log-prob| {max_dlp:.2e} (whole vocabulary, {} positions), \
         max|Δlogit|/max|logit| {rel:.2e} (position {at}), argmax {agree}/{checked}",
        r.ids.len()
    );
    assert!(max_dlp <= MAX_DLP, "f32: max |Δ log-prob| {max_dlp:.2e}");
    assert_eq!(agree, checked, "f32: argmax agreement");
}

#[test]
fn q8_and_mxfp4_conversions_match_the_reference_on_the_rounded_and_the_original_weights() {
    let original = Reference::read(golden());
    for (recipe, file) in RECIPE_GOLDENS {
        let g = load(file);
        assert_eq!(
            g["checkpoint"],
            golden()["checkpoint"],
            "{file} and {GOLDEN} name the same checkpoint"
        );
        let r = Reference::read(&g);
        assert_eq!(r.ids, original.ids);
        let got = engine_logits(&converted(recipe), &r.ids);
        let (max_dlp, agree, checked) = log_prob_figures(&got, &r);
        let (rel, at, agree_all) = relative_logit_figures(&got, &original);
        let (dlp_orig, _, _) = log_prob_figures(&got, &original);
        eprintln!(
            "{recipe}: against the rounded weights max |Δ log-prob| {max_dlp:.2e} (top 20), \
             argmax {agree}/{checked}; against the original weights max|Δlogit|/max|logit| \
             {rel:.2e} (position {at}), max |Δ log-prob| {dlp_orig:.2e}, argmax {agree_all}/{}",
            r.ids.len()
        );
        assert!(
            max_dlp <= MAX_DLP,
            "{recipe}: max |Δ log-prob| {max_dlp:.2e} against the reference on the weights \
             rounded as the recipe stores them"
        );
        assert_eq!(agree, checked, "{recipe}: argmax agreement");
        assert!(
            rel < QUANT_REL_LOGIT,
            "{recipe}: max|Δlogit| / max|logit| {rel:.3e} at position {at} against the \
             original weights"
        );
    }
}
