//! `ds4 --imatrix-dataset TEXT --imatrix-out FILE`: importance-matrix
//! collection in the engine (issue 37; docs/TOOLS.md § Collecting an
//! imatrix), written in llama.cpp's imatrix GGUF format
//! ([`crate::convert::imatrix`]).
//!
//! The dataset is tokenized whole and cut into chunks of `chunk` tokens
//! (the first of each replaced by BOS, as llama-imatrix does); each chunk
//! is scored from an empty state on the session's backend with the
//! [`Collector`] as the session's step observer. After every step the
//! collector reads the kept inputs of
//!
//! * every `MatMul` op (every dense projection, the grouped low-rank output
//!   projection, the compressors' and the indexer's projections, the HC
//!   mixes, the shared expert, the router and the output head): per input
//!   column Σ x² over the step's activation rows, and the row count. A
//!   grouped product (`groups > 1`, `attn_output_a`) multiplies each group
//!   of weight rows by its own slice of the activation row; its one matrix
//!   gets the slices of all groups summed, and `groups` rows per token;
//! * every `MoeExperts` op: for the gate and up tensors, per expert the
//!   rows of `x` routed to it; for the down tensor, per expert the rows its
//!   down slab multiplies, computed on the host from `x`, the selection and
//!   the route weights by the op's own CPU twin ([`MoeExperts::mid_rows`]:
//!   the route weight multiplied in and, under V4.1's `mid_fp8`, the FP8
//!   round trip). That costs the routed gate and up products once more on
//!   the CPU (reference kernels) per step, whatever the backend.
//!
//! Not collected: products inside other ops (V4.1's compressor of
//! kv-source layers multiplies its pooled latent by `indexer.wk` inside
//! `SourceCompress`; the Engram gate's `q_weight`/`k_weight`).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::convert::imatrix::{Entry, Format, Imatrix};
use crate::gguf::GgufFile;
use crate::graph::ops::matmul::MatMul;
use crate::graph::ops::moe::{MoeExperts, SlabSource};
use crate::graph::ops::Op;
use crate::graph::{Graph, ValueId, ValueName};
use crate::model::AnyModel;
use crate::session::{ObservedStep, Observer, Session, SessionError, SessionOptions, StepObserver};
use crate::tokenizer::Tokenizer;

/// Tokens per chunk by default (llama-imatrix's `-c 512`).
pub const DEFAULT_CHUNK: usize = 512;

/// One weight tensor's sums while collecting (f64 within a step, f32
/// across steps, as llama-imatrix keeps them).
#[derive(Clone, Debug)]
struct Sums {
    n_cols: usize,
    in_sum2: Vec<f32>,
    counts: Vec<f32>,
}

impl Sums {
    fn new(n_cols: usize, n_mat: usize) -> Sums {
        Sums {
            n_cols,
            in_sum2: vec![0.0; n_cols * n_mat],
            counts: vec![0.0; n_mat],
        }
    }

    /// Adds `rows` (`k × n_cols`) to matrix `m`.
    fn add(&mut self, m: usize, rows: &[f32]) {
        let n = self.n_cols;
        let mut acc = vec![0f64; n];
        for r in rows.chunks_exact(n) {
            for (a, &x) in acc.iter_mut().zip(r) {
                *a += (x as f64) * (x as f64);
            }
        }
        for (s, a) in self.in_sum2[m * n..(m + 1) * n].iter_mut().zip(acc) {
            *s += a as f32;
        }
        self.counts[m] += (rows.len() / n.max(1)) as f32;
    }
}

/// The step observer that sums the activations of every weight matrix.
pub struct Collector {
    file: Arc<dyn AsRef<GgufFile> + Send + Sync>,
    sums: BTreeMap<String, Sums>,
    /// Weights whose input value cannot be named uniquely in the graph
    /// (so it cannot be kept by name): reported, not collected.
    skipped: Vec<String>,
    /// Steps that were summed.
    pub steps: usize,
}

/// Whether `probe` computes logits at every row (a scoring graph, not a
/// speculative verify graph): the graphs the collector keeps values in.
fn scoring_graph(probe: &Graph) -> bool {
    probe.value(probe.logits).per_token && !probe.decode_paths
}

/// `v`'s name, when it names `v` and no earlier value.
fn unique_name(g: &Graph, v: ValueId) -> Option<ValueName> {
    let name = g.value(v).name.clone();
    (g.find(&name) == Some(v)).then_some(name)
}

impl Collector {
    pub fn new(file: Arc<dyn AsRef<GgufFile> + Send + Sync>) -> Collector {
        Collector {
            file,
            sums: BTreeMap::new(),
            skipped: Vec::new(),
            steps: 0,
        }
    }

