//! `ds4-bench --sessions 1,2,4,8`: N sessions served together through
//! [`Batch`], for each N of the list, after a single-session reference run.
//! All sessions arrive at once; each step carries the next prefill piece of
//! every session still prefilling and one decode row of every session
//! already decoding (greedy tokens). Decode tokens/s counts the steps in
//! which every session decodes. Writes CSV.

use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

use ds4::backend::{BackendKind, BackendOptions};
use ds4::model::ModelFile;
use ds4::session::{Batch, Session, SessionOptions, SlotWork};
use ds4::tokenizer::Tokenizer;

use super::{csv_out, open_model, Args};

/// The bytes one batched step reads under the model of issue 18: every
/// weight except the routed experts and the embedding table once, plus the
/// routed experts' bytes times the distinct experts the step's rows hit, with
/// `rows` rows choosing `k` of `n` experts uniformly (expected distinct
/// count `n·(1 − (1 − k/n)^rows)` per layer).
fn step_bytes_model(model: &ModelFile, rows: usize) -> (f64, f64, f64) {
    let cfg = &model.config;
    let mut dense = 0f64;
    let mut per_expert = 0f64;
    for t in model.file.tensor_infos() {
        let (name, b) = (t.name.as_str(), t.n_bytes as f64);
        if name.contains("_exps") {
            per_expert += b / cfg.n_expert as f64;
        } else if name != "token_embd.weight" {
            dense += b;
        }
    }
    let (n, k) = (cfg.n_expert as f64, cfg.n_expert_used as f64);
    let hit = n * (1.0 - (1.0 - k / n).powi(rows as i32));
    // per_expert sums every layer's slab of one expert.
    (dense, per_expert * hit, hit)
}

/// The runs' shared inputs.
struct Sessions<'a> {
    a: &'a Args,
    model: Arc<ModelFile>,
    opts: SessionOptions,
    /// The prompt file's tokens (empty without `--prompt-file`).
    base: Vec<u32>,
    threads: usize,
}

/// The reference run, then one batched run per count of `list`.
pub fn run(a: &Args, list: &str, backend: BackendKind, bo: BackendOptions) -> Result<(), String> {
    let counts: Vec<usize> = list
        .split(',')
        .map(|s| s.trim().parse::<usize>().ok().filter(|&n| n > 0))
        .collect::<Option<_>>()
        .ok_or_else(|| format!("--sessions {list:?}: give positive counts like 1,2,4,8"))?;
    if a.session_prompt == 0 || a.mixed_prefill_quantum == 0 || a.gen_tokens == 0 {
        return Err("--session-prompt, --mixed-prefill-quantum and -n must be positive".into());
    }
    let threads = ds4::app::threads::init_global_pool(a.threads);
    let model = open_model(a)?;
    // Every weight page faulted in first (as --warm-weights does), so the
    // first engine measured does not pay the file's page-in.
    model.warm(&mut |_, _| {});
    let base: Vec<u32> = match &a.prompt_file {
        Some(p) => {
            let tok = Tokenizer::from_gguf(&model.file)
                .map_err(|e| format!("{}: {e}", a.model.display()))?;
            let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
            tok.encode_plain(&text)
        }
        None => Vec::new(),
    };
    let opts = SessionOptions {
        ctx: a.session_prompt + a.gen_tokens + 8,
        prefill_chunk: a.mixed_prefill_quantum,
        backend,
        backend_options: bo,
        ..Default::default()
    };
    let s = Sessions {
        a,
        model,
        opts,
        base,
        threads,
    };
    let mut out = csv_out(a)?;
    writeln!(
        out,
        "engine,sessions,prompt_tokens,gen_tokens,ttft_mean_s,ttft_max_s,decode_agg_tps,decode_per_session_tps,decode_step_ms,model_bytes_per_step,model_distinct_experts,model_gbps"
    )
    .map_err(|e| e.to_string())?;
    s.single(&mut out)?;
    for &n in &counts {
        s.batch(n, &mut out)?;
    }
    Ok(())
}

/// The index of the largest logit (the first of equals).
fn greedy(l: &[f32]) -> u32 {
    (0..l.len()).fold(0, |m, j| if l[j] > l[m] { j } else { m }) as u32
}

/// What a batched run measured.
struct Served {
    /// Time to first token per session, from the start.
    ttft: Vec<f64>,
    /// Seconds and count of the steps in which every session decoded.
    dec_s: f64,
    dec_steps: usize,
}

