//! cuda/compress.cu: `compress`, one block of 1024 threads walking the
//! step's tokens (the state carries from one token to the next).

use super::{fixed, launch, unsupported, Cx, Grid};
use crate::backend::kernels::Entry;
use crate::backend::BackendError;
use crate::graph::ops::compress::{Compress, RowRounding};

pub fn compress(cx: &mut Cx, o: &Compress) -> Result<(), BackendError> {
    let hd = o.head_dim;
    if o.width() > 1024 || (o.rounding == RowRounding::HadamardFp4F16 && !hd.is_power_of_two()) {
        return Err(unsupported(format!("compressor of width {}", o.width())));
    }
    let ape = cx.small(&o.ape)?;
    let norm = cx.small(&o.norm)?;
    let f = cx.freqs(&o.rope)?;
    let rounding: u32 = match o.rounding {
        RowRounding::None => 0,
        RowRounding::Fp8F16 => 1,
        RowRounding::HadamardFp4F16 => 2,
    };
    let grid = Grid::Blocks(fixed(1), fixed(1));
    launch!(cx, Entry::Compress, grid, 1024, 0;
        o.kv, o.gate, ape, norm, o.state_kv, o.state_score, o.rows, f,
        o.ratio, hd, o.overlapped, o.rope.n_rot, rounding, o.eps)
}
