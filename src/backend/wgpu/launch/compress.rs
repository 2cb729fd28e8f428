//! shaders/compress.wgsl: `compress`, one workgroup walking the step's
//! tokens per session, in blocks of [`COMPRESS_BLOCK_TOKENS`] (one dispatch
//! each; the state carries over between them).

use super::super::kernels::Access::{Read as R, Write as W};
use super::super::params::{rope_table, CompressParams};
use super::round::MAX_ROW;
use super::{token_block, unsupported, Bindings, Cx};
use crate::backend::kernels::{Entry, Family};
use crate::backend::wgpu::Work;
use crate::backend::BackendError;
use crate::graph::ops::compress::{Compress, RowRounding};
use crate::graph::ops::{self, rope::frequencies};

/// kv, gate, constants, state kv, state score, rows0..7 (the rows beyond
/// one binding), the row table.
pub const BINDINGS: Bindings = Bindings::with_rows(&[R, R, R, W, W, W, W, W, W, W, W, W, W, R]);

/// Tokens one compressor dispatch walks through. The compressor is a
/// sequential loop in one workgroup; over a whole long step (thousands of
/// tokens) one invocation would loop more than llvmpipe (lavapipe) allows:
/// it ends every loop of an invocation after 65,535 iterations in all
/// (Mesa gallivm's `LP_MAX_TGSI_LOOP_ITERATIONS`), silently, so the rows of
/// the step's last tokens were never written (docs/VALIDATION.md, long
/// contexts). A block of 256 tokens stays near 10,000 iterations even at
/// Flash's widths (ratio 4: 64 rows of 512), and bounds the run time of
/// one dispatch on a GPU as well.
pub const COMPRESS_BLOCK_TOKENS: usize = 256;

pub fn compress(cx: &mut Cx, o: &Compress) -> Result<Vec<Work>, BackendError> {
    if o.head_dim > MAX_ROW {
        return Err(unsupported(format!("compressed rows of {}", o.head_dim)));
    }
    if o.rounding == RowRounding::HadamardFp4F16 && !o.head_dim.is_power_of_two() {
        return Err(unsupported(format!("Hadamard width {}", o.head_dim)));
    }
    // ape (ratio × width), the norm weight, the rope table.
    let mut consts = ops::load_f32(cx.file, &o.ape);
    consts.resize(o.ratio * o.width(), 0.0);
    consts.extend(ops::load_f32(cx.file, &o.norm));
    consts.extend(rope_table(&frequencies(&o.rope)));
    let p = CompressParams {
        ratio: o.ratio as u32,
        head_dim: o.head_dim as u32,
        width: o.width() as u32,
        overlapped: o.overlapped as u32,
        n_rot: o.rope.n_rot as u32,
        rounding: match o.rounding {
            RowRounding::None => 0,
            RowRounding::Fp8F16 => 1,
            RowRounding::HadamardFp4F16 => 2,
        },
        eps: o.eps,
        chunk_rows: cx.state_chunks(0, o.rows, true).1,
        ..Default::default()
    };
    let cb = cx.constants("compressor constants", &consts);
    let storage = |r: &Cx, set: usize| {
        let mut s = vec![
            r.val(o.kv),
            r.val(o.gate),
            cb.clone(),
            r.state(set, o.state_kv)?,
            r.state(set, o.state_score)?,
        ];
        s.extend(r.state_chunks(set, o.rows, true).0);
        Ok(s)
    };
    cx.check_f16_write(o.rows, o.rounding != RowRounding::None, "compress")?;
    let m = cx.kv_module(Family::Compress, &[o.rows])?;
    // One workgroup walks the tokens in order; one dispatch per block of
    // tokens.
    cx.per_block(COMPRESS_BLOCK_TOKENS, |cx, first| {
        let t1 = (first + COMPRESS_BLOCK_TOKENS) as u32;
        let p = CompressParams {
            t0: first as u32,
            t1,
            ..p
        };
        cx.kernel_sets(m, Entry::Compress, &p, storage, token_block(first, 1))
    })
}