    /// Weights not collected (their input has no unique name), sorted.
    pub fn skipped(&self) -> &[String] {
        &self.skipped
    }

    /// The sums as an imatrix of `chunks` chunks of `chunk` tokens over
    /// `dataset`.
    pub fn imatrix(&self, dataset: &str, chunks: usize, chunk: usize) -> Imatrix {
        let entries = self
            .sums
            .iter()
            .map(|(name, s)| {
                (
                    name.clone(),
                    Entry::new(s.n_cols, s.in_sum2.clone(), s.counts.clone()),
                )
            })
            .collect();
        Imatrix {
            format: Format::Gguf,
            datasets: vec![dataset.to_string()],
            chunk_count: chunks as u32,
            chunk_size: chunk as u32,
            entries,
        }
    }

    fn sums(&mut self, name: &str, n_cols: usize, n_mat: usize) -> &mut Sums {
        self.sums
            .entry(name.to_string())
            .or_insert_with(|| Sums::new(n_cols, n_mat))
    }

    fn dense(&mut self, step: &ObservedStep<'_>, op: &MatMul) -> Result<(), SessionError> {
        let (n_in, groups) = (op.in_dim(), op.groups.max(1));
        let rows = op.rows.at(step.n());
        let x = step.read(op.x)?;
        let want = rows * groups * n_in;
        if x.len() < want {
            return Err(SessionError::Observer(format!(
                "imatrix: {}: {} input values read, {want} expected",
                op.w.name,
                x.len()
            )));
        }
        // Every group's slice is one activation row of the weight's columns.
        self.sums(&op.w.name, n_in, 1).add(0, &x[..want]);
        Ok(())
    }

    fn experts(&mut self, step: &ObservedStep<'_>, op: &MoeExperts) -> Result<(), SessionError> {
        let n = step.n();
        let (dims, k) = (op.dims(), op.k);
        let (d, ff) = (dims.dim, dims.hidden);
        let x = step.read(op.x)?;
        let sel = step.read(op.selected)?;
        let w = step.read(op.weights)?;
        if x.len() < n * d || sel.len() < n * k || w.len() < n * k {
            return Err(SessionError::Observer(format!(
                "imatrix: {}: short expert inputs",
                op.gate.name
            )));
        }
        let file = self.file.clone();
        let src = SlabSource::File((*file).as_ref());
        let sel: Vec<i32> = sel[..n * k].iter().map(|&s| s as i32).collect();
        for e in 0..dims.n_expert {
            let users = op.users(&sel, n, e);
            if users.is_empty() {
                continue;
            }
            let mut xs = Vec::with_capacity(users.len() * d);
            for &i in &users {
                let t = i / k;
                xs.extend_from_slice(&x[t * d..(t + 1) * d]);
            }
            let wts: Vec<f32> = users.iter().map(|&i| w[i]).collect();
            self.sums(&op.gate.name, d, dims.n_expert).add(e, &xs);
            self.sums(&op.up.name, d, dims.n_expert).add(e, &xs);
            let mid = op.mid_rows(src, e, &xs, &wts);
            self.sums(&op.down.name, ff, dims.n_expert).add(e, &mid);
        }
        Ok(())
    }
}

impl StepObserver for Collector {
    fn targets(&self, probe: &Graph) -> Vec<ValueName> {
        if !scoring_graph(probe) {
            return Vec::new();
        }
        let mut keep = Vec::new();
        for op in probe.ops() {
            let inputs = match op {
                Op::MatMul(m) => vec![m.x],
                Op::MoeExperts(m) => vec![m.x, m.selected, m.weights],
                _ => continue,
            };
            for v in inputs {
                if let Some(name) = unique_name(probe, v) {
                    keep.push(name);
                }
            }
        }
        keep
    }

    fn observe(&mut self, step: &ObservedStep<'_>) -> Result<(), SessionError> {
        let g = step.graph();
        if !scoring_graph(g) {
            return Ok(());
        }
        let mut summed = false;
        for op in g.ops() {
            match op {
                Op::MatMul(m) if step.kept(m.x) => self.dense(step, m)?,
                Op::MoeExperts(m) if [m.x, m.selected, m.weights].iter().all(|&v| step.kept(v)) => {
                    self.experts(step, m)?
                }
                Op::MatMul(MatMul { w, .. }) | Op::MoeExperts(MoeExperts { gate: w, .. }) => {
                    if !self.skipped.contains(&w.name) {
                        self.skipped.push(w.name.clone());
                        self.skipped.sort();
                    }
                    continue;
                }
                _ => continue,
            }
            summed = true;
        }
        self.steps += usize::from(summed);
        Ok(())
    }
}

