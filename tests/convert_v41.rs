//! The V4.1 converter (`ds4-quantize --hf DIR --recipe R -o OUT` on a
//! DeepSeek V4.1 checkpoint, `ds4::convert`, issue 37) on the tiny checkpoint
//! of `tools/checkpoint/make_checkpoint.py --model v41 --vocab 512` (the
//! tiny V4.1 test model's shapes, with its `engram_tables.json`): every
//! recipe's output loads with the V4.1 loader and has, name by name, the
//! shapes and types of the test-model generator's `deepseek41` file of the
//! same variant, and the Engram keys the script computed; the mxfp4 recipe's
//! routed experts decode to exactly the checkpoint's FP4 values; the Engram
//! tables are the checkpoint's bytes; the q8 recipe's dense tensors are
//! within Q8_0's (F16's) bound of the decoded checkpoint, its vectors exact;
//! a cpu-ref forward on the q8 and mxfp4 outputs agrees with the f32
//! conversion and `ds4 -p` runs on one; a bad checkpoint exits 1 naming the
//! file and the tensor or key and leaves nothing under the output name.

mod common;

use std::path::{Path, PathBuf};

use common::checkpoint::{checkpoint_once, make_checkpoint};
use common::fresh_dir;
use common::quantize::{
    assert_converted, assert_fp4_experts_exact, assert_gguf_py_reads_the_same, convert,
    converted_once, cpu_ref_logits, directory, ds4_answers, s, small_vocab, tensor,
    worst_relative_logit_diff,
};
use ds4::convert::safetensors::{Checkpoint, CONFIG_FILE, INDEX_FILE};
use ds4::gguf::GgufFile;
use ds4::model::any_model::AnyModel;
use ds4::model::v41::{V41Config, V41ModelFile};
use ds4::quant::GgmlType;
use ds4::testmodel::v41::{write_v41_model, V41Spec};
use ds4::testmodel::Variant;

const VOCAB: usize = 512;

/// The script's tiny V4.1 checkpoint, written once for the whole file:
/// random bytes (every FP8 and FP4 code), or with `tame` a
/// well-conditioned model's values, for the forward passes.
fn checkpoint(tame: bool) -> PathBuf {
    let vocab = VOCAB.to_string();
    let mut args = vec!["--model", "v41", "--vocab", &vocab];
    if tame {
        args.push("--tame");
    }
    checkpoint_once("convert_v41", &format!("checkpoint-tame-{tame}"), &args)
}

/// The tiny checkpoint at the width of the 256-value blocks of q2's and
/// q4's expert types (IQ2_XXS, Q2_K, Q4_K), which the tiny model's 64 and
/// 32 do not fill: `hidden_size` and `moe_intermediate_size` 256.
fn wide_checkpoint() -> PathBuf {
    let vocab = VOCAB.to_string();
    let args = [
        "--model",
        "v41",
        "--vocab",
        &vocab,
        "--config",
        "hidden_size",
        "256",
    ];
    let width = ["--config", "moe_intermediate_size", "256"];
    checkpoint_once(
        "convert_v41",
        "checkpoint-wide",
        &[&args[..], &width].concat(),
    )
}

/// [`V41Spec::tiny`] at the widths of [`wide_checkpoint`].
fn wide_spec() -> V41Spec {
    let mut spec = V41Spec::tiny();
    spec.core.n_embd = 256;
    spec.core.expert_ff = 256;
    spec
}

/// The recipes the tiny model has: q2 and q4 need [`wide_checkpoint`].
const TINY_VARIANTS: [Variant; 3] = [Variant::F32, Variant::Q8, Variant::Mxfp4];

/// The checkpoint of [`checkpoint`]`(tame)` converted with `recipe` by the
/// command, once per recipe.
fn converted(recipe: &str, tame: bool) -> PathBuf {
    converted_from(&checkpoint(tame), &format!("tame-{tame}"), recipe)
}

/// Checkpoint `ck` (called `key`) converted with `recipe`, once per both.
fn converted_from(ck: &Path, key: &str, recipe: &str) -> PathBuf {
    converted_once("convert_v41", ck, key, "tiny-v41", recipe)
}

