//! Speculative decoding with V4 Flash's MTP block (issue 35, MODEL.md §6):
//! the drafts come from the block run on the session's own backend, and
//! whatever it drafts, the output is plain decoding's bit for bit: tokens,
//! streamed bytes, final logits and every target state buffer.
//!
//! The block's own numerics are checked against the transformers
//! reference in `reference_goldens.rs` (`tools/reference/mtp_reference.py`);
//! here, that its lazily caught-up ring equals running it over every
//! position, and that backends agree on its logits.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use common::draft::{
    self, assert_same_run, backends_agree_on_draft_logits, lazy_rings_equal_every_position, run_n,
    Run,
};
use common::{max_abs_diff, tokens};
use ds4::backend::BackendKind;
use ds4::model::{AnyModel, ModelFile};
use ds4::session::{DraftModel, Session, SessionOptions};
use ds4::speculate::draft_model::ModelDrafter;
use ds4::speculate::{Policy, Speculator};
use ds4::testmodel::{write_mtp, TestModelSpec, Variant};
use ds4::tokenizer::Tokenizer;

/// The tiny model of `variant` with its MTP file attached.
/// `tag` names the test (each writes its own copy).
fn model_with_mtp(variant: Variant, tag: &str) -> Arc<ModelFile> {
    let mut m = ModelFile::open(common::tiny_model_path(variant)).unwrap();
    let path = mtp_path(variant, tag);
    m.attach_mtp(&path).unwrap();
    Arc::new(m)
}

fn mtp_path(variant: Variant, tag: &str) -> PathBuf {
    mtp_path_of(&TestModelSpec::tiny(), variant, tag)
}

fn mtp_path_of(spec: &TestModelSpec, variant: Variant, tag: &str) -> PathBuf {
    let dir = common::fresh_dir("mtp", &format!("{tag}-{}", variant.name()));
    let path = dir.join("model.mtp.gguf");
    write_mtp(spec, variant, &path).unwrap();
    path
}

/// The long-context model (ratios 0,0,4,128,4,128, window 128, an
/// indexer keeping 64 rows) in f32 with its MTP file attached.
fn long_context_with_mtp(tag: &str) -> AnyModel {
    let path = common::models().long_context_path(Variant::F32).unwrap();
    let mut m = ModelFile::open(path).unwrap();
    m.attach_mtp(mtp_path_of(
        &TestModelSpec::long_context(),
        Variant::F32,
        tag,
    ))
    .unwrap();
    AnyModel::V4(Arc::new(m))
}

fn opts(backend: BackendKind, mtp: bool) -> SessionOptions {
    draft::opts(backend, mtp.then_some(DraftModel::Mtp))
}

fn run(
    s: &mut Session,
    tok: &Tokenizer,
    prompt: &[u32],
    temperature: f32,
    spec: Option<&mut Speculator>,
    target_states: usize,
) -> Run {
    run_n(s, tok, prompt, 48, temperature, spec, target_states)
}

/// Greedy and sampled generation with MTP drafts (fixed length 4, and the
/// adaptive policy) equal plain generation; with the fixed length the
/// block drafts on every step. A 40-token prompt crosses the tiny model's 32-row window,
/// so the first draft catches the ring up over a full window.
fn mtp_equals_plain(backend: BackendKind, variant: Variant) {
    let model = AnyModel::V4(model_with_mtp(variant, &format!("{backend:?}")));
    let tok = Tokenizer::from_gguf(model.file()).unwrap();
    let n_target = draft::n_target_states(&model, &opts(backend, false));
    let mut s = Session::open_any(&model, opts(backend, true)).unwrap();
    assert!(s.has_draft_model());
    let prompt = tokens(40, 11);
    for temperature in [0.0, 0.8] {
        let plain = run(&mut s, &tok, &prompt, temperature, None, n_target);
        for policy_fixed in [true, false] {
            let policy = if policy_fixed {
                Policy::fixed(4, 4)
            } else {
                Policy::new(4)
            };
            let mut spec = Speculator::new(Box::new(ModelDrafter::MTP), policy);
            let got = run(
                &mut s,
                &tok,
                &prompt,
                temperature,
                Some(&mut spec),
                n_target,
            );
            let what = format!("{backend:?} {variant:?} at temperature {temperature}");
            assert_same_run(&plain, &got, &what);
            assert_eq!(plain.finish, got.finish, "{what}: finish");
            let st = spec.stats();
            if policy_fixed {
                assert!(st.drafted > 0 && st.verify_steps > 0, "{what}: {st:?}");
            } else {
                // The random block's drafts are useless and cost a large
                // share of a tiny model's step: timed on a probe, they are
                // never worth a verify step.
                assert!(st.verify_steps <= 1, "{what}: {st:?}");
            }
        }
    }
}

