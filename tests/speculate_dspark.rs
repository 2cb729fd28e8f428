//! Speculative decoding with DeepSeek's DSpark drafter (issue 35;
//! `model::dspark`, docs/SPECULATIVE.md): the tiny generator writes a
//! `deepseek4-dspark` file for the tiny V4 model; the loader binds it and
//! refuses files that do not fit, naming why; whatever it drafts, greedy
//! and sampled output is plain decoding's bit for bit; its lazily seeded
//! rings equal seeding every position; the backends agree on its logits.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use common::draft::{self, assert_same_run, run_n};
use common::{max_abs_diff, tokens};
use ds4::backend::BackendKind;
use ds4::model::forward::Numerics;
use ds4::model::v41::V41ModelFile;
use ds4::model::{AnyModel, ModelFile};
use ds4::session::{DraftModel, Session, SessionOptions};
use ds4::speculate::draft_model::ModelDrafter;
use ds4::speculate::{Policy, Speculator};
use ds4::testmodel::dspark::{write_dspark, write_v41_dspark, DsparkSpec};
use ds4::testmodel::v41::V41Spec;
use ds4::testmodel::{write_mtp, TestModelSpec, Variant};
use ds4::tokenizer::Tokenizer;

fn n_vocab(variant: Variant) -> usize {
    ModelFile::open(common::tiny_model_path(variant))
        .unwrap()
        .config
        .n_vocab
}

/// Writes the tiny model's drafter (`edit` changes its spec) for test `tag`.
fn dspark_path(variant: Variant, tag: &str, edit: impl FnOnce(&mut DsparkSpec)) -> PathBuf {
    dspark_path_of(&TestModelSpec::tiny(), n_vocab(variant), variant, tag, edit)
}

/// Writes the drafter of the model `spec` (vocabulary `n_vocab`).
fn dspark_path_of(
    spec: &TestModelSpec,
    n_vocab: usize,
    variant: Variant,
    tag: &str,
    edit: impl FnOnce(&mut DsparkSpec),
) -> PathBuf {
    let mut ds = DsparkSpec::for_model(spec);
    edit(&mut ds);
    let dir = common::fresh_dir("dspark", &format!("{tag}-{}", variant.name()));
    let path = dir.join("model.dspark.gguf");
    write_dspark(spec, &ds, variant, n_vocab, &path).unwrap();
    path
}

/// The long-context model (ratios 0,0,4,128,4,128, window 128, an
/// indexer keeping 64 rows) in f32 with its DSpark file attached.
fn long_context_with_dspark(tag: &str) -> AnyModel {
    let path = common::models().long_context_path(Variant::F32).unwrap();
    let mut m = ModelFile::open(path).unwrap();
    let n_vocab = m.config.n_vocab;
    let ds = dspark_path_of(
        &TestModelSpec::long_context(),
        n_vocab,
        Variant::F32,
        tag,
        |_| {},
    );
    m.attach_dspark(ds).unwrap();
    AnyModel::V4(Arc::new(m))
}

/// The tiny model of `variant` with its DSpark file attached.
fn model_with_dspark(variant: Variant, tag: &str) -> AnyModel {
    let mut m = ModelFile::open(common::tiny_model_path(variant)).unwrap();
    m.attach_dspark(dspark_path(variant, tag, |_| {})).unwrap();
    AnyModel::V4(Arc::new(m))
}

fn opts(backend: BackendKind, dspark: bool) -> SessionOptions {
    draft::opts(backend, dspark.then_some(DraftModel::Dspark))
}

#[test]
fn the_drafter_binds_with_its_own_experts_and_taps() {
    let model = model_with_dspark(Variant::Q8, "binds");
    let m = model.v4().unwrap();
    let ds = m.dspark.as_ref().unwrap();
    let spec = TestModelSpec::tiny();
    let want = DsparkSpec::for_model(&spec);
    assert_eq!(ds.config, want, "the keys read back");
    assert_ne!(ds.config.n_expert, m.config.n_expert, "its own experts");
    assert_eq!(ds.config.target_layers[0], 0, "the embedding is tapped");
    assert_eq!(ds.stages.len(), 2);
    // Attached past the main file: every tensor reads through it.
    assert!(ds.main_proj.offset >= m.file.file_len());
}

