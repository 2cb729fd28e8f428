//! The routed-expert cache (SSD streaming, `--ssd-streaming`): every
//! non-expert weight stays resident as without streaming, and each
//! (layer, expert) slice — that expert's rows of the layer's `gate`, `up`
//! and `down` tensors — is read from the GGUF on demand by positioned reads
//! ([`read`]) into a cache of a fixed number of slots per streamed layer,
//! evicting by [`EvictionPolicy`]. A backend asks [`ExpertCache::pin`] for
//! the experts a pass selected before it runs the pass and reads their
//! bytes from the returned [`Pinned`] set; the bytes are the file's, so
//! results are bit-identical with streaming on and off.
//!
//! Read-ahead runs on a small pool of reader threads: the hash layers'
//! experts follow from the token ids alone (`tid2eid`), so a step's reads
//! for them start before layer 0 runs ([`ExpertCache::begin_step`]). The
//! other layers' choices are known only after the previous layer; the
//! previous step's choice, a strong predictor, is exactly what the policy
//! keeps (it is the most recently used set), and how often it predicts is
//! counted ([`StreamStats::predicted`]). Decisions and measurements:
//! docs/SSD_STREAMING.md.

pub mod device;
pub mod profile;
pub mod read;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, RwLock};
use std::time::Instant;

use rayon::prelude::*;

use self::read::{AlignedBuf, ReadError, SliceReader};
use super::options::{CacheBudget, EvictionPolicy, ProfileFile, StreamingOptions};
use crate::gguf::{GgufFile, TensorRef};
use crate::graph::ops::moe::{MoeExperts, PinnedSlabs};
use crate::graph::ops::Op;
use crate::graph::Graph;

/// One routed layer as the cache sees it: the three expert tensors, the
/// expert count, the experts a token selects and the hash table, if any.
#[derive(Clone, Debug)]
pub struct ExpertLayer {
    /// `gate`, `up`, `down` (each `n_expert` equal slabs).
    pub parts: [TensorRef; 3],
    pub n_expert: usize,
    /// Experts one token selects.
    pub k: usize,
    /// The token → experts table of a hash layer (`tid2eid`).
    pub hash: Option<TensorRef>,
}

impl ExpertLayer {
    /// The layer of a routed-expert op (`hash` from its router).
    pub fn of(o: &MoeExperts, hash: Option<TensorRef>) -> ExpertLayer {
        ExpertLayer {
            parts: [o.gate.clone(), o.up.clone(), o.down.clone()],
            n_expert: o.dims().n_expert,
            k: o.k,
            hash,
        }
    }

    /// Bytes of part `p`'s slab of one expert.
    fn part_bytes(&self, p: usize) -> u64 {
        self.parts[p].n_bytes / self.n_expert.max(1) as u64
    }

    /// Bytes of one expert's slice (its three slabs).
    pub fn slice_bytes(&self) -> u64 {
        (0..3).map(|p| self.part_bytes(p)).sum()
    }

    /// Every expert's bytes.
    pub fn routed_bytes(&self) -> u64 {
        self.parts.iter().map(|t| t.n_bytes).sum()
    }

    /// The experts of `tokens` in this hash layer, in first-use order
    /// (empty for a learned-router layer; ids outside the table skipped).
    fn hash_experts(&self, file: &GgufFile, tokens: &[u32]) -> Vec<u32> {
        let Some(t) = &self.hash else {
            return Vec::new();
        };
        let cols = t.ne[0] as usize;
        let bytes = t.bytes(file);
        let mut out = Vec::new();
        for &tok in tokens {
            let base = tok as usize * cols * 4;
            for i in 0..self.k.min(cols) {
                let Some(b) = bytes.get(base + 4 * i..base + 4 * i + 4) else {
                    break;
                };
                let e = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                if e >= 0 && (e as usize) < self.n_expert && !out.contains(&(e as u32)) {
                    out.push(e as u32);
                }
            }
        }
        out
    }

    /// Experts in the order a preload takes them: by how many token ids
    /// the hash table sends to each (a hash layer's traffic follows that),
    /// else by index (no prior for a learned router).
    fn popularity_order(&self, file: &GgufFile) -> Vec<u32> {
        let mut order: Vec<u32> = (0..self.n_expert as u32).collect();
        if let Some(t) = &self.hash {
            let mut count = vec![0u64; self.n_expert];
            let cols = t.ne[0] as usize;
            for row in t.bytes(file).chunks_exact(4 * cols.max(1)) {
                for b in row.chunks_exact(4).take(self.k) {
                    let e = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                    if e >= 0 && (e as usize) < self.n_expert {
                        count[e as usize] += 1;
                    }
                }
            }
            order.sort_by(|&a, &b| count[b as usize].cmp(&count[a as usize]).then(a.cmp(&b)));
        }
        order
    }
}