#[test]
fn cpu_ref_mtp_equals_plain() {
    mtp_equals_plain(BackendKind::CpuRef, Variant::Q8);
}

#[test]
fn fast_cpu_mtp_equals_plain() {
    mtp_equals_plain(BackendKind::Cpu, Variant::Q2);
}

/// MTP drafts with routed experts streamed from the SSD (the smallest
/// cache: every step evicts): the same greedy output and final logits as
/// plain decoding with every expert resident. The block's own experts live
/// in the MTP file and are read whole through the mapping; the model
/// file's stream.
#[test]
fn fast_cpu_mtp_with_ssd_streaming_equals_plain() {
    use ds4::app::selfcheck::streaming::{streaming, streaming_cases};
    let model = AnyModel::V4(model_with_mtp(Variant::Q2, "streaming"));
    let tok = Tokenizer::from_gguf(model.file()).unwrap();
    let prompt = tokens(40, 11);
    let mut plain = Session::open_any(&model, opts(BackendKind::Cpu, false)).unwrap();
    let n_target = plain.read_states().unwrap().len();
    let want = run(&mut plain, &tok, &prompt, 0.0, None, n_target);
    drop(plain);
    let k = model.config().n_expert_used;
    let [hardest, ..] = streaming_cases(k);
    let mut o = opts(BackendKind::Cpu, true);
    o.backend_options = streaming(hardest, &o.backend_options);
    let mut s = Session::open_any(&model, o).unwrap();
    let mut spec = Speculator::new(Box::new(ModelDrafter::MTP), Policy::fixed(4, 4));
    let got = run(&mut s, &tok, &prompt, 0.0, Some(&mut spec), n_target);
    assert_eq!(want.tokens, got.tokens, "tokens");
    assert_eq!(want.rec.bytes, got.rec.bytes, "streamed bytes");
    assert!(want.logits == got.logits, "final logits");
    let st = spec.stats();
    assert!(st.drafted > 0 && st.verify_steps > 0, "{st:?}");
    let cache = s.expert_cache().expect("a streaming backend has a cache");
    let cs = cache.stats();
    assert!(
        cs.misses > 0 && cs.bytes_read > 0,
        "the experts streamed: {cs:?}"
    );
    let plan = cache.plan().expect("planned by the main forward");
    assert_eq!(
        plan.layers,
        model.config().n_layer,
        "the block's layer is not planned"
    );
}

/// Rejected drafts across the first ratio-128 boundary on cpu-ref
/// (`common::draft::rejections_across_ratio_128`).
#[test]
fn ratio_128_boundary_rejections_with_mtp() {
    let model = long_context_with_mtp("r128");
    draft::rejections_across_ratio_128(&model, ModelDrafter::MTP, opts(BackendKind::CpuRef, true));
}

/// A 3,000-token prompt whose indexer selects, then drafts at every step
/// (`common::draft::long_prompt_equals_plain`), on `backend`.
fn long_prompt_with_mtp(backend: BackendKind) {
    let model = long_context_with_mtp(&format!("long-{backend:?}"));
    draft::long_prompt_equals_plain(&model, ModelDrafter::MTP, opts(backend, true));
}