/// The script's `engram_tables.json` of a checkpoint: (token map,
/// multipliers), computed with the official algorithm (HF `tokenizers`,
/// numpy).
fn script_tables(dir: &Path) -> (Vec<u32>, Vec<u64>) {
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("engram_tables.json")).unwrap()).unwrap();
    let ints = |k: &str| -> Vec<u64> {
        v[k].as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect()
    };
    (
        ints("token_map").into_iter().map(|x| x as u32).collect(),
        ints("multipliers"),
    )
}

/// `out` opens with the V4.1 loader and has the directory of the
/// generator's `spec` file in `variant`; returns the loaded model and the
/// generated file's configuration.
fn check_directory(out: &Path, spec: &V41Spec, variant: Variant) -> (V41ModelFile, V41Config) {
    let m = V41ModelFile::open(out)
        .unwrap_or_else(|e| panic!("{}: the V4.1 loader refuses: {e}", variant.name()));
    assert!(matches!(AnyModel::open(out), Ok(AnyModel::V41(_))));
    assert_eq!(m.config.n_vocab, VOCAB);
    assert_eq!(m.file.get_str("general.name"), Some("DeepSeek V4.1 Flash"));
    let tokens = m.file.get_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.as_strings().unwrap().len(), VOCAB);

    let gen = out.with_extension("generated");
    write_v41_model(spec, variant, &small_vocab(VOCAB), &gen).unwrap();
    let gf = GgufFile::open(&gen).unwrap();
    let (want, got) = (directory(&gf), directory(&m.file));
    assert_eq!(got.len(), want.len(), "{}", variant.name());
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g, w, "{}", variant.name());
    }
    let gc = V41Config::from_gguf(&gf).unwrap();
    drop(gf);
    std::fs::remove_file(&gen).unwrap();
    (m, gc)
}

