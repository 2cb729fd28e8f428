//! Memory plan of a graph: activations whose lifetimes do not overlap share
//! one slot, so a prefill chunk of a full-size model does not need a buffer
//! per intermediate value. Kept values (outputs, dump targets) get their own.

use super::{Graph, ValueId};

/// Slot assignment: `slot_of[v]` indexes `slot_len`.
#[derive(Clone, Debug)]
pub struct Plan {
    pub slot_of: Vec<usize>,
    pub slot_len: Vec<usize>,
}

impl Plan {
    pub fn total_elements(&self) -> usize {
        self.slot_len.iter().sum()
    }
}

/// Greedy interval allocation over the tape: a value is born at its first
/// write and dies after its last read; a dead value's slot goes back to a
/// free list and is reused by the next value of a size that fits.
pub fn plan(g: &Graph) -> Plan {
    let n = g.values.len();
    let mut first = vec![usize::MAX; n];
    let mut last = vec![0usize; n];
    for (i, op) in g.ops().enumerate() {
        for v in op.inputs().into_iter().chain(op.outputs()) {
            let k = v.0 as usize;
            first[k] = first[k].min(i);
            last[k] = last[k].max(i);
        }
    }
    let keep = |v: usize| g.keep.binary_search(&ValueId(v as u32)).is_ok();
    let mut slot_of = vec![usize::MAX; n];
    let mut slot_len: Vec<usize> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let mut dying: Vec<Vec<usize>> = vec![Vec::new(); g.ops().count() + 1];
    for v in 0..n {
        if first[v] == usize::MAX && !keep(v) {
            continue;
        }
        if !keep(v) {
            dying[last[v]].push(v);
        }
    }
    // Values sorted by birth; free slots released after their last use.
    let mut order: Vec<usize> = (0..n)
        .filter(|&v| first[v] != usize::MAX || keep(v))
        .collect();
    order.sort_by_key(|&v| (first[v] == usize::MAX, first[v]));
    let mut step = 0usize;
    for v in order {
        let birth = if first[v] == usize::MAX { 0 } else { first[v] };
        while step < birth {
            for &d in &dying[step] {
                if slot_of[d] != usize::MAX {
                    free.push(slot_of[d]);
                }
            }
            step += 1;
        }
        let len = g.values[v].len();
        if keep(v) {
            slot_of[v] = slot_len.len();
            slot_len.push(len);
            continue;
        }
        // Best fit: the smallest free slot that holds the value; a new slot
        // when none does (slots never grow).
        let pick = free
            .iter()
            .enumerate()
            .filter(|(_, &s)| slot_len[s] >= len)
            .min_by_key(|(_, &s)| slot_len[s])
            .map(|(i, _)| i);
        match pick {
            Some(i) => slot_of[v] = free.swap_remove(i),
            None => {
                slot_of[v] = slot_len.len();
                slot_len.push(len);
            }
        }
    }
    Plan { slot_of, slot_len }
}