/// cpu-ref and the fast CPU backend (8 s together).
#[test]
fn long_prompt_indexer_selects_with_mtp() {
    long_prompt_with_mtp(BackendKind::CpuRef);
    long_prompt_with_mtp(BackendKind::Cpu);
}

/// The same on wgpu (lavapipe here: 7 minutes). Run with
/// `cargo test --release --test speculate_mtp -- --ignored wgpu_long_prompt`.
#[test]
#[ignore]
fn wgpu_long_prompt_with_mtp() {
    long_prompt_with_mtp(BackendKind::Wgpu);
}

/// The MTP block's lazily caught-up ring equals running it over every
/// position; drafts of 3 past the target write ring slots that must come
/// back (`common::draft::lazy_rings_equal_every_position`).
#[test]
fn lazy_ring_equals_every_position() {
    let model = AnyModel::V4(model_with_mtp(Variant::Q8, "lazy"));
    let open = || Session::open_any(&model, opts(BackendKind::CpuRef, true)).unwrap();
    lazy_rings_equal_every_position(&open, 3);
}

/// wgpu and the fast CPU backend agree with cpu-ref on the block's logits
/// (`common::draft::backends_agree_on_draft_logits`).
#[test]
fn backends_agree_on_mtp_logits() {
    let model = AnyModel::V4(model_with_mtp(Variant::Q8, "backends"));
    backends_agree_on_draft_logits(&|b| Session::open_any(&model, opts(b, true)));
}

/// A drafter file that does not fit the model is refused, naming why.
#[test]
fn mismatched_mtp_file_is_refused() {
    let mut m = ModelFile::open(common::tiny_model_path(Variant::Q8)).unwrap();
    // The V4.1 test model's main file is no MTP file.
    let err = m
        .attach_mtp(common::v41_model_path())
        .unwrap_err()
        .to_string();
    assert!(err.contains("MTP"), "{err}");
    // An MTP file of another width.
    let dir = common::fresh_dir("mtp", "wide");
    let path = dir.join("wide.mtp.gguf");
    let mut spec = TestModelSpec::tiny();
    spec.core.n_embd *= 2;
    write_mtp(&spec, Variant::F32, &path).unwrap();
    let err = m.attach_mtp(&path).unwrap_err().to_string();
    assert!(err.contains("mtp.0."), "{err}");
    // A session asked for MTP on a model without it.
    let plain = AnyModel::V4(Arc::new(
        ModelFile::open(common::tiny_model_path(Variant::Q8)).unwrap(),
    ));
    let err = Session::open_any(&plain, opts(BackendKind::CpuRef, true))
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("--mtp-model"), "{err}");
}

// The CUDA emulator (tests/cuda_emu) under the `cuda` feature.
#[cfg(feature = "cuda")]
#[allow(dead_code)]
#[path = "cuda_emu/mod.rs"]
mod cuda_emu;

/// CUDA (the host emulator when there is no driver): the block's logits
/// equal cpu-ref's within f32 noise, and 12 tokens generated with MTP
/// drafts equal plain decoding's.
#[cfg(feature = "cuda")]
#[test]
fn cuda_mtp_logits_and_exactness() {
    use common::draft::Rec;
    use ds4::generate::{self, Sampled};
    use ds4::sampler::{Rng, SamplerConfig};
    let model = AnyModel::V4(model_with_mtp(Variant::Q8, "cuda"));
    let prompt = tokens(20, 3);
    let open = |b| Session::open_any(&model, opts(b, true)).unwrap();
    let mut s = draft::cuda_draft_logits_match(cuda_emu::install(), &open, &prompt);

    let tok = Tokenizer::from_gguf(model.file()).unwrap();
    let n_target = draft::n_target_states(&model, &opts(BackendKind::CpuRef, false));
    let short = |s: &mut Session, spec: Option<&mut Speculator>| {
        s.reset();
        s.sync(&prompt, &mut |_, _| {}).unwrap();
        let mut picker = Sampled {
            cfg: SamplerConfig::default(),
            rng: Rng::new(1),
        };
        let mut rec = Rec::default();
        let out = generate::generate_with(s, &tok, 12, &mut picker, &mut rec, spec).unwrap();
        let mut states = s.read_states().unwrap();
        states.truncate(n_target);
        (out.tokens, s.logits().to_vec(), states)
    };
    let plain = short(&mut s, None);
    let mut spec = Speculator::new(Box::new(ModelDrafter::MTP), Policy::fixed(3, 3));
    let got = short(&mut s, Some(&mut spec));
    assert!(
        plain == got,
        "CUDA: generation with MTP drafts differs from plain"
    );
    assert!(spec.stats().drafted > 0, "{:?}", spec.stats());
}

