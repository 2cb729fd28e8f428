//! What the worker remembers between requests besides the KV slot: the
//! tool memory (tool id → the exact sampled DSML block, SERVER.md §7), the
//! thinking-visible and protocol bindings (§9), and the ids it mints.

use std::collections::HashMap;
use std::sync::Arc;

use super::render::ReplayLookup;
use super::request::{Api, GenRequest, Role};
use crate::kvcache::{KtmEntry, ToolIds};
use crate::sampler::Rng;

/// Tool id → the exact sampled DSML block (SERVER.md §7), bounded, LRU.
#[derive(Default)]
pub(super) struct ToolMemory {
    map: HashMap<String, (Arc<String>, u64)>,
    tick: u64,
}

impl ToolMemory {
    pub(super) fn insert(&mut self, id: &str, block: Arc<String>, max: usize) {
        self.tick += 1;
        self.map.insert(id.to_string(), (block, self.tick));
        if self.map.len() > max {
            // Drop the least recently used tenth at once (amortised O(1)).
            let mut ticks: Vec<u64> = self.map.values().map(|v| v.1).collect();
            ticks.sort_unstable();
            let cut = ticks[(self.map.len() - max + max / 10).min(ticks.len() - 1)];
            self.map.retain(|_, v| v.1 > cut);
        }
    }

    pub(super) fn contains(&self, id: &str) -> bool {
        self.map.contains_key(id)
    }

    /// Adds pairs read back from a checkpoint's KTM map; equal blocks share
    /// one allocation, as blocks sampled together do. A block that is not
    /// UTF-8 cannot have been sampled by this server and is skipped.
    pub(super) fn restore(&mut self, entries: Vec<KtmEntry>, max: usize) -> usize {
        let mut blocks: HashMap<Vec<u8>, Arc<String>> = HashMap::new();
        let mut n = 0;
        for e in entries {
            let (Ok(id), Some(block)) = (
                String::from_utf8(e.id),
                match blocks.get(&e.dsml) {
                    Some(b) => Some(b.clone()),
                    None => String::from_utf8(e.dsml.clone()).ok().map(|b| {
                        let b = Arc::new(b);
                        blocks.insert(e.dsml, b.clone());
                        b
                    }),
                },
            ) else {
                continue;
            };
            self.insert(&id, block, max);
            n += 1;
        }
        n
    }
}

/// The KTM map of a checkpoint is written from this memory (KVCACHE.md §4.5).
impl ToolIds for ToolMemory {
    fn for_each_tool_id(&self, f: &mut dyn FnMut(&[u8], &[u8])) {
        for (id, (block, _)) in &self.map {
            f(id.as_bytes(), block.as_bytes());
        }
    }
}

impl ReplayLookup for ToolMemory {
    fn block_for(&mut self, ids: &[&str]) -> Option<String> {
        let first = self.map.get(ids[0])?.0.clone();
        for id in ids {
            let (b, _) = self.map.get(*id)?;
            if !Arc::ptr_eq(b, &first) && **b != *first {
                return None;
            }
        }
        self.tick += 1;
        for id in ids {
            if let Some(e) = self.map.get_mut(*id) {
                e.1 = self.tick;
            }
        }
        Some(first.to_string())
    }
}

/// The thinking-visible binding of SERVER.md §9.3.
pub(super) struct VisibleBinding {
    pub(super) text: String,
    pub(super) live_len: usize,
}

/// Protocol state of the last Responses / Anthropic turn (SERVER.md §9.1,
/// §9.2): the call ids it made, the live length then, and for Responses the
/// visible transcript a client that replays its input will render.
pub(super) struct ProtocolBinding {
    pub(super) api: Api,
    pub(super) ids: Vec<String>,
    pub(super) visible: Option<String>,
    pub(super) live_len: usize,
}

