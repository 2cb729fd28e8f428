//! Byte-level BPE merging (TOKENIZER.md §5): repeatedly merge the adjacent
//! pair with the lowest merge rank (leftmost among equals). A heap over a
//! linked list of symbols keeps long pieces O(n log n).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// Merge table keyed by the two symbol ids.
pub struct Merges {
    /// (left, right) → (rank, merged id)
    pub pairs: HashMap<(u32, u32), (u32, u32)>,
}

impl Merges {
    /// Merges the initial symbols `syms` (one per byte) in place.
    pub fn apply(&self, syms: &mut Vec<u32>) {
        let n = syms.len();
        if n < 2 {
            return;
        }
        if n <= 16 {
            self.apply_small(syms);
            return;
        }
        // Linked list over positions; `len[i] == 0` marks a consumed symbol.
        let mut id = syms.clone();
        let mut prev: Vec<usize> = (0..n).map(|i| i.wrapping_sub(1)).collect();
        let mut next: Vec<usize> = (1..=n).collect();
        let mut alive = vec![true; n];
        let mut heap = BinaryHeap::new();
        for i in 0..n - 1 {
            if let Some(&(rank, _)) = self.pairs.get(&(id[i], id[i + 1])) {
                heap.push(Reverse((rank, i, id[i], id[i + 1])));
            }
        }
        while let Some(Reverse((rank, i, l, r))) = heap.pop() {
            let j = next[i];
            // Stale entry: one side changed since it was queued.
            if !alive[i] || j >= n || id[i] != l || id[j] != r {
                continue;
            }
            let Some(&(rk, merged)) = self.pairs.get(&(l, r)) else {
                continue;
            };
            if rk != rank {
                continue;
            }
            id[i] = merged;
            alive[j] = false;
            next[i] = next[j];
            if next[j] < n {
                prev[next[j]] = i;
            }
            if prev[i] < n {
                let p = prev[i];
                if let Some(&(rk, _)) = self.pairs.get(&(id[p], id[i])) {
                    heap.push(Reverse((rk, p, id[p], id[i])));
                }
            }
            if next[i] < n {
                let q = next[i];
                if let Some(&(rk, _)) = self.pairs.get(&(id[i], id[q])) {
                    heap.push(Reverse((rk, i, id[i], id[q])));
                }
            }
        }
        syms.clear();
        let mut k = 0;
        while k < n {
            syms.push(id[k]);
            k = next[k];
        }
    }

    /// Quadratic scan, faster for the short pieces that dominate real text.
    fn apply_small(&self, syms: &mut Vec<u32>) {
        loop {
            let mut best: Option<(u32, usize, u32)> = None;
            for i in 0..syms.len().saturating_sub(1) {
                if let Some(&(rank, merged)) = self.pairs.get(&(syms[i], syms[i + 1])) {
                    if best.is_none_or(|(r, _, _)| rank < r) {
                        best = Some((rank, i, merged));
                    }
                }
            }
            let Some((_, i, merged)) = best else { return };
            syms[i] = merged;
            syms.remove(i + 1);
        }
    }
}
