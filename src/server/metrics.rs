//! Counters for `GET /metrics` (Prometheus text format): queue depth,
//! prompt/generated tokens, speed, live prefix reuse, and the disk KV
//! cache's counters when `--kv-disk-dir` is set, and a V4.1 model's Engram
//! reads (bytes per token, hot-row hit rate).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::model::v41::engram_reader::EngramStats;

#[derive(Default)]
pub struct Metrics {
    pub queue_depth: AtomicUsize,
    /// KV slots (`--batched-session`) and those running a job now.
    pub slots: AtomicUsize,
    pub active_slots: AtomicUsize,
    /// Engine steps of the slot scheduler, the slots and rows they carried
    /// (sums; the mean batch is rows / steps), and the last step's sizes.
    pub steps: AtomicU64,
    pub step_slots: AtomicU64,
    pub step_rows: AtomicU64,
    pub last_step_slots: AtomicUsize,
    pub last_step_rows: AtomicUsize,
    pub max_step_slots: AtomicUsize,
    /// Steps that carried prefill pieces and decode rows together.
    pub mixed_steps: AtomicU64,
    pub requests: AtomicU64,
    pub rejected: AtomicU64,
    pub cancelled: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub evaluated_prompt_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    pub prefix_hits: AtomicU64,
    pub reused_tokens: AtomicU64,
    /// The disk cache's counters (set once at start-up, with a cache).
    pub kv_disk: std::sync::OnceLock<std::sync::Arc<crate::kvcache::KvCacheMetrics>>,
    /// (generated tokens/s, prefill seconds) of the last request.
    last: Mutex<(f64, f64)>,
    /// A V4.1 model's Engram reader, after the last request.
    engram: Mutex<Option<EngramStats>>,
}

impl Metrics {
    /// The V4.1 Engram reader's counters (the worker calls it after each job).
    pub fn record_engram(&self, st: EngramStats) {
        if let Ok(mut e) = self.engram.lock() {
            *e = Some(st);
        }
    }

    pub fn record_speed(&self, tokens: usize, gen_s: f64, prefill_s: f64) {
        if let Ok(mut l) = self.last.lock() {
            *l = (tokens as f64 / gen_s.max(1e-9), prefill_s);
        }
    }

    /// One engine step of the slot scheduler over `slots` slots, `rows`
    /// token rows in all; `mixed` when it carried prefill and decode rows.
    pub fn record_step(&self, slots: usize, rows: usize, mixed: bool) {
        self.steps.fetch_add(1, Ordering::Relaxed);
        if mixed {
            self.mixed_steps.fetch_add(1, Ordering::Relaxed);
        }
        self.step_slots.fetch_add(slots as u64, Ordering::Relaxed);
        self.step_rows.fetch_add(rows as u64, Ordering::Relaxed);
        self.last_step_slots.store(slots, Ordering::Relaxed);
        self.last_step_rows.store(rows, Ordering::Relaxed);
        self.max_step_slots.fetch_max(slots, Ordering::Relaxed);
    }

