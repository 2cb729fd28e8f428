//! `ds4-bench --ssd-streaming --ssd-streaming-cache-experts 10%,25%,50%,100%`:
//! decode speed, disk bytes per token and hit rate per budget, cold (empty
//! cache) then warm (the cache the cold run left), beside the fully resident
//! speed and the disk's measured bandwidth and the roofline it implies; with
//! `--ssd-profile-check` also the recorded preload profile against none.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use ds4::backend::experts::read::DiskBandwidth;
use ds4::backend::experts::StreamStats;
use ds4::backend::options::{CacheBudget, ProfileFile, StreamingOptions};
use ds4::backend::{BackendKind, BackendOptions};
use ds4::model::ModelFile;
use ds4::session::{Session, SessionOptions};

use super::{open_model, Args};

/// The sweep's fixed inputs: one model, one prompt, one block length.
struct Sweep<'a> {
    a: &'a Args,
    model: Arc<ModelFile>,
    backend: BackendKind,
    bo: BackendOptions,
    /// The streaming options of the flags; each line sets its own budget.
    base: StreamingOptions,
    /// The routed experts' bytes, which the percentages are of.
    routed: u64,
    prompt: Vec<u32>,
    ctx: usize,
    n_gen: usize,
    repeat: usize,
}

/// The sweep over the budgets of `list`.
pub fn run(a: &Args, list: &str, bo: BackendOptions) -> Result<(), String> {
    let backend = a.backend_flags().resolve()?;
    let base = a
        .streaming_options()?
        .ok_or("--ssd-streaming-cache-experts needs --ssd-streaming")?;
    let threads = ds4::app::threads::init_global_pool(a.threads);
    let model = open_model(a)?;
    let routed: u64 = model
        .weights
        .layers
        .iter()
        .map(|l| l.ffn.routed().iter().map(|t| t.n_bytes).sum::<u64>())
        .sum();
    let n_gen = a.gen_tokens;
    let prompt: Vec<u32> = (0..a.ssd_prompt.max(1) as u32)
        .map(|i| (i * 7919) % (model.config.n_vocab as u32 - 10).min(120_000) + 10)
        .collect();
    let repeat = a.ssd_repeat.max(1);
    let s = Sweep {
        a,
        ctx: prompt.len() + (repeat + 1) * n_gen + 8,
        model,
        backend,
        bo,
        base,
        routed,
        prompt,
        n_gen,
        repeat,
    };
    let disk = s.probe_disk(threads)?;
    let resident_tps = s.resident()?;
    println!(
        "budget,slots,cache,decode_tps,of_resident_pct,read_mib_per_token,hit_pct,cache_hit_pct,prefetch_used_pct,predictor_pct,read_wait_ms_per_token,disk_roofline_tps,serial_bound_tps,of_bound_pct"
    );
    for item in list.split(',') {
        let item = item.trim();
        let budget = match item.strip_suffix('%') {
            Some(p) => {
                let p: f64 = p.trim().parse().map_err(|_| {
                    format!("--ssd-streaming-cache-experts: bad percentage {item:?}")
                })?;
                CacheBudget::Bytes((routed as f64 * p / 100.0).ceil() as u64)
            }
            None => CacheBudget::parse(item)?,
        };
        for mode in ["cold", "warm"] {
            s.line(item, budget, mode, resident_tps, &disk)?;
        }
    }
    if let Some(pct) = a.ssd_profile_check {
        s.profile_check(pct)?;
    }
    Ok(())
}

/// Greedy decode of `n` tokens; seconds taken.
fn decode(sess: &mut Session, n: usize) -> Result<f64, String> {
    let t = Instant::now();
    for _ in 0..n {
        let next = ds4::sampler::argmax(sess.logits()) as u32;
        sess.eval(next).map_err(|e| e.to_string())?;
    }
    Ok(t.elapsed().as_secs_f64())
}

