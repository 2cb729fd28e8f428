//! The V4 converter (`ds4-quantize --hf DIR --recipe R -o OUT`,
//! `ds4::convert::write`, issue 37) on the tiny checkpoint of
//! `tools/checkpoint/make_checkpoint.py --model v4 --vocab 512`: every
//! recipe's output loads and has, name by name, the types of the test-model
//! generator's file of the same variant (ds4's published mixes); the mxfp4
//! recipe's routed experts decode to exactly the checkpoint's FP4 values;
//! the q8 recipe's dense tensors are within Q8_0's (F16's) bound of the
//! decoded checkpoint, its vectors and tables exact; a cpu-ref forward on the
//! q8 and mxfp4 outputs agrees with the f32 conversion; a bad checkpoint
//! exits 1 naming the file and the tensor and leaves nothing under the
//! output name, also when it fails half-way through the writing.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::checkpoint::{checkpoint_once, make_checkpoint};
use common::fresh_dir;
use common::quantize::{
    assert_converted, assert_fp4_experts_exact, assert_gguf_py_reads_the_same, convert,
    converted_once, cpu_ref_logits, directory, draft_logits, s, small_vocab, tensor,
    worst_relative_logit_diff,
};
use ds4::convert::safetensors::{Checkpoint, INDEX_FILE};
use ds4::gguf::GgufFile;
use ds4::model::{AnyModel, ModelFile};
use ds4::quant::GgmlType;
use ds4::session::DraftModel;
use ds4::testmodel::{write_model, write_mtp, TestModelSpec, Variant};

const VOCAB: usize = 512;

/// The script's tiny V4 checkpoint, written once for the whole file: random
/// bytes (every FP8 and FP4 code), or with `tame` a well-conditioned model's
/// values (the script's `--tame`), for the forward passes.
fn checkpoint(tame: bool) -> PathBuf {
    let vocab = VOCAB.to_string();
    let mut args = vec!["--model", "v4", "--vocab", &vocab];
    if tame {
        args.push("--tame");
    }
    checkpoint_once("convert_write", &format!("checkpoint-tame-{tame}"), &args)
}

/// The checkpoint converted with `recipe` by the command, once per recipe.
fn converted(recipe: &str) -> PathBuf {
    converted_from(recipe, false)
}

/// [`converted`] from the checkpoint of [`checkpoint`]`(tame)`.
fn converted_from(recipe: &str, tame: bool) -> PathBuf {
    let key = format!("tame-{tame}");
    converted_once("convert_write", &checkpoint(tame), &key, "tiny", recipe)
}

#[test]
fn every_recipe_loads_with_the_published_mix_types() {
    let spec = TestModelSpec::tiny();
    for variant in Variant::ALL {
        let out = converted(variant.name());
        let m = ModelFile::open(&out)
            .unwrap_or_else(|e| panic!("{}: the loader refuses: {e}", variant.name()));
        assert_eq!(m.config.n_vocab, VOCAB);
        assert_eq!(m.file.get_str("general.name"), Some("DeepSeek V4 Flash"));
        // The checkpoint's tokenizer, padded to the vocabulary
        // (tests/convert_tokenizer.rs checks the keys).
        assert_eq!(m.file.get_str("tokenizer.ggml.model"), Some("gpt2"));
        let tokens = m.file.get_array("tokenizer.ggml.tokens").unwrap();
        assert_eq!(tokens.as_strings().unwrap().len(), VOCAB);

        let gen = fresh_dir("convert_write", &format!("gen-{}", variant.name())).join("t.gguf");
        write_model(&spec, variant, &small_vocab(VOCAB), &gen).unwrap();
        let want = directory(&GgufFile::open(&gen).unwrap());
        let got = directory(&m.file);
        assert_eq!(got.len(), want.len(), "{}", variant.name());
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g, w, "{}", variant.name());
        }
    }
}

/// Every recipe's file, and the MTP file, read by gguf-py (llama.cpp's own
/// GGUF library) as ds4 reads it: keys, tensor directory and every decoded
/// value (`assert_gguf_py_reads_the_same`; the random checkpoint, so every
/// FP8 and FP4 code goes through each type).
#[test]
fn every_tensor_reads_the_same_in_gguf_py() {
    for recipe in ["f32", "q8", "q2", "q4", "mxfp4"] {
        if !assert_gguf_py_reads_the_same(&converted(recipe)) {
            return;
        }
    }
    assert_gguf_py_reads_the_same(&converted_mtp("q8"));
}

