//! What the speculative-decoding tests share: a generation run recorded
//! whole (tokens, streamed bytes, final logits, target states), and the
//! check of a draft model's logits against a float64 golden.

use ds4::generate::{self, Finish, Observer, Sampled, Step};
use ds4::sampler::{Rng, SamplerConfig};
use ds4::session::Session;
use ds4::speculate::Speculator;
use ds4::tokenizer::Tokenizer;

/// The streamed tokens and bytes of a run.
#[derive(Default)]
pub struct Rec {
    pub ids: Vec<u32>,
    pub bytes: Vec<u8>,
}

impl Observer for Rec {
    fn greedy_next(&mut self) -> bool {
        false
    }
    fn token(&mut self, id: u32, bytes: &[u8]) -> Step {
        self.ids.push(id);
        self.bytes.extend_from_slice(bytes);
        Step::Continue
    }
}

pub struct Run {
    pub tokens: Vec<u32>,
    pub finish: Finish,
    pub rec: Rec,
    pub logits: Vec<f32>,
    /// The first `target_states` state buffers (a draft model's rings,
    /// last in the layout, left out).
    pub states: Vec<Vec<f32>>,
}

/// `n` tokens after `prompt` from a reset session, at `temperature` (seeded),
/// with `spec` drafting if given.
pub fn run_n(
    s: &mut Session,
    tok: &Tokenizer,
    prompt: &[u32],
    n: usize,
    temperature: f32,
    spec: Option<&mut Speculator>,
    target_states: usize,
) -> Run {
    s.reset();
    s.sync(prompt, &mut |_, _| {}).unwrap();
    let mut picker = Sampled {
        cfg: SamplerConfig {
            temperature,
            ..SamplerConfig::default()
        },
        rng: Rng::new(0x3a7),
    };
    let mut rec = Rec::default();
    let out = generate::generate_with(s, tok, n, &mut picker, &mut rec, spec).unwrap();
    let mut states = s.read_states().unwrap();
    states.truncate(target_states);
    Run {
        tokens: out.tokens,
        finish: out.finish,
        rec,
        logits: s.logits().to_vec(),
        states,
    }
}

/// Checks `logits` against a golden checkpoint's `top_ids` /
/// `top_logprobs` (float64 log-probs) within `tol`, and that their argmax
/// is the golden's; returns the largest difference.
pub fn check_top_logprobs(logits: &[f32], cp: &serde_json::Value, tol: f64, what: &str) -> f64 {
    let m = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = m + logits
        .iter()
        .map(|&x| (x as f64 - m).exp())
        .sum::<f64>()
        .ln();
    let top = super::json_uints(&cp["top_ids"]);
    let want: Vec<f64> = cp["top_logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    let mut worst = 0f64;
    for (&i, &w) in top.iter().zip(&want) {
        let got = logits[i] as f64 - lse;
        worst = worst.max((got - w).abs());
        assert!((got - w).abs() < tol, "{what}, id {i}: {got} vs {w}");
    }
    assert_eq!(
        super::argmax(logits) as usize,
        top[0],
        "{what}: first draft"
    );
    worst
}
