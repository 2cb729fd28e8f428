//! Counters for `GET /metrics` (Prometheus text format): queue depth,
//! prompt/generated tokens, speed, live prefix reuse, and the disk KV
//! cache's counters when `--kv-disk-dir` is set, and a V4.1 model's Engram
//! reads (bytes per token, hot-row hit rate).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::model::v41::engram_reader::EngramStats;
use crate::speculate::SpecStats;

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
    /// Speculative decoding, summed over requests (`--spec`, `--mtp`,
    /// `--dspark`); absent from `/metrics` while nothing was drafted.
    spec: Mutex<SpecStats>,
}

impl Metrics {
    /// The V4.1 Engram reader's counters (the worker calls it after each job).
    pub fn record_engram(&self, st: EngramStats) {
        if let Ok(mut e) = self.engram.lock() {
            *e = Some(st);
        }
    }

    /// What speculative decoding did in one request.
    pub fn record_spec(&self, st: &SpecStats) {
        if let Ok(mut s) = self.spec.lock() {
            s.drafted += st.drafted;
            s.accepted += st.accepted;
            s.verify_steps += st.verify_steps;
            s.verify_tokens += st.verify_tokens;
            s.plain_steps += st.plain_steps;
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

    /// The Prometheus text of `GET /metrics`: the queue, the slots and the
    /// slot scheduler's steps, the requests, a V4.1 model's Engram reads
    /// (after its first request), then the disk cache's counters.
    pub fn render(&self) -> String {
        let engram = self.engram.lock().map(|e| *e).unwrap_or(None);
        let spec = self.spec.lock().map(|s| *s).unwrap_or_default();
        let mut s = String::new();
        for x in self
            .slot_samples()
            .into_iter()
            .chain(self.request_samples())
            .chain(engram.as_ref().map(engram_samples).unwrap_or_default())
            .chain(spec_samples(&spec))
        {
            x.write(&mut s);
        }
        if let Some(k) = self.kv_disk.get() {
            s.push_str(&k.snapshot().prometheus());
        }
        s
    }

    /// The queue, the KV slots, and the slot scheduler's engine steps
    /// (zero with one slot).
    fn slot_samples(&self) -> Vec<Sample> {
        vec![
            gauge(
                "queue_depth",
                "Generation requests waiting for the worker.",
                load(&self.queue_depth),
            ),
            gauge("slots", "KV slots (--batched-session).", load(&self.slots)),
            gauge(
                "active_slots",
                "KV slots running a request now.",
                load(&self.active_slots),
            ),
            counter(
                "batch_steps_total",
                "Engine steps of the slot scheduler.",
                load64(&self.steps),
            ),
            counter(
                "batch_step_slots_total",
                "Slots carried by those steps, summed (mean batch: / steps).",
                load64(&self.step_slots),
            ),
            counter(
                "batch_step_rows_total",
                "Token rows carried by those steps, summed.",
                load64(&self.step_rows),
            ),
            gauge(
                "batch_last_step_slots",
                "Slots in the last engine step (the batch size).",
                load(&self.last_step_slots),
            ),
            counter(
                "batch_mixed_steps_total",
                "Steps that carried prefill pieces beside decode rows.",
                load64(&self.mixed_steps),
            ),
            gauge(
                "batch_max_step_slots",
                "Most slots one engine step carried since start-up.",
                load(&self.max_step_slots),
            ),
            gauge(
                "batch_last_step_rows",
                "Token rows in the last engine step.",
                load(&self.last_step_rows),
            ),
        ]
    }

    /// Requests, tokens, live prefix reuse and the last request's speed.
    fn request_samples(&self) -> Vec<Sample> {
        let (tps, prefill) = self.last.lock().map(|l| *l).unwrap_or((0.0, 0.0));
        vec![
            counter(
                "requests_total",
                "Generation requests served.",
                load64(&self.requests),
            ),
            counter(
                "rejected_total",
                "Requests refused (queue full).",
                load64(&self.rejected),
            ),
            counter(
                "cancelled_total",
                "Generations cancelled by a client disconnect.",
                load64(&self.cancelled),
            ),
            counter(
                "prompt_tokens_total",
                "Effective prompt tokens.",
                load64(&self.prompt_tokens),
            ),
            counter(
                "prompt_tokens_evaluated_total",
                "Prompt tokens actually evaluated.",
                load64(&self.evaluated_prompt_tokens),
            ),
            counter(
                "generated_tokens_total",
                "Generated tokens.",
                load64(&self.generated_tokens),
            ),
            counter(
                "prefix_reuse_hits_total",
                "Requests that reused the live session.",
                load64(&self.prefix_hits),
            ),
            counter(
                "prefix_reused_tokens_total",
                "Prompt tokens reused from the live session.",
                load64(&self.reused_tokens),
            ),
            gauge(
                "last_generation_tokens_per_second",
                "Decode speed of the last request.",
                format!("{tps:.3}"),
            ),
            gauge(
                "last_prefill_seconds",
                "Prefill time of the last request.",
                format!("{prefill:.3}"),
            ),
        ]
    }
}

/// Speculative decoding since start-up (none until something was drafted).
fn spec_samples(st: &SpecStats) -> Vec<Sample> {
    if st.drafted == 0 && st.verify_steps == 0 {
        return Vec::new();
    }
    vec![
        counter(
            "spec_drafted_tokens_total",
            "Tokens drafted and verified (speculative decoding).",
            st.drafted.to_string(),
        ),
        counter(
            "spec_accepted_tokens_total",
            "Drafted tokens kept.",
            st.accepted.to_string(),
        ),
        counter(
            "spec_verify_steps_total",
            "Verify steps (a next token with its drafts).",
            st.verify_steps.to_string(),
        ),
        counter(
            "spec_plain_steps_total",
            "Decode steps without drafts while speculation was on.",
            st.plain_steps.to_string(),
        ),
        gauge(
            "spec_acceptance_rate",
            "Fraction of drafted tokens kept since start-up.",
            format!("{:.4}", st.acceptance()),
        ),
        gauge(
            "spec_tokens_per_verify_step",
            "Tokens each verify step produced on average (1 + kept drafts).",
            format!("{:.3}", st.tokens_per_verify()),
        ),
    ]
}

/// A V4.1 model's Engram reader.
fn engram_samples(e: &EngramStats) -> Vec<Sample> {
    let counters = [
        (
            "engram_tokens_total",
            "Tokens whose Engram rows were read (V4.1).",
            e.tokens,
        ),
        (
            "engram_row_lookups_total",
            "Engram table rows asked for.",
            e.rows_requested,
        ),
        (
            "engram_row_hits_total",
            "Engram rows found in the hot-row cache.",
            e.cache_hits,
        ),
        (
            "engram_bytes_read_total",
            "Bytes of Engram rows read from the model file.",
            e.bytes_read,
        ),
    ];
    let mut out: Vec<Sample> = counters
        .into_iter()
        .map(|(name, help, v)| counter(name, help, v.to_string()))
        .collect();
    out.push(gauge(
        "engram_bytes_per_token",
        "Engram bytes read per token since start-up.",
        format!("{:.1}", e.bytes_per_token()),
    ));
    out.push(gauge(
        "engram_hit_rate",
        "Fraction of Engram row lookups served by the hot-row cache.",
        format!("{:.4}", e.hit_rate()),
    ));
    out
}

/// One metric of `/metrics`: its name (after `ds4_`), its type (`gauge`
/// or `counter`), its help line and its value as printed.
struct Sample {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    value: String,
}

impl Sample {
    fn write(&self, s: &mut String) {
        let Sample {
            name,
            kind,
            help,
            value,
        } = self;
        s.push_str(&format!(
            "# HELP ds4_{name} {help}\n# TYPE ds4_{name} {kind}\nds4_{name} {value}\n"
        ));
    }
}

fn gauge(name: &'static str, help: &'static str, value: String) -> Sample {
    Sample {
        name,
        kind: "gauge",
        help,
        value,
    }
}

fn counter(name: &'static str, help: &'static str, value: String) -> Sample {
    Sample {
        name,
        kind: "counter",
        help,
        value,
    }
}

fn load(a: &AtomicUsize) -> String {
    a.load(Ordering::Relaxed).to_string()
}

fn load64(a: &AtomicU64) -> String {
    a.load(Ordering::Relaxed).to_string()
}