#[test]
fn mxfp4_routed_experts_are_the_checkpoints_fp4_values_exactly() {
    let out = converted("mxfp4");
    let f = GgufFile::open(&out).unwrap();
    let ck = Checkpoint::open(&checkpoint(false)).unwrap();
    let spec = TestModelSpec::tiny();
    let n = assert_fp4_experts_exact(&f, &ck, spec.n_layer(), spec.core.n_expert);
    assert_eq!(n, 6 * 3 * 8);
}

#[test]
fn q8_dense_tensors_are_within_the_quant_bound_vectors_and_tables_exact() {
    let out = converted("q8");
    let f = GgufFile::open(&out).unwrap();
    let ck = Checkpoint::open(&checkpoint(false)).unwrap();
    // Q8_0: d = amax/127 rounded to f16 (relative error 2^-11), q rounded
    // to nearest: |x - q·d| ≤ d/2 + 127·d·2^-11 = amax/254 + amax/2048, per
    // block of 32. FP8 (attn_q_a, shared expert), BF16 (attn_output_a),
    // and the head (BF16).
    assert_converted(
        &f,
        &ck,
        GgmlType::Q8_0,
        &[
            ("blk.0.attn_q_a.weight", "layers.0.attn.wq_a.weight"),
            ("blk.3.attn_output_a.weight", "layers.3.attn.wo_a.weight"),
            (
                "blk.5.ffn_down_shexp.weight",
                "layers.5.ffn.shared_experts.w2.weight",
            ),
            ("output.weight", "head.weight"),
        ],
    );
    // F16 (embedding, router, compressor): within half an f16 ulp (2^-11
    // relative; the values are normal f16 numbers).
    assert_converted(
        &f,
        &ck,
        GgmlType::F16,
        &[
            ("token_embd.weight", "embed.weight"),
            ("blk.1.ffn_gate_inp.weight", "layers.1.ffn.gate.weight"),
            (
                "blk.2.attn_compressor_kv.weight",
                "layers.2.attn.compressor.wkv.weight",
            ),
        ],
    );
    // F32 vectors bit for bit.
    assert_converted(
        &f,
        &ck,
        GgmlType::F32,
        &[
            ("blk.0.attn_norm.weight", "layers.0.attn_norm.weight"),
            ("blk.4.attn_sinks.weight", "layers.4.attn.attn_sink"),
            ("blk.5.exp_probs_b.bias", "layers.5.ffn.gate.bias"),
            ("output_hc_scale.weight", "hc_head_scale"),
        ],
    );
    // The hash tables: the I64 ids narrowed.
    for l in 0..3 {
        let gguf = format!("blk.{l}.ffn_gate_tid2eid.weight");
        let (ty, _, data) = tensor(&f, &gguf);
        assert_eq!(ty, GgmlType::I32);
        let got: Vec<i32> = data
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let t = ck.tensor(&format!("layers.{l}.ffn.gate.tid2eid")).unwrap();
        assert_eq!(got, ds4::convert::decode::to_i32(&t).unwrap());
    }
}

#[test]
fn q8_and_mxfp4_logits_agree_with_the_f32_conversion() {
    let ids = [0u32, 7, 300, 511, 42, 42];
    let reference = cpu_ref_logits(&converted_from("f32", true), &ids);
    for recipe in ["q8", "mxfp4"] {
        let got = cpu_ref_logits(&converted_from(recipe, true), &ids);
        let worst = worst_relative_logit_diff(recipe, &got, &reference, VOCAB);
        assert!(worst < TOLERANCE, "{recipe}: {worst}");
    }
}

/// The largest |Δlogit| allowed, relative to the step's largest |logit|,
/// between a q8 / mxfp4 conversion and the f32 one of the tame checkpoint.
/// Each Q8_0 weight is off by at most 1/254 of its block's largest value
/// (measured RMSE / RMS 0.65 % per tensor), each F16 one by 2^-11; six
/// layers whose residual stream is RMS-normalised add such errors rather
/// than compound them: measured 0.86 % (q8) and 0.85 % (mxfp4, whose
/// experts are exact and whose dense tensors are q8's). 2 % leaves room
/// for another platform's summation order, while a wrong tensor (or the
/// untamed checkpoint's chaotic forward) gives differences of the order of
/// the logits themselves (measured 114 %).
const TOLERANCE: f32 = 0.02;