impl Sweep<'_> {
    /// A session of the sweep's context with these backend options.
    fn session(&self, bo: BackendOptions) -> Result<Session, String> {
        Session::new(
            self.model.clone(),
            SessionOptions {
                ctx: self.ctx,
                backend: self.backend,
                backend_options: bo,
                ..Default::default()
            },
        )
        .map_err(|e| e.to_string())
    }

    /// The disk's sequential and random read speed, and the `# disk` and
    /// `# model` lines.
    fn probe_disk(&self, threads: usize) -> Result<DiskBandwidth, String> {
        let (a, cfg, base) = (self.a, &self.model.config, &self.base);
        eprintln!(
            "ds4-bench: measuring the disk under {} ...",
            a.model.display()
        );
        let disk = ds4::backend::experts::read::probe_disk(&a.model, 2 << 30, 2.0, 8)
            .map_err(|e| format!("{}: {e}", a.model.display()))?;
        println!(
            "# disk: sequential {:.0} MB/s (8 MiB reads), random 4 KiB {:.0} MB/s = {:.0} IOPS ({} readers), {} reads",
            disk.sequential / 1e6,
            disk.random_4k / 1e6,
            disk.random_4k / 4096.0,
            disk.threads,
            if disk.direct { "direct" } else { "buffered (page cache counts)" }
        );
        println!(
            "# model: {} layers, {:.2} GiB routed of {:.2} GiB; {threads} CPU threads; {} prompt tokens, {} decoded; policy {}, {} reader threads, read-ahead {}",
            cfg.n_layer,
            self.routed as f64 / (1u64 << 30) as f64,
            self.model.file.file_len() as f64 / (1u64 << 30) as f64,
            self.prompt.len(),
            self.n_gen,
            base.policy.name(),
            base.read_threads,
            if base.prefetch { "on" } else { "off" },
        );
        Ok(disk)
    }

    /// Fully resident decode tokens/s: the weights faulted in first, as
    /// --warm-weights does, then the fastest of `repeat` blocks.
    fn resident(&self) -> Result<f64, String> {
        self.model.warm(&mut |_, _| {});
        let mut sess = self.session(BackendOptions {
            ssd_streaming: None,
            ..self.bo.clone()
        })?;
        sess.sync(&self.prompt, &mut |_, _| {})
            .map_err(|e| e.to_string())?;
        // The fastest of `repeat` blocks of n tokens.
        let mut best = f64::INFINITY;
        for _ in 0..self.repeat {
            best = best.min(decode(&mut sess, self.n_gen)?);
        }
        drop(sess);
        let (n_gen, repeat) = (self.n_gen, self.repeat);
        let resident_tps = n_gen as f64 / best;
        println!("# resident: {resident_tps:.3} tokens/s (fastest of {repeat} blocks of {n_gen})");
        Ok(resident_tps)
    }

    /// One CSV line: the budget `item` in `mode`. Cold: an empty cache
    /// (reads are direct, so the page cache holds nothing either), the n
    /// tokens after the prompt. Warm: the cache preloaded as without
    /// --ssd-streaming-cold, then n tokens of warm-up, then the n measured.
    fn line(
        &self,
        item: &str,
        budget: CacheBudget,
        mode: &str,
        resident_tps: f64,
        disk: &DiskBandwidth,
    ) -> Result<(), String> {
        let n_gen = self.n_gen;
        let o = StreamingOptions {
            budget,
            cold: mode == "cold",
            ..self.base.clone()
        };
        let mut sess = self.session(BackendOptions {
            ssd_streaming: Some(o),
            ..self.bo.clone()
        })?;
        let cache = sess.expert_cache().ok_or("no expert cache")?;
        let plan = cache.plan().ok_or("no plan")?.clone();
        if mode == "cold" {
            eprintln!(
                "ds4-bench: {item}: {}",
                cache.startup_line().unwrap_or_default()
            );
        }
        sess.sync(&self.prompt, &mut |_, _| {})
            .map_err(|e| e.to_string())?;
        if mode == "warm" {
            decode(&mut sess, n_gen)?;
        }
        // The fastest block, with its own counters; a cold block starts
        // from an empty cache each time.
        let mut best: Option<(f64, StreamStats)> = None;
        for _ in 0..self.repeat {
            if mode == "cold" {
                cache.clear();
            }
            cache.reset_stats();
            let s = decode(&mut sess, n_gen)?;
            if best.is_none_or(|(b, _)| s < b) {
                best = Some((s, cache.stats()));
            }
        }
        let (s, st) = best.expect("at least one block");
        let tps = n_gen as f64 / s;
        let per_tok = st.bytes_per_token();
        let disk_roof = if per_tok > 0.0 {
            disk.sequential / per_tok
        } else {
            f64::INFINITY
        };
        // Reads and compute one after the other: the bound without overlap.
        let serial = 1.0 / (1.0 / resident_tps + per_tok / disk.sequential);
        let bound = resident_tps.min(disk_roof);
        println!(
            "{item},{},{mode},{tps:.3},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{:.3},{serial:.3},{:.1}",
            plan.slots,
            100.0 * tps / resident_tps,
            per_tok / (1u64 << 20) as f64,
            100.0 * st.hit_rate(),
            100.0 * st.cache_hit_rate(),
            100.0 * st.prefetch_hit_rate(),
            100.0 * st.predictor_rate(),
            1e3 * st.read_wait_s / st.tokens.max(1) as f64,
            disk_roof,
            100.0 * tps / bound,
        );
        let _ = std::io::stdout().flush();
        Ok(())
    }

    /// `--ssd-profile-check PCT`: records a popularity profile (prompt, then
    /// -n greedy tokens, at PCT % of the routed bytes, cold), then times the
    /// first -n tokens after the prompt of fresh sessions preloaded with and
    /// without it (the fastest of `repeat` each). The decode repeats the
    /// recorded run's tokens, so this is the case the profile is for: traffic
    /// like the traffic it was recorded on.
    fn profile_check(&self, pct: f64) -> Result<(), String> {
        let (prompt, n_gen) = (&self.prompt, self.n_gen);
        let budget = CacheBudget::Bytes((self.routed as f64 * pct / 100.0).ceil() as u64);
        let mut path = self.a.model.as_os_str().to_owned();
        path.push(".bench-profile");
        let path = PathBuf::from(path);
        let _ = std::fs::remove_file(&path);
        let opts = |cold: bool, profile: ProfileFile| BackendOptions {
            ssd_streaming: Some(StreamingOptions {
                budget,
                cold,
                profile,
                ..self.base.clone()
            }),
            ..self.bo.clone()
        };
        {
            let mut sess = self.session(opts(true, ProfileFile::At(path.clone())))?;
            sess.sync(prompt, &mut |_, _| {})
                .map_err(|e| e.to_string())?;
            decode(&mut sess, n_gen)?;
            let cache = sess.expert_cache().ok_or("no expert cache")?;
            cache.save_profile()?;
        }
        println!(
            "# preload profile at {pct} %: first {n_gen} tokens after the prompt, fresh session"
        );
        println!("preload,decode_tps,hit_pct,cache_hit_pct,read_mib_per_token");
        let result = (|| {
            for (label, profile) in [
                ("no profile", ProfileFile::Off),
                ("profile", ProfileFile::At(path.clone())),
            ] {
                let mut best: Option<(f64, StreamStats)> = None;
                for _ in 0..self.repeat {
                    let mut sess = self.session(opts(false, profile.clone()))?;
                    let cache = sess.expert_cache().ok_or("no expert cache")?;
                    eprintln!("ds4-bench: {}", cache.startup_line().unwrap_or_default());
                    sess.sync(prompt, &mut |_, _| {})
                        .map_err(|e| e.to_string())?;
                    cache.reset_stats();
                    let s = decode(&mut sess, n_gen)?;
                    if best.is_none_or(|(b, _)| s < b) {
                        best = Some((s, cache.stats()));
                    }
                }
                let (s, st) = best.expect("at least one run");
                println!(
                    "{label},{:.3},{:.1},{:.1},{:.1}",
                    n_gen as f64 / s,
                    100.0 * st.hit_rate(),
                    100.0 * st.cache_hit_rate(),
                    st.bytes_per_token() / (1u64 << 20) as f64,
                );
            }
            Ok(())
        })();
        let _ = std::fs::remove_file(&path);
        result
    }
}
