//! SSD streaming exactness (docs/SSD_STREAMING.md): routed experts read
//! from the GGUF into a cache of a few slots per layer give logits
//! bit-identical to the same backend with every expert resident, and the
//! same greedy tokens, so that eviction runs at every step and a prefill
//! chunk selects more experts than there are slots. tests/ssd_streaming.rs
//! and `ds4-bench --check` run these.

use std::sync::Arc;

use crate::backend::options::{CacheBudget, EvictionPolicy, StreamingOptions};
use crate::backend::BackendOptions;
use crate::model::ModelFile;
use crate::session::{Session, SessionError, SessionOptions};

/// The exactness set-ups for `k` experts per token, hardest first: `k`
/// slots LRU, cold, with read-ahead (every step evicts); `k + 1` slots LFU,
/// cold, one layer whole, no read-ahead; `k + 1` slots LRU, preloaded, with
/// read-ahead. Three reader threads each.
pub fn streaming_cases(k: usize) -> [StreamingOptions; 3] {
    let case = |slots, policy, prefetch, full_layers, cold| StreamingOptions {
        budget: CacheBudget::Experts(slots),
        full_layers,
        cold,
        policy,
        prefetch,
        read_threads: 3,
        ..StreamingOptions::default()
    };
    [
        case(k, EvictionPolicy::Lru, true, 0, true),
        case(k + 1, EvictionPolicy::Lfu, false, 1, true),
        case(k + 1, EvictionPolicy::Lru, true, 0, false),
    ]
}

/// The slot count of a [`streaming_cases`] set-up (`None`: a byte budget).
pub fn case_slots(o: &StreamingOptions) -> Option<usize> {
    match o.budget {
        CacheBudget::Experts(n) => Some(n),
        CacheBudget::Bytes(_) => None,
    }
}

/// `opts` with routed experts streamed as `o` says.
pub fn streaming(o: StreamingOptions, opts: &BackendOptions) -> BackendOptions {
    BackendOptions {
        ssd_streaming: Some(o),
        ..opts.clone()
    }
}

/// Session options of the streaming runs: context 128, prefill chunks of 7
/// (a chunk selects more experts than the smallest cache has slots).
pub fn options(
    backend: crate::backend::BackendKind,
    backend_options: BackendOptions,
) -> SessionOptions {
    SessionOptions {
        ctx: 128,
        prefill_chunk: 7,
        numerics: crate::model::forward::Numerics::Model,
        backend,
        backend_options,
        ..Default::default()
    }
}

/// Every logits row of a chunked prefill, then greedy decode: (rows,
/// tokens). The first few tokens one by one (the decode graph), then
/// chunks.
pub fn run(
    s: &mut Session,
    prompt: &[u32],
    decode: usize,
) -> Result<(Vec<Vec<f32>>, Vec<u32>), SessionError> {
    let mut rows = Vec::new();
    for i in 1..=prompt.len() {
        if i <= 3 || i == prompt.len() || i % 5 == 0 {
            s.sync(&prompt[..i], &mut |_, _| {})?;
            rows.push(s.logits().to_vec());
        }
    }
    let mut out = Vec::new();
    for _ in 0..decode {
        let next = crate::sampler::argmax(s.logits()) as u32;
        out.push(next);
        s.eval(next)?;
        rows.push(s.logits().to_vec());
    }
    Ok((rows, out))
}

/// The rows as bit patterns (bit-for-bit comparisons).
pub fn bits(rows: &[Vec<f32>]) -> Vec<Vec<u32>> {
    rows.iter()
        .map(|r| r.iter().map(|x| x.to_bits()).collect())
        .collect()
}

/// `prompt` then `decode` greedy tokens on `opts` with every expert
/// resident, then with each of `cases` streamed: the same greedy tokens and
/// bit-identical logits, the cache having missed, hit and (with
/// read-ahead) read ahead. One line per case with the cache's counters.
pub fn check_exact(
    model: &Arc<ModelFile>,
    opts: &SessionOptions,
    prompt: &[u32],
    decode: usize,
    cases: &[StreamingOptions],
) -> Result<Vec<String>, String> {
    let e = |e: SessionError| e.to_string();
    let backend = opts.backend;
    let mut resident = Session::new(model.clone(), opts.clone()).map_err(e)?;
    let (want, want_out) = run(&mut resident, prompt, decode).map_err(e)?;
    drop(resident);
    let mut lines = Vec::new();
    for o in cases {
        let slots = case_slots(o).map_or("a byte budget".into(), |n| format!("{n} slots"));
        let what = format!(
            "{backend:?} {slots} {:?} prefetch {} cold {}",
            o.policy, o.prefetch, o.cold
        );
        let so = SessionOptions {
            backend_options: streaming(o.clone(), &opts.backend_options),
            ..opts.clone()
        };
        let mut s = Session::new(model.clone(), so).map_err(|x| format!("{what}: {x}"))?;
        let cache = s
            .expert_cache()
            .ok_or_else(|| format!("{what}: a streaming backend without a cache"))?;
        let (got, out) = run(&mut s, prompt, decode).map_err(|x| format!("{what}: {x}"))?;
        if out != want_out {
            return Err(format!(
                "{what}: greedy output {out:?}, resident {want_out:?}"
            ));
        }
        if bits(&got) != bits(&want) {
            return Err(format!("{what}: logits differ from the resident run"));
        }
        let st = cache.stats();
        if st.misses == 0 || st.hits == 0 || st.bytes_read == 0 || st.lookups != st.hits + st.misses
        {
            return Err(format!("{what}: the cache did not evict: {st:?}"));
        }
        if o.prefetch && st.prefetch_reads == 0 {
            return Err(format!("{what}: the hash layers did not read ahead"));
        }
        lines.push(format!("{what}: {}", st.line()));
    }
    Ok(lines)
}
