//! Imatrix collection in the engine (`ds4 --imatrix-dataset`, issue 37):
//! the collector's sums against Σx² of values dumped from a plain session
//! (the `--dump` facility) and host products of the expert weights; the
//! fast CPU backend against the reference; the CLI's refusals.

mod common;

use common::process::ds4;

use std::collections::BTreeMap;
use std::path::Path;

use ds4::app::imatrix::{chunks, collect};
use ds4::backend::BackendKind;
use ds4::convert::imatrix::{Entry, Imatrix};
use ds4::graph::ops::moe::swiglu;
use ds4::graph::ValueName;
use ds4::model::forward::Numerics;
use ds4::model::{AnyModel, ModelFile};
use ds4::quant;
use ds4::session::{Session, SessionOptions};
use ds4::testmodel::Variant;
use ds4::tokenizer::Tokenizer;

const CHUNK: usize = 32;

fn text() -> String {
    "The quick brown fox jumps over the lazy dog while the model counts its tokens. ".repeat(12)
}

fn opts(backend: BackendKind, numerics: Numerics) -> SessionOptions {
    SessionOptions {
        backend,
        numerics,
        ..Default::default()
    }
}

/// The imatrix of two chunks of [`text`] on `backend`.
fn collected(variant: Variant, backend: BackendKind, numerics: Numerics) -> Imatrix {
    let model = common::tiny_model(variant);
    let tok = Tokenizer::from_gguf(&model.file).unwrap();
    let (_, cs) = chunks(&tok, &text(), CHUNK, Some(2)).unwrap();
    assert_eq!(cs.len(), 2);
    let got = collect(
        &AnyModel::V4(model),
        opts(backend, numerics),
        "text",
        &cs,
        &mut |_| {},
    )
    .unwrap();
    assert!(got.skipped.is_empty(), "skipped: {:?}", got.skipped);
    got.imatrix
}

fn name(s: &str) -> ValueName {
    ValueName::parse(s).unwrap()
}

/// Σx² per column of `rows` (`k × cols`), in f64.
fn sum2(rows: &[f32], cols: usize) -> Vec<f64> {
    let mut s = vec![0f64; cols];
    for r in rows.chunks_exact(cols) {
        for (a, &x) in s.iter_mut().zip(r) {
            *a += (x as f64).powi(2);
        }
    }
    s
}

fn assert_close(got: &[f32], want: &[f64], rel: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(0f64, |m, &x| m.max(x.abs())).max(1e-12);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g as f64 - w).abs() <= rel * scale,
            "{what}[{i}]: collected {g}, reference {w}"
        );
    }
}

/// Expert `e`'s rows `e·ff .. (e+1)·ff` of `tensor`, dequantised.
fn expert_rows(m: &ModelFile, tensor: &str, e: usize) -> (Vec<f32>, usize) {
    let t = m.file.tensor(tensor).unwrap().unwrap();
    let (cols, rows) = (t.ne[0] as usize, t.ne[1] as usize);
    let mut out = vec![0f32; rows * cols];
    for r in 0..rows {
        quant::dequantize_row(
            t.ty,
            t.row(e * rows + r).unwrap(),
            &mut out[r * cols..][..cols],
        )
        .unwrap();
    }
    (out, cols)
}

fn dot(w: &[f32], x: &[f32]) -> f64 {
    w.iter().zip(x).map(|(&a, &b)| a as f64 * b as f64).sum()
}