#[test]
fn every_recipe_loads_with_the_generators_directory_and_the_scripts_engram_keys() {
    let spec = V41Spec::tiny();
    let (token_map, multipliers) = script_tables(&checkpoint(false));
    let config_json = std::fs::read_to_string(checkpoint(false).join(CONFIG_FILE)).unwrap();
    let config_json: serde_json::Value = serde_json::from_str(&config_json).unwrap();
    for variant in TINY_VARIANTS {
        let (m, gc) = check_directory(&converted(variant.name(), false), &spec, variant);
        // The hyper-parameters and Engram layout are the generator's; the
        // hash constants are the script's (the official algorithm).
        let c = &m.config;
        let mut core = gc.core.clone();
        core.name = c.core.name.clone();
        assert_eq!(c.core, core);
        assert_eq!(c.roles, gc.roles);
        assert_eq!(
            (
                c.candidate_source,
                c.candidate_topk_blocks,
                c.candidate_block_size
            ),
            (
                gc.candidate_source,
                gc.candidate_topk_blocks,
                gc.candidate_block_size
            )
        );
        let (e, ge) = (&c.engram, &gc.engram);
        assert_eq!(e.layer_ids, ge.layer_ids);
        assert_eq!(e.rows, [420, 508]);
        assert_eq!(e.primes, [101, 103, 107, 109, 113, 127, 131, 137]);
        assert_eq!(e.primes, spec.engram_primes());
        assert_eq!((e.max_ngram, e.n_heads, e.head_dim), (3, 2, 32));
        assert_eq!(e.token_map, token_map);
        assert_eq!(e.multipliers, multipliers);
        assert_eq!(e.pad_id, token_map[2]);
        let n_compressed = config_json["text_config"]["engram_compressed_vocab_size"].as_u64();
        assert_eq!(Some(e.compressed_vocab as u64), n_compressed);
        let stored: serde_json::Value =
            serde_json::from_str(m.file.get_str("deepseek41.config").unwrap()).unwrap();
        assert_eq!(stored, config_json);
    }
    // The tiny model's rows (64, 32) are not whole 256-value blocks: q2 and
    // q4 are refused naming the tensor, as the generator cannot write them.
    for recipe in ["q2", "q4"] {
        let dir = fresh_dir("convert_v41", &format!("narrow-{recipe}"));
        let o = convert(&checkpoint(false), recipe, &[], &dir.join("x.gguf"));
        assert_eq!(o.status.code(), Some(1), "{recipe}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("blk.0.ffn_gate_exps.weight"), "{err}");
        assert!(err.contains("blocks of 256"), "{err}");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    }
}

#[test]
fn q2_and_q4_at_a_width_of_256_have_the_generators_directory() {
    for variant in [Variant::Q2, Variant::Q4] {
        let out = converted_from(&wide_checkpoint(), "wide", variant.name());
        check_directory(&out, &wide_spec(), variant);
    }
}

#[test]
fn mxfp4_routed_experts_are_the_checkpoints_fp4_values_exactly() {
    let f = GgufFile::open(converted("mxfp4", false)).unwrap();
    let ck = Checkpoint::open(&checkpoint(false)).unwrap();
    let spec = V41Spec::tiny();
    let n = assert_fp4_experts_exact(&f, &ck, spec.n_layer(), spec.core.n_expert);
    assert_eq!(n, 8 * 3 * 4);
}

#[test]
fn engram_tables_are_the_checkpoints_rows_and_scales_byte_for_byte() {
    let ck = Checkpoint::open(&checkpoint(false)).unwrap();
    for recipe in ["q8", "f32"] {
        let f = GgufFile::open(converted(recipe, false)).unwrap();
        // Written after every other tensor, as ds4's files have them.
        let names: Vec<String> = f.tensor_infos().iter().map(|i| i.name.clone()).collect();
        assert_eq!(
            names[names.len() - 2..],
            ["blk.1.engram_embd.weight", "blk.4.engram_embd.weight"]
        );
        for (l, rows) in [(1, 420), (4, 508)] {
            let (ty, ne0, data) = tensor(&f, &format!("blk.{l}.engram_embd.weight"));
            assert_eq!((ty, ne0), (GgmlType::I8, 33));
            let codes = ck
                .tensor(&format!("layers.{l}.engram.embed.weight"))
                .unwrap();
            let scales = ck
                .tensor(&format!("layers.{l}.engram.embed.scale"))
                .unwrap();
            assert_eq!(data.len(), rows * 33);
            for r in 0..rows {
                let row = &data[r * 33..(r + 1) * 33];
                assert_eq!(&row[..32], &codes.bytes[r * 32..(r + 1) * 32], "{l} {r}");
                assert_eq!(row[32], scales.bytes[r], "{l} {r}");
            }
        }
    }
}

#[test]
fn q8_dense_tensors_are_within_the_quant_bound_vectors_exact() {
    let f = GgufFile::open(converted("q8", false)).unwrap();
    let ck = Checkpoint::open(&checkpoint(false)).unwrap();
    // Q8_0: |x - q·d| ≤ amax/254 + amax/2048 per block of 32
    // (tests/convert_write.rs). FP8 with V4.1's 32 × 32 blocks (attention,
    // indexer query, shared expert), BF16 (attn_output_a, head).
    assert_converted(
        &f,
        &ck,
        GgmlType::Q8_0,
        &[
            ("blk.0.attn_q_a.weight", "layers.0.attn.wq_a.weight"),
            ("blk.3.attn_q_b.weight", "layers.3.attn.wq_b.weight"),
            ("blk.5.attn_output_a.weight", "layers.5.attn.wo_a.weight"),
            (
                "blk.7.ffn_down_shexp.weight",
                "layers.7.ffn.shared_experts.w2.weight",
            ),
            ("output.weight", "head.weight"),
        ],
    );
    // F16: within half an f16 ulp (2^-11 relative).
    assert_converted(
        &f,
        &ck,
        GgmlType::F16,
        &[
            ("token_embd.weight", "embed.weight"),
            ("blk.4.engram_kv.weight", "layers.4.engram.wkv.weight"),
            (
                "blk.2.attn_compressor_gate.weight",
                "layers.2.attn.compressor.wgate.weight",
            ),
            (
                "blk.4.indexer.attn_k.weight",
                "layers.4.attn.indexer.wk.weight",
            ),
            (
                "blk.6.indexer.attn_q_b.weight",
                "layers.6.attn.indexer.wq_b.weight",
            ),
        ],
    );
    // F32 bit for bit: norms, sinks, both router biases, the router (F32
    // in V4.1) and the Engram norms.
    assert_converted(
        &f,
        &ck,
        GgmlType::F32,
        &[
            ("blk.0.attn_norm.weight", "layers.0.attn_norm.weight"),
            ("blk.4.attn_sinks.weight", "layers.4.attn.attn_sink"),
            ("blk.5.exp_probs_b.bias", "layers.5.ffn.gate.bias"),
            ("blk.5.exp_probs_b_vl.bias", "layers.5.ffn.gate.bias_vl"),
            ("blk.3.ffn_gate_inp.weight", "layers.3.ffn.gate.weight"),
            ("blk.1.engram_q_norm.weight", "layers.1.engram.q_weight"),
            ("blk.4.engram_k_norm.weight", "layers.4.engram.k_weight"),
            ("blk.2.hc_ffn_scale.weight", "layers.2.hc_ffn_scale"),
        ],
    );
}

#[test]
fn q8_and_mxfp4_logits_agree_with_the_f32_conversion() {
    // Twelve tokens: the window (4) wraps, both compressors emit rows, the
    // candidate blocks and the indexers' top-k (3) select among them, and
    // the Engram n-grams repeat (7, 300 twice).
    let ids = [0u32, 7, 300, 511, 42, 42, 7, 300, 9, 128, 256, 3];
    let reference = cpu_ref_logits(&converted("f32", true), &ids);
    for recipe in ["q8", "mxfp4"] {
        let got = cpu_ref_logits(&converted(recipe, true), &ids);
        let worst = worst_relative_logit_diff(recipe, &got, &reference, VOCAB);
        assert!(worst < TOLERANCE, "{recipe}: {worst}");
    }
}

/// The largest |Δlogit| allowed, relative to the step's largest |logit|,
/// between a q8 / mxfp4 conversion and the f32 one of the tame checkpoint:
/// tests/convert_write.rs's bound for V4 (Q8_0 weights off by at most 1/254
/// of their block's largest value, F16 ones by 2^-11, errors that add over
/// RMS-normalised layers rather than compound; a wrong tensor gives
/// differences of the order of the logits).
const TOLERANCE: f32 = 0.02;

/// The V4.1 files read by gguf-py as ds4 reads them (keys, directory,
/// every decoded value, the Engram tables' I8 bytes included).
#[test]
fn every_tensor_reads_the_same_in_gguf_py() {
    for recipe in ["f32", "q8", "mxfp4"] {
        if !assert_gguf_py_reads_the_same(&converted(recipe, false)) {
            return;
        }
    }
}

#[test]
fn ds4_runs_a_prompt_on_a_converted_file() {
    ds4_answers(&converted("q8", true), "Hello");
}

/// `--recipe FILE` over a V4.1 base mix: lossless MXFP4 routed down, F16
/// Engram norms, the rest q8's bytes; a rule that would send the Engram
/// table through a float type is refused (the loader binds it as I8 only).
#[test]
fn a_recipe_file_mixes_v41_types_and_keeps_the_engram_table_i8() {
    let dir = fresh_dir("convert_v41", "recipe-file");
    let recipe = dir.join("mix.recipe");
    std::fs::write(
        &recipe,
        "base q8\nblk.*.ffn_down_exps.weight mxfp4\nblk.*.engram_*_norm.weight f16\n",
    )
    .unwrap();
    let out = dir.join("mix.gguf");
    let o = convert(&checkpoint(false), s(&recipe), &[], &out);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let m = V41ModelFile::open(&out).expect("the V4.1 loader accepts the mix");
    let q8 = GgufFile::open(converted("q8", false)).unwrap();
    let mx = GgufFile::open(converted("mxfp4", false)).unwrap();
    let (mut down, mut norms) = (0, 0);
    for (name, _, ty) in directory(&m.file) {
        let from = if name.ends_with("ffn_down_exps.weight") {
            down += 1;
            assert_eq!(ty, GgmlType::Mxfp4, "{name}");
            &mx
        } else if name.contains(".engram_") && name.ends_with("_norm.weight") {
            norms += 1;
            assert_eq!(ty, GgmlType::F16, "{name}");
            continue;
        } else {
            &q8
        };
        assert_eq!(tensor(&m.file, &name).2, tensor(from, &name).2, "{name}");
    }
    assert_eq!((down, norms), (8, 4));

    std::fs::write(&recipe, "base q8\nblk.4.engram_embd.weight q8_0\n").unwrap();
    let bad = fresh_dir("convert_v41", "recipe-bad");
    let o = convert(&checkpoint(false), s(&recipe), &[], &bad.join("x.gguf"));
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    for want in [s(&recipe), "blk.4.engram_embd.weight", "only as I8"] {
        assert!(err.contains(want), "{err:?} lacks {want:?}");
    }
    assert_eq!(std::fs::read_dir(&bad).unwrap().count(), 0);
}

/// Converts the script's checkpoint made with `args` (after `--model v41
/// --vocab 512`): exit 1, stderr (which must hold every one of `want`),
/// and an empty output folder.
fn refused(name: &str, args: &[&str], want: &[&str]) {
    let ck = fresh_dir("convert_v41", &format!("{name}-ck"));
    let vocab = VOCAB.to_string();
    let mut all = vec!["--model", "v41", "--vocab", &vocab];
    all.extend_from_slice(args);
    make_checkpoint(&ck, &all);
    let dir = fresh_dir("convert_v41", &format!("{name}-out"));
    let o = convert(&ck, "q8", &[], &dir.join("x.gguf"));
    assert_eq!(o.status.code(), Some(1), "{name}");
    let err = String::from_utf8_lossy(&o.stderr).replace(s(&ck), "CK");
    for w in want {
        assert!(err.contains(w), "{name}: {err:?} lacks {w:?}");
    }
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "{name}");
}

