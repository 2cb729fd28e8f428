//! `ds4-bench`'s plain mode: prefill and generation speed at context
//! frontiers ctx-start, ctx-start+step, … ctx-max with one model load. Per
//! frontier: prefill the new tokens (timed), generate gen-tokens greedily
//! (timed), restore the frontier; with `--kv-restore-dir` also store the
//! frontier as a disk KV checkpoint and load it back (timed); with
//! `--roofline` (always for V4.1) the bytes per token against the measured
//! read bandwidth. One CSV row per frontier.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use ds4::backend::{BackendKind, BackendOptions};
use ds4::kvcache::{CacheKey, DiskCache, KvCacheConfig, LookupOutcome, SaveReason, StoreOutcome};
use ds4::model::v41::engram_reader::{drop_table_pages, EngramStats};
use ds4::model::{AnyModel, Arch};
use ds4::session::{Session, SessionOptions};
use ds4::tokenizer::Tokenizer;

use super::{csv_out, Args};

/// The server's disk cache (`DiskCache::store` / `lookup`), set so that
/// every frontier is stored whole and nothing is evicted or consumed.
fn restore_cache(dir: &std::path::Path, routed_bits: u8) -> Result<DiskCache, String> {
    let cfg = KvCacheConfig {
        kv_disk_dir: Some(dir.to_path_buf()),
        kv_disk_space_mb: 1 << 30,
        kv_cache_min_tokens: 1,
        kv_cache_cold_max_tokens: 0,
        ..KvCacheConfig::default()
    };
    DiskCache::open(&cfg, routed_bits)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| "no cache folder".to_string())
}

/// Stores the session (at a frontier) and loads it back into the same
/// session; returns (store s, restore s, file bytes). The logits after the
/// load must be the ones before it.
fn store_and_restore(
    cache: &DiskCache,
    sess: &mut Session,
    text: &[u8],
) -> Result<(f64, f64, u64), String> {
    let before = sess.logits().to_vec();
    let t = Instant::now();
    let (sha, bytes) = match cache.store(sess, text, CacheKey::Tokens, SaveReason::Unknown, &[]) {
        StoreOutcome::Stored { sha, bytes } => (sha, bytes),
        other => return Err(format!("kv store: {other:?}")),
    };
    let store_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let hit = match cache.lookup(sess, text) {
        LookupOutcome::Hit(h) => h,
        other => return Err(format!("kv restore: {other:?}")),
    };
    let restore_s = t.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(cache.dir().join(format!("{sha}.kv")));
    if hit.tokens != sess.tokens().len() || sess.logits() != &before[..] {
        return Err("kv restore: the loaded state differs from the stored one".into());
    }
    Ok((store_s, restore_s, bytes))
}

/// What the Engram reader did between two readings: (bytes read per
/// token, hot-row hit rate in %).
fn engram_delta(before: Option<EngramStats>, after: Option<EngramStats>) -> (f64, f64) {
    match (before, after) {
        (Some(b), Some(a)) => {
            let tokens = a.tokens - b.tokens;
            let asked = a.rows_requested - b.rows_requested;
            (
                (a.bytes_read - b.bytes_read) as f64 / tokens.max(1) as f64,
                100.0 * (a.cache_hits - b.cache_hits) as f64 / asked.max(1) as f64,
            )
        }
        _ => (0.0, 0.0),
    }
}

