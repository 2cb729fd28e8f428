//! One streamed layer's cache: its slices (one expert's three slabs in one
//! buffer), the slots that hold them with their use counts, eviction back
//! to capacity, and the [`Pinned`] set a pass reads while it runs.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Condvar, Mutex};

use super::plan::ExpertLayer;
use super::read::{AlignedBuf, ReadError, SliceReader};
use super::stats::{add, Counters};
use crate::backend::options::EvictionPolicy;
use crate::gguf::{GgufFile, TensorRef};
use crate::graph::ops::moe::PinnedSlabs;

/// One expert's three slabs, read from the file into one buffer.
pub struct Slice {
    pub(super) buf: AlignedBuf,
    pub(super) parts: [std::ops::Range<usize>; 3],
}

impl Slice {
    pub(super) fn part(&self, p: usize) -> &[u8] {
        &self.buf.as_slice()[self.parts[p].clone()]
    }
}

pub(super) struct Entry {
    pub(super) slice: Arc<Slice>,
    pub(super) last: u64,
    pub(super) uses: u64,
    /// Read ahead and not used yet.
    pub(super) prefetched: bool,
    /// Known to be needed by the step under way (a hash layer's, from the
    /// token ids) and not used yet.
    pub(super) reserved: bool,
}

#[derive(Default)]
pub(super) struct LayerState {
    pub(super) slots: HashMap<u32, Entry>,
    /// Being read by a read-ahead thread right now.
    pub(super) in_flight: HashSet<u32>,
    pub(super) clock: u64,
    /// The previous single-token step's choice (the predictor).
    pub(super) prev: Vec<u32>,
    /// Buffers of evicted (or cleared) slices, reused by the next reads: a
    /// fresh buffer costs a page fault per page on its first read. At most
    /// [`SPARE_SLICES`] from evictions; [`ExpertCache::clear`] keeps every
    /// emptied slot's (the slots are empty then, so the memory is the same).
    pub(super) spare: Vec<AlignedBuf>,
    /// How often the router chose each expert (the popularity profile,
    /// the loaded file's counts included).
    pub(super) chosen: Vec<u64>,
}

/// Evicted buffers a layer keeps for reuse.
pub(super) const SPARE_SLICES: usize = 8;

pub(super) struct LayerCache {
    pub(super) info: ExpertLayer,
    pub(super) streamed: bool,
    pub(super) capacity: usize,
    pub(super) policy: EvictionPolicy,
    pub(super) state: Mutex<LayerState>,
    /// Signalled when a read-ahead finishes.
    pub(super) ready: Condvar,
}

impl LayerCache {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, LayerState> {
        // A panic while holding the lock leaves the map consistent (every
        // update is a single insert or remove), so a poisoned lock is used.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Evicts down to capacity. Slices a pass holds are never evicted;
    /// read-ahead slices not used yet, and slices this step is known to
    /// need, only when nothing else can go (a read-ahead's eviction runs
    /// before the pass touches what it hits, so LRU would take this step's
    /// least recent hit, and LFU a new read-ahead slice: it has no uses).
    pub(super) fn trim(&self, st: &mut LayerState, stats: &Counters) {
        while st.slots.len() > self.capacity {
            let pick = |spare_prefetched: bool| {
                let free = st.slots.iter().filter(|(_, en)| {
                    Arc::strong_count(&en.slice) == 1
                        && (!spare_prefetched || !(en.prefetched || en.reserved))
                });
                match self.policy {
                    EvictionPolicy::Lru => free.min_by_key(|(_, en)| en.last),
                    EvictionPolicy::Lfu => free.min_by_key(|(_, en)| (en.uses, en.last)),
                }
                .map(|(&e, _)| e)
            };
            let Some(e) = pick(true).or_else(|| pick(false)) else {
                break;
            };
            if let Some(en) = st.slots.remove(&e) {
                if en.prefetched {
                    add(&stats.prefetch_wasted, 1);
                }
                if st.spare.len() < SPARE_SLICES {
                    if let Ok(s) = Arc::try_unwrap(en.slice) {
                        st.spare.push(s.buf);
                    }
                }
            }
        }
    }