/// Files that do not fit the model are refused, naming the key, the tensor
/// or the kind of file.
#[test]
fn mismatched_dspark_files_are_refused() {
    let attach = |p: PathBuf| {
        let mut m = ModelFile::open(common::tiny_model_path(Variant::Q8)).unwrap();
        m.attach_dspark(p).unwrap_err().to_string()
    };
    let n_layer = TestModelSpec::tiny().n_layer();
    let err = attach(dspark_path(Variant::Q8, "bad-tap", |d| {
        d.target_layers = vec![1, n_layer]
    }));
    assert!(err.contains("dspark.target_layer_ids"), "{err}");
    let err = attach(dspark_path(Variant::Q8, "bad-order", |d| {
        d.target_layers = vec![3, 1]
    }));
    assert!(err.contains("dspark.target_layer_ids"), "{err}");
    let err = attach(dspark_path(Variant::Q8, "bad-noise", |d| {
        d.noise_token = 1 << 30
    }));
    assert!(err.contains("dspark.noise_token_id"), "{err}");
    let err = attach(dspark_path(Variant::Q8, "bad-block", |d| d.block_size = 99));
    assert!(err.contains("dspark.block_size"), "{err}");
    let err = attach(dspark_path(Variant::Q8, "bad-used", |d| {
        d.n_expert_used = d.n_expert + 1
    }));
    assert!(err.contains("experts per token"), "{err}");
    // The MTP file is another drafter.
    let dir = common::fresh_dir("dspark", "mtp-file");
    let mtp = dir.join("model.mtp.gguf");
    write_mtp(&TestModelSpec::tiny(), Variant::Q8, &mtp).unwrap();
    let err = attach(mtp);
    assert!(err.contains("MTP draft file"), "{err}");
    // The main model is no drafter.
    let err = attach(common::tiny_model_path(Variant::Q8));
    assert!(err.contains("not a DSpark drafter"), "{err}");
}

/// Greedy and sampled generation with DSpark drafts of 4 (every step
/// drafts) equals plain generation: tokens, streamed bytes, final logits
/// and every target state buffer. The 40-token prompt crosses the tiny
/// model's 32-row window, so the first draft seeds a full ring.
fn dspark_equals_plain(backend: BackendKind, variant: Variant) {
    let model = model_with_dspark(variant, &format!("{backend:?}"));
    equals_plain(
        &model,
        opts(backend, true),
        &format!("{backend:?} {variant:?}"),
    );
}

/// Greedy and sampled runs of `model` with `o` (a drafter session) equal
/// plain runs: tokens, streamed ids and bytes, final logits, every target
/// state buffer.
fn equals_plain(model: &AnyModel, o: SessionOptions, what: &str) {
    let tok = Tokenizer::from_gguf(model.file()).unwrap();
    let n_target = draft::n_target_states(model, &o);
    let mut s = Session::open_any(model, o).unwrap();
    assert!(s.has_draft_model());
    let prompt = tokens(40, 11);
    for temperature in [0.0, 0.8] {
        let plain = run_n(&mut s, &tok, &prompt, 40, temperature, None, n_target);
        let mut spec = Speculator::new(Box::new(ModelDrafter::DSPARK), Policy::fixed(4, 4));
        let got = run_n(
            &mut s,
            &tok,
            &prompt,
            40,
            temperature,
            Some(&mut spec),
            n_target,
        );
        let what = format!("{what} at temperature {temperature}");
        assert_same_run(&plain, &got, &what);
        let st = spec.stats();
        assert!(st.drafted > 0 && st.verify_steps > 0, "{what}: {st:?}");
    }
}

#[test]
fn cpu_ref_dspark_equals_plain() {
    dspark_equals_plain(BackendKind::CpuRef, Variant::Q8);
}

#[test]
fn fast_cpu_dspark_equals_plain() {
    dspark_equals_plain(BackendKind::Cpu, Variant::Q2);
}

/// Rejected drafts across the first ratio-128 boundary on cpu-ref
/// (`common::draft::rejections_across_ratio_128`).
#[test]
fn ratio_128_boundary_rejections_with_dspark() {
    let model = long_context_with_dspark("r128");
    draft::rejections_across_ratio_128(
        &model,
        ModelDrafter::DSPARK,
        opts(BackendKind::CpuRef, true),
    );
}

