//! The slot table of a GPU backend's routed-expert cache: which expert each
//! of a streamed layer's `slots` device slices holds, and for one routed
//! pass which slots its experts use and which misses to upload where.
//!
//! The device buffer of a streamed layer holds `slots` expert slices in a
//! row, so the routed kernels run unchanged over it with expert ids
//! replaced by slot ids (the backend writes the selection through
//! [`Round::slot_of`]). A pass whose distinct experts do not all fit (a
//! prefill chunk can select more than the slots) runs in rounds: each round
//! uploads what fits, runs the routed rows for its experts only (the others
//! are given id [`OTHER_ROUND`], which the kernels skip without writing)
//! and the next round may reuse
//! its slots; the sum over the `k` choices runs once after the last round.
//! Backend-independent and pure, so it is tested here.

use std::collections::HashMap;

use super::super::options::EvictionPolicy;

/// The id an entry of the selection gets in a round that does not compute
/// it: the routed kernels leave its outputs as they are (an earlier round
/// wrote them). −1, an id no expert has, still means "no expert" (wgpu
/// skips it, CUDA writes zeros), as without streaming.
pub const OTHER_ROUND: i32 = -2;

/// One round of a routed pass.
#[derive(Clone, Debug, PartialEq)]
pub struct Round {
    /// expert → slot for the experts this round computes.
    pub slot_of: HashMap<u32, u32>,
    /// (expert, slot) slices to upload before the round runs.
    pub uploads: Vec<(u32, u32)>,
}

impl Round {
    /// The selection rewritten for this round: slot ids for its experts,
    /// [`OTHER_ROUND`] for the entries of other rounds, −1 for entries that
    /// name no expert of the layer (`n_expert` experts).
    pub fn slot_selection(&self, sel: &[i32], n_expert: usize) -> Vec<i32> {
        sel.iter()
            .map(|&e| match u32::try_from(e) {
                Ok(e) if (e as usize) < n_expert => {
                    self.slot_of.get(&e).map_or(OTHER_ROUND, |&s| s as i32)
                }
                _ => -1,
            })
            .collect()
    }
}

/// Which expert each device slot of one layer holds, with the policy's
/// bookkeeping (last use, uses).
#[derive(Clone, Debug)]
pub struct SlotTable {
    policy: EvictionPolicy,
    expert_at: Vec<Option<u32>>,
    slot_of: HashMap<u32, u32>,
    last: Vec<u64>,
    uses: Vec<u64>,
    clock: u64,
}

impl SlotTable {
    /// `slots` empty slots.
    pub fn new(slots: usize, policy: EvictionPolicy) -> SlotTable {
        SlotTable {
            policy,
            expert_at: vec![None; slots],
            slot_of: HashMap::new(),
            last: vec![0; slots],
            uses: vec![0; slots],
            clock: 0,
        }
    }

    /// Whether expert `e` is in a slot.
    pub fn holds(&self, e: u32) -> bool {
        self.slot_of.contains_key(&e)
    }

    /// The slot holding `e`.
    pub fn slot(&self, e: u32) -> Option<u32> {
        self.slot_of.get(&e).copied()
    }

    /// Experts resident now.
    pub fn len(&self) -> usize {
        self.slot_of.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slot_of.is_empty()
    }

    /// The rounds of a pass over the distinct experts `want`: the experts
    /// already resident all go in the first round (they never exceed the
    /// slots); each miss takes a free slot, else the slot the policy picks
    /// among those the round does not use (LRU: least recently used; LFU:
    /// fewest uses, then least recent). Empty for an empty `want`; no
    /// rounds at all when the table has no slots.
    pub fn plan(&mut self, want: &[u32]) -> Vec<Round> {
        if self.expert_at.is_empty() {
            return Vec::new();
        }
        self.clock += 1;
        let now = self.clock;
        let mut rounds = Vec::new();
        let (mut todo, mut misses): (Vec<u32>, Vec<u32>) =
            want.iter().copied().partition(|&e| self.holds(e));
        todo.append(&mut misses);
        let mut i = 0;
        while i < todo.len() {
            let mut round = Round {
                slot_of: HashMap::new(),
                uploads: Vec::new(),
            };
            let mut used = vec![false; self.expert_at.len()];
            while i < todo.len() {
                let e = todo[i];
                let s = match self.slot(e) {
                    Some(s) => s as usize,
                    None => {
                        let Some(s) = self.victim(&used) else { break };
                        if let Some(old) = self.expert_at[s].take() {
                            self.slot_of.remove(&old);
                        }
                        self.expert_at[s] = Some(e);
                        self.slot_of.insert(e, s as u32);
                        self.uses[s] = 0;
                        round.uploads.push((e, s as u32));
                        s
                    }
                };
                used[s] = true;
                self.last[s] = now;
                self.uses[s] += 1;
                round.slot_of.insert(e, s as u32);
                i += 1;
            }
            rounds.push(round);
        }
        rounds
    }

