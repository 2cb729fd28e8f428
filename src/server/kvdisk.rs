//! The disk KV cache behind the worker's [`KvCacheHook`]: each hook call is
//! one of `kvcache::SaveMoments`' save moments (KVCACHE.md §2 rule 7, §5).
//! Built from ds4's `--kv-*` flags; absent without `--kv-disk-dir`.

use super::job::{DiskResumed, KvCacheHook, VisibleKind};
use super::metrics::Metrics;
use crate::kvcache::{
    CacheKey, DiskCache, KtmEntry, KvCacheConfig, SaveMoments, ToolIds, VisibleKey,
};
use crate::session::{Session, SessionError, SyncStats};
use crate::tokenizer::Tokenizer;

pub struct DiskHook {
    moments: SaveMoments,
}

impl DiskHook {
    /// Opens the cache folder of `cfg` (`Ok(None)` without `--kv-disk-dir`)
    /// and makes its counters part of `/metrics`. `quant_bits` is the loaded
    /// model's routed-expert quant (`Session::routed_quant_bits`). `write_limit` is the
    /// library's test hook (every write fails with ENOSPC after that many
    /// bytes: a full disk without privileges).
    pub fn open(
        cfg: &KvCacheConfig,
        quant_bits: u8,
        metrics: &Metrics,
        write_limit: Option<u64>,
    ) -> Result<Option<DiskHook>, String> {
        Ok(open_cache(cfg, quant_bits, metrics, write_limit)?.map(DiskHook::new))
    }

    pub fn new(cache: DiskCache) -> DiskHook {
        DiskHook {
            moments: SaveMoments::new(cache),
        }
    }
}

/// The disk cache of `cfg` as [`DiskHook::open`] opens it, for the slot
/// scheduler's per-slot save moments (`slotdisk.rs`).
pub fn open_cache(
    cfg: &KvCacheConfig,
    quant_bits: u8,
    metrics: &Metrics,
    write_limit: Option<u64>,
) -> Result<Option<DiskCache>, String> {
    cfg.validate()?;
    let Some(mut cache) = DiskCache::open(cfg, quant_bits).map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    cache.set_write_limit(write_limit);
    // The library's logger is `eprintln!`, which a closed stderr turns
    // into a panic; the server's log lines never fail.
    let cache = cache.with_logger(|m| crate::log_line!("ds4: kv cache: {m}"));
    let _ = metrics.kv_disk.set(cache.metrics());
    Ok(Some(cache))
}

pub(super) fn key<'a>(v: Option<(&'a [u8], VisibleKind)>) -> Option<VisibleKey<'a>> {
    v.map(|(text, kind)| VisibleKey {
        text,
        key: match kind {
            VisibleKind::Responses => CacheKey::ResponsesVisible,
            VisibleKind::Thinking => CacheKey::ThinkingVisible,
        },
    })
}

impl KvCacheHook for DiskHook {
    fn resume(
        &mut self,
        sess: &mut Session,
        tok: &Tokenizer,
        rendered: &str,
        visible: Option<(&[u8], VisibleKind)>,
        tools: &dyn ToolIds,
    ) -> Option<DiskResumed> {
        let r = self
            .moments
            .resume_from_disk(sess, tok, rendered, key(visible).as_ref(), tools);
        r.hit.map(|hit| DiskResumed {
            effective: r.effective,
            cached: r.cached,
            tool_map: hit.tool_map,
        })
    }

    fn prefill(
        &mut self,
        sess: &mut Session,
        tok: &Tokenizer,
        prompt: &[u32],
        cached: usize,
        progress: &mut dyn FnMut(usize, usize),
        tools: &dyn ToolIds,
    ) -> Result<SyncStats, SessionError> {
        self.moments
            .prefill(sess, tok, prompt, cached, progress, tools)
    }

    fn before_decode(&mut self, sess: &Session, tok: &Tokenizer, tools: &dyn ToolIds) {
        self.moments.before_decode(sess, tok, tools);
    }

    fn next_checkpoint(&self, live: usize) -> Option<usize> {
        self.moments.next_checkpoint(live)
    }

    fn shutdown(
        &mut self,
        sess: &Session,
        tok: &Tokenizer,
        visible: Option<(&[u8], VisibleKind)>,
        tools: &dyn ToolIds,
    ) {
        self.moments
            .shutdown(sess, tok, key(visible).as_ref(), tools);
    }

    fn prefetch_tool_ids(&mut self, wanted: &dyn Fn(&[u8]) -> bool) -> Vec<KtmEntry> {
        self.moments.cache.prefetch_tool_ids(wanted)
    }
}