    /// Experts in the order a preload takes them: most chosen first by the
    /// profile, ties (and everything without a profile) in the layer's
    /// own order ([`ExpertLayer::popularity_order`]).
    pub(super) fn preload_order(&self, file: &GgufFile) -> Vec<u32> {
        let mut order = self.info.popularity_order(file);
        let st = self.lock();
        let n = |e: u32| st.chosen.get(e as usize).copied().unwrap_or(0);
        order.sort_by_key(|&e| std::cmp::Reverse(n(e)));
        order
    }

    /// Reads expert `e`'s slice (its three slabs in parallel, into one
    /// buffer), into an evicted slice's buffer when the layer has one.
    pub(super) fn read_slice(&self, reader: &SliceReader, e: u32) -> Result<Slice, ReadError> {
        let mut buf = self
            .lock()
            .spare
            .pop()
            .unwrap_or_else(|| AlignedBuf::zeroed(0));
        let extents: Vec<(u64, usize)> = (0..3)
            .map(|p| {
                let n = self.info.part_bytes(p);
                (self.info.parts[p].offset + e as u64 * n, n as usize)
            })
            .collect();
        let r = reader.read_extents_into(&extents, &mut buf);
        match r {
            Ok(r) => Ok(Slice {
                buf,
                parts: [r[0].clone(), r[1].clone(), r[2].clone()],
            }),
            Err(err) => {
                self.lock().spare.push(buf);
                Err(err)
            }
        }
    }

    pub(super) fn insert(&self, st: &mut LayerState, e: u32, slice: Arc<Slice>, prefetched: bool) {
        st.clock += 1;
        let last = st.clock;
        st.slots.entry(e).or_insert(Entry {
            slice,
            last,
            uses: u64::from(!prefetched),
            prefetched,
            reserved: false,
        });
    }
}

/// The slices one pass of one layer reads, held (never evicted) until it
/// drops; then the layer is trimmed back to its capacity.
pub struct Pinned {
    pub(super) layer: Arc<LayerCache>,
    pub(super) stats: Arc<Counters>,
    pub(super) offsets: [u64; 3],
    pub(super) slices: HashMap<u32, Arc<Slice>>,
}

impl Pinned {
    /// Part `p` (0 `gate`, 1 `up`, 2 `down`) of expert `e`'s slice.
    pub fn part(&self, e: u32, p: usize) -> Option<&[u8]> {
        Some(self.slices.get(&e)?.part(p))
    }
}

impl PinnedSlabs for Pinned {
    fn slab(&self, t: &TensorRef, e: usize) -> Option<&[u8]> {
        let p = self.offsets.iter().position(|&o| o == t.offset)?;
        Some(self.slices.get(&(e as u32))?.part(p))
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        self.slices.clear();
        let mut st = self.layer.lock();
        self.layer.trim(&mut st, &self.stats);
    }
}

/// One read-ahead on a reader thread: skipped when the slice arrived
/// meanwhile; a failed read is dropped (the pass that needs the slice reads
/// it again and reports the error).
pub(super) fn read_ahead(l: &LayerCache, reader: &SliceReader, stats: &Counters, e: u32) {
    {
        let mut st = l.lock();
        if st.slots.contains_key(&e) || !st.in_flight.insert(e) {
            return;
        }
    }
    let r = l.read_slice(reader, e);
    let mut st = l.lock();
    st.in_flight.remove(&e);
    if let Ok(s) = r {
        add(&stats.prefetch_reads, 1);
        add(&stats.bytes_read, l.info.slice_bytes());
        l.insert(&mut st, e, Arc::new(s), true);
        l.trim(&mut st, stats);
    }
    drop(st);
    l.ready.notify_all();
}
