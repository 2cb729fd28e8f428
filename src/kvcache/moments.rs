//! The server worker's side of the disk cache: what to do at each save
//! moment of KVCACHE.md §5 and at the disk rule of §2 (rule 7). The worker
//! owns one [`SaveMoments`] next to its live session and calls
//!
//! * [`SaveMoments::resume_from_disk`] when rules 1–6 found nothing (evict
//!   save of the live session, then lookup + load);
//! * [`SaveMoments::prefill`] instead of `Session::sync` (stops at the cold
//!   boundary and the continued frontiers to store them);
//! * [`SaveMoments::before_decode`] before each decode step (continued
//!   saves), except inside a DSML block of a tool request;
//! * [`SaveMoments::shutdown`] on SIGINT/SIGTERM after the last request.
//!
//! Every call that may store takes the caller's tool memory ([`ToolIds`]):
//! each checkpoint carries the ids of the tool calls in its text (the KTM
//! map, KVCACHE.md §4.5); pass [`super::NoToolIds`] when there is none or
//! exact DSML replay is off.
//!
//! Stores run on the worker thread between steps, so a save delays a
//! response by the save itself and nothing else; a failed save is logged
//! and counted, never returned as a request error.

use super::{
    tool_map_for, CacheKey, ContinuedSaves, DiskCache, DiskHit, LookupOutcome, SaveReason,
    StoreOutcome, ToolIds,
};
use crate::session::{Session, SessionError, SyncStats};
use crate::tokenizer::Tokenizer;

/// The effective prompt after the disk rule.
#[derive(Clone, Debug, PartialEq)]
pub struct DiskResume {
    /// Loaded tokens followed by the tokenized rest of the request, or the
    /// whole request tokenized when nothing loaded.
    pub effective: Vec<u32>,
    /// Usage `cached_tokens`: tokens that came from the file.
    pub cached: usize,
    pub hit: Option<DiskHit>,
}

/// A visible transcript remembered at exactly the live frontier (SERVER.md
/// §9): stored as the cache text of evict and shutdown saves.
pub struct VisibleKey<'a> {
    pub text: &'a [u8],
    pub key: CacheKey,
}

pub struct SaveMoments {
    pub cache: DiskCache,
    frontier: ContinuedSaves,
}

impl SaveMoments {
    pub fn new(cache: DiskCache) -> SaveMoments {
        SaveMoments {
            cache,
            frontier: ContinuedSaves::default(),
        }
    }

    /// The last stored or loaded continued frontier.
    pub fn continued_frontier(&self) -> usize {
        self.frontier.last()
    }

    fn store_live(
        &mut self,
        session: &Session,
        tok: &Tokenizer,
        reason: SaveReason,
        visible: Option<&VisibleKey<'_>>,
        tools: &dyn ToolIds,
    ) -> StoreOutcome {
        let decoded;
        let (text, key) = match visible {
            Some(v) => (v.text, v.key),
            None => {
                decoded = tok.decode(session.tokens());
                (&decoded[..], CacheKey::Tokens)
            }
        };
        let map = tool_map_for(text, tools);
        let r = self.cache.store(session, text, key, reason, &map);
        if matches!(
            r,
            StoreOutcome::Stored { .. } | StoreOutcome::AlreadyStored { .. }
        ) {
            self.frontier.mark(session.tokens().len());
        }
        r
    }

    /// §2 rule 7 with the evict save before it (§5.3): the live session is
    /// about to be replaced. `visible` is the remembered transcript valid at
    /// the live length, if any.
    pub fn resume_from_disk(
        &mut self,
        session: &mut Session,
        tok: &Tokenizer,
        rendered: &str,
        visible: Option<&VisibleKey<'_>>,
        tools: &dyn ToolIds,
    ) -> DiskResume {
        self.frontier.reset();
        if session.tokens().len() >= self.cache.config().kv_cache_min_tokens {
            self.store_live(session, tok, SaveReason::Evict, visible, tools);
            self.frontier.reset();
        }
        let miss = |tok: &Tokenizer| DiskResume {
            effective: tok.encode_chat(rendered),
            cached: 0,
            hit: None,
        };
        match self.cache.lookup(session, rendered.as_bytes()) {
            LookupOutcome::Hit(hit) => {
                // Token text may end inside a UTF-8 character (byte-level
                // BPE); the rest then cannot be tokenized on its own.
                let Some(rest) = rendered.get(hit.text_bytes..) else {
                    session.reset();
                    return miss(tok);
                };
                self.frontier.set(hit.tokens);
                let mut effective = session.tokens().to_vec();
                effective.extend(tok.encode_chat(rest));
                DiskResume {
                    effective,
                    cached: hit.tokens,
                    hit: Some(hit),
                }
            }
            LookupOutcome::Miss | LookupOutcome::Failed { .. } => miss(tok),
        }
    }

