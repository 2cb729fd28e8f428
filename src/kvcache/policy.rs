//! When checkpoints are written (KVCACHE.md §5): ds4's flags and defaults,
//! the cold-save boundary, and the continued-save frontier. Pure functions
//! over token counts; the server's worker calls them at its save moments.

use std::path::PathBuf;

/// The disk-cache flags of ds4-server (SERVER.md flag table), with ds4's
/// defaults. Field names are the flag names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvCacheConfig {
    /// `--kv-disk-dir`: `None` disables the disk cache.
    pub kv_disk_dir: Option<PathBuf>,
    /// `--kv-disk-space-mb` (MiB; default 4096).
    pub kv_disk_space_mb: u64,
    /// `--kv-cache-min-tokens` (default 512).
    pub kv_cache_min_tokens: usize,
    /// `--kv-cache-cold-max-tokens` (default 30000; 0 disables cold saves).
    pub kv_cache_cold_max_tokens: usize,
    /// `--kv-cache-continued-interval-tokens` (default 10000; 0 disables).
    pub kv_cache_continued_interval_tokens: usize,
    /// `--kv-cache-boundary-trim-tokens` (default 32).
    pub kv_cache_boundary_trim_tokens: usize,
    /// `--kv-cache-boundary-align-tokens` (default 2048; 0 = none).
    pub kv_cache_boundary_align_tokens: usize,
    /// `--kv-cache-reject-different-quant` (default off).
    pub kv_cache_reject_different_quant: bool,
    /// `--kv-cache-require-checksum` (default off): load only files whose
    /// header carries our CRC-32 mark, i.e. skip files ds4 wrote or touched.
    pub kv_cache_require_checksum: bool,
    /// `--tool-memory-max-ids` (default 100000): bounds a KTM section.
    pub tool_memory_max_ids: usize,
}

impl Default for KvCacheConfig {
    fn default() -> Self {
        KvCacheConfig {
            kv_disk_dir: None,
            kv_disk_space_mb: 4096,
            kv_cache_min_tokens: 512,
            kv_cache_cold_max_tokens: 30000,
            kv_cache_continued_interval_tokens: 10000,
            kv_cache_boundary_trim_tokens: 32,
            kv_cache_boundary_align_tokens: 2048,
            kv_cache_reject_different_quant: false,
            kv_cache_require_checksum: false,
            tool_memory_max_ids: 100_000,
        }
    }
}

impl KvCacheConfig {
    /// ds4's validation of the flag values (SERVER.md): a message naming the
    /// flag, for the server to print before exiting.
    pub fn validate(&self) -> Result<(), String> {
        if self.kv_disk_space_mb == 0 {
            return Err("--kv-disk-space-mb must be > 0".into());
        }
        if self.kv_cache_min_tokens == 0 {
            return Err("--kv-cache-min-tokens must be > 0".into());
        }
        if self.kv_cache_cold_max_tokens != 0
            && self.kv_cache_cold_max_tokens < self.kv_cache_min_tokens
        {
            return Err(format!(
                "--kv-cache-cold-max-tokens must be 0 or ≥ --kv-cache-min-tokens ({})",
                self.kv_cache_min_tokens
            ));
        }
        if self.tool_memory_max_ids == 0 {
            return Err("--tool-memory-max-ids must be > 0".into());
        }
        Ok(())
    }

    /// Disk budget in bytes (MiB × 1048576).
    pub fn budget_bytes(&self) -> u64 {
        self.kv_disk_space_mb.saturating_mul(1 << 20)
    }

    /// Trimmed, aligned store length for a prompt of `len` tokens when no
    /// chat anchor applies (§5.1): with defaults 11011 → 10240, 1695 → 1695.
    pub fn store_len(&self, len: usize) -> usize {
        let min = self.kv_cache_min_tokens;
        let trim = self.kv_cache_boundary_trim_tokens;
        let align = self.kv_cache_boundary_align_tokens;
        if len > min + trim {
            let mut s = len - trim;
            if align > 0 {
                s -= s % align;
            }
            if s >= min {
                return s;
            }
        }
        len
    }

