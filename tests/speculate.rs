//! Speculative verification is exact (issue 35): a verify step of the next
//! token and k drafts, with the rows that are not kept taken back, leaves
//! the session exactly where decoding the kept rows one at a time leaves it:
//! the same logits bit for bit after every kept row, and the same bits in
//! every state buffer (ring, compressed rows, frontiers; stale rows
//! included). Drafts are right (every draft kept), wrong (none kept) or a
//! mix, with draft lengths 1–5, across the window and across compressor
//! boundaries of every ratio.

mod common;

use common::{argmax, tokens};
use ds4::backend::{BackendKind, BackendOptions};
use ds4::model::forward::Numerics;
use ds4::model::AnyModel;
use ds4::session::{Session, SessionOptions};
use ds4::testmodel::Variant;

/// What plain greedy decoding gives after the prompt: the tokens, the
/// logits after each evaluated token, and the whole state at each length.
struct Plain {
    tokens: Vec<u32>,
    logits: Vec<Vec<f32>>,
    states: Vec<Vec<Vec<f32>>>,
}

fn opts(backend: BackendKind, numerics: Numerics, ctx: usize) -> SessionOptions {
    SessionOptions {
        ctx,
        prefill_chunk: 16,
        numerics,
        backend,
        backend_options: BackendOptions::from_env(),
        ..Default::default()
    }
}

/// Greedy decoding of `n` tokens after `prompt`, one token per step.
fn plain(model: &AnyModel, o: &SessionOptions, prompt: &[u32], n: usize) -> Plain {
    let mut s = Session::open_any(model, o.clone()).unwrap();
    s.sync(prompt, &mut |_, _| {}).unwrap();
    let mut p = Plain {
        tokens: Vec::new(),
        logits: vec![s.logits().to_vec()],
        states: vec![s.read_states().unwrap()],
    };
    for _ in 0..n {
        let t = argmax(s.logits());
        s.eval(t).unwrap();
        p.tokens.push(t);
        p.logits.push(s.logits().to_vec());
        p.states.push(s.read_states().unwrap());
    }
    p
}

/// How many of a step's drafts are right, by step: cycles through
/// all-wrong, all-right and partial, with draft lengths 1..=max.
fn schedule(step: usize, max: usize) -> (usize, usize) {
    let k = 1 + (step * 7 + 3) % max;
    let right = match step % 4 {
        0 => 0,
        1 => k,
        2 => k / 2,
        _ => (step / 4) % (k + 1),
    };
    (k, right)
}

/// Decodes the same tokens with verify steps and checks every kept row's
/// logits and the whole state after each step against `want`. Returns each
/// step's (first position, rows, kept rows).
fn speculative(
    model: &AnyModel,
    o: &SessionOptions,
    prompt: &[u32],
    want: &Plain,
    max_k: usize,
    sched: &dyn Fn(usize, usize, usize) -> (usize, usize),
) -> Vec<(usize, usize, usize)> {
    let mut s = Session::open_any(model, o.clone()).unwrap();
    s.sync(prompt, &mut |_, _| {}).unwrap();
    let max_k = max_k.min(s.max_verify_rows().unwrap() - 1);
    let vocab = s.n_vocab() as u32;
    let (mut done, mut step) = (0usize, 0usize);
    let (mut kept_total, mut rows_total) = (0, 0);
    let mut steps = Vec::new();
    while done < want.tokens.len() {
        let (k, right) = sched(step, s.tokens().len(), max_k);
        let k = k.min(want.tokens.len() - done - 1);
        let right = right.min(k);
        let next = argmax(s.logits());
        assert_eq!(next, want.tokens[done], "step {step}: the next token");
        let mut rows = vec![next];
        for i in 0..k {
            let t = want.tokens[done + 1 + i];
            rows.push(if i < right {
                t
            } else {
                (t + 1 + i as u32) % vocab
            });
        }
        let base = done;
        let pos0 = s.tokens().len();
        let v = s
            .verify(&rows, &mut |all| {
                let n = all.len() / vocab as usize;
                assert_eq!(n, rows.len());
                let mut keep = 1;
                for i in 0..n {
                    let row = &all[i * vocab as usize..(i + 1) * vocab as usize];
                    // Every row up to the first rejected draft is a row
                    // plain decoding ran.
                    assert!(
                        row == &want.logits[base + 1 + i][..],
                        "step {step}: logits of row {i} differ from decoding"
                    );
                    if i + 1 < n && argmax(row) == rows[i + 1] {
                        keep += 1;
                    } else {
                        break;
                    }
                }
                keep
            })
            .unwrap();
        assert_eq!(v.kept, 1 + right, "step {step}: kept rows");
        steps.push((pos0, rows.len(), v.kept));
        done += v.kept;
        kept_total += v.kept;
        rows_total += rows.len();
        let len = prompt.len() + done;
        assert_eq!(s.tokens().len(), len);
        assert_eq!(&s.tokens()[prompt.len()..], &want.tokens[..done]);
        assert!(
            s.logits() == &want.logits[done][..],
            "step {step}: logits after the step"
        );
        let got = s.read_states().unwrap();
        for (i, (a, b)) in got.iter().zip(&want.states[done]).enumerate() {
            assert!(
                a == b,
                "step {step} (length {len}): state buffer {i} differs from decoding"
            );
        }
        step += 1;
    }
    assert!(kept_total < rows_total, "some drafts were rejected");
    steps
}

