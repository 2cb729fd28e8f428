//! Deterministic data parallelism for the CPU twins.
//!
//! Work is split into contiguous chunks of output rows; each output element
//! is computed by exactly one thread in a fixed order, so results are
//! bit-identical whatever the thread count.

use rayon::prelude::*;

/// Calls `f(first_row, rows)` on disjoint chunks of `out` (`row_len` values per
/// row), in parallel when the work is large enough to pay for it.
pub fn for_rows<T: Send>(
    out: &mut [T],
    row_len: usize,
    work_per_row: usize,
    f: impl Fn(usize, &mut [T]) + Sync + Send,
) {
    if row_len == 0 || out.is_empty() {
        return;
    }
    let n_rows = out.len() / row_len;
    // Below ~64k multiply-adds a thread hand-off costs more than it saves.
    let min_rows = (65536 / work_per_row.max(1)).clamp(1, n_rows.max(1));
    let threads = rayon::current_num_threads().max(1);
    let rows_per_chunk = n_rows.div_ceil(threads * 4).max(min_rows);
    if rows_per_chunk >= n_rows {
        f(0, out);
        return;
    }
    out.par_chunks_mut(rows_per_chunk * row_len)
        .enumerate()
        .for_each(|(i, chunk)| f(i * rows_per_chunk, chunk));
}