    /// The cold-save boundary for a request that reused nothing, or `None`
    /// when no cold save applies (§5.1). `user` and `assistant` are the ids
    /// of `<｜User｜>` and `<｜Assistant｜>`. The checkpoint is the first
    /// returned-count tokens of `prompt`.
    pub fn cold_boundary(
        &self,
        prompt: &[u32],
        cached: usize,
        user: u32,
        assistant: u32,
    ) -> Option<usize> {
        let len = prompt.len();
        let max = self.kv_cache_cold_max_tokens;
        if cached != 0 || max == 0 || len < self.kv_cache_min_tokens || len > max {
            return None;
        }
        let first_assistant = prompt.iter().position(|&t| t == assistant).unwrap_or(len);
        let anchor = prompt[..first_assistant].iter().rposition(|&t| t == user);
        match anchor {
            Some(a) if a >= self.kv_cache_min_tokens => Some(a),
            _ => Some(self.store_len(len)),
        }
    }

    /// Spacing of continued saves: the interval rounded up to the alignment
    /// (defaults: ⌈10000/2048⌉·2048 = 10240); 0 when disabled.
    pub fn continued_step(&self) -> usize {
        let (i, a) = (
            self.kv_cache_continued_interval_tokens,
            self.kv_cache_boundary_align_tokens,
        );
        if a > 0 {
            i.div_ceil(a) * a
        } else {
            i
        }
    }
}

/// The continued-save frontier (§5.2): `last` is the last stored or loaded
/// checkpoint length.
#[derive(Clone, Debug, Default)]
pub struct ContinuedSaves {
    last: usize,
}

impl ContinuedSaves {
    /// Whether a live session of `live_len` tokens should be stored now.
    pub fn due(&self, cfg: &KvCacheConfig, live_len: usize) -> bool {
        let step = cfg.continued_step();
        step > 0
            && live_len >= cfg.kv_cache_min_tokens
            && live_len % step == 0
            && live_len > self.last
    }

    /// The first live length above `live_len` at which a continued save
    /// may be due (speculative decoding lands on it by a plain step).
    pub fn next_due(&self, cfg: &KvCacheConfig, live_len: usize) -> Option<usize> {
        let step = cfg.continued_step();
        if step == 0 {
            return None;
        }
        let next = (live_len / step + 1) * step;
        let mut m = next.max(self.last + 1);
        // The smallest multiple of `step` that is at least `m` and the minimum.
        m = m.max(cfg.kv_cache_min_tokens);
        Some(m.div_ceil(step) * step)
    }

    /// A full miss starts over.
    pub fn reset(&mut self) {
        self.last = 0;
    }

    /// After a disk hit (`n` = loaded tokens) or a successful store of `n`.
    pub fn mark(&mut self, n: usize) {
        self.last = self.last.max(n);
    }

    /// For a disk hit: the frontier is exactly the loaded length.
    pub fn set(&mut self, n: usize) {
        self.last = n;
    }

    pub fn last(&self) -> usize {
        self.last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ds4_examples() {
        let c = KvCacheConfig::default();
        assert_eq!(c.store_len(11011), 10240);
        assert_eq!(c.store_len(1695), 1695);
        assert_eq!(c.store_len(544), 544);
        assert_eq!(c.store_len(2100), 2048);
        assert_eq!(c.continued_step(), 10240);
        assert_eq!(c.budget_bytes(), 4096 << 20);
        assert!(c.validate().is_ok());
        let bad = KvCacheConfig {
            kv_cache_cold_max_tokens: 100,
            ..KvCacheConfig::default()
        };
        assert!(bad.validate().is_err());
    }

    #[test]
    fn cold_boundary_prefers_the_chat_anchor() {
        let c = KvCacheConfig {
            kv_cache_min_tokens: 4,
            kv_cache_boundary_trim_tokens: 2,
            kv_cache_boundary_align_tokens: 4,
            ..KvCacheConfig::default()
        };
        const U: u32 = 9;
        const A: u32 = 8;
        // BOS sys… U q A answer U q2 A : last User before the first Assistant.
        let p = [0, 5, 5, 5, 5, 5, U, 6, A, 7, U, 6, A];
        assert_eq!(c.cold_boundary(&p, 0, U, A), Some(6));
        assert_eq!(c.cold_boundary(&p, 3, U, A), None);
        // Anchor below min: trimmed and aligned length (13 − 2 = 11 → 8).
        let q = [0, U, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, A];
        assert_eq!(c.cold_boundary(&q, 0, U, A), Some(8));
        let mut f = ContinuedSaves::default();
        let c = KvCacheConfig {
            kv_cache_min_tokens: 4,
            kv_cache_continued_interval_tokens: 5,
            kv_cache_boundary_align_tokens: 4,
            ..KvCacheConfig::default()
        };
        assert!(!f.due(&c, 4) && f.due(&c, 8) && !f.due(&c, 9));
        f.mark(8);
        assert!(!f.due(&c, 8) && f.due(&c, 16));
    }
}