#[test]
fn sums_match_dumped_activations_on_cpu_ref() {
    let t0 = std::time::Instant::now();
    let im = collected(Variant::F32, BackendKind::CpuRef, Numerics::Plain);
    let model = common::tiny_model(Variant::F32);
    let cfg = &model.config;
    let (k, n_expert) = (cfg.n_expert_used, cfg.n_expert);
    let tok = Tokenizer::from_gguf(&model.file).unwrap();
    let (_, cs) = chunks(&tok, &text(), CHUNK, Some(2)).unwrap();
    let n_tokens = (cs.len() * CHUNK) as f32;

    // Layer 0 routes by the hash table, layer 4 by scores.
    let dumps = [
        "attn_norm@1",
        "attn_heads_unrope@1",
        "ffn_norm@0",
        "experts@0",
        "expert_weights@0",
        "ffn_norm@4",
        "experts@4",
        "expert_weights@4",
    ];
    let mut o = opts(BackendKind::CpuRef, Numerics::Plain);
    o.ctx = CHUNK;
    o.prefill_chunk = CHUNK;
    o.dump = dumps.iter().map(|d| name(d)).collect();
    let mut sess = Session::new(model.clone(), o).unwrap();
    let mut vals: BTreeMap<&str, Vec<f32>> = BTreeMap::new();
    for c in &cs {
        sess.score(c).unwrap();
        for d in dumps {
            vals.entry(d)
                .or_default()
                .extend(sess.dump(&name(d)).unwrap());
        }
    }

    // A dense projection: one activation row per token.
    let d = cfg.n_embd;
    let e = im.get("blk.1.attn_q_a.weight").expect("attn_q_a entry");
    assert_eq!(e.counts, vec![n_tokens]);
    assert_close(&e.in_sum2, &sum2(&vals["attn_norm@1"], d), 1e-6, "attn_q_a");
    // The grouped low-rank output projection: every group's slice is a row.
    let e = im
        .get("blk.1.attn_output_a.weight")
        .expect("attn_output_a entry");
    let groups = cfg.o_groups;
    assert_eq!(e.counts, vec![n_tokens * groups as f32]);
    let cols = e.n_cols;
    assert_close(
        &e.in_sum2,
        &sum2(&vals["attn_heads_unrope@1"], cols),
        1e-6,
        "attn_output_a",
    );
    // Every dense entry counts each token once (the head included:
    // scoring computes logits at every row), times its groups.
    for (n, e) in &im.entries {
        if !n.contains("_exps.") {
            assert_eq!(e.n_mat(), 1, "{n}");
            assert_eq!(e.counts[0] % n_tokens, 0.0, "{n}: {:?}", e.counts);
        }
    }
    assert!(im.get("output.weight").is_some());

    for l in [0usize, 4] {
        let x = &vals[format!("ffn_norm@{l}").as_str()];
        let sel = &vals[format!("experts@{l}").as_str()];
        let wt = &vals[format!("expert_weights@{l}").as_str()];
        let gate = im.get(&format!("blk.{l}.ffn_gate_exps.weight")).unwrap();
        let up = im.get(&format!("blk.{l}.ffn_up_exps.weight")).unwrap();
        let down = im.get(&format!("blk.{l}.ffn_down_exps.weight")).unwrap();
        assert_eq!(gate.n_mat(), n_expert);
        assert_eq!(gate.counts.iter().sum::<f32>(), n_tokens * k as f32);
        assert_eq!(gate.counts, down.counts);
        assert_eq!(gate, up);
        let clamp = cfg.swiglu_clamp[l];
        for ex in 0..n_expert {
            let users: Vec<usize> = (0..sel.len()).filter(|&i| sel[i] as usize == ex).collect();
            assert_eq!(gate.counts[ex], users.len() as f32, "layer {l} expert {ex}");
            let xs: Vec<f32> = users
                .iter()
                .flat_map(|&i| x[(i / k) * d..(i / k + 1) * d].to_vec())
                .collect();
            assert_close(
                &gate.in_sum2[ex * d..(ex + 1) * d],
                &sum2(&xs, d),
                1e-6,
                &format!("layer {l} gate expert {ex}"),
            );
            // down's input: the route-weighted clamped SwiGLU of the
            // expert's gate and up rows, in f64 from dequantised weights.
            let (wg, _) = expert_rows(&model, &format!("blk.{l}.ffn_gate_exps.weight"), ex);
            let (wu, _) = expert_rows(&model, &format!("blk.{l}.ffn_up_exps.weight"), ex);
            let ff = wg.len() / d;
            let mut mids = Vec::new();
            for &i in &users {
                let xt = &x[(i / k) * d..(i / k + 1) * d];
                for f in 0..ff {
                    let g = dot(&wg[f * d..(f + 1) * d], xt) as f32;
                    let u = dot(&wu[f * d..(f + 1) * d], xt) as f32;
                    mids.push(wt[i] * swiglu(g, u, clamp));
                }
            }
            assert_close(
                &down.in_sum2[ex * ff..(ex + 1) * ff],
                &sum2(&mids, ff),
                1e-4,
                &format!("layer {l} down expert {ex}"),
            );
        }
    }
    eprintln!("cpu-ref check: {:.2} s", t0.elapsed().as_secs_f64());
}

