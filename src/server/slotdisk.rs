//! The disk KV cache under the slot scheduler: KVCACHE.md's save moments
//! (§2 rule 7 with the evict save, §5.1 cold, §5.2 continued, §5.4
//! shutdown) kept per slot, each slot with its own continued frontier. The
//! moments are those of `kvcache::SaveMoments`, which drives one `Session`
//! (its `prefill` runs `Session::sync` to each save point); here the
//! scheduler cuts its prefill pieces at the save points ([`SlotDisk::stops`])
//! and calls the store between steps.
//!
//! `DiskCache` reads and writes through a `Session`: a store copies the
//! slot's snapshot into one scratch session first, a hit is loaded into the
//! scratch session and copied into the slot. The copies cost one snapshot
//! each, small beside the file write or read they go with; the scratch
//! session holds one more slot's worth of KV state on the CPU.

use super::job::VisibleKind;
use super::kvdisk::key;
use crate::kvcache::{
    tool_map_for, CacheKey, ContinuedSaves, DiskCache, KtmEntry, LookupOutcome, SaveReason,
    StoreOutcome, ToolIds,
};
use crate::session::{Batch, Session};
use crate::tokenizer::Tokenizer;

pub struct SlotDisk {
    cache: DiskCache,
    scratch: Session,
    frontiers: Vec<ContinuedSaves>,
}

/// A disk hit brought into a slot.
pub(super) struct SlotResumed {
    pub(super) effective: Vec<u32>,
    pub(super) cached: usize,
    pub(super) tool_map: Vec<KtmEntry>,
}

impl SlotDisk {
    /// `scratch` must have the slots' model and context (its backend may
    /// differ: snapshots are backend-independent).
    pub fn new(cache: DiskCache, scratch: Session, slots: usize) -> SlotDisk {
        SlotDisk {
            cache,
            scratch,
            frontiers: vec![ContinuedSaves::default(); slots],
        }
    }

    fn store(
        &mut self,
        batch: &Batch,
        slot: usize,
        tok: &Tokenizer,
        reason: SaveReason,
        visible: Option<(&[u8], VisibleKind)>,
        tools: &dyn ToolIds,
    ) {
        let payload = match batch.save_snapshot(slot) {
            Ok(p) => p,
            Err(e) => {
                crate::log_line!("ds4: kv cache: slot {slot}: no snapshot to store ({e})");
                return;
            }
        };
        if let Err(e) = self.scratch.load_snapshot(&payload) {
            crate::log_line!("ds4: kv cache: slot {slot}: snapshot copy failed ({e})");
            return;
        }
        let decoded;
        let visible = key(visible);
        let (text, k) = match &visible {
            Some(v) => (v.text, v.key),
            None => {
                decoded = tok.decode(batch.tokens(slot));
                (&decoded[..], CacheKey::Tokens)
            }
        };
        let map = tool_map_for(text, tools);
        let r = self.cache.store(&self.scratch, text, k, reason, &map);
        if matches!(
            r,
            StoreOutcome::Stored { .. } | StoreOutcome::AlreadyStored { .. }
        ) {
            self.frontiers[slot].mark(batch.tokens(slot).len());
        }
        self.scratch.reset();
    }

    /// Rule 7 with the evict save before it: the slot's content is about
    /// to be replaced. A hit is loaded into the slot.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn resume(
        &mut self,
        batch: &mut Batch,
        slot: usize,
        tok: &Tokenizer,
        rendered: &str,
        visible: Option<(&[u8], VisibleKind)>,
        tools: &dyn ToolIds,
    ) -> Option<SlotResumed> {
        self.frontiers[slot].reset();
        if batch.tokens(slot).len() >= self.cache.config().kv_cache_min_tokens {
            self.store(batch, slot, tok, SaveReason::Evict, visible, tools);
            self.frontiers[slot].reset();
        }
        let LookupOutcome::Hit(hit) = self.cache.lookup(&mut self.scratch, rendered.as_bytes())
        else {
            return None;
        };
        // Token text may end inside a UTF-8 character (byte-level BPE);
        // the rest then cannot be tokenized on its own.
        let rest = rendered.get(hit.text_bytes..);
        let payload = self.scratch.save_snapshot();
        self.scratch.reset();
        let (Some(rest), Ok(payload)) = (rest, payload) else {
            return None;
        };
        if let Err(e) = batch.load_snapshot(slot, &payload) {
            crate::log_line!("ds4: kv cache: slot {slot}: loading the hit failed ({e})");
            return None;
        }
        self.frontiers[slot].set(hit.tokens);
        let mut effective = batch.tokens(slot).to_vec();
        effective.extend(tok.encode_chat(rest));
        Some(SlotResumed {
            effective,
            cached: hit.tokens,
            tool_map: hit.tool_map,
        })
    }

    /// The save points strictly inside `prompt` for a slot that holds its
    /// first `start` tokens (the cold boundary when `cached == 0`, every
    /// continued frontier), ascending: the prefill pieces end there.
    pub(super) fn stops(
        &self,
        tok: &Tokenizer,
        prompt: &[u32],
        cached: usize,
        start: usize,
    ) -> Vec<(usize, SaveReason)> {
        let cfg = self.cache.config();
        let sp = tok.specials();
        let mut stops: Vec<(usize, SaveReason)> = Vec::new();
        if let Some(b) = cfg
            .cold_boundary(prompt, cached, sp.user, sp.assistant)
            .filter(|&b| b > start && b <= prompt.len())
        {
            stops.push((b, SaveReason::Cold));
        }
        if let Some(q) = start.checked_div(cfg.continued_step()) {
            let step = cfg.continued_step();
            let mut f = (q + 1) * step;
            while f <= prompt.len() {
                if !stops.iter().any(|&(b, _)| b == f) {
                    stops.push((f, SaveReason::Continued));
                }
                f += step;
            }
        }
        stops.sort_by_key(|&(b, _)| b);
        stops
    }

    /// The slot reached save point `reason` (it holds exactly the tokens
    /// to store).
    pub(super) fn at_stop(
        &mut self,
        batch: &Batch,
        slot: usize,
        tok: &Tokenizer,
        reason: SaveReason,
        tools: &dyn ToolIds,
    ) {
        let due = self.frontiers[slot].due(self.cache.config(), batch.tokens(slot).len());
        if reason == SaveReason::Cold || due {
            self.store(batch, slot, tok, reason, None, tools);
        }
    }

    /// Before a decode step of the slot (not inside a tool block).
    pub(super) fn before_decode(
        &mut self,
        batch: &Batch,
        slot: usize,
        tok: &Tokenizer,
        tools: &dyn ToolIds,
    ) {
        if self.frontiers[slot].due(self.cache.config(), batch.tokens(slot).len()) {
            self.store(batch, slot, tok, SaveReason::Continued, None, tools);
        }
    }

    /// The shutdown checkpoint of one slot (§5.4).
    pub(super) fn shutdown(
        &mut self,
        batch: &Batch,
        slot: usize,
        tok: &Tokenizer,
        visible: Option<(&[u8], VisibleKind)>,
        tools: &dyn ToolIds,
    ) {
        if batch.tokens(slot).len() >= self.cache.config().kv_cache_min_tokens {
            self.store(batch, slot, tok, SaveReason::Shutdown, visible, tools);
        }
    }

    /// Tool-id prefetch (KVCACHE.md §7).
    pub(super) fn prefetch_tool_ids(&mut self, wanted: &dyn Fn(&[u8]) -> bool) -> Vec<KtmEntry> {
        self.cache.prefetch_tool_ids(wanted)
    }
}
