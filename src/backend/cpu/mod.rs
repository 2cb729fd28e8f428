//! The CPU reference backend: executes a graph op by op with the CPU twins
//! in [`crate::graph::ops`]. Activations live in planned slots (f32; i32 values are
//! stored bit-cast), persistent state in one buffer per state.
//!
//! The same op loop serves the fast backend (`cpu`): built with
//! [`CpuBackend::fast`] it sends the matrix products (dense matmuls, routed
//! experts) to the quantised SIMD kernels of [`fast`], and the
//! indexer and attention to their SIMD twins there; every other op runs the reference twin
//! either way.
//!
//! State sets: the backend holds one copy of the state layout per session
//! ([`Backend::set_state_sets`]); a batched step ([`Backend::run_rows`])
//! runs the position-dependent ops once per session's block of rows against
//! that session's set, and every other op once over all rows.

pub mod fast;

use std::sync::Arc;

use std::ops::Range;

use super::experts::ExpertCache;
use super::{clamp_rows, state_range, Backend, BackendError, GraphHandle, WeightFile};
use crate::graph::ops::{CpuCx, Op};
use crate::graph::RowRecord;
use crate::graph::{plan, DType, Graph, Node, Plan, StateId, StateLayout, StepParams, ValueId};

struct LoadedGraph {
    graph: Arc<Graph>,
    plan: Plan,
    slots: Vec<Vec<f32>>,
    /// Live token count of the last step (rows readable by `read_value`).
    n_tokens: usize,
}

pub struct CpuBackend {
    file: WeightFile,
    layout: StateLayout,
    /// `states[set][s]`: state `s` of session `set`.
    states: Vec<Vec<Vec<f32>>>,
    graphs: Vec<LoadedGraph>,
    /// `Some`: the fast backend's matrix kernels; `None`: the reference.
    fast: Option<fast::Kernels>,
    /// Seconds and calls per op name when profiling (`DS4_CPU_PROFILE`; printed
    /// to stderr when the backend is dropped).
    profile: Option<std::collections::BTreeMap<&'static str, (f64, usize)>>,
    /// Routed experts streamed through this cache (`--ssd-streaming`).
    experts: Option<Arc<ExpertCache>>,
}

impl Drop for CpuBackend {
    fn drop(&mut self) {
        if let Some(p) = &self.profile {
            let total: f64 = p.values().map(|v| v.0).sum();
            eprintln!("{} op profile ({total:.3} s):", self.name());
            let mut v: Vec<_> = p.iter().collect();
            v.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0));
            for (name, (s, n)) in v {
                eprintln!(
                    "  {name:<14} {s:>8.3} s {:>5.1} % {n:>7} calls",
                    100.0 * s / total.max(1e-12)
                );
            }
        }
    }
}

impl CpuBackend {
    /// A backend reading weights from `file` (a model or a bare GGUF file)
    /// with the session state `layout`.
    pub fn new(file: WeightFile, layout: StateLayout) -> CpuBackend {
        let states = vec![fresh_states(&layout)];
        CpuBackend {
            file,
            layout,
            states,
            graphs: Vec::new(),
            fast: None,
            profile: None,
            experts: None,
        }
    }

    /// Reads routed experts through `cache` instead of the mapping.
    pub fn with_experts(mut self, cache: Arc<ExpertCache>) -> CpuBackend {
        self.experts = Some(cache);
        self
    }

    /// Prints seconds and calls per op name when the backend drops
    /// ([`super::BackendOptions::cpu_profile`]).
    pub fn with_profile(mut self, on: bool) -> CpuBackend {
        self.profile = on.then(Default::default);
        self
    }

    /// The fast CPU backend: the reference op loop with the matrix products
    /// run by `kernels` (quantised activations, integer SIMD dot products).
    pub fn fast(file: WeightFile, layout: StateLayout, kernels: fast::Kernels) -> CpuBackend {
        let mut b = CpuBackend::new(file, layout);
        b.fast = Some(kernels);
        b
    }

    /// The fast kernels' path (`None` for the reference backend).
    pub fn isa(&self) -> Option<fast::Isa> {
        self.fast.map(|k| k.isa)
    }
}

fn fresh_states(layout: &StateLayout) -> Vec<Vec<f32>> {
    layout
        .states
        .iter()
        .map(|s| vec![s.init; s.rows * s.cols])
        .collect()
}

fn as_i32(v: &[f32]) -> &[i32] {
    bytemuck::cast_slice(v)
}

fn as_i32_mut(v: &mut [f32]) -> &mut [i32] {
    bytemuck::cast_slice_mut(v)
}

impl CpuBackend {
    fn set(&self, set: usize) -> Result<&Vec<Vec<f32>>, BackendError> {
        self.states.get(set).ok_or_else(|| BackendError::State {
            state: format!("set {set}"),
            msg: format!("the backend holds {} sets", self.states.len()),
        })
    }
}