#[test]
fn a_missing_tensor_exits_1_and_leaves_no_output() {
    let ck = fresh_dir("convert_write", "missing-ck");
    let drop = "layers.4.ffn.experts.5.w3.weight";
    make_checkpoint(
        &ck,
        &[
            "--model",
            "v4",
            "--vocab",
            &VOCAB.to_string(),
            "--drop",
            drop,
        ],
    );
    let dir = fresh_dir("convert_write", "missing-out");
    let out = dir.join("x.gguf");
    let o = convert(&ck, "q8", &[], &out);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(s(&ck.join(INDEX_FILE))), "{err}");
    assert!(err.contains(drop), "{err}");
    assert!(err.contains("blk.4.ffn_up_exps.weight"), "{err}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
}

/// A disk too small for the output (a 1 MiB file-size limit, `ulimit -f`;
/// the q8 file is 13 MB): exit 1 naming the output and the cause before any
/// tensor is converted (the whole length is reserved first), nothing left
/// in the folder.
#[test]
fn a_full_disk_exits_1_and_leaves_no_output() {
    let dir = fresh_dir("convert_write", "full-disk-out");
    let out = dir.join("x.gguf");
    let o = std::process::Command::new("sh")
        .arg("-c")
        .arg(r#"ulimit -f 1024 && exec "$0" --hf "$1" --recipe q8 -o "$2" --quiet"#)
        .arg(env!("CARGO_BIN_EXE_ds4-quantize"))
        .arg(checkpoint(false))
        .arg(&out)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(s(&out)) && err.contains("cannot reserve"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
}

/// Overwrites the first byte of checkpoint tensor `name` in its shard.
fn poke(dir: &Path, name: &str, byte: u8) -> PathBuf {
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join(INDEX_FILE)).unwrap()).unwrap();
    let shard = dir.join(index["weight_map"][name].as_str().unwrap());
    let mut bytes = std::fs::read(&shard).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let at = 8 + n + header[name]["data_offsets"][0].as_u64().unwrap() as usize;
    bytes[at] = byte;
    std::fs::write(&shard, bytes).unwrap();
    shard
}

#[test]
fn a_bad_scale_late_in_the_file_exits_1_and_leaves_no_output() {
    // The headers pass the checks; the E8M0 NaN byte in the last layer's
    // shared-expert scale is found only when that tensor is converted,
    // after most of the file is written.
    let ck = fresh_dir("convert_write", "bad-scale-ck");
    make_checkpoint(&ck, &["--model", "v4", "--vocab", &VOCAB.to_string()]);
    let scale = "layers.5.ffn.shared_experts.w2.scale";
    let shard = poke(&ck, scale, 0xff);
    let dir = fresh_dir("convert_write", "bad-scale-out");
    let out = dir.join("x.gguf");
    let o = convert(&ck, "q8", &[], &out);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains(s(&shard)), "{err}");
    assert!(err.contains(scale), "{err}");
    assert!(err.contains("255"), "{err}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
}

/// `--recipe FILE`: q2's types with Q4_K routed gate/up and lossless MXFP4
/// routed down (a mix no named recipe has).
#[test]
fn a_recipe_file_mixes_types_over_its_base_and_the_file_loads() {
    let dir = fresh_dir("convert_write", "recipe-file");
    let recipe = dir.join("mix.recipe");
    std::fs::write(
        &recipe,
        "# Q4_K gate/up, lossless down, the rest as q2\nbase q2\n\
         blk.*.ffn_gate_exps.weight q4_k\nblk.*.ffn_up_exps.weight Q4_K\n\
         blk.*.ffn_down_exps.weight mxfp4  # the checkpoint's FP4\n",
    )
    .unwrap();
    let out = dir.join("mix.gguf");
    let o = convert(&checkpoint(false), s(&recipe), &[], &out);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let m = ModelFile::open(&out).expect("the loader accepts the mix");
    let q2 = GgufFile::open(converted("q2")).unwrap();
    let mx = GgufFile::open(converted("mxfp4")).unwrap();
    let mut routed = 0;
    for (name, _, ty) in directory(&m.file) {
        let want = if name.ends_with("ffn_gate_exps.weight") || name.ends_with("ffn_up_exps.weight")
        {
            GgmlType::Q4K
        } else if name.ends_with("ffn_down_exps.weight") {
            // The same bytes as the mxfp4 recipe's: the lossless repack.
            assert_eq!(tensor(&m.file, &name).2, tensor(&mx, &name).2, "{name}");
            GgmlType::Mxfp4
        } else {
            // Not from a rule: q2's type and q2's bytes.
            assert_eq!(tensor(&m.file, &name).2, tensor(&q2, &name).2, "{name}");
            tensor(&q2, &name).0
        };
        routed += name.contains("_exps.") as usize;
        assert_eq!(ty, want, "{name}");
    }
    assert_eq!(routed, 6 * 3);
}