    /// A free slot, else the policy's pick among the slots `used` leaves.
    fn victim(&self, used: &[bool]) -> Option<usize> {
        if let Some(s) = self.expert_at.iter().position(Option::is_none) {
            return Some(s);
        }
        let free = (0..self.expert_at.len()).filter(|&s| !used[s]);
        match self.policy {
            EvictionPolicy::Lru => free.min_by_key(|&s| self.last[s]),
            EvictionPolicy::Lfu => free.min_by_key(|&s| (self.uses[s], self.last[s])),
        }
    }

    /// Empties every slot (the benchmark's cold runs).
    pub fn clear(&mut self) {
        self.expert_at.iter_mut().for_each(|s| *s = None);
        self.slot_of.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every expert of `want` gets a slot in exactly one round, no slot is
    /// used twice in a round, and the table ends holding the last round's
    /// experts in the slots it says.
    fn check(t: &SlotTable, want: &[u32], rounds: &[Round]) {
        let mut seen: Vec<u32> = rounds
            .iter()
            .flat_map(|r| r.slot_of.keys().copied())
            .collect();
        seen.sort_unstable();
        let mut w = want.to_vec();
        w.sort_unstable();
        assert_eq!(seen, w);
        for r in rounds {
            let mut slots: Vec<u32> = r.slot_of.values().copied().collect();
            slots.sort_unstable();
            slots.dedup();
            assert_eq!(slots.len(), r.slot_of.len(), "a slot used twice in a round");
            for &(e, s) in &r.uploads {
                assert_eq!(r.slot_of[&e], s);
            }
        }
        for (&e, &s) in &rounds.last().unwrap().slot_of {
            assert_eq!(t.slot(e), Some(s));
        }
    }

    #[test]
    fn hits_upload_nothing_and_misses_evict_the_least_recent() {
        let mut t = SlotTable::new(3, EvictionPolicy::Lru);
        let r = t.plan(&[1, 2, 3]);
        check(&t, &[1, 2, 3], &r);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].uploads.len(), 3);
        let r = t.plan(&[2, 3]);
        assert!(r[0].uploads.is_empty(), "hits upload nothing");
        // 1 is the least recently used.
        let r = t.plan(&[4, 3]);
        check(&t, &[4, 3], &r);
        assert_eq!(r[0].uploads, vec![(4, t.slot(4).unwrap())]);
        assert!(!t.holds(1) && t.holds(2) && t.holds(3));
    }

    #[test]
    fn lfu_keeps_the_most_used_where_lru_keeps_the_most_recent() {
        for (policy, keeps) in [(EvictionPolicy::Lfu, 1), (EvictionPolicy::Lru, 2)] {
            let mut t = SlotTable::new(2, policy);
            // 1 used three times, 2 twice but most recently.
            for w in [&[1, 2][..], &[1], &[1], &[2]] {
                t.plan(w);
            }
            let r = t.plan(&[9]);
            check(&t, &[9], &r);
            assert!(t.holds(keeps) && t.holds(9) && t.len() == 2, "{policy:?}");
        }
    }

    #[test]
    fn more_experts_than_slots_run_in_rounds() {
        let mut t = SlotTable::new(4, EvictionPolicy::Lru);
        t.plan(&[0, 1]);
        let want: Vec<u32> = (0..11).collect();
        let r = t.plan(&want);
        check(&t, &want, &r);
        assert_eq!(r.len(), 3);
        // The resident ones are computed in the first round, unread.
        assert!(r[0].slot_of.contains_key(&0) && r[0].slot_of.contains_key(&1));
        assert_eq!(r.iter().map(|r| r.uploads.len()).sum::<usize>(), 9);
        let sel = [0, 5, -1, 10, 7, 11];
        let s0 = r[0].slot_selection(&sel, 11);
        assert_eq!(s0[0], r[0].slot_of[&0] as i32);
        assert_eq!(&s0[1..], &[OTHER_ROUND, -1, OTHER_ROUND, OTHER_ROUND, -1]);
        assert_eq!(r[2].slot_selection(&sel, 11)[3], r[2].slot_of[&10] as i32);
    }
}