/// The MTP golden (tests/golden/mtp-tiny-q8.*): 40 target states of the
/// tiny q8 model and the ids they come from, and the float64 reference's
/// log-probs of the block at rows 5, 31, 32 (the first row whose window
/// drops a row) and 39, from `tools/reference/mtp_reference.py` (written
/// from the official `MTPBlock.forward`, not from ds4's graph).
const MTP_GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/mtp-tiny-q8");
const GOLDEN_LEN: usize = 40;
const GOLDEN_CHECKPOINTS: [usize; 4] = [5, 31, 32, 39];

/// The target's final states of the golden prompt (cpu-ref, plain
/// numerics, one prefill step).
fn golden_states(model: &AnyModel, ids: &[u32]) -> Vec<f32> {
    let name = ds4::model::forward::final_state(match model {
        AnyModel::V4(m) => &m.config,
        AnyModel::V41(_) => unreachable!(),
    });
    let o = SessionOptions {
        dump: vec![name.clone()],
        ..draft::golden_opts(None)
    };
    let mut s = Session::open_any(model, o).unwrap();
    s.sync(ids, &mut |_, _| {}).unwrap();
    s.dump(&name).unwrap()
}

/// Writes the golden's inputs; then run the reference (tests/golden/README.md):
/// `cargo test --release --test speculate_mtp -- --ignored write_mtp_golden_inputs`.
#[test]
#[ignore = "writes tests/golden/mtp-tiny-q8.{ids.json,states.bin}; run by hand"]
fn write_mtp_golden_inputs() {
    let model = AnyModel::V4(common::tiny_model(Variant::Q8));
    let ids = tokens(GOLDEN_LEN + 1, 17);
    let states = golden_states(&model, &ids[..GOLDEN_LEN]);
    std::fs::write(
        format!("{MTP_GOLDEN}.states.bin"),
        draft::f32_bytes(&states),
    )
    .unwrap();
    let json = serde_json::json!({ "ids": ids, "checkpoints": GOLDEN_CHECKPOINTS });
    std::fs::write(format!("{MTP_GOLDEN}.ids.json"), json.to_string()).unwrap();
}

/// The block's log-probs equal the float64 reference's within 1e-4 on the
/// top 20 (f32 arithmetic moves them by ~1e-6 here), and its first draft
/// is the reference's argmax, at every checkpoint; the target states the
/// reference read are still the engine's.
#[test]
fn mtp_matches_reference() {
    let (g, ids) = draft::read_golden(MTP_GOLDEN);
    assert_eq!(ids.len(), GOLDEN_LEN + 1);
    let base = common::tiny_model(Variant::Q8);
    let plain = AnyModel::V4(base.clone());
    let committed = draft::read_f32s(&format!("{MTP_GOLDEN}.states.bin"));
    let ours = golden_states(&plain, &ids[..GOLDEN_LEN]);
    let d = max_abs_diff(&ours, &committed);
    assert!(
        d < 1e-5,
        "the target states moved by {d}: rewrite the golden's inputs"
    );

    let model = AnyModel::V4(model_with_mtp(Variant::Q8, "golden"));
    let mut s = Session::open_any(&model, draft::golden_opts(Some(DraftModel::Mtp))).unwrap();
    draft::check_checkpoints(
        &mut s,
        &ids,
        &g,
        GOLDEN_CHECKPOINTS.len(),
        &|p| format!("row {p}"),
        &mut |_, _, _| {},
    );
}