/// A 3,000-token prompt whose indexer selects, then drafts at every step
/// (`common::draft::long_prompt_equals_plain`), on `backend`.
fn long_prompt_with_dspark(backend: BackendKind) {
    let model = long_context_with_dspark(&format!("long-{backend:?}"));
    draft::long_prompt_equals_plain(&model, ModelDrafter::DSPARK, opts(backend, true));
}

/// cpu-ref and the fast CPU backend.
#[test]
fn long_prompt_indexer_selects_with_dspark() {
    long_prompt_with_dspark(BackendKind::CpuRef);
    long_prompt_with_dspark(BackendKind::Cpu);
}

/// The same on wgpu (lavapipe here: minutes). Run with
/// `cargo test --release --test speculate_dspark -- --ignored wgpu_long_prompt`.
#[test]
#[ignore]
fn wgpu_long_prompt_with_dspark() {
    long_prompt_with_dspark(BackendKind::Wgpu);
}

/// The lazily seeded rings equal seeding every position, bit for bit
/// (`common::draft::lazy_rings_equal_every_position`): rows a verify step
/// took back are never seeded, the block writes none.
#[test]
fn lazy_rings_equal_every_position() {
    let model = model_with_dspark(Variant::Q8, "lazy");
    let open = || Session::open_any(&model, opts(BackendKind::CpuRef, true)).unwrap();
    draft::lazy_rings_equal_every_position(&open, 4);
}

/// wgpu and the fast CPU backend agree with cpu-ref on the drafter's
/// first-row logits, Markov bias included
/// (`common::draft::backends_agree_on_draft_logits`).
#[test]
fn backends_agree_on_dspark_logits() {
    let model = model_with_dspark(Variant::Q8, "backends");
    draft::backends_agree_on_draft_logits(&|b| Session::open_any(&model, opts(b, true)));
}

// ---- V4.1: the drafter's stages are V4.1 blocks (model::v41::dspark) ----

/// The tiny V4.1 model (f32) with its DSpark drafter (`edit` changes the
/// drafter's spec) attached.
fn v41_with_dspark(tag: &str, edit: impl FnOnce(&mut DsparkSpec)) -> AnyModel {
    let mut m = V41ModelFile::open(common::v41_model_path()).unwrap();
    let path = v41_dspark_path(tag, m.config.n_vocab, edit);
    m.attach_dspark(path).unwrap();
    AnyModel::V41(Arc::new(m))
}

fn v41_dspark_path(tag: &str, n_vocab: usize, edit: impl FnOnce(&mut DsparkSpec)) -> PathBuf {
    let spec = V41Spec::tiny();
    let mut ds = DsparkSpec::for_v41(&spec);
    edit(&mut ds);
    let dir = common::fresh_dir("dspark", &format!("v41-{tag}"));
    let path = dir.join("model.dspark.gguf");
    write_v41_dspark(&spec, &ds, Variant::F32, n_vocab, &path).unwrap();
    path
}

fn v41_opts(backend: BackendKind, numerics: Numerics) -> SessionOptions {
    SessionOptions {
        numerics,
        ..opts(backend, true)
    }
}

/// The drafter binds: the keys read back, V4.1 stages (no learned head
/// mix), its own experts.
#[test]
fn v41_drafter_binds() {
    let model = v41_with_dspark("binds", |_| {});
    let AnyModel::V41(m) = &model else {
        unreachable!()
    };
    let ds = m.dspark.as_ref().unwrap();
    assert_eq!(ds.config, DsparkSpec::for_v41(&V41Spec::tiny()));
    assert!(ds.head_mix.is_none(), "V4.1 collapses with the lagged mix");
    assert_ne!(ds.config.n_expert, m.config.n_expert);
    assert!(ds.main_proj.offset >= m.file.file_len());
}

