//! The disk KV cache behind the worker's [`KvCacheHook`]: each hook call is
//! one of `kvcache::SaveMoments`' save moments (KVCACHE.md §2 rule 7, §5).
//! Built from ds4's `--kv-*` flags; absent without `--kv-disk-dir`.

use std::sync::Arc;

use super::metrics::Metrics;
use super::worker::{KvCacheHook, Visible};
use crate::kvcache::{routed_quant_bits, DiskCache, KvCacheConfig, SaveMoments, VisibleKey};
use crate::model::ModelFile;
use crate::session::{Session, SessionError, SyncStats};
use crate::tokenizer::Tokenizer;

pub struct DiskHook {
    moments: SaveMoments,
    tok: Arc<Tokenizer>,
}

impl DiskHook {
    /// Opens the cache folder of `cfg` (`Ok(None)` without `--kv-disk-dir`)
    /// and makes its counters part of `/metrics`. `write_limit` is the
    /// library's test hook (every write fails with ENOSPC after that many
    /// bytes: a full disk without privileges).
    pub fn open(
        cfg: &KvCacheConfig,
        model: &ModelFile,
        tok: Arc<Tokenizer>,
        metrics: &Metrics,
        write_limit: Option<u64>,
    ) -> Result<Option<DiskHook>, String> {
        cfg.validate()?;
        let Some(mut cache) =
            DiskCache::open(cfg, routed_quant_bits(model)).map_err(|e| e.to_string())?
        else {
            return Ok(None);
        };
        cache.set_write_limit(write_limit);
        let _ = metrics.kv_disk.set(cache.metrics());
        Ok(Some(DiskHook {
            moments: SaveMoments::new(cache),
            tok,
        }))
    }
}

fn key<'a>(v: &Option<Visible<'a>>) -> Option<VisibleKey<'a>> {
    v.as_ref().map(|v| VisibleKey {
        text: v.text.as_bytes(),
        key: v.key,
    })
}

impl KvCacheHook for DiskHook {
    fn resume(
        &mut self,
        sess: &mut Session,
        text: &str,
        visible: Option<Visible<'_>>,
    ) -> Option<(Vec<u32>, usize)> {
        let r = self
            .moments
            .resume_from_disk(sess, &self.tok, text, key(&visible).as_ref());
        r.hit.map(|_| (r.effective, r.cached))
    }

    fn prefill(
        &mut self,
        sess: &mut Session,
        prompt: &[u32],
        cached: usize,
    ) -> Result<SyncStats, SessionError> {
        self.moments
            .prefill(sess, &self.tok, prompt, cached, &mut |_, _| {})
    }

    fn before_decode(&mut self, sess: &Session) {
        self.moments.before_decode(sess, &self.tok);
    }

    fn shutdown(&mut self, sess: &Session, visible: Option<Visible<'_>>) {
        self.moments
            .shutdown(sess, &self.tok, key(&visible).as_ref());
    }
}
