//! What the V4.1 golden tests share: the committed goldens, the tiny model
//! they were made from, the float64 log-softmax they are compared in, and
//! the comparison under `--numerics model` (tests/v41_model_numerics.rs
//! explains its bounds).

use std::path::PathBuf;
use std::sync::Arc;

use ds4::backend::{self, Backend, BackendError, BackendKind, BackendOptions, GraphHandle};
use ds4::graph::{Graph, StepParams, ValueName};
use ds4::model::forward::Numerics;
use ds4::model::logits::Logits;
use ds4::model::v41::forward::{record, V41ForwardOptions, V41KvLayout};
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

/// The values the choice checks read: every index source's
/// `index_selected` and the candidate source's `candidate_blocks`.
pub fn keep_names(m: &V41ModelFile) -> Vec<ValueName> {
    let mut v: Vec<ValueName> = m
        .config
        .index_source_layers
        .iter()
        .map(|&l| ValueName {
            name: "index_selected".into(),
            layer: Some(l),
        })
        .collect();
    v.push(ValueName {
        name: "candidate_blocks".into(),
        layer: m.config.candidate_source,
    });
    v
}

/// Forward options with the logits of every position.
pub fn forward_options(
    numerics: Numerics,
    keep: Vec<ValueName>,
    engram_from_host: bool,
) -> V41ForwardOptions {
    V41ForwardOptions {
        numerics,
        logits: Logits::All,
        keep,
        engram_from_host,
    }
}

/// Opens backend `kind` on `m` with `kv`'s state layout.
pub fn try_open(
    kind: BackendKind,
    m: &Arc<V41ModelFile>,
    kv: &V41KvLayout,
) -> Result<Box<dyn Backend>, BackendError> {
    backend::open(
        kind,
        m.clone(),
        kv.layout.clone(),
        &BackendOptions::default(),
    )
    .map(|o| o.backend)
}

/// Backend `kind` on `m` with the graph of `opts` in steps of `step`
/// recorded and loaded.
pub fn load(
    kind: BackendKind,
    m: &Arc<V41ModelFile>,
    kv: &V41KvLayout,
    step: usize,
    opts: &V41ForwardOptions,
) -> (Box<dyn Backend>, Arc<Graph>, GraphHandle) {
    let g = Arc::new(record(&m.config, &m.weights, kv, step, opts));
    let mut b = try_open(kind, m, kv).unwrap();
    let h = b.load_graph(g.clone()).unwrap();
    (b, g, h)
}

/// Runs the step of `tokens` at `pos0` and reads its logits.
pub fn step_logits(
    b: &mut dyn Backend,
    h: GraphHandle,
    g: &Graph,
    tokens: &[u32],
    pos0: usize,
) -> Vec<f32> {
    let p = StepParams {
        pos0,
        n_tokens: tokens.len(),
    };
    b.run(h, tokens, p).unwrap();
    b.read_value(h, g.logits).unwrap()
}

/// The first index of a row's largest logit (a NaN never wins).
pub fn first_argmax(row: &[f32]) -> usize {
    row.iter()
        .enumerate()
        .fold(
            (0, f32::NEG_INFINITY),
            |a, (k, &x)| if x > a.1 { (k, x) } else { a },
        )
        .0
}

/// |Δ log-prob| of each id the golden prompt `p` lists at position `t`,
/// `lp` being that position's log-probabilities.
pub fn top_dlogprobs<'a>(p: &'a Value, t: usize, lp: &'a [f64]) -> impl Iterator<Item = f64> + 'a {
    p["top_ids"][t]
        .as_array()
        .unwrap()
        .iter()
        .zip(p["top_logprobs"][t].as_array().unwrap())
        .map(|(id, want)| (lp[id.as_u64().unwrap() as usize] - want.as_f64().unwrap()).abs())
}

/// The largest |Δ log-prob| over the golden's listed ids, per position.
pub fn worst_per_position(p: &Value, logits: &[Vec<f32>]) -> Vec<f64> {
    assert_eq!(logits.len(), p["top_ids"].as_array().unwrap().len());
    logits
        .iter()
        .enumerate()
        .map(|(t, row)| top_dlogprobs(p, t, &log_softmax(row)).fold(0.0, f64::max))
        .collect()
}

/// The index source `layer`'s top-k rows per position against the golden
/// prompt `p`'s; `label` names the run.
pub fn check_topk(p: &Value, layer: usize, per_pos: &[Vec<i32>], label: &str) {
    let want = &p["topk"][layer.to_string()];
    for (t, row) in per_pos.iter().enumerate() {
        let w: Vec<i32> = want[t]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_i64().unwrap() as i32)
            .collect();
        assert_eq!(row, &w, "{label}: layer {layer} top-k at position {t}");
    }
}

/// The rows of the candidate source `layer`'s kept blocks per position
/// against the golden prompt `p`'s (every row of a kept block up to the
/// prompt's compressed length); `label` names the run.
pub fn check_candidate_rows(
    m: &V41ModelFile,
    p: &Value,
    layer: usize,
    per_pos: &[Vec<i32>],
    label: &str,
) {
    let bs = m.config.candidate_block_size;
    let n_rows = ids_of(p).len() / m.config.compress_ratios[layer];
    for (t, blocks) in per_pos.iter().enumerate() {
        let rows: Vec<i64> = blocks
            .iter()
            .filter(|&&b| b >= 0)
            .flat_map(|&b| b as usize * bs..((b as usize + 1) * bs).min(n_rows))
            .map(|r| r as i64)
            .collect();
        let want: Vec<i64> = p["candidates"][layer.to_string()][t]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_i64().unwrap())
            .collect();
        assert_eq!(rows, want, "{label}: candidate rows at position {t}");
    }
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
    let top_ids = p["top_ids"].as_array().unwrap();
    let (argmax, margin) = (
        p["argmax"].as_array().unwrap(),
        p["margin"].as_array().unwrap(),
    );
    assert_eq!(logits.len(), top_ids.len());
    let mut d = Vec::new();
    let (mut agree, mut checked) = (0, 0);
    let mut first = None;
    for (t, row) in logits.iter().enumerate() {
        for x in top_dlogprobs(p, t, &log_softmax(row)) {
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