#[test]
fn a_recipe_the_loader_would_refuse_exits_1_naming_the_tensor_and_writes_nothing() {
    let dir = fresh_dir("convert_write", "recipe-bad");
    for (k, (text, want)) in [
        // Gate and up of a layer must share a type.
        (
            "base q2\nblk.1.ffn_gate_exps.weight q4_k\n",
            "blk.1.ffn_gate_exps.weight: gate is Q4_K but blk.1.ffn_up_exps.weight is IQ2_XXS",
        ),
        // ds4 has no Q4_K kernel for dense matrices.
        (
            "base q8\noutput.weight q4_k\n",
            "tensor output.weight: Q4_K (line 2): ds4 loads it only as F32, F16, BF16, Q8_0",
        ),
        // A misspelt pattern changes nothing: refused.
        (
            "base q8\nblk.*.ffn_gate_exp.weight q4_k\n",
            "line 2: pattern \"blk.*.ffn_gate_exp.weight\" matches no tensor",
        ),
        // No base: every tensor needs a rule.
        (
            "*_exps.weight q8_0\n",
            "token_embd.weight: no rule matches it",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let recipe = dir.join(format!("bad-{k}.recipe"));
        std::fs::write(&recipe, text).unwrap();
        let out = dir.join(format!("bad-{k}.gguf"));
        let o = convert(&checkpoint(false), s(&recipe), &[], &out);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{text:?}: {err}");
        assert!(
            err.contains(s(&recipe)) && err.contains(want),
            "{text:?}: {err}"
        );
        assert!(!out.exists(), "{text:?}");
    }
    // Only the recipes are left: no output, no partial file.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 4);
}

/// The checkpoint's MTP block converted (`--mtp`) to ds4's MTP file, of the
/// recipe `recipe`, from the tame checkpoint.
fn converted_mtp(recipe: &str) -> PathBuf {
    let dir = fresh_dir("convert_write", &format!("mtp-{recipe}"));
    let out = dir.join(format!("tiny-mtp-{recipe}.gguf"));
    let o = convert(&checkpoint(true), recipe, &["--mtp"], &out);
    assert!(
        o.status.success(),
        "--mtp --recipe {recipe}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// The MTP draft block's logits after `ids` (cpu-ref, plain numerics), with
/// the MTP file `mtp` attached to the main file `main`.
fn mtp_logits(main: &Path, mtp: &Path, ids: &[u32], next: u32) -> Vec<f32> {
    let mut m = ModelFile::open(main).unwrap();
    m.attach_mtp(mtp)
        .expect("the loader attaches the converted MTP file");
    draft_logits(AnyModel::V4(Arc::new(m)), DraftModel::Mtp, ids, next)
}

/// `--mtp`: the MTP file has, name by name, the test-model generator's MTP
/// file's shapes and types for each recipe (GGUF.md §7: 32 tensors); the
/// loader attaches it to the converted main file; the MTP block's logits
/// from the q8 conversion agree with those from the f32 one as closely as
/// the main model's do.
#[test]
fn the_mtp_block_converts_to_an_mtp_file_the_loader_attaches() {
    let spec = TestModelSpec::tiny();
    for variant in [Variant::F32, Variant::Q8, Variant::Q4] {
        let out = converted_mtp(variant.name());
        let gen = fresh_dir("convert_write", &format!("gen-mtp-{}", variant.name())).join("m.gguf");
        write_mtp(&spec, variant, &gen).unwrap();
        let got = directory(&GgufFile::open(&out).unwrap());
        assert_eq!(
            got,
            directory(&GgufFile::open(&gen).unwrap()),
            "{}",
            variant.name()
        );
        assert_eq!(got.len(), 32);
    }
    let ids = [0u32, 7, 300, 511, 42];
    let want = mtp_logits(&converted_from("f32", true), &converted_mtp("f32"), &ids, 9);
    let got = mtp_logits(&converted_from("q8", true), &converted_mtp("q8"), &ids, 9);
    assert!(got.iter().all(|x| x.is_finite()));
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
    let worst = common::max_abs_diff(&got, &want) / scale;
    eprintln!("mtp q8: max|Δlogit| / max|logit| = {worst:.3e}");
    assert!(worst < TOLERANCE, "MTP logits q8 vs f32: {worst}");
}