/// The frontier benchmark.
pub fn run(a: &Args, backend: BackendKind, bo: BackendOptions) -> Result<(), String> {
    let ctx = check(a)?;
    let threads = ds4::app::threads::init_global_pool(a.threads);
    let model = load(a)?;
    let v41 = model.arch() == Arch::V41;
    let tok =
        Tokenizer::from_gguf(model.file()).map_err(|e| format!("{}: {e}", a.model.display()))?;
    let tokens = prompt(a, &tok, v41)?;
    let mut sess = open_session(a, &model, ctx, backend, &bo, threads)?;
    let streaming = sess.expert_cache();
    let weights = model.active_bytes_per_token();
    // The roofline columns: on request for V4, always for V4.1 (whose
    // per-token bytes are the point of running it).
    let roofline = a.roofline || v41;
    let bandwidth = if roofline {
        read_bandwidth(&sess, backend, &bo, &model, weights)?
    } else {
        0.0
    };
    if let AnyModel::V41(m) = &model {
        print_engram(a, m);
    }
    let mut out = csv_out(a)?;
    let cache = match &a.kv_restore_dir {
        Some(d) => Some(restore_cache(d, sess.routed_quant_bits())?),
        None => None,
    };
    let f = Frontiers {
        a,
        model: &model,
        tok: &tok,
        tokens: &tokens,
        cache,
        roofline,
        v41,
        weights,
        bandwidth,
    };
    f.run(&mut sess, &mut out)?;
    if let Some(c) = streaming {
        eprintln!("ds4-bench: {}", c.stats().line());
    }
    if let Some(st) = sess.engram_stats() {
        eprintln!("ds4-bench: {}", ds4::app::report::engram_line(&st));
    }
    Ok(())
}

/// The frontier flags, checked; the session context.
fn check(a: &Args) -> Result<usize, String> {
    if a.ctx_start == 0 || a.ctx_start > a.ctx_max {
        return Err("--ctx-start must be in 1..=ctx-max".into());
    }
    if a.step_mul < 1.0 || a.step_incr == 0 {
        return Err("--step-mul must be ≥ 1 and --step-incr > 0".into());
    }
    let ctx = a.ctx_alloc.unwrap_or(a.ctx_max + a.gen_tokens + 1);
    if ctx <= a.ctx_max + a.gen_tokens {
        return Err(format!(
            "--ctx-alloc must exceed ctx-max + gen-tokens ({})",
            a.ctx_max + a.gen_tokens
        ));
    }
    Ok(ctx)
}

/// The model, its pages faulted in with `--warm-weights`.
fn load(a: &Args) -> Result<AnyModel, String> {
    let model = AnyModel::open(&a.model).map_err(|e| format!("{}: {e}", a.model.display()))?;
    if a.warm_weights {
        let t = Instant::now();
        model.warm();
        eprintln!(
            "ds4-bench: weights warmed in {:.1} s",
            t.elapsed().as_secs_f64()
        );
    }
    Ok(model)
}

/// The prompt's tokens: `--prompt-file` as plain text, or
/// `--chat-prompt-file` as one non-thinking turn in the file's own
/// template; at least `--ctx-max` of them.
fn prompt(a: &Args, tok: &Tokenizer, v41: bool) -> Result<Vec<u32>, String> {
    let read = |p: &PathBuf| -> Result<String, String> {
        String::from_utf8(std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()))?)
            .map_err(|_| format!("{}: not UTF-8", p.display()))
    };
    let tokens: Vec<u32> = match (&a.prompt_file, &a.chat_prompt_file) {
        (Some(p), None) => tok.encode_plain(&read(p)?),
        // One non-thinking turn in the file's own template.
        (None, Some(p)) if v41 => ds4::chat::v41::one_shot_prompt(tok, &a.system, &read(p)?, 0),
        (None, Some(p)) => {
            let mut t = ds4::chat::transcript_start(tok, &a.system, ds4::chat::ThinkMode::None);
            t.extend(ds4::chat::user_turn(
                tok,
                &read(p)?,
                ds4::chat::ThinkMode::None,
            ));
            t
        }
        _ => return Err("give exactly one of --prompt-file and --chat-prompt-file".into()),
    };
    if tokens.len() < a.ctx_max {
        return Err(format!(
            "the prompt has {} tokens, fewer than --ctx-max {}",
            tokens.len(),
            a.ctx_max
        ));
    }
    Ok(tokens)
}

/// The session of `ctx` tokens, with the backend and buffer lines on stderr.
fn open_session(
    a: &Args,
    model: &AnyModel,
    ctx: usize,
    backend: BackendKind,
    bo: &BackendOptions,
    threads: usize,
) -> Result<Session, String> {
    let opts = SessionOptions {
        ctx,
        backend,
        backend_options: bo.clone(),
        engram_cache_rows: a
            .engram_cache_rows
            .unwrap_or(ds4::session::DEFAULT_ENGRAM_CACHE_ROWS),
        ..Default::default()
    };
    let sess = Session::open_any(model, opts).map_err(|e| e.to_string())?;
    if let Some(line) = sess.expert_cache().as_ref().and_then(|c| c.startup_line()) {
        eprintln!("ds4-bench: {line}");
    }
    eprintln!(
        "ds4-bench: {}; context buffers {:.1} MiB for {ctx} tokens; {threads} CPU threads",
        sess.backend_notice(),
        sess.state_bytes() as f64 / (1u64 << 20) as f64
    );
    Ok(sess)
}

