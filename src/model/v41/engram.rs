//! Engram n-gram hashing on the host (research §2.5; official
//! `inference/engram.py`, ds4 `ds4_engram.c`): token ids → table rows, known
//! as soon as the ids are, before any layer runs.
//!
//! For token `p`, the compressed ids of `p, p−1, …, p−(max_ngram−1)` are
//! combined; once the history runs out (sequence start) or meets a dead
//! token (an image token), that slot and every older one take the pad. The
//! rolling hash is `c₀·m₀ ⊕ c₁·m₁ ⊕ …` in 64 bits; after adding order `s + 1`
//! each head takes `hash mod prime + offset`, offsets being the running sum
//! of the layer's primes, so every column indexes its own slice of one table.

use std::sync::Arc;

use super::config::EngramConfig;
use crate::graph::ops::engram::EngramHashLayout;

pub use crate::graph::ops::engram::decode_row;

impl EngramConfig {
    /// The constants the graph's `EngramHash` op (and a host prefetcher) hash with.
    pub fn hash_layout(&self) -> EngramHashLayout {
        EngramHashLayout {
            token_map: Arc::from(self.token_map.as_slice()),
            pad_id: self.pad_id,
            max_ngram: self.max_ngram,
            n_heads: self.n_heads,
            n_layers: self.layer_ids.len(),
            primes: self.primes.clone(),
            multipliers: self.multipliers.clone(),
        }
    }
}

/// The table's bucket sizes (official `engram.py`, research §2.5): for each
/// of `n_layers` Engram layers and each n-gram order 2..=`max_ngram`, start
/// at `vocab_size − 1` (`engram_vocab_size`, a start, not a row count) and
/// take the next `n_heads` primes not used anywhere before (one set across
/// layers). Layer-major; a layer's rows are the sum of its primes.
pub fn bucket_primes(
    n_layers: usize,
    max_ngram: usize,
    n_heads: usize,
    vocab_size: u64,
) -> Vec<u64> {
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for _ in 0..n_layers {
        for _ in 1..max_ngram {
            let mut cur = vocab_size.saturating_sub(1);
            for _ in 0..n_heads {
                cur = next_prime(cur);
                while seen.contains(&cur) {
                    cur = next_prime(cur);
                }
                seen.insert(cur);
                out.push(cur);
            }
        }
    }
    out
}

fn next_prime(n: u64) -> u64 {
    let is_prime = |x: u64| x >= 2 && (2..).take_while(|d| d * d <= x).all(|d| x % d != 0);
    (n + 1..).find(|&x| is_prime(x)).unwrap_or(n + 1)
}

/// The compressed ids of the tokens before the next one, newest first
/// (`None` = no history or a dead token).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EngramHistory {
    tail: Vec<Option<u32>>,
}

impl EngramHistory {
    pub fn new(cfg: &EngramConfig) -> EngramHistory {
        EngramHistory {
            tail: vec![None; cfg.max_ngram - 1],
        }
    }
}

/// Row ids of `tokens` for every Engram layer: `[token][layer slot][col]`,
/// flattened. `dead[i]` marks a token that takes no part (image spans).
/// Token ids outside the map count as dead, so nothing panics; callers
/// refuse them before.
pub fn hash_rows(
    cfg: &EngramConfig,
    history: &mut EngramHistory,
    tokens: &[u32],
    dead: Option<&[bool]>,
) -> Vec<u32> {
    let layout = cfg.hash_layout();
    let mut out = Vec::with_capacity(tokens.len() * layout.n_layers * layout.cols());
    for (i, &tok) in tokens.iter().enumerate() {
        let is_dead = dead.is_some_and(|d| d.get(i).copied().unwrap_or(false));
        let current = if is_dead {
            None
        } else {
            cfg.token_map.get(tok as usize).copied()
        };
        layout.hash_token(&mut history.tail, current, &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> EngramConfig {
        // The research note's tiny layout: primes from 100 for two layers.
        EngramConfig {
            layer_ids: vec![1, 4],
            rows: vec![420, 508],
            max_ngram: 3,
            n_heads: 2,
            head_dim: 32,
            compressed_vocab: 5,
            pad_id: 3,
            token_map: vec![0, 1, 3, 2, 4, 1],
            primes: vec![101, 103, 107, 109, 113, 127, 131, 137],
            multipliers: vec![7, 11, 13, 17, 19, 23],
        }
    }

    #[test]
    fn hashes_by_the_formula_with_pad_at_the_start() {
        let c = cfg();
        let mut h = EngramHistory::new(&c);
        let rows = hash_rows(&c, &mut h, &[4, 5], None);
        assert_eq!(rows.len(), 2 * 2 * 4);
        // token 4 → c=4; history pad 3, 3.
        let (a, b, p) = (4u64, 3u64, 3u64);
        let h2 = (a * 7) ^ (b * 11);
        let h3 = h2 ^ (p * 13);
        assert_eq!(
            &rows[..4],
            &[
                (h2 % 101) as u32,
                (h2 % 103 + 101) as u32,
                (h3 % 107 + 204) as u32,
                (h3 % 109 + 311) as u32
            ]
        );
        // Token 5 → c = 1 with history [4, pad], second layer's multipliers.
        let m = [17u64, 19, 23];
        let h2 = m[0] ^ (4 * m[1]);
        let h3 = h2 ^ (3 * m[2]);
        assert_eq!(
            &rows[12..16],
            &[
                (h2 % 113) as u32,
                (h2 % 127 + 113) as u32,
                (h3 % 131 + 240) as u32,
                (h3 % 137 + 371) as u32
            ]
        );
    }

    #[test]
    fn bucket_primes_are_the_official_search() {
        // Research note §1/§2.5 and the tiny recipe.
        assert_eq!(
            bucket_primes(2, 3, 2, 100),
            [101, 103, 107, 109, 113, 127, 131, 137]
        );
        let flash = bucket_primes(2, 4, 8, 16_000_000);
        assert_eq!(&flash[..3], &[16000057, 16000079, 16000081]);
        let rows: Vec<u64> = flash.chunks(24).map(|c| c.iter().sum()).collect();
        assert_eq!(rows, [384006168, 384016682]);
    }

    #[test]
    fn dead_tokens_block_longer_orders() {
        let c = cfg();
        let mut h1 = EngramHistory::new(&c);
        let with_dead = hash_rows(&c, &mut h1, &[1, 2, 4], Some(&[false, true, false]));
        let mut h2 = EngramHistory::new(&c);
        let fresh = hash_rows(&c, &mut h2, &[4], None);
        // After a dead token every older slot is pad: token 4 hashes as at the start.
        assert_eq!(&with_dead[16..24], &fresh[..8]);
        // The dead token itself is hashed from pads only.
        let mut h3 = EngramHistory::new(&c);
        let pads = hash_rows(&c, &mut h3, &[2], Some(&[true]));
        assert_eq!(&with_dead[8..16], &pads[..]);
    }
}