    /// Brings `session` to `prompt` like `Session::sync`, storing the cold
    /// checkpoint (§5.1, only when `cached == 0`) and every continued
    /// frontier (§5.2) on the way. The returned stats cover the whole call.
    pub fn prefill(
        &mut self,
        session: &mut Session,
        tok: &Tokenizer,
        prompt: &[u32],
        cached: usize,
        progress: &mut dyn FnMut(usize, usize),
        tools: &dyn ToolIds,
    ) -> Result<SyncStats, SessionError> {
        let cfg = self.cache.config().clone();
        let sp = tok.specials();
        let cold = cfg.cold_boundary(prompt, cached, sp.user, sp.assistant);
        let step = cfg.continued_step();
        let start = common_prefix(session.tokens(), prompt);
        // Save points strictly inside the prompt, in order.
        let mut stops: Vec<(usize, SaveReason)> = Vec::new();
        if let Some(b) = cold.filter(|&b| b > start && b < prompt.len()) {
            stops.push((b, SaveReason::Cold));
        }
        if let Some(q) = start.checked_div(step) {
            let mut f = (q + 1) * step;
            while f < prompt.len() {
                if !stops.iter().any(|&(b, _)| b == f) {
                    stops.push((f, SaveReason::Continued));
                }
                f += step;
            }
        }
        stops.sort_by_key(|&(b, _)| b);
        let mut total = SyncStats {
            reused: 0,
            evaluated: 0,
        };
        let mut first = true;
        let targets = stops
            .iter()
            .map(|&(b, r)| (b, Some(r)))
            .chain(std::iter::once((prompt.len(), None)));
        for (end, reason) in targets {
            let s = session.sync(&prompt[..end], progress)?;
            if first {
                total.reused = s.reused;
                first = false;
            }
            total.evaluated += s.evaluated;
            match reason {
                Some(SaveReason::Cold) => {
                    self.store_live(session, tok, SaveReason::Cold, None, tools);
                }
                Some(r) if self.frontier.due(&cfg, end) => {
                    self.store_live(session, tok, r, None, tools);
                }
                _ => {}
            }
        }
        if cold == Some(prompt.len()) {
            self.store_live(session, tok, SaveReason::Cold, None, tools);
        } else if self.frontier.due(&cfg, prompt.len()) {
            self.store_live(session, tok, SaveReason::Continued, None, tools);
        }
        Ok(total)
    }

    /// Before each decode step: store the live session if it sits on a
    /// continued frontier.
    pub fn before_decode(&mut self, session: &Session, tok: &Tokenizer, tools: &dyn ToolIds) {
        let cfg = self.cache.config().clone();
        if self.frontier.due(&cfg, session.tokens().len()) {
            self.store_live(session, tok, SaveReason::Continued, None, tools);
        }
    }

    /// The next live length at which [`Moments::before_decode`] may store.
    pub fn next_checkpoint(&self, live: usize) -> Option<usize> {
        self.frontier.next_due(self.cache.config(), live)
    }

    /// The shutdown checkpoint (§5.4).
    pub fn shutdown(
        &mut self,
        session: &Session,
        tok: &Tokenizer,
        visible: Option<&VisibleKey<'_>>,
        tools: &dyn ToolIds,
    ) -> Option<StoreOutcome> {
        (session.tokens().len() >= self.cache.config().kv_cache_min_tokens)
            .then(|| self.store_live(session, tok, SaveReason::Shutdown, visible, tools))
    }
}

fn common_prefix(live: &[u32], prompt: &[u32]) -> usize {
    // Session::sync reuses the live state only when it is a whole prefix.
    if live.len() <= prompt.len() && prompt.starts_with(live) {
        live.len()
    } else {
        0
    }
}
