//! What the speculative-decoding tests share: a generation run recorded
//! whole (tokens, streamed bytes, final logits, target states), and the
//! check of a draft model's logits against a float64 golden.

use ds4::backend::{BackendKind, BackendOptions};
use ds4::generate::{self, Finish, Observer, Sampled, Step};
use ds4::model::forward::Numerics;
use ds4::model::AnyModel;
use ds4::sampler::{Rng, SamplerConfig};
use ds4::session::{DraftModel, Session, SessionOptions};
use ds4::speculate::draft_model::ModelDrafter;
use ds4::speculate::{Policy, Speculator};
use ds4::tokenizer::Tokenizer;

/// The streamed tokens and bytes of a run.
#[derive(Default)]
pub struct Rec {
    pub ids: Vec<u32>,
    pub bytes: Vec<u8>,
}

impl Observer for Rec {
    fn greedy_next(&mut self) -> bool {
        false
    }
    fn token(&mut self, id: u32, bytes: &[u8]) -> Step {
        self.ids.push(id);
        self.bytes.extend_from_slice(bytes);
        Step::Continue
    }
}

pub struct Run {
    pub tokens: Vec<u32>,
    pub finish: Finish,
    pub rec: Rec,
    pub logits: Vec<f32>,
    /// The first `target_states` state buffers (a draft model's rings,
    /// last in the layout, left out).
    pub states: Vec<Vec<f32>>,
}

/// The drafter tests' session on `backend` (opened as the environment
/// says): context 256, prefill in chunks of 16, model numerics, drafting
/// with `drafter` (none: plain decoding).
pub fn opts(backend: BackendKind, drafter: Option<DraftModel>) -> SessionOptions {
    SessionOptions {
        ctx: 256,
        prefill_chunk: 16,
        numerics: Numerics::Model,
        backend,
        backend_options: BackendOptions::from_env(),
        drafter: drafter.unwrap_or(DraftModel::None),
        ..Default::default()
    }
}

/// [`opts`] as the float64 goldens were computed: cpu-ref, plain numerics,
/// a 40-token prompt in one prefill step.
pub fn golden_opts(drafter: Option<DraftModel>) -> SessionOptions {
    SessionOptions {
        numerics: Numerics::Plain,
        prefill_chunk: 64,
        ..opts(BackendKind::CpuRef, drafter)
    }
}

/// How many state buffers `model`'s target has under `o` without a drafter
/// (a drafter's rings come after them in the layout).
pub fn n_target_states(model: &AnyModel, o: &SessionOptions) -> usize {
    let plain = SessionOptions {
        drafter: DraftModel::None,
        ..o.clone()
    };
    Session::open_any(model, plain)
        .unwrap()
        .read_states()
        .unwrap()
        .len()
}

/// A drafter golden `<base>.json` and the prompt ids it lists.
pub fn read_golden(base: &str) -> (serde_json::Value, Vec<u32>) {
    let g: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{base}.json")).unwrap()).unwrap();
    let ids = super::json_uints(&g["ids"])
        .iter()
        .map(|&i| i as u32)
        .collect();
    (g, ids)
}

