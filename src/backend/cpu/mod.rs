//! The CPU reference backend: executes a graph op by op with the CPU twins
//! in [`crate::graph::ops`]. Activations live in planned slots (f32; i32 values are
//! stored bit-cast), persistent state in one buffer per state.
//!
//! The same op loop serves the fast backend (`cpu`): built with
//! [`CpuBackend::fast`] it sends the matrix products (dense matmuls, routed
//! experts) to the quantised SIMD kernels of [`fast`], and the
//! indexer and attention to their SIMD twins there; every other op runs the reference twin
//! either way.

pub mod fast;

use std::sync::Arc;

use std::ops::Range;

use super::{state_range, Backend, BackendError, GraphHandle, WeightFile};
use crate::graph::ops::attention::AttentionInputs;
use crate::graph::ops::compress::CompressState;
use crate::graph::ops::Op;
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
    states: Vec<Vec<f32>>,
    graphs: Vec<LoadedGraph>,
    /// `Some`: the fast backend's matrix kernels; `None`: the reference.
    fast: Option<fast::Kernels>,
    /// Seconds and calls per op name when profiling (`DS4_CPU_PROFILE`; printed
    /// to stderr when the backend is dropped).
    profile: Option<std::collections::BTreeMap<&'static str, (f64, usize)>>,
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
        let states = layout
            .states
            .iter()
            .map(|s| vec![s.init; s.rows * s.cols])
            .collect();
        CpuBackend {
            file,
            layout,
            states,
            graphs: Vec::new(),
            fast: None,
            profile: None,
        }
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

fn as_i32(v: &[f32]) -> &[i32] {
    bytemuck::cast_slice(v)
}

