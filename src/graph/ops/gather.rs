//! The output head's input in a step of several sessions: the last row of
//! each session's piece, gathered into that session's row (issue 18). A
//! prefill piece then pays the vocabulary projection for one row instead
//! of one per prompt token; the gathered rows go through the same
//! row-independent norm and product as a single session's last row, so a
//! session's logits do not change.

use super::CpuCx;
use crate::graph::{Segment, ValueId};

/// `out[s] = x[the last row of state s in the step]` for every state
/// `s < states`; rows of states with no row in the step are zero. `x` is
/// token-indexed (`cols` per row), `out` a fixed value of `states` rows.
#[derive(Clone, Debug)]
pub struct GatherLast {
    pub x: ValueId,
    pub out: ValueId,
    pub cols: usize,
    /// Rows of `out`: the backend's state sets (KV slots).
    pub states: usize,
}

impl GatherLast {
    pub fn cpu(&self, cx: &mut CpuCx) {
        cx.write(self.out, |cx, out| {
            self.compute(cx.get(self.x), cx.segments(), out)
        });
    }

    /// `segments` are the step's (rows from 0, as [`crate::graph::segments`]
    /// gives them).
    pub fn compute(&self, x: &[f32], segments: &[Segment], out: &mut [f32]) {
        let c = self.cols;
        out[..self.states * c].fill(0.0);
        for s in segments.iter().filter(|s| s.state < self.states && s.n > 0) {
            let t = s.row0 + s.n - 1;
            out[s.state * c..(s.state + 1) * c].copy_from_slice(&x[t * c..(t + 1) * c]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{segments, RowRecord};

    /// Seeded random steps (several states, pieces of random lengths, in
    /// random state order) against the definition written out row by row:
    /// for each state, the row table's last row of that state.
    #[test]
    fn gathers_each_states_last_row_of_random_steps() {
        let mut seed = 0x6A7u64;
        let mut next = move |m: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % m
        };
        for _ in 0..200 {
            let states = 1 + next(6) as usize;
            let cols = 1 + next(9) as usize;
            let mut order: Vec<usize> = (0..states).collect();
            for i in (1..states).rev() {
                order.swap(i, next(i as u64 + 1) as usize);
            }
            let mut table = Vec::new();
            for &s in order.iter().take(1 + next(states as u64) as usize) {
                let pos0 = next(1000) as u32;
                for t in 0..1 + next(5) as u32 {
                    table.push(RowRecord {
                        pos: pos0 + t,
                        state: s as u32,
                    });
                }
            }
            let x: Vec<f32> = (0..table.len() * cols)
                .map(|_| next(2001) as f32 - 1000.0)
                .collect();
            let op = GatherLast {
                x: ValueId(0),
                out: ValueId(1),
                cols,
                states,
            };
            let segs = segments(&table, states).unwrap();
            let mut out = vec![f32::NAN; states * cols];
            op.compute(&x, &segs, &mut out);
            for s in 0..states {
                let want: Vec<f32> = match table.iter().rposition(|r| r.state as usize == s) {
                    Some(t) => x[t * cols..(t + 1) * cols].to_vec(),
                    None => vec![0.0; cols],
                };
                assert_eq!(&out[s * cols..(s + 1) * cols], &want[..], "state {s}");
            }
        }
    }
}