/// A file of little-endian f32s (a golden's committed inputs).
pub fn read_f32s(path: &str) -> Vec<f32> {
    std::fs::read(path)
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// `xs` as little-endian bytes, the format [`read_f32s`] reads.
pub fn f32_bytes(xs: &[f32]) -> Vec<u8> {
    xs.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A run with drafts equals the plain run: tokens, streamed ids and bytes,
/// final logits, every target state buffer.
pub fn assert_same_run(plain: &Run, got: &Run, what: &str) {
    assert_eq!(plain.tokens, got.tokens, "{what}: tokens");
    assert_eq!(plain.rec.ids, got.rec.ids, "{what}: streamed ids");
    assert_eq!(plain.rec.bytes, got.rec.bytes, "{what}: streamed bytes");
    assert!(plain.logits == got.logits, "{what}: final logits");
    assert!(plain.states == got.states, "{what}: target state");
}

/// CUDA (`installed`: the driver, or the host emulator of tests/cuda_emu)
/// agrees with cpu-ref on the draft logits after `prompt` and token 7
/// within f32 noise (1e-4); `open` opens a drafter session on a backend.
/// Returns the CUDA session, synced on `prompt`.
pub fn cuda_draft_logits_match(
    installed: Result<String, String>,
    open: &dyn Fn(BackendKind) -> Session,
    prompt: &[u32],
) -> Session {
    match installed {
        Ok(d) => eprintln!("cuda on {d}"),
        Err(e) => panic!("no CUDA driver or emulator: {e}"),
    }
    let mut r = open(BackendKind::CpuRef);
    r.sync(prompt, &mut |_, _| {}).unwrap();
    let reference = r.draft_logits(7).unwrap();
    let mut s = open(BackendKind::Cuda);
    s.sync(prompt, &mut |_, _| {}).unwrap();
    let d = super::max_abs_diff(&reference, &s.draft_logits(7).unwrap());
    eprintln!("cuda: max |Δlogit| {d}");
    assert!(d < 1e-4, "max |Δlogit| {d}");
    s
}

/// At each of the golden `g`'s `n` checkpoints P: `s`, reset and holding
/// `ids[..=P]`, drafts after `ids[P+1]` a first row whose top-20 log-probs
/// are the golden's within 1e-4 (`label(P)` names it), then `more(s, P,
/// checkpoint)` checks what else the golden holds.
pub fn check_checkpoints(
    s: &mut Session,
    ids: &[u32],
    g: &serde_json::Value,
    n: usize,
    label: &dyn Fn(usize) -> String,
    more: &mut dyn FnMut(&mut Session, usize, &serde_json::Value),
) {
    let cps = g["checkpoints"].as_array().unwrap();
    assert_eq!(cps.len(), n);
    for cp in cps {
        let p = cp["position"].as_u64().unwrap() as usize;
        s.reset();
        s.sync(&ids[..=p], &mut |_, _| {}).unwrap();
        let logits = s.draft_logits(ids[p + 1]).unwrap();
        let what = label(p);
        let worst = check_top_logprobs(&logits, cp, 1e-4, &what);
        eprintln!("{what}: max |Δ log-prob| over the top 20 {worst:.2e}");
        more(s, p, cp);
    }
}

/// `n` tokens after `prompt` from a reset session, at `temperature` (seeded),
/// with `spec` drafting if given.
pub fn run_n(
    s: &mut Session,
    tok: &Tokenizer,
    prompt: &[u32],
    n: usize,
    temperature: f32,
    spec: Option<&mut Speculator>,
    target_states: usize,
) -> Run {
    s.reset();
    s.sync(prompt, &mut |_, _| {}).unwrap();
    let mut picker = Sampled {
        cfg: SamplerConfig {
            temperature,
            ..SamplerConfig::default()
        },
        rng: Rng::new(0x3a7),
    };
    let mut rec = Rec::default();
    let out = generate::generate_with(s, tok, n, &mut picker, &mut rec, spec).unwrap();
    let mut states = s.read_states().unwrap();
    states.truncate(target_states);
    Run {
        tokens: out.tokens,
        finish: out.finish,
        rec,
        logits: s.logits().to_vec(),
        states,
    }
}

/// Checks `logits` against a golden checkpoint's `top_ids` /
/// `top_logprobs` (float64 log-probs) within `tol`, and that their argmax
/// is the golden's; returns the largest difference.
pub fn check_top_logprobs(logits: &[f32], cp: &serde_json::Value, tol: f64, what: &str) -> f64 {
    let lse = super::log_sum_exp(logits);
    let top = super::json_uints(&cp["top_ids"]);
    let want: Vec<f64> = cp["top_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    let mut worst = 0f64;
    for (&i, &w) in top.iter().zip(&want) {
        let got = logits[i] as f64 - lse;
        worst = worst.max((got - w).abs());
        assert!((got - w).abs() < tol, "{what}, id {i}: {got} vs {w}");
    }
    assert_eq!(
        super::argmax(logits) as usize,
        top[0],
        "{what}: first draft"
    );
    worst
}

/// A draft model's lazily caught-up rings (the last window's rows, after
/// verify steps and drafts) give it the logits a session that caught up at
/// every position gives, bit for bit: drafting `k` after each of 50 decoded
/// tokens vs. only at checkpoints. Before any target step there is nothing
/// to draft from. `open` opens a cpu-ref session with the draft model.
pub fn lazy_rings_equal_every_position(open: &dyn Fn() -> Session, k: usize) {
    let prompt = super::tokens(20, 5);
    let (mut every, mut once) = (open(), open());
    every.sync(&prompt, &mut |_, _| {}).unwrap();
    once.sync(&prompt, &mut |_, _| {}).unwrap();
    assert!(matches!(
        open().draft_logits(1),
        Err(ds4::session::SessionError::Speculation(_))
    ));
    for i in 0..50 {
        let t = super::argmax(every.logits());
        every.model_draft(t, k).unwrap();
        every.eval(t).unwrap();
        once.eval(t).unwrap();
        if i % 7 == 6 {
            let next = super::argmax(every.logits());
            let a = every.draft_logits(next).unwrap();
            let b = once.draft_logits(next).unwrap();
            let d = super::max_abs_diff(&a, &b);
            assert!(a == b, "after {} tokens: {d}", i + 1);
        }
    }
}

/// wgpu (lavapipe here; skipped without an adapter) and the fast CPU
/// backend agree with cpu-ref on a draft model's first-row logits after a
/// prompt: the fast CPU within 5e-2 (it quantises activations to 8 bits
/// before its products, docs/NUMERICS.md), wgpu within 1e-4 (f32 like
/// cpu-ref); the first draft agrees unless the reference's top two are
/// closer than the bound tells apart. `open` opens a session on a backend.
pub fn backends_agree_on_draft_logits(
    open: &dyn Fn(BackendKind) -> Result<Session, ds4::session::SessionError>,
) {
    let prompt = super::tokens(36, 3);
    let reference = {
        let mut s = open(BackendKind::CpuRef).unwrap();
        s.sync(&prompt, &mut |_, _| {}).unwrap();
        s.draft_logits(7).unwrap()
    };
    for backend in [BackendKind::Cpu, BackendKind::Wgpu] {
        let mut s = match open(backend) {
            Ok(s) => s,
            Err(e) if backend == BackendKind::Wgpu => {
                eprintln!("skipping wgpu: {e}");
                continue;
            }
            Err(e) => panic!("{e}"),
        };
        s.sync(&prompt, &mut |_, _| {}).unwrap();
        let got = s.draft_logits(7).unwrap();
        let d = super::max_abs_diff(&reference, &got);
        let bound = if backend == BackendKind::Cpu {
            5e-2
        } else {
            1e-4
        };
        eprintln!("{backend:?}: max |Δlogit| {d} (bound {bound})");
        assert!(d < bound, "{backend:?}: max |Δlogit| {d}");
        let mut sorted = reference.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        if sorted[0] - sorted[1] > 2.0 * bound {
            assert_eq!(
                super::argmax(&reference),
                super::argmax(&got),
                "{backend:?}: first draft"
            );
        }
    }
}

/// Greedy generation of `n` tokens after `prompt` with `drafter`'s drafts of 4 at
/// every step equals plain generation (tokens, bytes, final logits, every
/// target state buffer), on `o`'s backend.
fn long_context_equals_plain(
    model: &AnyModel,
    drafter: ModelDrafter,
    o: SessionOptions,
    prompt: &[u32],
    n: usize,
) {
    let tok = Tokenizer::from_gguf(model.file()).unwrap();
    let plain_opts = SessionOptions {
        drafter: DraftModel::None,
        ..o.clone()
    };
    let mut plain = Session::open_any(model, plain_opts).unwrap();
    let n_target = plain.read_states().unwrap().len();
    let want = run_n(&mut plain, &tok, prompt, n, 0.0, None, n_target);
    drop(plain);
    let mut s = Session::open_any(model, o).unwrap();
    let mut spec = Speculator::new(Box::new(drafter), Policy::fixed(4, 4));
    let got = run_n(&mut s, &tok, prompt, n, 0.0, Some(&mut spec), n_target);
    let what = format!("{} prompt tokens", prompt.len());
    assert_eq!(want.tokens, got.tokens, "{what}: tokens");
    assert_eq!(want.rec.bytes, got.rec.bytes, "{what}: streamed bytes");
    assert!(want.logits == got.logits, "{what}: final logits");
    assert!(want.states == got.states, "{what}: target state");
    let st = spec.stats();
    assert!(st.drafted > 0 && st.verify_steps > 0, "{what}: {st:?}");
    eprintln!("{what}: {st:?}");
}

/// Verify steps whose drafted rows cross the first ratio-128 boundary
/// (position 127) and are taken back: a 120-token prompt on the
/// long-context model `model`, 30 tokens decoded with `drafter`'s drafts of
/// 4 (random drafts are rejected, so steps at 123..=127 each write row
/// 127's compression and roll it back), with `o` (its context set here).
pub fn rejections_across_ratio_128(model: &AnyModel, drafter: ModelDrafter, o: SessionOptions) {
    let o = SessionOptions { ctx: 512, ..o };
    long_context_equals_plain(model, drafter, o, &super::tokens(120, 5), 30);
}

/// A 3,000-token prompt on the long-context model `model`, whose indexer
/// selects 64 of ~750 compressed rows, then 60 tokens with `drafter`'s
/// drafts of 4 at every step, with `o` (context and chunk set here).
pub fn long_prompt_equals_plain(model: &AnyModel, drafter: ModelDrafter, o: SessionOptions) {
    let o = SessionOptions {
        ctx: 4096,
        prefill_chunk: 256,
        ..o
    };
    long_context_equals_plain(model, drafter, o, &super::tokens(3000, 9), 60);
}