/// Trailing tool outputs of a request and the id set they answer
/// (SERVER.md §9.1 b, §9.2); None when the request does not end with them.
pub(super) fn trailing_tool_run(req: &GenRequest) -> Option<(usize, Vec<String>)> {
    let msgs = &req.messages;
    let is_result = |m: &super::request::Message| match req.api {
        Api::Messages => m.role == Role::User && !m.tool_result_ids.is_empty(),
        _ => m.role == Role::Tool,
    };
    let mut start = msgs.len();
    while start > 0 && (is_result(&msgs[start - 1]) || msgs[start - 1].role == Role::System) {
        start -= 1;
    }
    let run = &msgs[start..];
    if !run.iter().any(is_result) {
        return None;
    }
    let mut ids: Vec<String> = run
        .iter()
        .flat_map(|m| m.tool_result_ids.iter().cloned())
        .collect();
    if req.api == Api::Responses {
        // The set comes from the assistant message right before the run.
        if let Some(prev) = start.checked_sub(1).map(|i| &msgs[i]) {
            if prev.role != Role::Assistant || prev.tool_calls.is_empty() {
                return None;
            }
            ids = prev.tool_calls.iter().map(|c| c.id.clone()).collect();
        }
    }
    let first = run.iter().position(is_result).map_or(start, |p| start + p);
    Some((first, ids))
}

pub(super) fn same_set(a: &[String], b: &[String]) -> bool {
    let mut a = a.to_vec();
    let mut b = b.to_vec();
    a.sort();
    b.sort();
    a == b
}

/// 16 random bytes as 32 hex chars (`/dev/urandom`, time-mixed fallback).
pub(super) fn random_hex(n: usize, rng: &mut Rng) -> String {
    use std::io::Read;
    let mut bytes = vec![0u8; n];
    let ok = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .is_ok();
    if !ok {
        for b in &mut bytes {
            *b = rng.next_u64() as u8;
        }
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The generator for ids and unseeded sampling of request `seq`: seeded
/// from the clock (nanoseconds) and the sequence number, so two requests
/// in the same second still differ.
pub(super) fn id_rng(seq: u64) -> Rng {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    // Mix through the generator once so nearby seeds do not start alike.
    let mut mix = Rng::new(t ^ seq.rotate_left(32));
    Rng::new(mix.next_u64() ^ seq)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_memory_is_bounded_and_replays_one_block() {
        let mut m = ToolMemory::default();
        let b = Arc::new("\n\n<｜DSML｜tool_calls>…".to_string());
        for i in 0..50 {
            m.insert(&format!("call_{i}"), b.clone(), 20);
        }
        assert!(m.map.len() <= 20);
        assert!(m.contains("call_49") && !m.contains("call_0"));
        assert_eq!(m.block_for(&["call_49", "call_48"]), Some(b.to_string()));
        m.insert("call_x", Arc::new("other".into()), 20);
        assert_eq!(m.block_for(&["call_49", "call_x"]), None);
    }

    #[test]
    fn tool_memory_takes_ktm_entries_back_and_lists_its_pairs() {
        let e = |id: &[u8], dsml: &[u8]| KtmEntry {
            id: id.to_vec(),
            dsml: dsml.to_vec(),
        };
        let mut m = ToolMemory::default();
        let n = m.restore(
            vec![
                e(b"call_a", b"<tool_calls>1</tool_calls>"),
                e(b"call_b", b"<tool_calls>1</tool_calls>"),
                e(b"call_c", b"\xff not utf-8"),
                e(b"\xfe", b"<tool_calls>2</tool_calls>"),
            ],
            20,
        );
        assert_eq!(n, 2);
        assert!(Arc::ptr_eq(&m.map["call_a"].0, &m.map["call_b"].0));
        assert_eq!(
            m.block_for(&["call_a", "call_b"]).as_deref(),
            Some("<tool_calls>1</tool_calls>")
        );
        let mut pairs = Vec::new();
        m.for_each_tool_id(&mut |id, b| pairs.push((id.to_vec(), b.to_vec())));
        pairs.sort();
        assert_eq!(
            pairs,
            vec![
                (b"call_a".to_vec(), b"<tool_calls>1</tool_calls>".to_vec()),
                (b"call_b".to_vec(), b"<tool_calls>1</tool_calls>".to_vec()),
            ]
        );
    }
}
