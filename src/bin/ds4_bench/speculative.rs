//! `ds4-bench --spec-table`: the speculative-decoding table of issue 35
//! (docs/PERFORMANCE.md, docs/SPECULATIVE.md). From one prefilled prompt
//! (restored from a snapshot before each run):
//! * plain greedy decoding of `-n` tokens: the reference tokens and speed;
//! * the cost of a verify step of `k + 1` rows, `k = 1..=--draft`, against
//!   one decode step (each step keeps its first row only; medians);
//! * tokens/s at synthetic acceptance lengths 1.0, 1.8, 2.8 and 3.5 (a
//!   drafter that proposes the reference token with the probability that
//!   gives that mean at the longest draft), with the draft fixed at
//!   `--draft` and with the adaptive policy, beside plain decoding, with
//!   what the policy chose (mean draft of its verify steps, plain steps);
//! * prompt lookup on the same prompt, and its own cost per call;
//! * with `--mtp` or `--dspark` and `--mtp-model FILE`: the draft model as
//!   the drafter, and its own cost per drafted token against a decode step.
//!
//! Every speculative run's tokens are checked against the reference: a
//! difference is an error, not a figure.

use std::io::Write;
use std::time::{Duration, Instant};

use ds4::backend::{BackendKind, BackendOptions};
use ds4::generate::{self, Observer, Sampled, Step};
use ds4::sampler::{Rng, SamplerConfig};
use ds4::session::{Session, SessionOptions};
use ds4::speculate::draft_model::ModelDrafter;
use ds4::speculate::lookup::PromptLookup;
use ds4::speculate::synthetic::Synthetic;
use ds4::speculate::{DraftContext, Drafter, Policy, SpecKind, SpecStats, Speculator};
use ds4::tokenizer::Tokenizer;

use super::{csv_out, Args};

/// The synthetic acceptance lengths of the table.
const LENGTHS: [f64; 4] = [1.0, 1.8, 2.8, 3.5];

struct Quiet;

impl Observer for Quiet {
    fn token(&mut self, _id: u32, _bytes: &[u8]) -> Step {
        Step::Continue
    }
}