/// The read bandwidth of the session's device in bytes/s, with its line
/// on stderr.
fn read_bandwidth(
    sess: &Session,
    backend: BackendKind,
    bo: &BackendOptions,
    model: &AnyModel,
    weights: u64,
) -> Result<f64, String> {
    let (device, bw) = ds4::app::report::read_bandwidth_for(sess_backend(sess, backend), bo)?;
    eprintln!(
        "ds4-bench: read bandwidth {:.2} GB/s ({device}); weights read per decoded token {} (the model's accounting: routed experts at {} of {})",
        bw / 1e9,
        ds4::app::report::human(weights),
        model.config().n_expert_used,
        model.config().n_expert,
    );
    Ok(bw)
}

/// The V4.1 Engram line: the tables, what a step reads, the hot-row cache.
fn print_engram(a: &Args, m: &ds4::model::v41::V41ModelFile) {
    let eg = &m.config.engram;
    eprintln!(
        "ds4-bench: DeepSeek V4.1: Engram tables {} on disk at layers {:?} (never mapped), rows of {} bytes read per step, at most {} bytes per token; hot-row cache {} rows{}",
        ds4::app::report::human(m.weights.engram_table_bytes()),
        eg.layer_ids,
        eg.row_bytes(),
        ds4::app::report::v41_engram_cold_bytes(&m.config),
        a.engram_cache_rows
            .unwrap_or(ds4::session::DEFAULT_ENGRAM_CACHE_ROWS),
        if a.engram_cold {
            "; table pages dropped from the page cache before each timed phase"
        } else {
            ""
        }
    );
}

/// The backend whose memory the roofline measures: `auto` as resolved.
fn sess_backend(sess: &Session, asked: BackendKind) -> BackendKind {
    match (asked, sess.backend_name()) {
        (BackendKind::Auto, "wgpu") => BackendKind::Wgpu,
        (BackendKind::Auto, "cuda") => BackendKind::Cuda,
        (BackendKind::Auto, _) => BackendKind::Cpu,
        (k, _) => k,
    }
}

/// The frontier loop's fixed inputs.
struct Frontiers<'a> {
    a: &'a Args,
    model: &'a AnyModel,
    tok: &'a Tokenizer,
    tokens: &'a [u32],
    /// `--kv-restore-dir`: the disk cache each frontier is stored in.
    cache: Option<DiskCache>,
    roofline: bool,
    v41: bool,
    /// Weight bytes per decoded token.
    weights: u64,
    /// Read bytes/s (0 without the roofline columns).
    bandwidth: f64,
}