impl LoadedGraph {
    fn slot(&self, v: ValueId) -> usize {
        self.plan.slot_of[v.0 as usize]
    }

    fn get(&self, v: ValueId) -> &[f32] {
        let len = self.graph.value(v).len();
        &self.slots[self.slot(v)][..len]
    }

    /// Takes the output buffer out of its slot so inputs can be borrowed
    /// alongside it; `put` returns it.
    fn take(&mut self, v: ValueId) -> Vec<f32> {
        let s = self.slot(v);
        std::mem::take(&mut self.slots[s])
    }

    fn put(&mut self, v: ValueId, buf: Vec<f32>) {
        let s = self.slot(v);
        self.slots[s] = buf;
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        if self.fast.is_some() {
            "cpu"
        } else {
            "cpu-ref"
        }
    }

    fn device(&self) -> String {
        match self.fast {
            Some(k) => format!(
                "cpu ({} kernels, {} threads)",
                k.isa.name(),
                rayon::current_num_threads()
            ),
            None => "cpu-ref".into(),
        }
    }

    fn load_graph(&mut self, graph: Arc<Graph>) -> Result<GraphHandle, BackendError> {
        if let Some(c) = &self.experts {
            c.register((*self.file).as_ref(), &graph)
                .map_err(BackendError::Weights)?;
        }
        let plan = plan(&graph);
        let slots = plan.slot_len.iter().map(|&n| vec![0f32; n]).collect();
        self.graphs.push(LoadedGraph {
            graph,
            plan,
            slots,
            n_tokens: 0,
        });
        Ok(GraphHandle(self.graphs.len() - 1))
    }

    fn run(&mut self, h: GraphHandle, tokens: &[u32], p: StepParams) -> Result<(), BackendError> {
        let g = self
            .graphs
            .get(h.0)
            .ok_or(BackendError::UnknownGraph(h.0))?;
        super::check_step(&g.graph, tokens, &p)?;
        self.run_rows(h, tokens, &RowRecord::contiguous(p))
    }

    fn state_sets(&self) -> usize {
        self.states.len()
    }

    fn set_state_sets(&mut self, n: usize) -> Result<(), BackendError> {
        if n == 0 {
            return Err(BackendError::BadRows("no state sets".into()));
        }
        self.states.truncate(n);
        while self.states.len() < n {
            self.states.push(fresh_states(&self.layout));
        }
        Ok(())
    }

    fn read_set_rows(
        &self,
        set: usize,
        s: StateId,
        rows: Range<usize>,
    ) -> Result<Vec<f32>, BackendError> {
        let r = state_range(&self.layout, s, 0, None, Some(rows))?;
        Ok(self.set(set)?[s.0 as usize][r].to_vec())
    }

    fn write_set_rows(
        &mut self,
        set: usize,
        s: StateId,
        first: usize,
        data: &[f32],
    ) -> Result<(), BackendError> {
        let r = state_range(&self.layout, s, first, Some(data.len()), None)?;
        self.set(set)?;
        self.states[set][s.0 as usize][r].copy_from_slice(data);
        Ok(())
    }

    fn reset_set(&mut self, set: usize) -> Result<(), BackendError> {
        self.set(set)?;
        for (buf, d) in self.states[set].iter_mut().zip(&self.layout.states) {
            buf.fill(d.init);
        }
        Ok(())
    }

    fn run_rows(
        &mut self,
        h: GraphHandle,
        tokens: &[u32],
        rows: &[RowRecord],
    ) -> Result<(), BackendError> {
        let weights = self.file.clone();
        let file: &crate::gguf::GgufFile = (*weights).as_ref();
        let states = &mut self.states;
        let g = self
            .graphs
            .get_mut(h.0)
            .ok_or(BackendError::UnknownGraph(h.0))?;
        let graph = g.graph.clone();
        let segs = super::check_rows(&graph, tokens, rows, states.len())?;
        if let Some(c) = &self.experts {
            c.begin_step(file, tokens)
                .map_err(|e| BackendError::Weights(e.to_string()))?;
        }
        let mut tok = g.take(graph.tokens);
        for (d, &t) in as_i32_mut(&mut tok).iter_mut().zip(tokens) {
            *d = t as i32;
        }
        g.put(graph.tokens, tok);
        let n = rows.len();
        let profile = self.profile.is_some();
        let mut cx = CpuCx::new(file, &graph, &segs, &g.plan.slot_of, &mut g.slots, states);
        let fast = self.fast.as_ref();
        for node in &graph.nodes {
            let Node::Op(op) = node else { continue };
            let t0 = profile.then(std::time::Instant::now);
            // Streaming: the pass's experts come from the cache, pinned
            // until the op is done.
            if let (Op::MoeExperts(o), Some(c)) = (op, &self.experts) {
                let pinned = c
                    .pin(o, cx.get_i32(o.selected), n)
                    .map_err(|e| BackendError::Weights(e.to_string()))?;
                cx.experts = pinned.map(|p| p as Arc<dyn crate::graph::ops::moe::PinnedSlabs>);
            }
            if op.per_segment() {
                cx.for_each_segment(|cx| run_op(cx, op, fast));
            } else {
                run_op(&mut cx, op, fast);
            }
            cx.experts = None;
            if let (Some(t0), Some(prof)) = (t0, self.profile.as_mut()) {
                // Dense products split by weight format (their kernels differ).
                let name = match op {
                    Op::MatMul(o) => match o.w.ty {
                        crate::quant::GgmlType::F16 => "matmul f16",
                        crate::quant::GgmlType::F32 => "matmul f32",
                        crate::quant::GgmlType::Bf16 => "matmul bf16",
                        crate::quant::GgmlType::Q8_0 => "matmul q8_0",
                        _ => "matmul other",
                    },
                    _ => op.name(),
                };
                let e = prof.entry(name).or_insert((0.0, 0));
                e.0 += t0.elapsed().as_secs_f64();
                e.1 += 1;
            }
        }
        g.n_tokens = n;
        Ok(())
    }