fn check(
    model: &AnyModel,
    o: &SessionOptions,
    prompt_len: usize,
    n: usize,
    max_k: usize,
) -> Vec<(usize, usize, usize)> {
    check_with(model, o, prompt_len, n, max_k, &|step, _, max| {
        schedule(step, max)
    })
}

fn check_with(
    model: &AnyModel,
    o: &SessionOptions,
    prompt_len: usize,
    n: usize,
    max_k: usize,
    sched: &dyn Fn(usize, usize, usize) -> (usize, usize),
) -> Vec<(usize, usize, usize)> {
    let prompt = tokens(prompt_len, 35);
    let want = plain(model, o, &prompt, n);
    speculative(model, o, &prompt, &want, max_k, sched)
}

/// Whether some step's rows ran past the end of the window that ends at
/// position `last` and the step kept `kept_side` of it: `false`, rows up
/// to `last` at most (the closing row and after taken back); `true`, the
/// closing row kept and later rows taken back.
fn crossed(steps: &[(usize, usize, usize)], last: usize, closing_kept: bool) -> bool {
    steps
        .iter()
        .any(|&(p, n, k)| p <= last && last < p + n && k < n && (p + k > last) == closing_kept)
}

fn v4(variant: Variant) -> AnyModel {
    AnyModel::V4(common::tiny_model(variant))
}

/// cpu-ref, tiny V4 (window 32, ratios 4 and 16): 40 decoded tokens after
/// a 20-token prompt cross the window and windows of both ratios.
#[test]
fn cpu_ref_verify_equals_decoding() {
    let o = opts(BackendKind::CpuRef, Numerics::Model, 256);
    check(&v4(Variant::Q8), &o, 20, 40, 5);
}

/// The fast CPU backend on the q2 model: its products take another path
/// from 4 rows on (`Graph::decode_paths` keeps verify rows on the decode
/// path), and its experts are the formats that path changes.
#[test]
fn fast_cpu_verify_equals_decoding() {
    let o = opts(BackendKind::Cpu, Numerics::Model, 256);
    check(&v4(Variant::Q2), &o, 20, 40, 5);
}

/// V4.1 (window 4, so 3 drafts at most; ratio-2 and ratio-1 sources, the
/// host's Engram history) on cpu-ref.
#[test]
fn v41_verify_equals_decoding() {
    let model = AnyModel::open(common::v41_model_path()).unwrap();
    let o = opts(BackendKind::CpuRef, Numerics::Plain, 128);
    check(&model, &o, 12, 24, 5);
}

/// A rejection right after a ratio-128 window closed and one right before
/// (long-context model, cpu-ref): prompts of 120 tokens, decoding to 150.
#[test]
fn ratio_128_boundary_rejections() {
    let model = AnyModel::V4(common::long_context_model());
    let o = opts(BackendKind::CpuRef, Numerics::Model, 512);
    // From 120: steps of 4 rows, one draft right (the closing row 127 is
    // not reached, then taken back), then 5 drafts with 2 right across it.
    let sched = |step: usize, pos: usize, max: usize| match pos {
        125..=127 if step > 2 => (5, 2),
        _ if pos < 127 => (3, 1),
        _ => schedule(step, max),
    };
    let steps = check_with(&model, &o, 120, 30, 5, &sched);
    // Position 127 closes the first ratio-128 window.
    assert!(crossed(&steps, 127, false), "{steps:?}");
    assert!(crossed(&steps, 127, true), "{steps:?}");
}

/// The same on every other backend variant: fast CPU on each quant,
/// plain numerics. Run with
/// `cargo test --release --test speculate -- --ignored fast_cpu_every_variant`.
#[test]
#[ignore]
fn fast_cpu_every_variant() {
    for v in Variant::ALL {
        for num in [Numerics::Model, Numerics::Plain] {
            let o = opts(BackendKind::Cpu, num, 256);
            check(&v4(v), &o, 20, 40, 5);
        }
    }
}

