//! The long-context figures of docs/VALIDATION.md (issue 16), not a CI
//! test: max |Δ log-prob| of a backend against `cpu-ref` on the long-context
//! test model (`DS4_LONG_VARIANT`: f32, the default, or q8; plain numerics) after prompts of `DS4_LONG_LENGTHS`
//! tokens (default 1024,3072,8192) prefilled in the default 2,048-token
//! steps, at the prompt's last position and over 4 decoded tokens; also the
//! share of positions of the last prefill step where the indexer of layer 2
//! and 4 chose other rows than cpu-ref's.
//!
//! ```text
//! DS4_LONG_BACKEND=wgpu cargo test --release --test long_context_figures -- --ignored --nocapture
//! DS4_LONG_BACKEND=wgpu DS4_WGPU_FEATURES=all cargo test ...   (subgroup kernels)
//! DS4_LONG_BACKEND=cpu cargo test ...                          (the fast CPU backend)
//! ```

mod common;
use common::{long_context_model_of, max_dlogprob, tokens};

use ds4::backend::{BackendKind, BackendOptions};
use ds4::graph::ValueName;
use ds4::model::forward::Numerics;
use ds4::session::{Session, SessionOptions};
use ds4::testmodel::Variant;

#[test]
#[ignore]
fn long_context_figures() {
    let backend = match std::env::var("DS4_LONG_BACKEND").as_deref() {
        Ok("cpu") => BackendKind::Cpu,
        Ok("cuda") => BackendKind::Cuda,
        _ => BackendKind::Wgpu,
    };
    let lengths: Vec<usize> = std::env::var("DS4_LONG_LENGTHS")
        .unwrap_or_else(|_| "1024,3072,8192".into())
        .split(',')
        .map(|x| x.trim().parse().unwrap())
        .collect();
    let variant = match std::env::var("DS4_LONG_VARIANT").as_deref() {
        Ok("q8") => Variant::Q8,
        _ => Variant::F32,
    };
    let model = long_context_model_of(variant);
    let sel: Vec<ValueName> = [2, 4]
        .iter()
        .map(|l| ValueName::parse(&format!("index_selected@{l}")).unwrap())
        .collect();
    for &n in &lengths {
        let toks = tokens(n + 4, 16);
        let open = |k| {
            let opts = SessionOptions {
                ctx: n + 4,
                prefill_chunk: 2048,
                numerics: Numerics::Plain,
                backend: k,
                dump: sel.clone(),
                backend_options: BackendOptions::from_env(),
                ..Default::default()
            };
            Session::new(model.clone(), opts).unwrap()
        };
        let (mut r, mut b) = (open(BackendKind::CpuRef), open(backend));
        let t = std::time::Instant::now();
        r.sync(&toks[..n], &mut |_, _| {}).unwrap();
        let t_ref = t.elapsed();
        let t = std::time::Instant::now();
        b.sync(&toks[..n], &mut |_, _| {}).unwrap();
        let t_b = t.elapsed();
        let mut differ = 0;
        let mut total = 0;
        for v in &sel {
            let (x, y) = (r.dump(v).unwrap(), b.dump(v).unwrap());
            for (p, q) in x.chunks(64).zip(y.chunks(64)) {
                total += 1;
                differ += (p != q) as usize;
            }
        }
        let vocab = r.n_vocab();
        let prompt = max_dlogprob(b.logits(), r.logits(), vocab);
        let mut worst = prompt;
        for &t in &toks[n..] {
            r.eval(t).unwrap();
            b.eval(t).unwrap();
            worst = worst.max(max_dlogprob(b.logits(), r.logits(), vocab));
        }
        eprintln!(
            "{backend:?} {variant:?} {} tokens: max |Δ log-prob| last prompt position {prompt:e}, with 4 decoded {worst:e}; \
             indexer choices differing in the last prefill step {differ}/{total}; time cpu-ref {t_ref:?}, {backend:?} {t_b:?}",
            n
        );
    }
}