/// The routed layers of a graph, in the order they run.
pub fn graph_layers(graph: &Graph) -> Vec<ExpertLayer> {
    let mut out = Vec::new();
    let mut hash = None;
    for node in &graph.nodes {
        match node {
            crate::graph::Node::Op(Op::Router(r)) => hash = r.tid2eid.clone(),
            crate::graph::Node::Op(Op::MoeExperts(o)) => {
                out.push(ExpertLayer::of(o, hash.take()));
            }
            _ => {}
        }
    }
    out
}

/// What stays resident and what streams, from the file, its routed layers
/// and the options: the start-up line's figures. Pure arithmetic, so the
/// full-shape header test checks it for the 81 GiB file.
#[derive(Clone, Debug, PartialEq)]
pub struct StreamPlan {
    pub file_bytes: u64,
    pub layers: usize,
    /// Routed layers kept whole (the first `full_layers`).
    pub full_layers: usize,
    /// Experts per layer (the largest layer's).
    pub n_expert: usize,
    /// Experts one token selects per layer (the largest).
    pub k: usize,
    /// Cache slots per streamed layer.
    pub slots: usize,
    /// One expert slice in every streamed layer (the bytes of one slot
    /// across the cache).
    pub slot_bytes: u64,
    /// Every routed byte of the streamed layers.
    pub streamed_bytes: u64,
    /// The cache: `slots × slot_bytes`.
    pub cache_bytes: u64,
    /// Everything else: non-expert weights, metadata and full layers.
    pub resident_bytes: u64,
    /// Routed bytes one decoded token reads in the streamed layers.
    pub active_bytes: u64,
}

impl StreamPlan {
    /// The plan for `layers` of a file of `file_bytes`; an error naming
    /// the smallest budget that works when the cache cannot hold one
    /// token's experts of a layer.
    pub fn new(
        file_bytes: u64,
        layers: &[ExpertLayer],
        o: &StreamingOptions,
    ) -> Result<StreamPlan, String> {
        let full_layers = o.full_layers.min(layers.len());
        let streamed = &layers[full_layers..];
        let n_expert = streamed.iter().map(|l| l.n_expert).max().unwrap_or(0);
        let k = streamed.iter().map(|l| l.k).max().unwrap_or(0);
        let slot_bytes: u64 = streamed.iter().map(|l| l.slice_bytes()).sum();
        let streamed_bytes: u64 = streamed.iter().map(|l| l.routed_bytes()).sum();
        let slots = match o.budget {
            _ if slot_bytes == 0 => n_expert,
            CacheBudget::Experts(n) => n.min(n_expert),
            CacheBudget::Bytes(b) => ((b / slot_bytes) as usize).min(n_expert),
        };
        if slots < k {
            let min = k as u64 * slot_bytes;
            return Err(format!(
                "--ssd-streaming-cache-experts: the cache holds {slots} expert(s) per layer, \
                 but one token uses {k} in every layer; the minimum is {k} \
                 (--ssd-streaming-cache-experts {k}, or {} MiB)",
                min.div_ceil(1 << 20)
            ));
        }
        Ok(StreamPlan {
            file_bytes,
            layers: layers.len(),
            full_layers,
            n_expert,
            k,
            slots,
            slot_bytes,
            streamed_bytes,
            cache_bytes: slots as u64 * slot_bytes,
            resident_bytes: file_bytes.saturating_sub(streamed_bytes),
            active_bytes: k as u64 * slot_bytes,
        })
    }

    /// The hit rate if routing were uniform: slots ÷ experts (the start-up
    /// estimate before anything is measured).
    pub fn uniform_hit_rate(&self) -> f64 {
        if self.n_expert == 0 {
            1.0
        } else {
            self.slots as f64 / self.n_expert as f64
        }
    }

    /// Routed bytes read from disk per decoded token at `hit_rate`.
    pub fn bytes_per_token(&self, hit_rate: f64) -> f64 {
        self.active_bytes as f64 * (1.0 - hit_rate).max(0.0)
    }

