"""Deterministic prompt texts for the goldens (written for this project).

Each entry: name -> (target token count including BOS, text). make_goldens.py cuts
the text at the last whitespace boundary where BOS + tokens <= target, so the stored
ids are exactly BOS followed by the tokenization of the stored (cut) text.
"""

SHORT = "The lighthouse keeper climbed the stairs before the storm"

PROSE = """\
On the northern edge of the bay stands a lighthouse that has not been lit for forty years. \
The keepers left one by one when the automatic beacon on the breakwater took over, and the \
tower was sold to a family who wanted a quiet place to spend their summers. They painted the \
door a deep green, planted tomatoes in the old oil store, and kept the great lens polished \
out of respect, although it no longer turned. On clear nights the children would climb the \
spiral stairs, one hundred and twelve steps, and sit in the lantern room counting the ships \
that passed along the horizon. Their grandmother told them that every light at sea was a \
promise: somebody, somewhere, was awake and watching so that others could sleep."""

CODE = '''\
def moving_average(values, window):
    """Return the moving average of `values` over `window` items.

    The first `window - 1` outputs average over the items seen so far, so the
    result has the same length as the input.
    """
    if window <= 0:
        raise ValueError("window must be positive")
    out = []
    total = 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


class RingBuffer:
    """A fixed-capacity buffer that overwrites its oldest entry when full."""

    def __init__(self, capacity):
        self.capacity = capacity
        self.items = [None] * capacity
        self.start = 0
        self.size = 0

    def push(self, item):
        end = (self.start + self.size) % self.capacity
        self.items[end] = item
        if self.size < self.capacity:
            self.size += 1
        else:
            self.start = (self.start + 1) % self.capacity

    def __iter__(self):
        for k in range(self.size):
            yield self.items[(self.start + k) % self.capacity]


if __name__ == "__main__":
    buf = RingBuffer(3)
    for x in [1, 2, 3, 4, 5]:
        buf.push(x)
    print(list(buf), moving_average([1, 2, 3, 4, 5], 2))
'''

LONG = '''\
# Notes on a small inference engine

An inference engine for a large language model spends almost all of its time moving \
weights from memory into the arithmetic units. A single token of decoding touches every \
active parameter once, so the speed of generation is bounded by memory bandwidth long \
before it is bounded by floating point throughput. Prefill is different: a batch of prompt \
tokens reuses each weight many times, and the work becomes a sequence of matrix \
multiplications that can keep the hardware busy.

Mixture-of-experts models change the picture again. Each token chooses a few experts out \
of many, and only those experts' weights are read. The router is a small linear layer \
followed by a scoring function; the chosen experts are the ones with the largest scores, \
and their outputs are mixed with weights derived from the same scores. Because the choice \
is discrete, two implementations that differ in the last bit of a router score can pick \
different experts, and from then on their hidden states drift apart. Tests must therefore \
be designed so that near-ties are rare, or so that they are detected and reported instead \
of silently failing.

Attention with compressed memory adds another discrete step. Every few tokens the keys \
and values of a short window are pooled into one compressed row. A lightweight indexer \
scores the compressed rows against the current query and keeps only the best ones. The \
remaining rows are invisible to the query, which saves time on long contexts but makes \
the result depend on a ranking.

## A worked example

The following function computes a numerically stable log-softmax over a vector, the \
quantity the golden files record for every position of every prompt:

```rust
/// Log-softmax of `logits`, computed in f64 with the maximum subtracted first.
pub fn log_softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x as f64));
    let sum: f64 = logits.iter().map(|&x| ((x as f64) - max).exp()).sum();
    let lse = max + sum.ln();
    logits.iter().map(|&x| x as f64 - lse).collect()
}

/// Indices of the `k` largest values; ties go to the lower index.
pub fn top_k(values: &[f64], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..values.len()).collect();
    idx.sort_by(|&a, &b| values[b].partial_cmp(&values[a]).unwrap().then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probabilities_sum_to_one() {
        let lp = log_softmax(&[1.0, 2.0, 3.0, 4.0]);
        let total: f64 = lp.iter().map(|x| x.exp()).sum();
        assert!((total - 1.0).abs() < 1e-12);
    }

    #[test]
    fn ties_prefer_the_lower_index() {
        assert_eq!(top_k(&[1.0, 3.0, 3.0, 2.0], 2), vec![1, 2]);
    }
}
```

Sorting the whole vocabulary for every position is wasteful but simple, and the \
reference only has to be correct. A production engine would keep a small heap instead.

## Numbers that matter

| quantity | value |
|---|---|
| vocabulary | 129280 tokens |
| hidden streams | 4 |
| experts per token | 6 of 256 |
| sliding window | 128 tokens |

When a test fails, the first question is whether the difference is real. A difference of \
one unit in the last place of a log-probability is noise; a different argmax at a position \
where the top two logits are far apart is a bug. The golden files therefore store the \
margin between the two best logits at every position, so that a test can tell the two \
cases apart without guessing. The same reasoning applies to the hidden state traces: they \
are recorded after each sublayer so that the first layer where two implementations diverge \
can be found quickly, and the search does not have to start from the logits.

Finally, remember that a tokenizer is part of the model. The same text can become a \
different sequence of ids if the pre-tokenizer splits digits or punctuation differently, \
and every later comparison then measures the tokenizer rather than the network. Storing \
the ids next to the text avoids that trap: the engine under test is fed the ids, and the \
tokenizer is tested on its own with the text.
'''

PROMPTS = {
    "short": (10, SHORT),
    "prose": (100, PROSE),
    "code": (300, CODE),
    "long": (1000, LONG),
}

# The per-layer hyper-connection trace uses the first 64 tokens of LONG.
TRACE = ("trace", 64, LONG)

# The greedy continuation starts from this prompt.
GREEDY_FROM = "prose"
GREEDY_TOKENS = 24