/// A 3,000-token prompt on the long-context model, whose indexer selects
/// 64 of ~750 rows, then 60 tokens decoded with verify steps, on cpu-ref
/// and the fast CPU backend. Run with
/// `cargo test --release --test speculate -- --ignored long_prompt`.
#[test]
#[ignore]
fn long_prompt_indexer_selects() {
    let model = AnyModel::V4(common::long_context_model());
    for b in [BackendKind::CpuRef, BackendKind::Cpu] {
        let o = SessionOptions {
            prefill_chunk: 256,
            ..opts(b, Numerics::Model, 4096)
        };
        check(&model, &o, 3000, 60, 5);
    }
}

/// wgpu (lavapipe here), tiny q8 and V4.1. Run with
/// `cargo test --release --test speculate -- --ignored wgpu_verify`.
#[test]
#[ignore]
fn wgpu_verify_equals_decoding() {
    let o = opts(BackendKind::Wgpu, Numerics::Model, 256);
    check(&v4(Variant::Q8), &o, 20, 40, 5);
    let model = AnyModel::open(common::v41_model_path()).unwrap();
    let o = opts(BackendKind::Wgpu, Numerics::Plain, 128);
    check(&model, &o, 12, 24, 5);
}

// The CUDA emulator (tests/cuda_emu) under the `cuda` feature.
#[cfg(feature = "cuda")]
#[allow(dead_code)]
#[path = "cuda_emu/mod.rs"]
mod cuda_emu;

/// CUDA (the host emulator of tests/cuda_emu when there is no driver):
/// tiny q8, model numerics, 16 tokens decoded after 20 (the emulator is
/// slow). Run with
/// `cargo test --release --features cuda --test speculate -- --ignored cuda_verify`.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "minutes on the CUDA host emulator; run on a GPU or by hand"]
fn cuda_verify_equals_decoding() {
    match cuda_emu::install() {
        Ok(d) => eprintln!("cuda on {d}"),
        Err(e) => panic!("no CUDA driver or emulator: {e}"),
    }
    let o = opts(BackendKind::Cuda, Numerics::Model, 256);
    check(&v4(Variant::Q8), &o, 20, 16, 5);
}

/// Too many rows, and a verify after the context: errors, nothing run.
#[test]
fn verify_refuses_bad_steps() {
    let model = v4(Variant::Q8);
    let o = opts(BackendKind::CpuRef, Numerics::Model, 40);
    let mut s = Session::open_any(&model, o).unwrap();
    s.sync(&tokens(30, 1), &mut |_, _| {}).unwrap();
    let max = s.max_verify_rows().unwrap();
    assert_eq!(max, 16, "MAX_VERIFY_ROWS under a window of 32");
    let before = s.read_states().unwrap();
    let e = s.verify(&tokens(17, 2), &mut |_| 1).unwrap_err();
    assert!(e.to_string().contains("at most 16"), "{e}");
    let e = s.verify(&tokens(11, 2), &mut |_| 1).unwrap_err();
    assert!(e.to_string().contains("context"), "{e}");
    assert_eq!(s.tokens().len(), 30);
    assert!(s.read_states().unwrap() == before);
}

// ---- The generation loop with a speculator (generate_with) ----

use ds4::generate::{self, Finish, Observer, Sampled, Step};
use ds4::sampler::{Rng, SamplerConfig};
use ds4::speculate::lookup::PromptLookup;
use ds4::speculate::synthetic::Synthetic;
use ds4::speculate::{Drafter, Policy, Speculator};
use ds4::tokenizer::Tokenizer;

/// Records what it is shown; asks to stop after `stop_after` tokens.
#[derive(Default)]
struct Rec {
    ids: Vec<u32>,
    bytes: Vec<u8>,
    greedy_calls: usize,
    stop_after: Option<usize>,
}

impl Observer for Rec {
    fn greedy_next(&mut self) -> bool {
        self.greedy_calls += 1;
        false
    }
    fn token(&mut self, id: u32, bytes: &[u8]) -> Step {
        self.ids.push(id);
        self.bytes.extend_from_slice(bytes);
        match self.stop_after {
            Some(n) if self.ids.len() >= n => Step::Stop,
            _ => Step::Continue,
        }
    }
}

struct Run {
    tokens: Vec<u32>,
    finish: Finish,
    rec: Rec,
    logits: Vec<f32>,
    states: Vec<Vec<f32>>,
    held: Vec<u32>,
}

fn sampler(temperature: f32) -> Sampled {
    Sampled {
        cfg: SamplerConfig {
            temperature,
            ..SamplerConfig::default()
        },
        rng: Rng::new(0xd5d4),
    }
}

fn run_generate(
    s: &mut Session,
    tok: &Tokenizer,
    prompt: &[u32],
    max_new: usize,
    temperature: f32,
    stop_after: Option<usize>,
    spec: Option<&mut Speculator>,
) -> Run {
    s.sync(prompt, &mut |_, _| {}).unwrap();
    let mut picker = sampler(temperature);
    let mut rec = Rec {
        stop_after,
        ..Rec::default()
    };
    let out = generate::generate_with(s, tok, max_new, &mut picker, &mut rec, spec).unwrap();
    Run {
        tokens: out.tokens,
        finish: out.finish,
        rec,
        logits: s.logits().to_vec(),
        states: s.read_states().unwrap(),
        held: s.tokens().to_vec(),
    }
}