    fn read_value_rows(
        &self,
        h: GraphHandle,
        v: ValueId,
        rows: Range<usize>,
    ) -> Result<Vec<f32>, BackendError> {
        let g = self
            .graphs
            .get(h.0)
            .ok_or(BackendError::UnknownGraph(h.0))?;
        let d = g.graph.value(v);
        let rows = clamp_rows(rows, d.live_rows(g.n_tokens));
        let data = &g.get(v)[rows.start * d.cols..rows.end * d.cols];
        Ok(match d.dtype {
            DType::F32 => data.to_vec(),
            DType::I32 => as_i32(data).iter().map(|&x| x as f32).collect(),
        })
    }

    fn write_value(
        &mut self,
        h: GraphHandle,
        v: ValueId,
        data: &[f32],
    ) -> Result<(), BackendError> {
        let g = self
            .graphs
            .get_mut(h.0)
            .ok_or(BackendError::UnknownGraph(h.0))?;
        let d = g.graph.value(v).clone();
        if data.len() > d.len() {
            return Err(BackendError::Value {
                value: d.name.to_string(),
                msg: format!("{} values given, it holds {}", data.len(), d.len()),
            });
        }
        let mut buf = g.take(v);
        match d.dtype {
            DType::F32 => buf[..data.len()].copy_from_slice(data),
            DType::I32 => {
                for (o, &x) in as_i32_mut(&mut buf[..data.len()]).iter_mut().zip(data) {
                    *o = x as i32;
                }
            }
        }
        g.put(v, buf);
        Ok(())
    }

    fn state_layout(&self) -> &StateLayout {
        &self.layout
    }

    fn reset_states(&mut self) {
        for set in 0..self.states.len() {
            let _ = self.reset_set(set);
        }
    }

    fn expert_cache(&self) -> Option<Arc<ExpertCache>> {
        self.experts.clone()
    }
}

/// Executes one op: the single exhaustive dispatch of this backend. The fast
/// kernels take the ops they override first.
fn run_op(cx: &mut CpuCx, op: &Op, fast: Option<&fast::Kernels>) {
    if fast.is_some_and(|k| k.try_op(op, cx)) {
        return;
    }
    match op {
        Op::Embed(o) => o.cpu(cx),
        Op::HcInit(o) => o.cpu(cx),
        Op::RmsNorm(o) => o.cpu(cx),
        Op::MatMul(o) => o.cpu(cx),
        Op::HcMix(o) => o.cpu(cx),
        Op::HcCollapse(o) => o.cpu(cx),
        Op::HcExpand(o) => o.cpu(cx),
        Op::Rope(o) => o.cpu(cx),
        Op::KvRound(o) => o.cpu(cx),
        Op::HadamardFp4(o) => o.cpu(cx),
        Op::BlockRound(o) => o.cpu(cx),
        Op::Attention(o) => o.cpu(cx),
        Op::RingWrite(o) => o.cpu(cx),
        Op::Compress(o) => o.cpu(cx),
        Op::IndexerTopK(o) => o.cpu(cx),
        Op::Router(o) => o.cpu(cx),
        Op::MoeExperts(o) => o.cpu(cx),
        Op::SwiGlu(o) => o.cpu(cx),
        Op::Add(o) => o.cpu(cx),
        Op::Scale(o) => o.cpu(cx),
        Op::TakeLast(o) => o.cpu(cx),
        Op::GatherLast(o) => o.cpu(cx),
        Op::V41(o) => o.cpu(cx),
    }
}