/// A drafter of the other family is refused, naming both; a V4.1 drafter
/// of another width or with a tensor missing, naming the key or tensor.
#[test]
fn drafters_of_the_other_family_are_refused() {
    let mut v41 = V41ModelFile::open(common::v41_model_path()).unwrap();
    let v4_drafter = dspark_path(Variant::Q8, "v4-for-v41", |_| {});
    let err = v41.attach_dspark(v4_drafter).unwrap_err().to_string();
    assert!(
        err.contains("V4 (deepseek4-dspark)") && err.contains("V4.1"),
        "{err}"
    );
    let mut v4 = ModelFile::open(common::tiny_model_path(Variant::Q8)).unwrap();
    let v41_drafter = v41_dspark_path("v41-for-v4", v41.config.n_vocab, |_| {});
    let err = v4.attach_dspark(v41_drafter).unwrap_err().to_string();
    assert!(err.contains("V4.1 (deepseek41-dspark)"), "{err}");

    // A V4.1 drafter of another width, and one missing a tensor (its name
    // changed in the header), are refused naming the key and the tensor.
    let n_vocab = v41.config.n_vocab;
    let dir = common::fresh_dir("dspark", "v41-wide");
    let wide = dir.join("wide.dspark.gguf");
    let mut spec = V41Spec::tiny();
    spec.core.n_embd *= 2;
    write_v41_dspark(
        &spec,
        &DsparkSpec::for_v41(&spec),
        Variant::F32,
        n_vocab,
        &wide,
    )
    .unwrap();
    let err = v41.attach_dspark(&wide).unwrap_err().to_string();
    assert!(err.contains("dspark.embedding_length"), "{err}");
    let path = v41_dspark_path("v41-missing", n_vocab, |_| {});
    let mut bytes = std::fs::read(&path).unwrap();
    let name = b"mtp.1.norm.weight";
    let at = bytes
        .windows(name.len())
        .position(|w| w == name)
        .expect("the tensor's name in the header");
    bytes[at + 9] = b'X'; // mtp.1.norX.weight
    std::fs::write(&path, bytes).unwrap();
    let err = v41.attach_dspark(&path).unwrap_err().to_string();
    assert!(err.contains("mtp.1.norm.weight"), "{err}");
}

/// Greedy and sampled generation on V4.1 with DSpark drafts of 4 equals
/// plain generation, under the official rounding steps (model numerics)
/// on cpu-ref and the fast CPU backend, and plain numerics on cpu-ref.
#[test]
fn v41_dspark_equals_plain() {
    let model = v41_with_dspark("exact", |_| {});
    for (backend, numerics) in [
        (BackendKind::CpuRef, Numerics::Model),
        (BackendKind::CpuRef, Numerics::Plain),
        (BackendKind::Cpu, Numerics::Model),
    ] {
        let what = format!("V4.1 {backend:?} {numerics:?}");
        equals_plain(&model, v41_opts(backend, numerics), &what);
    }
}

/// The same on wgpu (lavapipe here: 5 minutes). Run with
/// `cargo test --release --test speculate_dspark -- --ignored wgpu_v41`.
#[test]
#[ignore]
fn wgpu_v41_dspark_equals_plain() {
    let model = v41_with_dspark("exact-wgpu", |_| {});
    let o = v41_opts(BackendKind::Wgpu, Numerics::Model);
    equals_plain(&model, o, "V4.1 Wgpu Model");
}

/// The lazily seeded rings equal seeding every position on V4.1.
#[test]
fn v41_lazy_rings_equal_every_position() {
    let model = v41_with_dspark("lazy", |_| {});
    let open =
        || Session::open_any(&model, v41_opts(BackendKind::CpuRef, Numerics::Model)).unwrap();
    draft::lazy_rings_equal_every_position(&open, 4);
}

/// wgpu and the fast CPU backend agree with cpu-ref on the V4.1 drafter's
/// first-row logits.
#[test]
fn v41_backends_agree_on_dspark_logits() {
    let model = v41_with_dspark("backends", |_| {});
    draft::backends_agree_on_draft_logits(&|b| {
        Session::open_any(&model, v41_opts(b, Numerics::Model))
    });
}

const V41_GOLDEN: &str = "tests/golden/dspark-v41-tiny";
/// The tiny V4.1 model's window is 4: positions 1 and 3 inside the first
/// window, the rest past it.
const V41_CHECKPOINTS: [usize; 4] = [1, 3, 20, 39];

