//! What the V4.1 golden tests share: the committed goldens, the tiny model
//! they were made from, the float64 log-softmax they are compared in, and
//! the comparison under `--numerics model` (tests/v41_model_numerics.rs
//! explains its bounds).

use std::path::PathBuf;
use std::sync::Arc;

use ds4::model::v41::V41ModelFile;
use serde_json::Value;

/// `tests/golden/<name>`.
pub fn golden(name: &str) -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    serde_json::from_slice(&std::fs::read(p).expect("committed golden")).unwrap()
}

/// The tiny V4.1 model (f32) the goldens were made from, generated once per
/// build tree.
pub fn tiny() -> Arc<V41ModelFile> {
    Arc::new(V41ModelFile::open(super::v41_model_path()).unwrap())
}

/// A golden prompt's token ids.
pub fn ids_of(p: &Value) -> Vec<u32> {
    super::json_uints(&p["ids"])
        .into_iter()
        .map(|x| x as u32)
        .collect()
}

/// Log-probabilities of a logit row, in f64 (the goldens are float64).
pub fn log_softmax(l: &[f32]) -> Vec<f64> {
    let m = l.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let s: f64 = l.iter().map(|&x| (x as f64 - m).exp()).sum();
    l.iter().map(|&x| x as f64 - m - s.ln()).collect()
}

/// Median |Δ log-prob| bound over the reference's top-20 at every
/// position, V4's for model numerics (tests/reference_goldens.rs); measured
/// ≤ 9.2e-8 (16, 64 and 3,000 tokens), against 9e-3 to 2.2e-2 between plain
/// and model numerics.
pub const MEDIAN_BOUND: f64 = 1e-4;
/// Greedy agreement, in percent of the positions whose reference top-2
/// margin is at least 1e-3 (measured ≥ 99.9 %).
pub const GREEDY_PERCENT: usize = 98;

/// The figures of one run against one golden prompt.
#[derive(Debug)]
pub struct Figures {
    /// Positions before the first whose |Δ log-prob| exceeds 1e-4 (V4.1's
    /// plain bound, `selfcheck::e2e::V41_MAX_DLOGPROB`).
    pub prefix: usize,
    /// The largest |Δ log-prob| within that prefix.
    pub prefix_max: f64,
    pub median: f64,
    pub max: f64,
    pub greedy_agree: usize,
    pub greedy_checked: usize,
}

/// One run's logits against one golden prompt under model numerics.
pub fn compare(p: &Value, logits: &[Vec<f32>]) -> Figures {
    let (top_ids, top_lp) = (
        p["top_ids"].as_array().unwrap(),
        p["top_logprobs"].as_array().unwrap(),
    );
    let (argmax, margin) = (
        p["argmax"].as_array().unwrap(),
        p["margin"].as_array().unwrap(),
    );
    assert_eq!(logits.len(), top_ids.len());
    let mut d = Vec::new();
    let (mut agree, mut checked) = (0, 0);
    let mut first = None;
    for (t, row) in logits.iter().enumerate() {
        let lp = log_softmax(row);
        for (id, want) in top_ids[t]
            .as_array()
            .unwrap()
            .iter()
            .zip(top_lp[t].as_array().unwrap())
        {
            let x = (lp[id.as_u64().unwrap() as usize] - want.as_f64().unwrap()).abs();
            if x > 1e-4 && first.is_none() {
                first = Some(t);
            }
            d.push(x);
        }
        if margin[t].as_f64().unwrap() >= 1e-3 {
            checked += 1;
            let got = ds4::sampler::argmax(row) as u64;
            agree += (got == argmax[t].as_u64().unwrap()) as usize;
        }
    }
    let d_unsorted = d.clone();
    d.sort_by(f64::total_cmp);
    let k = top_ids[0].as_array().unwrap().len();
    let prefix = first.unwrap_or(logits.len());
    let prefix_max = d_unsorted[..prefix * k]
        .iter()
        .cloned()
        .fold(0f64, f64::max);
    Figures {
        prefix,
        prefix_max,
        median: d[d.len() / 2],
        max: *d.last().unwrap(),
        greedy_agree: agree,
        greedy_checked: checked,
    }
}

/// The bounds of tests/v41_model_numerics.rs's module doc.
pub fn check_model(what: &str, p: &Value, f: &Figures) {
    let plain = p["plain_vs_model"]["median_abs_dlogprob"].as_f64().unwrap();
    eprintln!(
        "{what}: {} positions agree to {:.1e} before the first flip; median |Δ log-prob| \
         {:.2e} (plain vs model {plain:.2e}), max {:.2e}, greedy {}/{}",
        f.prefix, f.prefix_max, f.median, f.max, f.greedy_agree, f.greedy_checked
    );
    assert!(f.median <= MEDIAN_BOUND, "{what}: median {:.2e}", f.median);
    assert!(
        f.greedy_agree * 100 >= f.greedy_checked * GREEDY_PERCENT,
        "{what}: greedy {}/{}",
        f.greedy_agree,
        f.greedy_checked
    );
}