impl Sessions<'_> {
    /// Session i's prompt: the prompt file's tokens from offset 7·i (so the
    /// prompts differ), or pseudo-random ids below the vocabulary.
    fn prompt(&self, i: usize) -> Vec<u32> {
        let vocab = self.model.config.n_vocab;
        let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (i as u64 + 1);
        (0..self.a.session_prompt)
            .map(|j| match self.base.get(7 * i + j) {
                Some(&t) => t,
                None => {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x % vocab.min(100_000) as u64) as u32
                }
            })
            .collect()
    }

    /// The single-session reference: one `Session` (its own kernel choice
    /// per piece size), the first prompt, greedy decode.
    fn single(&self, out: &mut dyn Write) -> Result<(), String> {
        let a = self.a;
        let mut sess =
            Session::new(self.model.clone(), self.opts.clone()).map_err(|e| e.to_string())?;
        let t = Instant::now();
        sess.sync(&self.prompt(0), &mut |_, _| {})
            .map_err(|e| e.to_string())?;
        let ttft = t.elapsed().as_secs_f64();
        let t = Instant::now();
        for _ in 0..a.gen_tokens {
            let next = greedy(sess.logits());
            sess.eval(next).map_err(|e| e.to_string())?;
        }
        let s = t.elapsed().as_secs_f64();
        let (dense, routed, hit) = step_bytes_model(&self.model, 1);
        let tps = a.gen_tokens as f64 / s;
        writeln!(
            out,
            "session,1,{},{},{ttft:.3},{ttft:.3},{tps:.2},{tps:.2},{:.1},{:.0},{hit:.1},{:.2}",
            a.session_prompt,
            a.gen_tokens,
            1e3 / tps,
            dense + routed,
            (dense + routed) * tps / 1e9
        )
        .and_then(|_| out.flush())
        .map_err(|e| e.to_string())
    }

    /// `n` sessions through one [`Batch`]: one CSV row.
    fn batch(&self, n: usize, out: &mut dyn Write) -> Result<(), String> {
        let a = self.a;
        let mut b =
            Batch::new(self.model.clone(), self.opts.clone(), n).map_err(|e| e.to_string())?;
        eprintln!(
            "ds4-bench: {n} sessions, {}; {:.1} MiB of state per slot; {} CPU threads",
            b.backend_notice(),
            b.slot_state_bytes() as f64 / (1u64 << 20) as f64,
            self.threads
        );
        let Served {
            ttft,
            dec_s,
            dec_steps,
        } = self.serve(&mut b, n)?;
        let agg = if dec_s > 0.0 {
            (dec_steps * n) as f64 / dec_s
        } else {
            0.0
        };
        let step_ms = if dec_steps > 0 {
            1e3 * dec_s / dec_steps as f64
        } else {
            0.0
        };
        let (dense, routed, hit) = step_bytes_model(&self.model, n);
        let bytes = dense + routed;
        let gbps = if step_ms > 0.0 {
            bytes / (step_ms / 1e3) / 1e9
        } else {
            0.0
        };
        writeln!(
            out,
            "batch,{n},{},{},{:.3},{:.3},{agg:.2},{:.2},{step_ms:.1},{bytes:.0},{hit:.1},{gbps:.2}",
            a.session_prompt,
            a.gen_tokens,
            ttft.iter().sum::<f64>() / n as f64,
            ttft.iter().cloned().fold(0.0, f64::max),
            agg / n as f64,
        )
        .and_then(|_| out.flush())
        .map_err(|e| e.to_string())
    }

    /// Steps the batch until every session has prefilled its prompt and
    /// decoded -n tokens: each step a prefill piece of every session still
    /// prefilling, one decode row of every other.
    fn serve(&self, b: &mut Batch, n: usize) -> Result<Served, String> {
        let (quantum, gen_tokens) = (self.a.mixed_prefill_quantum, self.a.gen_tokens);
        let prompts: Vec<Vec<u32>> = (0..n).map(|i| self.prompt(i)).collect();
        let mut done = vec![0usize; n];
        let mut generated = vec![0usize; n];
        let mut next_tok = vec![0u32; n];
        let mut r = Served {
            ttft: vec![0f64; n],
            dec_s: 0.0,
            dec_steps: 0,
        };
        let t0 = Instant::now();
        while generated.iter().any(|&g| g < gen_tokens) {
            let mut work = Vec::new();
            let mut all_decode = true;
            let single: Vec<[u32; 1]> = next_tok.iter().map(|&t| [t]).collect();
            for i in 0..n {
                let tokens = if done[i] < prompts[i].len() {
                    all_decode = false;
                    let end = (done[i] + quantum).min(prompts[i].len());
                    &prompts[i][done[i]..end]
                } else if generated[i] < gen_tokens {
                    &single[i][..]
                } else {
                    continue;
                };
                work.push(SlotWork {
                    slot: i,
                    tokens,
                    all_logits: false,
                });
            }
            all_decode &= work.len() == n;
            let t = Instant::now();
            b.step(&work).map_err(|e| e.to_string())?;
            let dt = t.elapsed().as_secs_f64();
            if all_decode {
                r.dec_s += dt;
                r.dec_steps += 1;
            }
            let lens: Vec<(usize, usize)> = work.iter().map(|w| (w.slot, w.tokens.len())).collect();
            for (i, len) in lens {
                if done[i] < prompts[i].len() {
                    done[i] += len;
                    if done[i] == prompts[i].len() {
                        r.ttft[i] = t0.elapsed().as_secs_f64();
                    }
                } else {
                    generated[i] += 1;
                }
                next_tok[i] = greedy(b.logits(i));
            }
        }
        Ok(r)
    }
}