#[test]
fn bad_checkpoints_exit_1_naming_the_file_and_the_tensor_and_write_nothing() {
    // A missing Engram table (its scale stays).
    refused(
        "no-table",
        &["--drop", "layers.4.engram.embed.weight"],
        &[
            &format!("CK/{INDEX_FILE}"),
            "layers.4.engram.embed.weight",
            "blk.4.engram_embd.weight",
            "missing",
        ],
    );
    // A table whose scale is missing.
    refused(
        "no-scale",
        &["--drop", "layers.1.engram.embed.scale"],
        &[
            "CK/model-00003-of-00004.safetensors",
            "layers.1.engram.embed.scale",
        ],
    );
    // Shapes that disagree with config.json: a table one row longer, an
    // FP8 projection, the Engram projection.
    refused(
        "long-table",
        &["--reshape", "layers.1.engram.embed.weight"],
        &[
            "CK/model-00003-of-00004.safetensors",
            "layers.1.engram.embed.weight",
            "[421, 32]",
            "[420, 32]",
        ],
    );
    refused(
        "long-wq-a",
        &["--reshape", "layers.6.attn.wq_a.weight"],
        &[
            "CK/model-00002-of-00004.safetensors",
            "layers.6.attn.wq_a.weight",
            "blk.6.attn_q_a.weight",
        ],
    );
    refused(
        "long-engram-kv",
        &["--reshape", "layers.4.engram.wkv.weight"],
        &[
            "layers.4.engram.wkv.weight",
            "blk.4.engram_kv.weight",
            "[321, 128]",
        ],
    );
    // Bad Engram configuration: rows that are not the prime search's, an
    // Engram layer past the last layer, no tables file.
    refused(
        "bad-rows",
        &["--config", "engram_num_embeddings", "[421, 508]"],
        &[
            "CK/config.json",
            "`engram_num_embeddings` is [421, 508]",
            "[420, 508]",
        ],
    );
    refused(
        "bad-layer",
        &["--config", "engram_layer_ids", "[1, 9]"],
        &["CK/config.json", "`engram.layer_ids`"],
    );
    refused(
        "no-tables",
        &["--no-engram-tables"],
        &["CK/engram_tables.json", "engram_tables.py"],
    );
}
