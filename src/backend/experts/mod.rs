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
mod plan;
pub mod profile;
pub mod read;
mod slots;
mod stats;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, RwLock};
use std::time::Instant;

use rayon::prelude::*;

pub use self::plan::{graph_layers, ExpertLayer, HashTable, StreamPlan};
use self::read::{ReadError, SliceReader};
use self::slots::{read_ahead, LayerCache, LayerState};
pub use self::slots::{Pinned, Slice};
pub use self::stats::StreamStats;
use self::stats::{add, Counters};
use super::options::{ProfileFile, StreamingOptions};
use crate::gguf::GgufFile;
use crate::graph::ops::moe::MoeExperts;
use crate::graph::Graph;

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
    /// layers. Layers in a support file attached past the model file's end
    /// (the MTP block's, `GgufFile::attach`) never stream: the reader reads
    /// the model file only, and one small layer is read whole through the
    /// mapping, as the first `--ssd-streaming-full-layers` are.
    pub fn register(&self, file: &GgufFile, graph: &Graph) -> Result<(), String> {
        let mut layers = graph_layers(graph);
        layers.retain(|l| l.parts.iter().all(|p| p.offset < self.file_len));
        if self.plan.get().is_some() {
            let reg = self.registry.read().unwrap_or_else(|p| p.into_inner());
            if layers
                .iter()
                .any(|l| !reg.by_gate.contains_key(&l.parts[0].offset))
            {
                return Err(
                    "ssd streaming: a graph with other routed layers than the first".into(),
                );
            }
            return Ok(());
        }
        if layers.is_empty() {
            // Nothing of the model file routed (the MTP block's step): the
            // main forward plans the cache when it comes.
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

    /// What a GPU backend gives device slots to: registers `graph`'s routed
    /// layers (the first graph plans the cache; a budget below one token's
    /// experts is refused here) and returns the plan with the streamed
    /// layers for which `has_slots` is false. `None` when nothing streams.
    pub fn layers_for_slots(
        &self,
        file: &GgufFile,
        graph: &Graph,
        has_slots: impl Fn(u64) -> bool,
    ) -> Result<Option<(StreamPlan, Vec<ExpertLayer>)>, String> {
        self.register(file, graph)?;
        let Some(plan) = self.plan().cloned() else {
            return Ok(None);
        };
        let mut layers = graph_layers(graph);
        layers.retain(|l| {
            let gate = l.parts[0].offset;
            self.is_streamed(gate) && !has_slots(gate)
        });
        Ok(Some((plan, layers)))
    }

    /// The experts a GPU backend preloads into the new slots of the layer
    /// at `gate_offset` ([`ExpertCache::preload_list`]), read and pinned;
    /// `None` when there are none (a cold start).
    pub fn read_preload(
        &self,
        file: &GgufFile,
        gate_offset: u64,
    ) -> Result<Option<(Vec<u32>, Pinned)>, String> {
        let list = self.preload_list(file, gate_offset);
        if list.is_empty() {
            return Ok(None);
        }
        let pinned = self
            .read_experts(gate_offset, &list)
            .map_err(|e| e.to_string())?
            .ok_or("ssd streaming: preload of a layer kept whole")?;
        Ok(Some((list, pinned)))
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

    /// Reads the slices of `experts` of `layer` in parallel on the read
    /// pool, counting their bytes as read.
    fn read_slices(
        &self,
        layer: &LayerCache,
        experts: &[u32],
    ) -> Result<Vec<(u32, Slice)>, ReadError> {
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
        Ok(read)
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
        let read = self.read_slices(&layer, experts)?;
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
            let read = self.read_slices(&layer, &missing)?;
            add(&stats.read_wait_ns, t.elapsed().as_nanos() as u64);
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

impl Drop for ExpertCache {
    /// Writes the popularity profile at exit (the one log line the cache
    /// prints itself: there is no caller left to return the error to).
    fn drop(&mut self) {
        if let Err(e) = self.save_profile() {
            eprintln!("ssd streaming: the expert profile was not written: {e}");
        }
    }
}