fn same(a: &Run, b: &Run, what: &str) {
    assert_eq!(a.tokens, b.tokens, "{what}: tokens");
    assert_eq!(a.finish, b.finish, "{what}: finish");
    assert_eq!(a.rec.ids, b.rec.ids, "{what}: streamed ids");
    assert_eq!(a.rec.bytes, b.rec.bytes, "{what}: streamed bytes");
    assert_eq!(a.rec.greedy_calls, b.rec.greedy_calls, "{what}: picks");
    assert_eq!(a.held, b.held, "{what}: session tokens");
    assert!(a.logits == b.logits, "{what}: final logits");
    assert!(a.states == b.states, "{what}: state");
}

/// Greedy and sampled generation through `generate_with` equal plain
/// generation token for token (same seed), with drafts that are all
/// right, all wrong, right at 60 %, and prompt lookup; also when the
/// observer stops inside a verify step. tiny q8, cpu-ref.
#[test]
fn generation_with_drafts_equals_plain() {
    let model = v4(Variant::Q8);
    let tok = Tokenizer::from_gguf(&common::tiny_model(Variant::Q8).file).unwrap();
    let o = opts(BackendKind::CpuRef, Numerics::Model, 256);
    let mut s = Session::open_any(&model, o.clone()).unwrap();
    let vocab = s.n_vocab();
    // A prompt that repeats itself, so that lookup finds matches.
    let mut prompt = tokens(12, 9);
    prompt.extend_from_within(..);
    for (temperature, stop_after) in [(0.0, None), (0.9, None), (0.0, Some(17))] {
        let plain = run_generate(&mut s, &tok, &prompt, 40, temperature, stop_after, None);
        s.reset();
        let mut reference = prompt.clone();
        reference.extend_from_slice(&plain.tokens);
        for name in ["right", "wrong", "60%", "lookup"] {
            for policy in [Policy::fixed(5, 5), Policy::new(5)] {
                let mut spec = Speculator::new(drafter(name, &reference, vocab), policy);
                let got = run_generate(
                    &mut s,
                    &tok,
                    &prompt,
                    40,
                    temperature,
                    stop_after,
                    Some(&mut spec),
                );
                s.reset();
                let what = format!("{name} at temperature {temperature}, stop {stop_after:?}");
                same(&plain, &got, &what);
                let st = spec.stats();
                if name == "right" && stop_after.is_none() {
                    assert!(st.accepted > 0, "{what}: {st:?}");
                }
                if name == "wrong" {
                    assert_eq!(st.accepted, 0, "{what}: {st:?}");
                }
            }
        }
    }
}

/// A fresh drafter `name` (each run starts from scratch).
fn drafter(name: &str, reference: &[u32], vocab: usize) -> Box<dyn Drafter> {
    match name {
        "right" => Box::new(Synthetic::right(reference.to_vec(), vocab)),
        "wrong" => Box::new(Synthetic::wrong(reference.to_vec(), vocab)),
        "60%" => Box::new(Synthetic::new(reference.to_vec(), 0.6, vocab, 7)),
        _ => Box::new(PromptLookup::new()),
    }
}

/// Useless drafts: after the calibration steps the policy drafts nothing
/// (a cheap drafter is still asked, its first token compared with the
/// pick), so nearly every step is plain.
#[test]
fn useless_drafts_turn_off() {
    let model = v4(Variant::Q8);
    let tok = Tokenizer::from_gguf(&common::tiny_model(Variant::Q8).file).unwrap();
    let o = opts(BackendKind::Cpu, Numerics::Model, 512);
    let mut s = Session::open_any(&model, o).unwrap();
    let prompt = tokens(16, 4);
    let plain = run_generate(&mut s, &tok, &prompt, 120, 0.0, None, None);
    s.reset();
    let mut reference = prompt.clone();
    reference.extend_from_slice(&plain.tokens);
    let vocab = s.n_vocab();
    let mut spec = Speculator::new(Box::new(Synthetic::wrong(reference, vocab)), Policy::new(5));
    let got = run_generate(&mut s, &tok, &prompt, 120, 0.0, None, Some(&mut spec));
    same(&plain, &got, "wrong drafts, adaptive");
    let st = spec.stats();
    // A few steps to measure the rows and see the drafts fail.
    assert!(st.verify_steps <= 8, "{st:?}");
    assert_eq!(st.accepted, 0);
    assert!(st.plain_steps >= 110, "{st:?}");
}
