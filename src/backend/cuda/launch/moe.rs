//! cuda/moe.cu: the routed experts (ops::moe::MoeExperts). Gate and up of
//! one type take the fused `expert_gate_up_<type>` (one launch writes the
//! weighted, clamped SwiGLU); else `expert_rows_<type>` for each and
//! `expert_swiglu`. Then `expert_rows_<type>` for down and `expert_sum`.
//! A streamed layer (`--ssd-streaming`) reads its device slots through a
//! slot-id selection (super::super::streaming).

use super::{fixed, launch, per_token, unsupported, Cx, Dev, Grid, THREADS};
use crate::backend::cuda::kernels::Kernel;
use crate::backend::cuda::streaming::{StreamPoint, StreamedLayer};
use crate::backend::experts::HashTable;
use crate::backend::kernels::Entry;
use crate::backend::BackendError;
use crate::gguf::TensorRef;
use crate::graph::ops::moe::{ExpertDims, MoeExperts, MID_FP8_BLOCK};
use crate::graph::ops::round::BlockFormat;

/// Where the pass reads its experts: the uploaded tensors, or a streamed
/// layer's slots.
struct Pass<'a> {
    o: &'a MoeExperts,
    dims: ExpertDims,
    stream: Option<&'a StreamedLayer>,
    /// Experts the rows kernels index: the layer's, or its slots.
    n_ex: usize,
    /// The selection the rows kernels read.
    sel: Dev,
}

impl Pass<'_> {
    /// Part `t`'s device address.
    fn weights(&self, cx: &mut Cx, t: &TensorRef) -> Result<Dev, BackendError> {
        match self.stream {
            Some(l) => l
                .ptr(t)
                .map(Dev)
                .ok_or_else(|| unsupported(format!("streamed {} without slots", t.name))),
            None => cx.tensor(t),
        }
    }

    /// `expert_rows_<type>` of part `t` (`n_in` → `n_out`) from `x` into
    /// `dst`; `per_slot`: x holds one row per slot rather than per token.
    #[allow(clippy::too_many_arguments)]
    fn rows(
        &self,
        cx: &mut Cx,
        t: &TensorRef,
        n_in: usize,
        n_out: usize,
        x: Dev,
        per_slot: bool,
        dst: Dev,
    ) -> Result<(), BackendError> {
        let kernel = Kernel::typed(Entry::ExpertRows, t.ty);
        kernel.name().map_err(unsupported)?;
        let w = self.weights(cx, t)?;
        let slab = t.n_bytes / self.dims.n_expert as u64;
        let k = self.o.k;
        launch!(cx, kernel, rows_grid(n_out, k), THREADS, 0;
            w, t.row_bytes(), slab, self.n_ex, n_in, n_out, x, per_slot, self.sel, k, dst)
    }
}

/// A warp per output row of (token, slot).
fn rows_grid(n_out: usize, k: usize) -> Grid {
    Grid::Blocks(fixed(n_out.div_ceil(8)), per_token(k))
}

pub fn moe_experts(cx: &mut Cx, o: &MoeExperts) -> Result<(), BackendError> {
    let dims = o.dims();
    let ExpertDims {
        dim: d,
        hidden: ff,
        n_expert,
    } = dims;
    if n_expert == 0 {
        return Err(unsupported(format!("experts {d} × {ff}")));
    }
    let k = o.k;
    let slots = cx.max_tokens() * k;
    let h = cx.scratch(slots * ff * 4)?;
    let y = cx.scratch(slots * d * 4)?;
    let streamed = cx.streamed;
    let stream = streamed.get(&o.gate.offset);
    let (n_ex, sel) = match stream {
        Some(l) => {
            let slot_sel = cx.scratch(slots * 4)?;
            cx.pending = Some(StreamPoint {
                first: 0,
                sum: 0,
                gate: o.gate.offset,
                k,
                n_expert,
                selected: cx.value(o.selected),
                slot_sel: slot_sel.0,
                hash: HashTable::of(cx.graph, o),
            });
            (l.slots, slot_sel)
        }
        None => (n_expert, Dev(cx.value(o.selected))),
    };
    let pass = Pass {
        o,
        dims,
        stream,
        n_ex,
        sel,
    };
    let x = Dev(cx.value(o.x));
    if o.gate_up_alike() {
        // One launch reads both rows and writes the weighted, clamped
        // SwiGLU product.
        let kernel = Kernel::typed(Entry::ExpertGateUp, o.gate.ty);
        kernel.name().map_err(unsupported)?;
        let gw = pass.weights(cx, &o.gate)?;
        let uw = pass.weights(cx, &o.up)?;
        let slab = o.gate.n_bytes / n_expert as u64;
        launch!(cx, kernel, rows_grid(ff, k), THREADS, 0;
            gw, uw, o.gate.row_bytes(), slab, n_ex, d, ff, x, sel, o.weights, k, o.clamp, h)?;
    } else {
        let g = cx.scratch(slots * ff * 4)?;
        let up = cx.scratch(slots * ff * 4)?;
        pass.rows(cx, &o.gate, d, ff, x, false, g)?;
        pass.rows(cx, &o.up, d, ff, x, false, up)?;
        let grid = Grid::Threads(per_token(k * ff));
        launch!(cx, Entry::ExpertSwiGlu, grid, THREADS, 0; g, up, o.weights, h, ff, k, o.clamp)?;
    }
    if o.mid_fp8 {
        // V4.1 model numerics: w2's input (the weighted SwiGLU row of each
        // slot) through FP8 in place, before down. A streamed pass reruns
        // this every round over every slot: the round trip is idempotent.
        let grid = Grid::Blocks(per_token(k), fixed(1));
        let (block, fp8) = (MID_FP8_BLOCK, BlockFormat::Fp8.code());
        launch!(cx, Entry::BlockRound, grid, THREADS, 0; h, h, ff, k, block, fp8)?;
    }
    pass.rows(cx, &o.down, ff, d, h, true, y)?;
    let grid = Grid::Threads(per_token(d));
    launch!(cx, Entry::ExpertSum, grid, THREADS, 0; y, o.out, d, k)
}