/// ‖a − b‖ / ‖b‖ over an entry's sums.
fn rel_l2(a: &Entry, b: &Entry) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (&x, &y) in a.in_sum2.iter().zip(&b.in_sum2) {
        num += (x as f64 - y as f64).powi(2);
        den += (y as f64).powi(2);
    }
    (num / den.max(1e-30)).sqrt()
}

#[test]
fn fast_cpu_matches_the_reference() {
    let t0 = std::time::Instant::now();
    let want = collected(Variant::Q8, BackendKind::CpuRef, Numerics::Model);
    let got = collected(Variant::Q8, BackendKind::Cpu, Numerics::Model);
    assert_eq!(
        got.entries.keys().collect::<Vec<_>>(),
        want.entries.keys().collect::<Vec<_>>()
    );
    let mut worst = (0f64, String::new());
    for (n, w) in &want.entries {
        let g = &got.entries[n];
        assert_eq!(g.n_cols, w.n_cols, "{n}");
        assert_eq!(
            g.counts.iter().sum::<f32>(),
            w.counts.iter().sum::<f32>(),
            "{n}"
        );
        let r = rel_l2(g, w);
        if r > worst.0 {
            worst = (r, n.clone());
        }
    }
    eprintln!(
        "fast vs reference: worst relative L2 {:.2e} ({}); {:.2} s",
        worst.0,
        worst.1,
        t0.elapsed().as_secs_f64()
    );
    assert!(worst.0 < 0.05, "{worst:?}");
}

fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "data.txt" && n != "short.txt")
        .collect()
}

#[test]
fn cli_writes_a_readable_file_and_refuses_bad_input() {
    let dir = common::fresh_dir("imatrix_collect", "cli");
    let model = common::tiny_model_path(Variant::Q8);
    let m = model.to_str().unwrap();
    let data = dir.join("data.txt");
    std::fs::write(&data, text()).unwrap();
    std::fs::write(dir.join("short.txt"), "too short").unwrap();
    let out = dir.join("out.imatrix");
    let (d, o) = (data.to_str().unwrap(), out.to_str().unwrap());
    let base = ["-m", m, "--backend", "cpu-ref", "--imatrix-chunk", "32"];
    let run = |more: &[&str]| ds4(&[&base[..], more].concat());

    let r = run(&[
        "--imatrix-dataset",
        d,
        "--imatrix-out",
        o,
        "--imatrix-chunks",
        "2",
    ]);
    let err = String::from_utf8_lossy(&r.stderr).into_owned();
    assert!(r.status.success(), "{err}");
    assert!(err.contains("chunk 2/2: perplexity"), "{err}");
    let im = Imatrix::read(&out).unwrap();
    assert_eq!((im.chunk_count, im.chunk_size), (2, 32));
    assert_eq!(im.datasets, vec![d.to_string()]);
    assert!(im.get("blk.0.ffn_down_exps.weight").is_some());
    assert_eq!(leftovers(&dir), vec!["out.imatrix".to_string()]);
    std::fs::remove_file(&out).unwrap();

    let missing = dir.join("missing.txt");
    let short = dir.join("short.txt");
    let nodir = dir.join("no-such-dir").join("x.imatrix");
    let cases: [(&[&str], &str); 5] = [
        (
            &[
                "--imatrix-dataset",
                missing.to_str().unwrap(),
                "--imatrix-out",
                o,
            ],
            "missing.txt",
        ),
        (
            &[
                "--imatrix-dataset",
                short.to_str().unwrap(),
                "--imatrix-out",
                o,
            ],
            "fewer than one chunk",
        ),
        (
            &[
                "--imatrix-dataset",
                d,
                "--imatrix-out",
                nodir.to_str().unwrap(),
            ],
            "cannot write",
        ),
        (&["--imatrix-dataset", d], "go together"),
        (
            &[
                "--imatrix-dataset",
                d,
                "--imatrix-out",
                o,
                "--imatrix-chunks",
                "0",
            ],
            "at least 1",
        ),
    ];
    for (args, want) in cases {
        let r = run(args);
        let err = String::from_utf8_lossy(&r.stderr).into_owned();
        assert_eq!(r.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(
            leftovers(&dir).is_empty(),
            "{args:?}: {:?}",
            leftovers(&dir)
        );
    }
}