    pub fn render(&self) -> String {
        let (tps, prefill) = self.last.lock().map(|l| *l).unwrap_or((0.0, 0.0));
        let mut s = String::new();
        let mut put = |name: &str, kind: &str, help: &str, v: String| {
            s.push_str(&format!(
                "# HELP ds4_{name} {help}\n# TYPE ds4_{name} {kind}\nds4_{name} {v}\n"
            ));
        };
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed).to_string();
        put(
            "queue_depth",
            "gauge",
            "Generation requests waiting for the worker.",
            self.queue_depth.load(Ordering::Relaxed).to_string(),
        );
        let u = |a: &AtomicUsize| a.load(Ordering::Relaxed).to_string();
        put(
            "slots",
            "gauge",
            "KV slots (--batched-session).",
            u(&self.slots),
        );
        put(
            "active_slots",
            "gauge",
            "KV slots running a request now.",
            u(&self.active_slots),
        );
        put(
            "batch_steps_total",
            "counter",
            "Engine steps of the slot scheduler.",
            g(&self.steps),
        );
        put(
            "batch_step_slots_total",
            "counter",
            "Slots carried by those steps, summed (mean batch: / steps).",
            g(&self.step_slots),
        );
        put(
            "batch_step_rows_total",
            "counter",
            "Token rows carried by those steps, summed.",
            g(&self.step_rows),
        );
        put(
            "batch_last_step_slots",
            "gauge",
            "Slots in the last engine step (the batch size).",
            u(&self.last_step_slots),
        );
        put(
            "batch_mixed_steps_total",
            "counter",
            "Steps that carried prefill pieces beside decode rows.",
            g(&self.mixed_steps),
        );
        put(
            "batch_max_step_slots",
            "gauge",
            "Most slots one engine step carried since start-up.",
            u(&self.max_step_slots),
        );
        put(
            "batch_last_step_rows",
            "gauge",
            "Token rows in the last engine step.",
            u(&self.last_step_rows),
        );
        put(
            "requests_total",
            "counter",
            "Generation requests served.",
            g(&self.requests),
        );
        put(
            "rejected_total",
            "counter",
            "Requests refused (queue full).",
            g(&self.rejected),
        );
        put(
            "cancelled_total",
            "counter",
            "Generations cancelled by a client disconnect.",
            g(&self.cancelled),
        );
        put(
            "prompt_tokens_total",
            "counter",
            "Effective prompt tokens.",
            g(&self.prompt_tokens),
        );
        put(
            "prompt_tokens_evaluated_total",
            "counter",
            "Prompt tokens actually evaluated.",
            g(&self.evaluated_prompt_tokens),
        );
        put(
            "generated_tokens_total",
            "counter",
            "Generated tokens.",
            g(&self.generated_tokens),
        );
        put(
            "prefix_reuse_hits_total",
            "counter",
            "Requests that reused the live session.",
            g(&self.prefix_hits),
        );
        put(
            "prefix_reused_tokens_total",
            "counter",
            "Prompt tokens reused from the live session.",
            g(&self.reused_tokens),
        );
        put(
            "last_generation_tokens_per_second",
            "gauge",
            "Decode speed of the last request.",
            format!("{tps:.3}"),
        );
        put(
            "last_prefill_seconds",
            "gauge",
            "Prefill time of the last request.",
            format!("{prefill:.3}"),
        );
        let engram = self.engram.lock().map(|e| *e).unwrap_or(None);
        if let Some(e) = engram {
            for (name, kind, help, v) in [
                (
                    "engram_tokens_total",
                    "counter",
                    "Tokens whose Engram rows were read (V4.1).",
                    e.tokens.to_string(),
                ),
                (
                    "engram_row_lookups_total",
                    "counter",
                    "Engram table rows asked for.",
                    e.rows_requested.to_string(),
                ),
                (
                    "engram_row_hits_total",
                    "counter",
                    "Engram rows found in the hot-row cache.",
                    e.cache_hits.to_string(),
                ),
                (
                    "engram_bytes_read_total",
                    "counter",
                    "Bytes of Engram rows read from the model file.",
                    e.bytes_read.to_string(),
                ),
                (
                    "engram_bytes_per_token",
                    "gauge",
                    "Engram bytes read per token since start-up.",
                    format!("{:.1}", e.bytes_per_token()),
                ),
                (
                    "engram_hit_rate",
                    "gauge",
                    "Fraction of Engram row lookups served by the hot-row cache.",
                    format!("{:.4}", e.hit_rate()),
                ),
            ] {
                s.push_str(&format!(
                    "# HELP ds4_{name} {help}\n# TYPE ds4_{name} {kind}\nds4_{name} {v}\n"
                ));
            }
        }
        if let Some(k) = self.kv_disk.get() {
            s.push_str(&k.snapshot().prometheus());
        }
        s
    }
}
