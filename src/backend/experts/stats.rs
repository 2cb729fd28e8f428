//! The cache's counters: atomics the readers and passes bump
//! ([`Counters`]), and the snapshot a caller reads ([`StreamStats`]).

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters since start or the last [`ExpertCache::reset_stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StreamStats {
    /// Tokens run.
    pub tokens: u64,
    /// Expert slices asked for by passes of streamed layers.
    pub lookups: u64,
    /// Found in the cache (prefetched ones included).
    pub hits: u64,
    /// Read by the pass itself.
    pub misses: u64,
    /// Hits on slices a read-ahead brought in and nothing had used yet.
    pub prefetch_hits: u64,
    /// Slices read ahead.
    pub prefetch_reads: u64,
    /// Read-ahead slices evicted before any use.
    pub prefetch_wasted: u64,
    /// Single-token lookups the previous step's choice in the same layer
    /// predicted.
    pub predicted: u64,
    /// Single-token lookups with a previous step to compare with.
    pub predictable: u64,
    /// Bytes read from the file (passes, read-ahead and preload).
    pub bytes_read: u64,
    /// Seconds the passes waited for reads: their own misses and
    /// read-aheads still in flight (the reads compute did not hide).
    pub read_wait_s: f64,
}

impl StreamStats {
    pub fn hit_rate(&self) -> f64 {
        self.hits as f64 / self.lookups.max(1) as f64
    }

    /// Share of read-ahead slices that a pass then used.
    /// Hits on slices that were there before this step's read-ahead
    /// (what the cache alone gives).
    pub fn cache_hit_rate(&self) -> f64 {
        self.hits.saturating_sub(self.prefetch_hits) as f64 / self.lookups.max(1) as f64
    }

    pub fn prefetch_hit_rate(&self) -> f64 {
        self.prefetch_hits as f64 / self.prefetch_reads.max(1) as f64
    }

    pub fn predictor_rate(&self) -> f64 {
        self.predicted as f64 / self.predictable.max(1) as f64
    }

    pub fn bytes_per_token(&self) -> f64 {
        self.bytes_read as f64 / self.tokens.max(1) as f64
    }

    /// One line for the end of a run.
    pub fn line(&self) -> String {
        format!(
            "ssd streaming: hit rate {:.1} % ({} of {}; {:.1} % without read-ahead), \
             {:.1} MiB read per token, prefetch {} reads, {:.0} % used, previous-step predictor {:.0} %",
            100.0 * self.hit_rate(),
            self.hits,
            self.lookups,
            100.0 * self.cache_hit_rate(),
            self.bytes_per_token() / (1u64 << 20) as f64,
            self.prefetch_reads,
            100.0 * self.prefetch_hit_rate(),
            100.0 * self.predictor_rate(),
        )
    }
}

#[derive(Default)]
pub(super) struct Counters {
    pub(super) tokens: AtomicU64,
    pub(super) lookups: AtomicU64,
    pub(super) hits: AtomicU64,
    pub(super) misses: AtomicU64,
    pub(super) prefetch_hits: AtomicU64,
    pub(super) prefetch_reads: AtomicU64,
    pub(super) prefetch_wasted: AtomicU64,
    pub(super) predicted: AtomicU64,
    pub(super) predictable: AtomicU64,
    pub(super) bytes_read: AtomicU64,
    pub(super) read_wait_ns: AtomicU64,
}

pub(super) fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}