impl Frontiers<'_> {
    /// The CSV header, then one row per frontier.
    fn run(&self, sess: &mut Session, out: &mut dyn Write) -> Result<(), String> {
        let a = self.a;
        writeln!(out, "{}", self.header()).map_err(|e| e.to_string())?;
        let mut prefill_total_s = 0.0;
        let (mut f, mut prev) = (a.ctx_start, 0usize);
        loop {
            let row = self.row(sess, f, prev, &mut prefill_total_s)?;
            writeln!(out, "{row}")
                .and_then(|_| out.flush())
                .map_err(|e| e.to_string())?;
            if f >= a.ctx_max {
                break;
            }
            prev = f;
            f = if a.step_mul == 1.0 {
                f + a.step_incr
            } else {
                ((f as f64 * a.step_mul).ceil() as usize).max(f + 1)
            };
            f = f.min(a.ctx_max);
        }
        Ok(())
    }

    fn header(&self) -> String {
        let mut extra = String::new();
        if self.cache.is_some() {
            extra += ",prefill_total_s,kv_store_s,kv_restore_s,kv_file_bytes";
        }
        if self.roofline {
            extra += ",weight_bytes_per_token";
            if self.v41 {
                extra += ",prefill_engram_bytes_per_token,prefill_engram_hit_pct,gen_engram_bytes_per_token,gen_engram_hit_pct";
            }
            extra += ",read_gbps,gen_roofline_pct";
        }
        format!("ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes{extra}")
    }

    /// `--engram-cold`: the Engram tables' pages dropped from the page cache.
    fn cold(&self) -> Result<(), String> {
        match self.model {
            AnyModel::V41(m) if self.a.engram_cold => {
                drop_table_pages(m).map_err(|e| format!("{}: {e}", self.a.model.display()))
            }
            _ => Ok(()),
        }
    }

    /// Frontier `f` (the previous one `prev`): prefill to it, store and
    /// restore it with `--kv-restore-dir`, decode -n tokens from it, go
    /// back to it. The CSV row.
    fn row(
        &self,
        sess: &mut Session,
        f: usize,
        prev: usize,
        prefill_total_s: &mut f64,
    ) -> Result<String, String> {
        let a = self.a;
        self.cold()?;
        let e0 = sess.engram_stats();
        let t = Instant::now();
        sess.sync(&self.tokens[..f], &mut |_, _| {})
            .map_err(|e| e.to_string())?;
        let prefill_s = t.elapsed().as_secs_f64();
        let e1 = sess.engram_stats();
        *prefill_total_s += prefill_s;
        let restore = match &self.cache {
            Some(c) => {
                let text = self.tok.decode(&self.tokens[..f]);
                let (st, rs, b) = store_and_restore(c, sess, &text)?;
                format!(",{prefill_total_s:.4},{st:.4},{rs:.4},{b}")
            }
            None => String::new(),
        };
        let snap = sess.save_snapshot().map_err(|e| e.to_string())?;
        self.cold()?;
        let e2 = sess.engram_stats();
        let gen_s = self.decode(sess)?;
        let e3 = sess.engram_stats();
        sess.load_snapshot(&snap).map_err(|e| e.to_string())?;
        let rate = |n: usize, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };
        let gen_tps = rate(a.gen_tokens, gen_s);
        let bytes = self.roofline_columns([e0, e1, e2, e3], gen_tps);
        Ok(format!(
            "{},{},{:.2},{},{:.2},{}{}{}",
            f,
            f - prev,
            rate(f - prev, prefill_s),
            a.gen_tokens,
            gen_tps,
            snap.len(),
            restore,
            bytes
        ))
    }

    /// -n greedy tokens, EOS never taken; seconds taken.
    fn decode(&self, sess: &mut Session) -> Result<f64, String> {
        let eos = self.tok.specials().eos as usize;
        let t = Instant::now();
        for _ in 0..self.a.gen_tokens {
            let logits = sess.logits();
            let next = (0..logits.len()).filter(|&i| i != eos).fold(0, |b, i| {
                if logits[i] > logits[b] || b == eos {
                    i
                } else {
                    b
                }
            });
            sess.eval(next as u32).map_err(|e| e.to_string())?;
        }
        Ok(t.elapsed().as_secs_f64())
    }

    /// The roofline columns of a row (empty without them), from the Engram
    /// counters before and after the prefill, then the decode.
    fn roofline_columns(&self, engram: [Option<EngramStats>; 4], gen_tps: f64) -> String {
        let mut bytes = String::new();
        if !self.roofline {
            return bytes;
        }
        let [e0, e1, e2, e3] = engram;
        let (pb, ph) = engram_delta(e0, e1);
        let (gb, gh) = engram_delta(e2, e3);
        bytes += &format!(",{}", self.weights);
        if self.v41 {
            bytes += &format!(",{pb:.0},{ph:.1},{gb:.0},{gh:.1}");
        }
        // Weights from memory plus the Engram rows read from the file,
        // per decoded token, against the measured read bandwidth.
        let per_token = self.weights as f64 + gb;
        bytes += &format!(
            ",{:.2},{:.1}",
            self.bandwidth / 1e9,
            100.0 * per_token * gen_tps / self.bandwidth.max(1.0)
        );
        bytes
    }
}