/// Writes the V4.1 golden's ids; then run the reference (tests/golden/README.md):
/// `cargo test --release --test speculate_dspark -- --ignored write_v41_dspark_golden_inputs`.
#[test]
#[ignore = "writes tests/golden/dspark-v41-tiny.ids.json; run by hand"]
fn write_v41_dspark_golden_inputs() {
    let ids = tokens(GOLDEN_LEN + 1, 17);
    let json = serde_json::json!({ "ids": ids, "checkpoints": V41_CHECKPOINTS });
    std::fs::write(format!("{V41_GOLDEN}.ids.json"), json.to_string()).unwrap();
}

/// The V4.1 drafter's first-row log-probs (Markov bias included) equal the
/// float64 reference's (`tools/reference/dspark_v41_reference.py`, from the
/// official `DSparkBlock` on V4.1's `Block`; it computes the taps with its
/// own V4.1 forward) within 1e-4 on the top 20, and its whole draft block
/// is the reference's, at every checkpoint (cpu-ref, plain numerics).
#[test]
fn v41_dspark_matches_reference() {
    let (g, ids) = draft::read_golden(V41_GOLDEN);
    assert_eq!(ids, tokens(GOLDEN_LEN + 1, 17));
    let model = v41_with_dspark("golden", |_| {});
    let o = SessionOptions {
        prefill_chunk: 64,
        ..v41_opts(BackendKind::CpuRef, Numerics::Plain)
    };
    let mut s = Session::open_any(&model, o).unwrap();
    check_checkpoints(&mut s, &ids, &g, V41_CHECKPOINTS.len(), "V4.1");
}

/// At each of the golden `g`'s `n` checkpoints P: `s` holding `ids[..=P]`
/// drafts after `ids[P+1]` a first row whose top-20 log-probs are the
/// golden's within 1e-4, and the golden's whole draft block.
fn check_checkpoints(s: &mut Session, ids: &[u32], g: &serde_json::Value, n: usize, what: &str) {
    let label = |p| format!("{what} position {p}");
    draft::check_checkpoints(s, ids, g, n, &label, &mut |s, p, cp| {
        let drafts = s.model_draft(ids[p + 1], 16).unwrap();
        let want: Vec<u32> = common::json_uints(&cp["drafts"])
            .iter()
            .map(|&i| i as u32)
            .collect();
        assert_eq!(drafts, want, "{}: the draft block", label(p));
    });
}

const GOLDEN: &str = "tests/golden/dspark-tiny-q8";
const GOLDEN_LEN: usize = 40;
const GOLDEN_CHECKPOINTS: [usize; 4] = [5, 31, 32, 39];

/// The taps of every position of `ids` (cpu-ref, plain numerics, one
/// step), computed here from the dumped layer inputs, not by the runner:
/// per target layer L, the mean over the HC streams of the state entering
/// L (the embedding for L = 0), concatenated. `[len][taps·D]`.
fn golden_taps(ids: &[u32]) -> Vec<f32> {
    let model = AnyModel::V4(common::tiny_model(Variant::Q8));
    let cfg = model.config().clone();
    let layers = DsparkSpec::for_model(&TestModelSpec::tiny()).target_layers;
    let names: Vec<ds4::graph::ValueName> = layers
        .iter()
        .map(|&l| match l {
            0 => ds4::graph::ValueName::parse("embed").unwrap(),
            l => ds4::graph::ValueName::parse(&format!("ffn_hc_state@{}", l - 1)).unwrap(),
        })
        .collect();
    let o = SessionOptions {
        dump: names.clone(),
        ..draft::golden_opts(None)
    };
    let mut s = Session::open_any(&model, o).unwrap();
    s.sync(ids, &mut |_, _| {}).unwrap();
    let d = cfg.n_embd;
    let dumps: Vec<Vec<f32>> = names.iter().map(|n| s.dump(n).unwrap()).collect();
    let mut taps = Vec::new();
    for p in 0..ids.len() {
        for v in &dumps {
            let w = v.len() / ids.len();
            let row = &v[p * w..(p + 1) * w];
            let n = w / d;
            for j in 0..d {
                let sum: f32 = (0..n).map(|s| row[s * d + j]).sum();
                taps.push(sum / n as f32);
            }
        }
    }
    taps
}