fn as_i32_mut(v: &mut [f32]) -> &mut [i32] {
    bytemuck::cast_slice_mut(v)
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

    fn rows(&self, v: ValueId, n_tokens: usize) -> usize {
        let d = self.graph.value(v);
        if d.per_token {
            n_tokens
        } else {
            d.rows
        }
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
        let weights = self.file.clone();
        let file: &crate::gguf::GgufFile = (*weights).as_ref();
        let states = &mut self.states;
        let g = self
            .graphs
            .get_mut(h.0)
            .ok_or(BackendError::UnknownGraph(h.0))?;
        let graph = g.graph.clone();
        super::check_step(&graph, tokens, &p)?;
        let mut tok = g.take(graph.tokens);
        for (d, &t) in as_i32_mut(&mut tok).iter_mut().zip(tokens) {
            *d = t as i32;
        }
        g.put(graph.tokens, tok);
        let n = p.n_tokens;
        let profile = self.profile.is_some();
        for node in &graph.nodes {
            let Node::Op(op) = node else { continue };
            let t0 = profile.then(std::time::Instant::now);
            run_op(g, op, file, states, p, n, self.fast.as_ref());
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

    fn read_value(&self, h: GraphHandle, v: ValueId) -> Result<Vec<f32>, BackendError> {
        let g = self
            .graphs
            .get(h.0)
            .ok_or(BackendError::UnknownGraph(h.0))?;
        let d = g.graph.value(v);
        let rows = g.rows(v, g.n_tokens);
        let data = &g.get(v)[..rows * d.cols];
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

    fn read_state_rows(&self, s: StateId, rows: Range<usize>) -> Result<Vec<f32>, BackendError> {
        let r = state_range(&self.layout, s, 0, None, Some(rows))?;
        Ok(self.states[s.0 as usize][r].to_vec())
    }

    fn write_state_rows(
        &mut self,
        s: StateId,
        first: usize,
        data: &[f32],
    ) -> Result<(), BackendError> {
        let r = state_range(&self.layout, s, first, Some(data.len()), None)?;
        self.states[s.0 as usize][r].copy_from_slice(data);
        Ok(())
    }

    fn reset_states(&mut self) {
        for (buf, d) in self.states.iter_mut().zip(&self.layout.states) {
            buf.fill(d.init);
        }
    }
}

/// Executes one op: the single exhaustive dispatch of this backend.
fn run_op(
    g: &mut LoadedGraph,
    op: &Op,
    file: &crate::gguf::GgufFile,
    states: &mut [Vec<f32>],
    p: StepParams,
    n: usize,
    fast: Option<&fast::Kernels>,
) {
    let st = |s: StateId| s.0 as usize;
    match op {
        Op::Embed(o) => {
            let mut out = g.take(o.out);
            o.cpu(file, &as_i32(g.get(o.tokens))[..n], &mut out);
            g.put(o.out, out);
        }
        Op::HcInit(o) => {
            let mut out = g.take(o.out);
            o.cpu(g.get(o.x), n, &mut out);
            g.put(o.out, out);
        }
        Op::RmsNorm(o) => {
            let rows = g.rows(o.out, n);
            let cols = g.graph.value(o.out).cols;
            let mut out = g.take(o.out);
            o.cpu(file, &g.get(o.x)[..rows * cols], &mut out[..rows * cols]);
            g.put(o.out, out);
        }
        Op::MatMul(o) => {
            let rows = g.rows(o.out, n);
            let mut out = g.take(o.out);
            let done = fast.is_some_and(|k| {
                fast::matmul::matmul(
                    k,
                    o.w.ty,
                    o.w.bytes(file),
                    o.in_dim(),
                    o.out_dim(),
                    o.groups,
                    g.get(o.x),
                    rows,
                    &mut out,
                )
            });
            if !done {
                o.cpu(file, g.get(o.x), rows, &mut out);
            }
            g.put(o.out, out);
        }
        Op::HcMix(o) => {
            let mut pre = g.take(o.pre);
            let mut post = o.post.map(|v| g.take(v));
            let mut comb = o.comb.map(|v| g.take(v));
            o.cpu(
                file,
                g.get(o.logits),
                n,
                &mut pre,
                post.as_deref_mut(),
                comb.as_deref_mut(),
            );
            g.put(o.pre, pre);
            if let (Some(v), Some(b)) = (o.post, post) {
                g.put(v, b);
            }
            if let (Some(v), Some(b)) = (o.comb, comb) {
                g.put(v, b);
            }
        }
        Op::HcCollapse(o) => {
            let mut out = g.take(o.out);
            o.cpu(g.get(o.state), g.get(o.pre), n, &mut out);
            g.put(o.out, out);
        }
        Op::HcExpand(o) => {
            let mut out = g.take(o.out);
            o.cpu(
                g.get(o.state),
                g.get(o.y),
                g.get(o.post),
                g.get(o.comb),
                n,
                &mut out,
            );
            g.put(o.out, out);
        }
        Op::Rope(o) => {
            let mut out = g.take(o.out);
            o.cpu(g.get(o.x), p.pos0, n, &mut out);
            g.put(o.out, out);
        }
        Op::KvRound(o) => {
            let mut out = g.take(o.out);
            o.cpu(g.get(o.x), n, &mut out);
            g.put(o.out, out);
        }
        Op::HadamardFp4(o) => {
            let mut out = g.take(o.out);
            o.cpu(g.get(o.x), n, &mut out);
            g.put(o.out, out);
        }
        Op::Attention(o) => {
            let mut out = g.take(o.out);
            let inp = AttentionInputs {
                q: g.get(o.q),
                kv: g.get(o.kv),
                ring: &states[st(o.ring)],
                compressed: o.compressed.map(|c| &states[st(c.rows)][..]),
                selected: o.selected.map(|v| as_i32(g.get(v))),
            };
            match fast {
                Some(k) => fast::attention::attention(k, o, file, inp, p.pos0, n, &mut out),
                None => o.cpu(file, inp, p.pos0, n, &mut out),
            }
            g.put(o.out, out);
        }
        Op::RingWrite(o) => o.cpu(g.get(o.kv), p.pos0, n, &mut states[st(o.ring)]),
        Op::Compress(o) => {
            let mut kv = std::mem::take(&mut states[st(o.state_kv)]);
            let mut score = std::mem::take(&mut states[st(o.state_score)]);
            let mut rows = std::mem::take(&mut states[st(o.rows)]);
            o.cpu(
                file,
                g.get(o.kv),
                g.get(o.gate),
                p.pos0,
                n,
                CompressState {
                    kv: &mut kv,
                    score: &mut score,
                    rows: &mut rows,
                },
            );
            states[st(o.state_kv)] = kv;
            states[st(o.state_score)] = score;
            states[st(o.rows)] = rows;
        }
        Op::IndexerTopK(o) => {
            let mut out = g.take(o.out);
            let (q, w, rows) = (g.get(o.q), g.get(o.weights), &states[st(o.rows)]);
            match fast {
                Some(k) => fast::indexer::topk(k, o, q, w, rows, p.pos0, n, as_i32_mut(&mut out)),
                None => o.cpu(q, w, rows, p.pos0, n, as_i32_mut(&mut out)),
            }
            g.put(o.out, out);
        }
        Op::Router(o) => {
            let mut sel = g.take(o.selected);
            let mut w = g.take(o.weights);
            o.cpu(
                file,
                g.get(o.logits),
                as_i32(g.get(o.tokens)),
                n,
                as_i32_mut(&mut sel),
                &mut w,
            );
            g.put(o.selected, sel);
            g.put(o.weights, w);
        }
        Op::MoeExperts(o) => {
            let mut out = g.take(o.out);
            let (x, sel, w) = (g.get(o.x), as_i32(g.get(o.selected)), g.get(o.weights));
            let done =
                fast.is_some_and(|k| fast::matmul::moe_experts(k, o, file, x, sel, w, n, &mut out));
            if !done {
                o.cpu(file, x, sel, w, n, &mut out);
            }
            g.put(o.out, out);
        }
        Op::SwiGlu(o) => {
            let cols = g.graph.value(o.out).cols;
            let mut out = g.take(o.out);
            o.cpu(
                &g.get(o.gate)[..n * cols],
                &g.get(o.up)[..n * cols],
                &mut out[..n * cols],
            );
            g.put(o.out, out);
        }
        Op::Add(o) => {
            let cols = g.graph.value(o.out).cols;
            let mut out = g.take(o.out);
            o.cpu(
                &g.get(o.a)[..n * cols],
                &g.get(o.b)[..n * cols],
                &mut out[..n * cols],
            );
            g.put(o.out, out);
        }
        Op::Scale(o) => {
            let cols = g.graph.value(o.out).cols;
            let mut out = g.take(o.out);
            o.cpu(&g.get(o.x)[..n * cols], &mut out[..n * cols]);
            g.put(o.out, out);
        }
        Op::TakeLast(o) => {
            let mut out = g.take(o.out);
            o.cpu(g.get(o.x), n, &mut out);
            g.put(o.out, out);
        }
    }
}