fn greedy() -> Sampled {
    Sampled {
        cfg: SamplerConfig {
            temperature: 0.0,
            ..SamplerConfig::default()
        },
        rng: Rng::new(1),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// The runs' shared inputs.
struct Bench {
    sess: Session,
    tok: Tokenizer,
    snap: Vec<u8>,
    prompt: Vec<u32>,
    n: usize,
}

/// One generation run from the prompt: its tokens, seconds and counters.
struct Run {
    tokens: Vec<u32>,
    secs: f64,
    stats: SpecStats,
}

impl Bench {
    fn restore(&mut self) -> Result<(), String> {
        self.sess
            .load_snapshot(&self.snap)
            .map_err(|e| e.to_string())
    }

    fn generate(&mut self, spec: Option<&mut Speculator>) -> Result<Run, String> {
        self.restore()?;
        let mut picker = greedy();
        let t0 = Instant::now();
        let mut spec = spec;
        let before = spec.as_ref().map(|s| s.stats()).unwrap_or_default();
        let out = generate::generate_with(
            &mut self.sess,
            &self.tok,
            self.n,
            &mut picker,
            &mut Quiet,
            spec.as_deref_mut(),
        )
        .map_err(|e| e.to_string())?;
        let secs = t0.elapsed().as_secs_f64();
        let stats = spec.map(|s| s.stats().since(&before)).unwrap_or_default();
        Ok(Run {
            tokens: out.tokens,
            secs,
            stats,
        })
    }

    /// Median seconds of `steps` steps of `k + 1` rows (k = 0: plain decode
    /// steps) along the reference, each keeping its first row.
    fn step_cost(&mut self, reference: &[u32], k: usize, steps: usize) -> Result<f64, String> {
        self.restore()?;
        let vocab = self.sess.n_vocab() as u32;
        let mut times = Vec::with_capacity(steps);
        for (i, &next) in reference.iter().take(steps).enumerate() {
            let t0 = Instant::now();
            if k == 0 {
                self.sess.eval(next).map_err(|e| e.to_string())?;
            } else {
                let mut rows = vec![next];
                rows.extend((0..k as u32).map(|j| (next + 1 + j) % vocab));
                self.sess
                    .verify(&rows, &mut |_| 1)
                    .map_err(|e| e.to_string())?;
            }
            // The first step of each size loads its graph or warms caches.
            if i > 0 {
                times.push(t0.elapsed().as_secs_f64());
            }
        }
        Ok(median(times))
    }
}

/// CSV columns (one line per case; empty where a column does not apply).
const HEADER: &str = "case,draft,policy,tokens,seconds,tok_per_s,vs_plain,tokens_per_verify,\
acceptance,mean_draft,verify_steps,plain_steps,step_ms,step_vs_decode";

fn spec_row(case: &str, policy: &str, k: usize, r: &Run, plain_tps: f64) -> String {
    let tps = r.tokens.len() as f64 / r.secs.max(1e-9);
    let st = &r.stats;
    let mean_draft = if st.verify_steps > 0 {
        st.drafted as f64 / st.verify_steps as f64
    } else {
        0.0
    };
    format!(
        "{case},{k},{policy},{},{:.3},{tps:.2},{:.3},{:.2},{:.3},{mean_draft:.2},{},{},,",
        r.tokens.len(),
        r.secs,
        tps / plain_tps.max(1e-9),
        st.tokens_per_verify(),
        st.acceptance(),
        st.verify_steps,
        st.plain_steps
    )
}

pub fn run(a: &Args, backend: BackendKind, bo: BackendOptions) -> Result<(), String> {
    let k_max = a.draft.unwrap_or(ds4::speculate::DEFAULT_MAX_DRAFT);
    if !(1..ds4::session::MAX_VERIFY_ROWS).contains(&k_max) {
        return Err(format!(
            "--draft must be in 1..={}, got {k_max}",
            ds4::session::MAX_VERIFY_ROWS - 1
        ));
    }
    if a.gen_tokens < 8 || a.session_prompt == 0 {
        return Err("--spec-table needs -n ≥ 8 and --session-prompt > 0".into());
    }
    let choice = a.spec_flags().resolve()?;
    let drafter = ds4::app::spec::session_drafter(&choice);
    let model_drafter = match choice.kind {
        SpecKind::Mtp => Some(ModelDrafter::MTP),
        SpecKind::Dspark => Some(ModelDrafter::DSPARK),
        _ => None,
    };
    if choice.on() && model_drafter.is_none() {
        return Err(
            "--spec-table runs lookup and the synthetic drafters always; \
                    of the drafter flags it takes --mtp or --dspark with --mtp-model FILE"
                .into(),
        );
    }
    let threads = ds4::app::threads::init_global_pool(a.threads);
    let model = ds4::app::spec::open_model(&a.model, &choice)?;
    if let Some(m) = model.v4() {
        m.warm(&mut |_, _| {});
    }
    let tok =
        Tokenizer::from_gguf(model.file()).map_err(|e| format!("{}: {e}", a.model.display()))?;
    let prompt: Vec<u32> = match &a.prompt_file {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
            tok.encode_plain(&text)
        }
        None => (0..a.session_prompt as u32)
            .map(|i| (i * 7919) % 120_000 + 10)
            .collect(),
    };
    let n = a.gen_tokens;
    let opts = SessionOptions {
        ctx: prompt.len() + n + 32,
        prefill_chunk: 256,
        backend,
        backend_options: bo,
        drafter,
        ..SessionOptions::default()
    };
    let mut sess = Session::open_any(&model, opts).map_err(|e| e.to_string())?;
    eprintln!(
        "ds4-bench: {}; {threads} threads; prompt {} tokens, {n} generated, drafts up to {k_max}",
        sess.backend_notice(),
        prompt.len()
    );
    sess.sync(&prompt, &mut |_, _| {})
        .map_err(|e| e.to_string())?;
    let snap = sess.save_snapshot().map_err(|e| e.to_string())?;
    let mut b = Bench {
        sess,
        tok,
        snap,
        prompt,
        n,
    };
    let mut out = csv_out(a)?;
    let w = |out: &mut Box<dyn Write>, s: String| writeln!(out, "{s}").map_err(|e| e.to_string());
    w(&mut out, HEADER.into())?;

    // Plain decoding: once to warm, once timed; the reference tokens.
    b.generate(None)?;
    let plain = b.generate(None)?;
    let plain_tps = plain.tokens.len() as f64 / plain.secs.max(1e-9);
    let reference = plain.tokens.clone();
    w(
        &mut out,
        format!(
            "plain,0,,{},{:.3},{plain_tps:.2},1.000,,,,,{},,",
            plain.tokens.len(),
            plain.secs,
            plain.tokens.len()
        ),
    )?;
    eprintln!("plain decoding: {plain_tps:.2} tok/s");

    // Verify cost by row count.
    let steps = (n / 2).clamp(4, 24);
    let decode = b.step_cost(&reference, 0, steps)?;
    w(
        &mut out,
        format!("step,0,,,,,,,,,,,{:.3},1.000", decode * 1e3),
    )?;
    for k in 1..=k_max {
        let t = b.step_cost(&reference, k, steps)?;
        w(
            &mut out,
            format!(
                "step,{k},,,,,,,,,,,{:.3},{:.3}",
                t * 1e3,
                t / decode.max(1e-12)
            ),
        )?;
        eprintln!(
            "verify step of {} rows: {:.2} ms = {:.3} × a decode step ({:.2} ms)",
            k + 1,
            t * 1e3,
            t / decode.max(1e-12),
            decode * 1e3
        );
    }

    // Synthetic acceptance lengths, fixed and adaptive.
    let mut full = b.prompt.clone();
    full.extend_from_slice(&reference);
    let vocab = b.sess.n_vocab();
    for (i, &len) in LENGTHS.iter().enumerate() {
        let p = Synthetic::p_for_length(len, k_max);
        let name = format!("synthetic-{len:.1}");
        let make = || -> Box<dyn Drafter> {
            Box::new(Synthetic::new(full.clone(), p, vocab, 0x5eed + i as u64))
        };
        drafter_runs(&mut b, &mut out, &name, &make, &reference, k_max, plain_tps)?;
    }

    // Prompt lookup on this prompt, and its cost per call.
    let make = || -> Box<dyn Drafter> { Box::new(PromptLookup::new()) };
    drafter_runs(
        &mut b, &mut out, "lookup", &make, &reference, k_max, plain_tps,
    )?;
    let mut d = PromptLookup::new();
    let t0 = Instant::now();
    let start = b.prompt.len();
    for i in start..full.len() {
        let cx = DraftContext {
            tokens: &full[..i],
            next: full[i],
        };
        d.draft(&cx, k_max);
    }
    let per_call: Duration = t0.elapsed() / (full.len() - start).max(1) as u32;
    w(
        &mut out,
        format!(
            "lookup-cost,{k_max},,,,,,,,,,,{:.4},{:.5}",
            per_call.as_secs_f64() * 1e3,
            per_call.as_secs_f64() / decode.max(1e-12)
        ),
    )?;
    eprintln!(
        "lookup drafter: {:.1} µs per call ({:.4} % of a decode step)",
        per_call.as_secs_f64() * 1e6,
        100.0 * per_call.as_secs_f64() / decode.max(1e-12)
    );
    if let Some(d) = model_drafter {
        model_rows(
            &mut b, &mut out, d, &reference, k_max, plain_tps, decode, steps,
        )?;
    }
    Ok(())
}

/// Two runs with the drafter `make` gives, with drafts fixed at `k_max`
/// and adaptive: a CSV row and a line each; tokens that differ from plain
/// decoding's are an error.
fn drafter_runs(
    b: &mut Bench,
    out: &mut Box<dyn Write>,
    name: &str,
    make: &dyn Fn() -> Box<dyn Drafter>,
    reference: &[u32],
    k_max: usize,
    plain_tps: f64,
) -> Result<(), String> {
    for adaptive in [false, true] {
        let policy = if adaptive {
            Policy::new(k_max)
        } else {
            Policy::fixed(k_max, k_max)
        };
        let mut spec = Speculator::new(make(), policy);
        let r = b.generate(Some(&mut spec))?;
        if r.tokens != reference {
            return Err(format!(
                "{name}: the speculative tokens differ from plain decoding"
            ));
        }
        let pol = if adaptive { "adaptive" } else { "fixed" };
        writeln!(out, "{}", spec_row(name, pol, k_max, &r, plain_tps))
            .map_err(|e| e.to_string())?;
        let tps = r.tokens.len() as f64 / r.secs.max(1e-9);
        eprintln!(
            "{name} {pol}: {tps:.2} tok/s ({:.2}× plain), acceptance {:.3}, {:.2} tokens per \
             verify step, {} verify / {} plain steps",
            tps / plain_tps.max(1e-9),
            r.stats.acceptance(),
            r.stats.tokens_per_verify(),
            r.stats.verify_steps,
            r.stats.plain_steps
        );
    }
    Ok(())
}

/// The draft model (MTP or DSpark) as the drafter (fixed and adaptive),
/// and its own cost: the median time of one draft of `k_max` tokens after
/// a decode step (catching its rings up on one position, then drafting),
/// per drafted token.
#[allow(clippy::too_many_arguments)]
fn model_rows(
    b: &mut Bench,
    out: &mut Box<dyn Write>,
    drafter: ModelDrafter,
    reference: &[u32],
    k_max: usize,
    plain_tps: f64,
    decode: f64,
    steps: usize,
) -> Result<(), String> {
    let w = |out: &mut Box<dyn Write>, s: String| writeln!(out, "{s}").map_err(|e| e.to_string());
    let name = drafter.name();
    let make = || -> Box<dyn Drafter> { Box::new(drafter) };
    drafter_runs(b, out, name, &make, reference, k_max, plain_tps)?;
    b.restore()?;
    let mut times = Vec::new();
    for &t in reference.iter().take(steps + 1) {
        let t0 = Instant::now();
        let d = b.sess.model_draft(t, k_max).map_err(|e| e.to_string())?;
        // After the snapshot there is no target state yet: nothing drafted.
        if !d.is_empty() {
            times.push(t0.elapsed().as_secs_f64());
        }
        b.sess.eval(t).map_err(|e| e.to_string())?;
    }
    let per_token = median(times) / k_max as f64;
    w(
        out,
        format!(
            "{name}-cost,{k_max},,,,,,,,,,,{:.4},{:.5}",
            per_token * 1e3,
            per_token / decode.max(1e-12)
        ),
    )?;
    eprintln!(
        "{name} drafter: {:.2} ms per drafted token ({:.3} × a decode step)",
        per_token * 1e3,
        per_token / decode.max(1e-12)
    );
    Ok(())
}