    /// The start-up line: resident bytes, cache budget, slices that fit,
    /// expected reads per token at `hit_rate`.
    pub fn line(&self, hit_rate: f64, direct: bool) -> String {
        format!(
            "ssd streaming: {} resident ({} of {} routed layers whole), cache {} = \
             {} of {} experts × {} streamed layers ({:.0} % of {} routed), \
             ~{:.1} MiB read per token at a {:.0} % hit rate, {} reads",
            size(self.resident_bytes),
            self.full_layers,
            self.layers,
            size(self.cache_bytes),
            self.slots,
            self.n_expert,
            self.layers - self.full_layers,
            100.0 * self.cache_bytes as f64 / self.streamed_bytes.max(1) as f64,
            size(self.streamed_bytes),
            self.bytes_per_token(hit_rate) / (1u64 << 20) as f64,
            100.0 * hit_rate,
            if direct { "direct" } else { "buffered" },
        )
    }
}

/// Bytes as GiB from 1 GiB up, else MiB.
fn size(b: u64) -> String {
    if b >= 1 << 30 {
        format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
    }
}

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
struct Counters {
    tokens: AtomicU64,
    lookups: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    prefetch_hits: AtomicU64,
    prefetch_reads: AtomicU64,
    prefetch_wasted: AtomicU64,
    predicted: AtomicU64,
    predictable: AtomicU64,
    bytes_read: AtomicU64,
    read_wait_ns: AtomicU64,
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// One expert's three slabs, read from the file into one buffer.
pub struct Slice {
    buf: AlignedBuf,
    parts: [std::ops::Range<usize>; 3],
}

impl Slice {
    fn part(&self, p: usize) -> &[u8] {
        &self.buf.as_slice()[self.parts[p].clone()]
    }
}

struct Entry {
    slice: Arc<Slice>,
    last: u64,
    uses: u64,
    /// Read ahead and not used yet.
    prefetched: bool,
    /// Known to be needed by the step under way (a hash layer's, from the
    /// token ids) and not used yet.
    reserved: bool,
}

#[derive(Default)]
struct LayerState {
    slots: HashMap<u32, Entry>,
    /// Being read by a read-ahead thread right now.
    in_flight: HashSet<u32>,
    clock: u64,
    /// The previous single-token step's choice (the predictor).
    prev: Vec<u32>,
    /// Buffers of evicted (or cleared) slices, reused by the next reads: a
    /// fresh buffer costs a page fault per page on its first read. At most
    /// [`SPARE_SLICES`] from evictions; [`ExpertCache::clear`] keeps every
    /// emptied slot's (the slots are empty then, so the memory is the same).
    spare: Vec<AlignedBuf>,
    /// How often the router chose each expert (the popularity profile,
    /// the loaded file's counts included).
    chosen: Vec<u64>,
}

/// Evicted buffers a layer keeps for reuse.
const SPARE_SLICES: usize = 8;

struct LayerCache {
    info: ExpertLayer,
    streamed: bool,
    capacity: usize,
    policy: EvictionPolicy,
    state: Mutex<LayerState>,
    /// Signalled when a read-ahead finishes.
    ready: Condvar,
}

impl LayerCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, LayerState> {
        // A panic while holding the lock leaves the map consistent (every
        // update is a single insert or remove), so a poisoned lock is used.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Evicts down to capacity. Slices a pass holds are never evicted;
    /// read-ahead slices not used yet, and slices this step is known to
    /// need, only when nothing else can go (a read-ahead's eviction runs
    /// before the pass touches what it hits, so LRU would take this step's
    /// least recent hit, and LFU a new read-ahead slice: it has no uses).
    fn trim(&self, st: &mut LayerState, stats: &Counters) {
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
    fn preload_order(&self, file: &GgufFile) -> Vec<u32> {
        let mut order = self.info.popularity_order(file);
        let st = self.lock();
        let n = |e: u32| st.chosen.get(e as usize).copied().unwrap_or(0);
        order.sort_by_key(|&e| std::cmp::Reverse(n(e)));
        order
    }

    /// Reads expert `e`'s slice (its three slabs in parallel, into one
    /// buffer), into an evicted slice's buffer when the layer has one.
    fn read_slice(&self, reader: &SliceReader, e: u32) -> Result<Slice, ReadError> {
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

    fn insert(&self, st: &mut LayerState, e: u32, slice: Arc<Slice>, prefetched: bool) {
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
    layer: Arc<LayerCache>,
    stats: Arc<Counters>,
    offsets: [u64; 3],
    slices: HashMap<u32, Arc<Slice>>,
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

struct Registry {
    layers: Vec<Arc<LayerCache>>,
    /// Layer index by the file offset of its `gate` tensor.
    by_gate: HashMap<u64, usize>,
}

/// The routed-expert cache of one backend (see the module comment).
pub struct ExpertCache {
    opts: StreamingOptions,
    reader: Arc<SliceReader>,
    file_len: u64,
    plan: OnceLock<StreamPlan>,
    registry: RwLock<Registry>,
    stats: Arc<Counters>,
    /// Reads slices: a pass's misses in parallel, and the read-ahead.
    readers: rayon::ThreadPool,
    /// The popularity profile's file, if recorded.
    profile_path: Option<PathBuf>,
    /// The model the profile belongs to (set with the plan).
    model_key: OnceLock<profile::ModelKey>,
    /// What became of the profile at start (for the start-up line).
    profile_note: Mutex<Option<String>>,
    /// Tokens run since the profile was last written.
    profile_unsaved: AtomicU64,
    /// A GPU backend's cache ([`ExpertCache::open_for_device`]): the slots
    /// live in device memory, this one only stages reads (`k` slices per
    /// layer plus what a pass pins) and is never preloaded.
    staging_only: bool,
}

/// Tokens between two writes of the popularity profile.
const PROFILE_EVERY_TOKENS: u64 = 1024;

fn read_err_to_string(e: ReadError) -> String {
    e.to_string()
}

impl ExpertCache {
    /// A cache over the GGUF at `file`'s path. The layers are registered
    /// with the first graph ([`ExpertCache::register`]).
    pub fn open(file: &GgufFile, opts: &StreamingOptions) -> Result<ExpertCache, String> {
        let path: &Path = file.path();
        if path.as_os_str().is_empty() {
            return Err("ssd streaming reads the GGUF from disk; this model has no file".into());
        }
        let reader = SliceReader::open(path, opts.direct_io)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if reader.identity().len != file.file_len() {
            return Err(format!(
                "{}: the file on disk is {} bytes, the loaded one {}",
                path.display(),
                reader.identity().len,
                file.file_len()
            ));
        }
        let readers = rayon::ThreadPoolBuilder::new()
            .num_threads(opts.read_threads.max(1))
            .thread_name(|i| format!("ds4-expert-read-{i}"))
            .build()
            .map_err(|e| format!("expert reader threads: {e}"))?;
        Ok(ExpertCache {
            opts: opts.clone(),
            reader: Arc::new(reader),
            file_len: file.file_len(),
            plan: OnceLock::new(),
            registry: RwLock::new(Registry {
                layers: Vec::new(),
                by_gate: HashMap::new(),
            }),
            stats: Arc::default(),
            readers,
            profile_path: match &opts.profile {
                ProfileFile::Off => None,
                ProfileFile::NextToModel => Some(profile::default_path(path)),
                ProfileFile::At(p) => Some(p.clone()),
            },
            model_key: OnceLock::new(),
            profile_note: Mutex::new(None),
            profile_unsaved: AtomicU64::new(0),
            staging_only: false,
        })
    }

    /// The cache of a GPU backend: the plan, reads, read-ahead, policy of
    /// the staging slices and counters as [`ExpertCache::open`], but the
    /// cache slots themselves are device memory ([`device::SlotTable`]), so
    /// host memory holds only the slices being uploaded (`k` per layer,
    /// plus a pass's misses while it runs) and nothing is preloaded here
    /// (the backend preloads its slots through [`ExpertCache::read_experts`]).
    pub fn open_for_device(
        file: &GgufFile,
        opts: &StreamingOptions,
    ) -> Result<ExpertCache, String> {
        let mut c = ExpertCache::open(file, opts)?;
        c.staging_only = true;
        Ok(c)
    }

    /// Registers the routed layers of `graph`. The first graph sets the
    /// plan (an error when the budget is below one token's experts) and,
    /// unless cold, preloads the cache; later graphs must use the same
    /// layers.
    pub fn register(&self, file: &GgufFile, graph: &Graph) -> Result<(), String> {
        let layers = graph_layers(graph);
        if let Some(plan) = self.plan.get() {
            let reg = self.registry.read().unwrap_or_else(|p| p.into_inner());
            if layers.len() != plan.layers
                || layers
                    .iter()
                    .any(|l| !reg.by_gate.contains_key(&l.parts[0].offset))
            {
                return Err(
                    "ssd streaming: a graph with other routed layers than the first".into(),
                );
            }
            return Ok(());
        }
        let plan = StreamPlan::new(self.file_len, &layers, &self.opts)?;
        let key = profile::ModelKey::of(file, &layers);
        let loaded = self.profile_path.as_ref().map(|p| profile::load(p, &key));
        let mut reg = self.registry.write().unwrap_or_else(|p| p.into_inner());
        for (i, info) in layers.into_iter().enumerate() {
            let info_n_expert = info.n_expert;
            reg.by_gate.insert(info.parts[0].offset, i);
            let capacity = if self.staging_only {
                info.k
            } else {
                plan.slots
            };
            reg.layers.push(Arc::new(LayerCache {
                info,
                streamed: i >= plan.full_layers,
                capacity,
                policy: self.opts.policy,
                state: Mutex::new(LayerState {
                    chosen: vec![0; info_n_expert],
                    ..LayerState::default()
                }),
                ready: Condvar::new(),
            }));
        }
        let layers = reg.layers.clone();
        drop(reg);
        let _ = self.plan.set(plan);
        let _ = self.model_key.set(key);
        let note = match (&self.profile_path, loaded) {
            (Some(path), Some(Ok(Some(p)))) => {
                let total = p.total();
                for (l, c) in layers.iter().zip(p.counts) {
                    l.lock().chosen = c;
                }
                Some(format!(
                    "preload order from the profile {} ({total} tokens)",
                    path.display()
                ))
            }
            (Some(path), Some(Ok(None))) => {
                Some(format!("no profile yet, recording to {}", path.display()))
            }
            (_, Some(Err(e))) => Some(format!("profile ignored: {e}")),
            _ => None,
        };
        *self.profile_note.lock().unwrap_or_else(|p| p.into_inner()) = note;
        if !self.opts.cold && !self.staging_only {
            self.preload(file, &layers).map_err(read_err_to_string)?;
        }
        Ok(())
    }

    /// Fills each streamed layer with its most popular experts (up to
    /// `--ssd-streaming-preload-experts` or the whole cache).
    fn preload(&self, file: &GgufFile, layers: &[Arc<LayerCache>]) -> Result<(), ReadError> {
        let jobs: Vec<(Arc<LayerCache>, u32)> = layers
            .iter()
            .filter(|l| l.streamed)
            .flat_map(|l| {
                let n = self
                    .opts
                    .preload_experts
                    .unwrap_or(l.capacity)
                    .min(l.capacity);
                let order = l.preload_order(file);
                order.into_iter().take(n).map(move |e| (l.clone(), e))
            })
            .collect();
        let read: Vec<(Arc<LayerCache>, u32, Slice)> = self.readers.install(|| {
            jobs.into_par_iter()
                .map(|(l, e)| {
                    let s = l.read_slice(&self.reader, e)?;
                    Ok((l, e, s))
                })
                .collect::<Result<_, ReadError>>()
        })?;
        for (l, e, s) in read {
            add(&self.stats.bytes_read, l.info.slice_bytes());
            let mut st = l.lock();
            l.insert(&mut st, e, Arc::new(s), false);
            st.slots.get_mut(&e).expect("just inserted").uses = 0;
        }
        Ok(())
    }

    /// The plan (after the first graph).
    pub fn plan(&self) -> Option<&StreamPlan> {
        self.plan.get()
    }

    /// Whether expert reads bypass the page cache.
    pub fn is_direct(&self) -> bool {
        self.reader.is_direct()
    }

    /// The start-up line (after the first graph): the uniform-routing hit
    /// rate stands in for the measured one until a run measures it.
    pub fn startup_line(&self) -> Option<String> {
        let p = self.plan.get()?;
        let s = self.stats();
        let hit = if s.lookups > 0 {
            s.hit_rate()
        } else {
            p.uniform_hit_rate()
        };
        let mut line = p.line(hit, self.reader.is_direct());
        if let Some(n) = &*self.profile_note.lock().unwrap_or_else(|p| p.into_inner()) {
            line.push_str("; ");
            line.push_str(n);
        }
        Some(line)
    }

    pub fn stats(&self) -> StreamStats {
        let c = &self.stats;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StreamStats {
            tokens: g(&c.tokens),
            lookups: g(&c.lookups),
            hits: g(&c.hits),
            misses: g(&c.misses),
            prefetch_hits: g(&c.prefetch_hits),
            prefetch_reads: g(&c.prefetch_reads),
            prefetch_wasted: g(&c.prefetch_wasted),
            predicted: g(&c.predicted),
            predictable: g(&c.predictable),
            bytes_read: g(&c.bytes_read),
            read_wait_s: g(&c.read_wait_ns) as f64 * 1e-9,
        }
    }

    /// Zeroes the counters; slices read ahead earlier count as cached from
    /// now on.
    pub fn reset_stats(&self) {
        let reg = self.registry.read().unwrap_or_else(|p| p.into_inner());
        for l in &reg.layers {
            l.lock()
                .slots
                .values_mut()
                .for_each(|en| en.prefetched = false);
        }
        drop(reg);
        let c = &self.stats;
        for a in [
            &c.tokens,
            &c.lookups,
            &c.hits,
            &c.misses,
            &c.prefetch_hits,
            &c.prefetch_reads,
            &c.prefetch_wasted,
            &c.predicted,
            &c.predictable,
            &c.bytes_read,
            &c.read_wait_ns,
        ] {
            a.store(0, Ordering::Relaxed);
        }
    }

    /// Empties every layer (the benchmark's cold runs); the emptied slots'
    /// buffers are kept for the next reads, so a cold block measures the
    /// reads, not the allocator.
    pub fn clear(&self) {
        let reg = self.registry.read().unwrap_or_else(|p| p.into_inner());
        for l in &reg.layers {
            let mut st = l.lock();
            let slots = std::mem::take(&mut st.slots);
            for en in slots.into_values() {
                if let Ok(s) = Arc::try_unwrap(en.slice) {
                    st.spare.push(s.buf);
                }
            }
            st.prev.clear();
        }
    }

    fn layer_of(&self, gate_offset: u64) -> Option<Arc<LayerCache>> {
        let reg = self.registry.read().unwrap_or_else(|p| p.into_inner());
        reg.by_gate
            .get(&gate_offset)
            .map(|&i| reg.layers[i].clone())
    }

    /// Called before a step runs: refuses a file changed on disk, counts
    /// the tokens and starts reading the hash layers' experts, which the
    /// token ids alone decide.
    pub fn begin_step(&self, file: &GgufFile, tokens: &[u32]) -> Result<(), ReadError> {
        self.begin_step_except(file, tokens, &|_, _| false)
    }

    /// [`ExpertCache::begin_step`] for a GPU backend: experts for which
    /// `on_device(gate offset, expert)` holds are already in device memory
    /// and are not read ahead.
    pub fn begin_step_except(
        &self,
        file: &GgufFile,
        tokens: &[u32],
        on_device: &dyn Fn(u64, u32) -> bool,
    ) -> Result<(), ReadError> {
        self.reader.check_unchanged()?;
        add(&self.stats.tokens, tokens.len() as u64);
        self.profile_tokens(tokens.len() as u64);
        if !self.opts.prefetch {
            return Ok(());
        }
        let layers = self
            .registry
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .layers
            .clone();
        for l in layers
            .iter()
            .filter(|l| l.streamed && l.info.hash.is_some())
        {
            let mut want = l.info.hash_experts(file, tokens);
            want.truncate(l.capacity);
            let mut st = l.lock();
            for e in &want {
                if let Some(en) = st.slots.get_mut(e) {
                    en.reserved = true;
                }
            }
            let gate = l.info.parts[0].offset;
            want.retain(|e| {
                !st.slots.contains_key(e) && !st.in_flight.contains(e) && !on_device(gate, *e)
            });
            drop(st);
            for e in want {
                let (l, reader, stats) = (l.clone(), self.reader.clone(), self.stats.clone());
                self.readers
                    .spawn(move || read_ahead(&l, &reader, &stats, e));
            }
        }
        Ok(())
    }

    /// The experts layer `layer` holds now, in index order (tests and
    /// diagnostics).
    pub fn cached_experts(&self, layer: usize) -> Vec<u32> {
        let reg = self.registry.read().unwrap_or_else(|p| p.into_inner());
        let mut v: Vec<u32> = reg
            .layers
            .get(layer)
            .map(|l| l.lock().slots.keys().copied().collect())
            .unwrap_or_default();
        v.sort_unstable();
        v
    }

    /// The popularity profile recorded so far (the loaded file's counts
    /// included); `None` before the first graph.
    pub fn profile(&self) -> Option<profile::Profile> {
        self.model_key.get()?;
        let reg = self.registry.read().unwrap_or_else(|p| p.into_inner());
        Some(profile::Profile {
            counts: reg.layers.iter().map(|l| l.lock().chosen.clone()).collect(),
        })
    }

    /// Writes the profile to its file (nothing when profiles are off or
    /// nothing was recorded). Also done every
    /// [`PROFILE_EVERY_TOKENS`] tokens and when the cache drops.
    pub fn save_profile(&self) -> Result<(), String> {
        let (Some(path), Some(key)) = (&self.profile_path, self.model_key.get()) else {
            return Ok(());
        };
        match self.profile() {
            Some(p) if p.total() > 0 => {
                profile::save(path, &p, key).map_err(|e| format!("{}: {e}", path.display()))
            }
            _ => Ok(()),
        }
    }

    /// Counts `n` tokens toward the next periodic write of the profile and
    /// writes it on the reader pool when one is due.
    fn profile_tokens(&self, n: u64) {
        let Some(key) = self.model_key.get() else {
            return;
        };
        let Some(path) = &self.profile_path else {
            return;
        };
        let since = self.profile_unsaved.fetch_add(n, Ordering::Relaxed) + n;
        if since < PROFILE_EVERY_TOKENS {
            return;
        }
        self.profile_unsaved.store(0, Ordering::Relaxed);
        if let Some(p) = self.profile() {
            let (path, key) = (path.clone(), *key);
            self.readers.spawn(move || {
                // A failed periodic write is retried at the next one and
                // reported when the cache drops.
                let _ = profile::save(&path, &p, &key);
            });
        }
    }

    /// Pins the experts `o` selected this step (`sel`, `n_tokens × k`),
    /// reading the missing ones; `None` for a layer kept whole (read
    /// through the mapping). A failed read fails this pass (the error
    /// names the file and the offset) and leaves the cache as it was.
    pub fn pin(
        &self,
        o: &MoeExperts,
        sel: &[i32],
        n_tokens: usize,
    ) -> Result<Option<Arc<Pinned>>, ReadError> {
        let sel = &sel[..(n_tokens * o.k).min(sel.len())];
        if let Some(layer) = self.layer_of(o.gate.offset) {
            // Every choice counts toward the popularity profile (repeats
            // within a step included), not only the distinct experts.
            let mut st = layer.lock();
            for &e in sel {
                if let Some(c) = usize::try_from(e).ok().and_then(|e| st.chosen.get_mut(e)) {
                    *c += 1;
                }
            }
        }
        let want = distinct_experts(sel, o.dims().n_expert);
        self.pin_experts(o.gate.offset, &want, n_tokens == 1, &|_| false)
    }

    /// Whether the layer whose `gate` tensor starts at `gate_offset` streams
    /// (registered and not kept whole).
    pub fn is_streamed(&self, gate_offset: u64) -> bool {
        self.layer_of(gate_offset).is_some_and(|l| l.streamed)
    }

    /// The experts a GPU backend preloads into its slots of the layer at
    /// `gate_offset`: none when cold, else the most popular
    /// (`--ssd-streaming-preload-experts`, at most the slots).
    pub fn preload_list(&self, file: &GgufFile, gate_offset: u64) -> Vec<u32> {
        let (Some(l), Some(plan)) = (self.layer_of(gate_offset), self.plan.get()) else {
            return Vec::new();
        };
        if self.opts.cold || !l.streamed {
            return Vec::new();
        }
        let n = self
            .opts
            .preload_experts
            .unwrap_or(plan.slots)
            .min(plan.slots);
        let mut order = l.info.popularity_order(file);
        order.truncate(n);
        order
    }

    /// Reads `experts` of the layer at `gate_offset` in parallel, outside
    /// the cache and its hit counters (a GPU backend's preload); `None`
    /// for a layer that does not stream.
    pub fn read_experts(
        &self,
        gate_offset: u64,
        experts: &[u32],
    ) -> Result<Option<Pinned>, ReadError> {
        let Some(layer) = self.layer_of(gate_offset).filter(|l| l.streamed) else {
            return Ok(None);
        };
        let read: Vec<(u32, Slice)> = self.readers.install(|| {
            experts
                .par_iter()
                .map(|&e| Ok((e, layer.read_slice(&self.reader, e)?)))
                .collect::<Result<_, ReadError>>()
        })?;
        add(
            &self.stats.bytes_read,
            read.len() as u64 * layer.info.slice_bytes(),
        );
        let offsets = [0, 1, 2].map(|p| layer.info.parts[p].offset);
        Ok(Some(Pinned {
            layer,
            stats: self.stats.clone(),
            offsets,
            slices: read.into_iter().map(|(e, s)| (e, Arc::new(s))).collect(),
        }))
    }

    /// Pins the distinct experts `want` of the layer at `gate_offset`
    /// (see [`ExpertCache::pin`]); those for which `on_device` holds are
    /// already in a GPU backend's slots: counted as hits, neither read nor
    /// pinned.
    pub fn pin_experts(
        &self,
        gate_offset: u64,
        want: &[u32],
        single_token: bool,
        on_device: &dyn Fn(u32) -> bool,
    ) -> Result<Option<Arc<Pinned>>, ReadError> {
        let Some(layer) = self.layer_of(gate_offset) else {
            return Ok(None);
        };
        if !layer.streamed {
            return Ok(None);
        }
        let stats = &self.stats;
        add(&stats.lookups, want.len() as u64);
        let resident: Vec<u32> = want.iter().copied().filter(|&e| on_device(e)).collect();
        let want: Vec<u32> = want.iter().copied().filter(|&e| !on_device(e)).collect();
        add(&stats.hits, resident.len() as u64);
        let mut got: HashMap<u32, Arc<Slice>> = HashMap::with_capacity(want.len());
        let mut missing = Vec::new();
        {
            let mut st = layer.lock();
            if single_token {
                let want: Vec<u32> = {
                    let mut all = [resident.as_slice(), want.as_slice()].concat();
                    all.sort_unstable();
                    all
                };
                if !st.prev.is_empty() {
                    let p = want.iter().filter(|e| st.prev.contains(e)).count();
                    add(&stats.predicted, p as u64);
                    add(&stats.predictable, want.len() as u64);
                }
                st.prev = want;
            }
            // A read-ahead of one of ours is under way: wait for it.
            if want.iter().any(|e| st.in_flight.contains(e)) {
                let t = Instant::now();
                while want.iter().any(|e| st.in_flight.contains(e)) {
                    st = layer.ready.wait(st).unwrap_or_else(|p| p.into_inner());
                }
                add(&stats.read_wait_ns, t.elapsed().as_nanos() as u64);
            }
            st.clock += 1;
            let now = st.clock;
            for &e in &want {
                match st.slots.get_mut(&e) {
                    Some(en) => {
                        en.last = now;
                        en.uses += 1;
                        en.reserved = false;
                        if std::mem::take(&mut en.prefetched) {
                            add(&stats.prefetch_hits, 1);
                        }
                        got.insert(e, en.slice.clone());
                    }
                    None => missing.push(e),
                }
            }
        }
        add(&stats.hits, (want.len() - missing.len()) as u64);
        add(&stats.misses, missing.len() as u64);
        if !missing.is_empty() {
            let t = Instant::now();
            let read: Vec<(u32, Slice)> = self.readers.install(|| {
                missing
                    .par_iter()
                    .map(|&e| Ok((e, layer.read_slice(&self.reader, e)?)))
                    .collect::<Result<_, ReadError>>()
            })?;
            add(&stats.read_wait_ns, t.elapsed().as_nanos() as u64);
            add(
                &stats.bytes_read,
                read.len() as u64 * layer.info.slice_bytes(),
            );
            let mut st = layer.lock();
            for (e, s) in read {
                layer.insert(&mut st, e, Arc::new(s), false);
                got.insert(e, st.slots[&e].slice.clone());
            }
        }
        let offsets = [0, 1, 2].map(|p| layer.info.parts[p].offset);
        Ok(Some(Arc::new(Pinned {
            layer,
            stats: self.stats.clone(),
            offsets,
            slices: got,
        })))
    }
}

/// The distinct valid expert ids of a selection, sorted.
pub fn distinct_experts(sel: &[i32], n_expert: usize) -> Vec<u32> {
    let mut want: Vec<u32> = sel
        .iter()
        .filter(|&&e| e >= 0 && (e as usize) < n_expert)
        .map(|&e| e as u32)
        .collect();
    want.sort_unstable();
    want.dedup();
    want
}

/// One read-ahead on a reader thread: skipped when the slice arrived
/// meanwhile; a failed read is dropped (the pass that needs the slice reads
/// it again and reports the error).
fn read_ahead(l: &LayerCache, reader: &SliceReader, stats: &Counters, e: u32) {
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

impl Drop for ExpertCache {
    /// Writes the popularity profile at exit (the one log line the cache
    /// prints itself: there is no caller left to return the error to).
    fn drop(&mut self) {
        if let Err(e) = self.save_profile() {
            eprintln!("ssd streaming: the expert profile was not written: {e}");
        }
    }
}