/// What one chunk gave.
#[derive(Clone, Copy, Debug)]
pub struct ChunkDone {
    /// Chunks done, of `total`.
    pub done: usize,
    pub total: usize,
    /// Perplexity of the chunk's second half (llama-imatrix's measure).
    pub ppl: f64,
    pub seconds: f64,
}

/// What a collection gave.
pub struct Collected {
    pub imatrix: Imatrix,
    /// Weights not collected ([`Collector::skipped`]).
    pub skipped: Vec<String>,
    /// Chunks run.
    pub chunks: usize,
}

/// The dataset's chunks: `text` tokenized, cut into `chunk`-token pieces
/// (at most `max_chunks`), the first token of each replaced by BOS.
pub fn chunks(
    tok: &Tokenizer,
    text: &str,
    chunk: usize,
    max_chunks: Option<usize>,
) -> Result<(usize, Vec<Vec<u32>>), String> {
    if chunk < 2 {
        return Err(format!(
            "--imatrix-chunk must be at least 2 tokens, got {chunk}"
        ));
    }
    if max_chunks == Some(0) {
        return Err("--imatrix-chunks must be at least 1".into());
    }
    let ids = tok.encode_plain(text);
    let n = (ids.len() / chunk).min(max_chunks.unwrap_or(usize::MAX));
    if n == 0 {
        return Err(format!(
            "the dataset has {} tokens, fewer than one chunk of {chunk} (use a longer text or a smaller --imatrix-chunk)",
            ids.len()
        ));
    }
    let bos = tok.specials().bos;
    let out = (0..n)
        .map(|c| {
            let mut v = ids[c * chunk..(c + 1) * chunk].to_vec();
            v[0] = bos;
            v
        })
        .collect();
    Ok((ids.len(), out))
}

/// Perplexity of `tokens[first+1..]` under `logits` (`tokens.len() × vocab`).
fn chunk_ppl(logits: &[f32], tokens: &[u32], vocab: usize) -> f64 {
    let first = tokens.len() / 2;
    let mut nll = 0f64;
    let mut count = 0usize;
    for t in first..tokens.len() - 1 {
        let row = &logits[t * vocab..(t + 1) * vocab];
        let m = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
        let lse = m + row.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln();
        nll += lse - row[tokens[t + 1] as usize] as f64;
        count += 1;
    }
    (nll / count.max(1) as f64).exp()
}

/// Collects the imatrix of `chunks` (from [`chunks`]) on a session of
/// `model` opened as `base` says (backend, numerics; the context and
/// prefill chunk are set to the chunk size). `progress` is called after
/// each chunk.
pub fn collect(
    model: &AnyModel,
    base: SessionOptions,
    dataset: &str,
    chunks: &[Vec<u32>],
    progress: &mut dyn FnMut(ChunkDone),
) -> Result<Collected, String> {
    let chunk = chunks.first().map_or(0, Vec::len);
    if chunk < 2 || chunks.iter().any(|c| c.len() != chunk) {
        return Err("imatrix: chunks of at least 2 tokens, all of one length, are needed".into());
    }
    let collector = Arc::new(Mutex::new(Collector::new(model.weight_file())));
    let opts = SessionOptions {
        ctx: chunk,
        prefill_chunk: chunk,
        observer: Some(Observer(collector.clone())),
        ..base
    };
    let mut sess = Session::open_any(model, opts).map_err(|e| e.to_string())?;
    let vocab = sess.n_vocab();
    for (i, c) in chunks.iter().enumerate() {
        let t0 = Instant::now();
        let logits = sess.score(c).map_err(|e| format!("chunk {}: {e}", i + 1))?;
        progress(ChunkDone {
            done: i + 1,
            total: chunks.len(),
            ppl: chunk_ppl(&logits, c, vocab),
            seconds: t0.elapsed().as_secs_f64(),
        });
    }
    drop(sess);
    let col = collector
        .lock()
        .map_err(|_| "the imatrix collector panicked".to_string())?;
    Ok(Collected {
        imatrix: col.imatrix(dataset, chunks.len(), chunk),
        skipped: col.skipped().to_vec(),
        chunks: chunks.len(),
    })
}

/// Checks before any work that `out` can be written: its folder exists and
/// takes a new file (a probe file, removed at once).
pub fn check_out(out: &Path) -> Result<(), String> {
    let dir = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    if out.is_dir() {
        return Err(format!("--imatrix-out {}: is a directory", out.display()));
    }
    let probe = dir.join(format!(
        ".{}.probe-{}",
        out.file_name()
            .map_or("imatrix".into(), |n| n.to_string_lossy()),
        std::process::id()
    ));
    std::fs::write(&probe, b"")
        .map_err(|e| format!("--imatrix-out {}: cannot write there: {e}", out.display()))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}
