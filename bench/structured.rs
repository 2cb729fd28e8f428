//! Cost of grammar-constrained decoding per token (`cargo bench --bench
//! structured`), one thread, on the real 129,280-token V4 vocabulary: the
//! one-time engine build, then a decode over pseudo-random logits (a noise
//! model, like the random tiny model of tests/structured_output.rs) under
//! each schema of tests/data/structured_schemas.json, restarted whenever an
//! answer ends. Per token it reports llguidance's mask computation alone,
//! the whole constrained pick (mask + −∞ fill + sampling + commit) and, as
//! the peer in the same run, the unconstrained sampler on the same logits.

use std::time::Instant;

use ds4::constrain::{GrammarEngine, OutputGrammar};
use ds4::generate::{Constrained, Sampled, TokenPicker};
use ds4::sampler::{Rng, SamplerConfig};
use ds4::testmodel::vocab::default_tokenizer_json_bytes;
use ds4::tokenizer::Tokenizer;
use serde_json::Value;

const TOKENS_PER_SCHEMA: usize = 60;

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let tok = Tokenizer::from_tokenizer_json(&default_tokenizer_json_bytes().unwrap()).unwrap();
    let t = Instant::now();
    let engine = GrammarEngine::new(&tok).unwrap();
    let build_ms = t.elapsed().as_secs_f64() * 1e3;
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/structured_schemas.json"
    );
    let list: Vec<Value> = serde_json::from_slice(&std::fs::read(fixture).unwrap()).unwrap();
    println!(
        "structured output, V4 vocabulary ({} tokens), {TOKENS_PER_SCHEMA} tokens per schema",
        tok.vocab_size()
    );
    println!("engine build (token trie + llguidance tables, once per tokenizer): {build_ms:.0} ms");
    for greedy in [true, false] {
        run(&tok, &engine, &list, greedy);
    }
}

/// One pass over the schemas, greedy or sampled; prints its figures.
fn run(tok: &Tokenizer, engine: &GrammarEngine, list: &[Value], greedy: bool) {
    let n = tok.vocab_size();
    let eos = tok.specials().eos;
    let mut noise = Rng::new(12345);
    let cfg = SamplerConfig {
        temperature: 1.0,
        min_p: 0.0,
        ..SamplerConfig::default()
    };
    let (mut mask_us, mut pick_us, mut plain_us) = (Vec::new(), Vec::new(), Vec::new());
    let mut answers = 0;
    for (si, c) in list.iter().enumerate() {
        let g = OutputGrammar::JsonSchema(c["schema"].clone());
        let mut done = 0;
        while done < TOKENS_PER_SCHEMA {
            // `probe` follows the same tokens to time llguidance's mask alone.
            let mut probe = engine.constraint(&g).unwrap();
            let mut picker = Constrained::new(
                Sampled {
                    cfg,
                    rng: Rng::new(si as u64 + 1),
                },
                engine.constraint(&g).unwrap(),
                Vec::new(),
                true,
                eos,
            );
            let mut plain = Sampled {
                cfg,
                rng: Rng::new(si as u64 + 1),
            };
            answers += 1;
            while done < TOKENS_PER_SCHEMA {
                let logits: Vec<f32> = (0..n).map(|_| noise.uniform() * 8.0).collect();
                let t = Instant::now();
                std::hint::black_box(probe.allowed().unwrap());
                mask_us.push(t.elapsed().as_secs_f64() * 1e6);
                let t = Instant::now();
                let id = picker.pick(&logits, greedy);
                pick_us.push(t.elapsed().as_secs_f64() * 1e6);
                let t = Instant::now();
                std::hint::black_box(plain.pick(&logits, greedy));
                plain_us.push(t.elapsed().as_secs_f64() * 1e6);
                done += 1;
                if id == eos || picker.dead_end() {
                    break;
                }
                probe.commit(id).unwrap();
            }
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (m, p, s) = (mean(&mask_us), mean(&pick_us), mean(&plain_us));
    let mode = if greedy { "greedy" } else { "sampled (T=1)" };
    println!(
        "-- {mode}: {} schemas, {} tokens, {answers} answers",
        list.len(),
        pick_us.len()
    );
    println!(
        "  llguidance mask alone:      mean {m:8.1} us  p50 {:8.1}  p99 {:8.1}",
        percentile(&mut mask_us, 0.5),
        percentile(&mut mask_us, 0.99)
    );
    println!(
        "  constrained pick (mask, -inf fill, pick, commit): mean {p:8.1} us  p50 {:8.1}  p99 {:8.1}",
        percentile(&mut pick_us, 0.5),
        percentile(&mut pick_us, 0.99)
    );
    println!(
        "  peer, unconstrained pick:   mean {s:8.1} us  p50 {:8.1}  p99 {:8.1}",
        percentile(&mut plain_us, 0.5),
        percentile(&mut plain_us, 0.99)
    );
}