/// Writes the golden's inputs; then run the reference (tests/golden/README.md):
/// `cargo test --release --test speculate_dspark -- --ignored write_dspark_golden_inputs`.
#[test]
#[ignore = "writes tests/golden/dspark-tiny-q8.{ids.json,taps.bin}; run by hand"]
fn write_dspark_golden_inputs() {
    let ids = tokens(GOLDEN_LEN + 1, 17);
    let taps = golden_taps(&ids[..GOLDEN_LEN]);
    std::fs::write(format!("{GOLDEN}.taps.bin"), draft::f32_bytes(&taps)).unwrap();
    let json = serde_json::json!({ "ids": ids, "checkpoints": GOLDEN_CHECKPOINTS });
    std::fs::write(format!("{GOLDEN}.ids.json"), json.to_string()).unwrap();
}

/// The drafter's first-row log-probs (Markov bias included) equal the
/// float64 reference's (`tools/reference/dspark_reference.py`, from the
/// official `DSparkBlock`) within 1e-4 on the top 20, and its whole draft
/// block is the reference's, at every checkpoint; the taps the reference
/// read are still the engine's.
#[test]
fn dspark_matches_reference() {
    let (g, ids) = draft::read_golden(GOLDEN);
    assert_eq!(ids.len(), GOLDEN_LEN + 1);
    let committed = draft::read_f32s(&format!("{GOLDEN}.taps.bin"));
    let d = max_abs_diff(&golden_taps(&ids[..GOLDEN_LEN]), &committed);
    assert!(
        d < 1e-5,
        "the taps moved by {d}: rewrite the golden's inputs"
    );

    let model = model_with_dspark(Variant::Q8, "golden");
    let mut s = Session::open_any(&model, draft::golden_opts(Some(DraftModel::Dspark))).unwrap();
    check_checkpoints(&mut s, &ids, &g, GOLDEN_CHECKPOINTS.len(), "V4");
}

#[cfg(feature = "cuda")]
#[allow(dead_code)]
#[path = "cuda_emu/mod.rs"]
mod cuda_emu;

/// CUDA (the host emulator when there is no driver): the drafter's logits
/// equal cpu-ref's within f32 noise, and 12 greedy tokens with DSpark
/// drafts equal plain decoding's; the V4.1 drafter's logits too.
#[cfg(feature = "cuda")]
#[test]
fn cuda_dspark_logits_and_exactness() {
    let model = model_with_dspark(Variant::Q8, "cuda");
    let prompt = tokens(20, 3);
    let open = |b| Session::open_any(&model, opts(b, true)).unwrap();
    let mut s = draft::cuda_draft_logits_match(cuda_emu::install(), &open, &prompt);

    let tok = Tokenizer::from_gguf(model.file()).unwrap();
    let n_target = draft::n_target_states(&model, &opts(BackendKind::CpuRef, false));
    let plain = run_n(&mut s, &tok, &prompt, 12, 0.0, None, n_target);
    let mut spec = Speculator::new(Box::new(ModelDrafter::DSPARK), Policy::fixed(4, 4));
    let got = run_n(&mut s, &tok, &prompt, 12, 0.0, Some(&mut spec), n_target);
    assert_eq!(plain.tokens, got.tokens, "CUDA: tokens");
    assert!(plain.logits == got.logits, "CUDA: final logits");
    assert!(plain.states == got.states, "CUDA: target state");
    assert!(spec.stats().drafted > 0, "{:?}", spec.stats());

    // The V4.1 drafter's logits (model numerics) on CUDA.
    let v41 = v41_with_dspark("cuda", |_| {});
    let logits = |backend| {
        let mut s = Session::open_any(&v41, v41_opts(backend, Numerics::Model)).unwrap();
        s.sync(&prompt, &mut |_, _| {}).unwrap();
        s.draft_logits(7).unwrap()
    };
    let d = max_abs_diff(&logits(BackendKind::CpuRef), &logits(BackendKind::Cuda));
    eprintln!("cuda V4.1: max |Δlogit| {d}");
    assert!(d < 1e-4, "V4.1: max |Δlogit| {d}");
}
