//! The V4 Flash name map (`ds4::convert::layout`, issue 37): the `deepseek4`
//! tensor directory computed from `config.json` equals, name by name and
//! shape by shape, the full-shape header of the published Flash file and
//! what ds4's loader binds; the tiny checkpoint of
//! `tools/checkpoint/make_checkpoint.py --model v4` is accepted and maps onto
//! the tiny test model's directory; a missing tensor or a shape that
//! disagrees with `config.json` is refused naming the file and the tensor.
//! The `deepseek4` metadata made from `config.json` (`ds4::convert::metadata`)
//! is, key by key, that of the published Flash file's header and of the
//! tiny model's generator, and reads back into the same `ModelConfig`; a
//! `config.json` value the loader would refuse is refused naming the file
//! and the key.

mod common;

use std::path::{Path, PathBuf};

use common::checkpoint::make_checkpoint;
use common::fresh_dir;
use ds4::convert::layout::{Layout, Source};
use ds4::convert::metadata::V4Config;
use ds4::convert::safetensors::{Checkpoint, CONFIG_FILE, INDEX_FILE};
use ds4::convert::ConvertError;
use ds4::gguf::{GgufFile, GgufWriter, MetaValue};
use ds4::model::{ModelConfig, ModelFile};
use ds4::testmodel::{write_model, write_sparse_flash, TestModelSpec, Variant, Vocab};
use serde_json::{json, Value};

/// The official DeepSeek V4 Flash `config.json` (deepseek-ai/DeepSeek-V4-Flash;
/// MODEL.md §1, GGUF.md §3): 43 layers, and the MTP layer's slot at the end
/// of `compress_ratios`.
const FLASH_CONFIG: &str = r#"{
  "architectures": ["DeepseekV4ForCausalLM"],
  "model_type": "deepseek_v4",
  "vocab_size": 129280,
  "hidden_size": 4096,
  "moe_intermediate_size": 2048,
  "num_hidden_layers": 43,
  "num_attention_heads": 64,
  "num_key_value_heads": 1,
  "n_routed_experts": 256,
  "n_shared_experts": 1,
  "num_experts_per_tok": 6,
  "first_k_dense_replace": 0,
  "max_position_embeddings": 1048576,
  "rms_norm_eps": 1e-6,
  "rope_theta": 10000,
  "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                   "beta_fast": 32, "beta_slow": 1},
  "q_lora_rank": 1024,
  "qk_rope_head_dim": 64,
  "head_dim": 512,
  "compress_ratios": [0, 0, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4,
                      128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4,
                      128, 4, 128, 4, 128, 4, 0],
  "sliding_window": 128,
  "compress_rope_theta": 160000,
  "o_lora_rank": 1024,
  "o_groups": 8,
  "index_n_heads": 64,
  "index_head_dim": 128,
  "index_topk": 512,
  "num_hash_layers": 3,
  "hc_mult": 4,
  "hc_eps": 1e-6,
  "hc_sinkhorn_iters": 20,
  "swiglu_limit": 10.0,
  "routed_scaling_factor": 1.5,
  "scoring_func": "sqrtsoftplus",
  "topk_method": "noaux_tc",
  "num_nextn_predict_layers": 1,
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                          "scale_fmt": "ue8m0", "weight_block_size": [128, 128]}
}"#;

fn flash_config() -> Value {
    serde_json::from_str(FLASH_CONFIG).unwrap()
}

fn tmp(name: &str) -> PathBuf {
    fresh_dir("convert_layout", name)
}

/// The GGUF's tensor directory: (name, ne) in file order.
fn header(path: &Path) -> Vec<(String, Vec<u64>)> {
    let f = GgufFile::open(path).unwrap();
    f.tensor_infos()
        .iter()
        .map(|t| (t.name.clone(), t.ne.clone()))
        .collect()
}

fn directory(l: &Layout) -> Vec<(String, Vec<u64>)> {
    l.tensors
        .iter()
        .map(|t| (t.name.clone(), t.ne.clone()))
        .collect()
}

/// `want` and `got` hold the same tensors in the same order, each with the
/// same shape; a difference names the first tensor that differs.
fn assert_same_directory(got: &[(String, Vec<u64>)], want: &[(String, Vec<u64>)]) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g, w, "tensor {i} differs");
    }
    assert_eq!(got.len(), want.len(), "tensor counts differ");
}

/// Every tensor the loader binds has the directory's shape, and the loader
/// binds the whole directory (its `ne` padded to 4 dimensions).
fn assert_loader_binds(m: &ModelFile, l: &Layout) {
    let bound = m.weights.all();
    assert_eq!(bound.len(), l.tensors.len());
    for t in bound {
        let d = l
            .get(&t.name)
            .unwrap_or_else(|| panic!("{} bound but not in the directory", t.name));
        let mut ne = [1u64; 4];
        ne[..d.ne.len()].copy_from_slice(&d.ne);
        assert_eq!(t.ne, ne, "{}", t.name);
    }
}

#[test]
fn flash_directory_is_the_published_header_and_what_the_loader_binds() {
    let l = Layout::from_config(&flash_config(), Path::new(CONFIG_FILE)).unwrap();
    assert_eq!(l.tensors.len(), 1328);

    // The header the tests build for the published q2 file (a hole for data).
    let dir = std::env::temp_dir().join(format!("ds4-convert-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("flash-q2-sparse.gguf");
    let vocab = Vocab::load_default().expect("committed tokenizer.json");
    write_sparse_flash(&vocab, &path).unwrap();
    drop(vocab);
    assert_same_directory(&directory(&l), &header(&path));

    let m = ModelFile::open(&path).expect("the full-shape file validates");
    assert_loader_binds(&m, &l);
    drop(m);
    std::fs::remove_dir_all(&dir).ok();

    // Every routed-expert tensor stacks 256 experts of the HF shape.
    let n_exps = l
        .tensors
        .iter()
        .filter(|t| matches!(t.source, Source::Experts { .. }))
        .inspect(|t| {
            let src = t.sources();
            assert_eq!(src.len(), 256, "{}", t.name);
            assert_eq!(src[255].1, [t.ne[1], t.ne[0]], "{}", t.name);
        })
        .count();
    assert_eq!(n_exps, 3 * 43);
    let tables = l
        .tensors
        .iter()
        .filter(|t| matches!(t.source, Source::Table(_)))
        .count();
    assert_eq!(tables, 3);
}

/// A vocabulary of `n` made-up tokens (the loader reads only its size).
fn small_vocab(n: usize) -> Vocab {
    let tokens: Vec<String> = (0..n).map(|i| format!("t{i}")).collect();
    Vocab {
        token_types: vec![1; n],
        tokens,
        merges: Vec::new(),
    }
}

/// The script's complete tiny V4 checkpoint (a 512-token vocabulary), with
/// `extra` arguments (`--drop`, `--reshape`).
fn v4_checkpoint(name: &str, extra: &[&str]) -> PathBuf {
    let dir = tmp(name);
    let mut args = vec!["--model", "v4", "--vocab", "512"];
    args.extend_from_slice(extra);
    make_checkpoint(&dir, &args);
    dir
}

#[test]
fn tiny_checkpoint_is_accepted_and_maps_onto_the_tiny_model() {
    let dir = v4_checkpoint("good", &[]);
    let ck = Checkpoint::open(&dir).unwrap();
    let l = Layout::for_checkpoint(&ck).expect("the tiny checkpoint passes the checks");
    // The main file's map reads every tensor but the MTP block's, and the
    // MTP file's map reads exactly those (GGUF.md §7: 32 tensors).
    let unused = l.unused(&ck);
    assert!(!unused.is_empty() && unused.iter().all(|n| n.starts_with("mtp.0.")));
    let mtp = Layout::v4_mtp(&l.config);
    mtp.check(&ck).expect("the MTP block passes the checks");
    assert_eq!(mtp.tensors.len(), 32);
    let mtp_unused = mtp.unused(&ck);
    assert!(unused.iter().all(|n| !mtp_unused.contains(n)));
    // Every tensor of the checkpoint is read by exactly one of the two.
    assert_eq!(mtp_unused.len() + unused.len(), ck.names().count());

    // The tiny model's generator writes the same directory, and the loader
    // binds it.
    let spec = TestModelSpec::tiny();
    let gguf = dir.join("tiny.gguf");
    write_model(&spec, Variant::F32, &small_vocab(512), &gguf).unwrap();
    assert_same_directory(&directory(&l), &header(&gguf));
    let m = ModelFile::open(&gguf).expect("the tiny model loads");
    assert_loader_binds(&m, &l);

    // The script's config.json is TestModelSpec::tiny() in the official
    // keys: the directory's configuration is the loader's of the tiny model
    // (but for general.name, which the directory leaves empty).
    let mut want = m.config.clone();
    want.core.name = String::new();
    assert_eq!(l.config, want);
}

/// The error `Layout::for_checkpoint` gives for a broken checkpoint.
fn refusal(dir: &Path) -> (String, String, String) {
    let ck = Checkpoint::open(dir).expect("the container itself is sound");
    match Layout::for_checkpoint(&ck) {
        Err(ConvertError::Tensor { file, tensor, msg }) => (file, tensor, msg),
        Err(e) => panic!("not a tensor error: {e}"),
        Ok(_) => panic!("accepted"),
    }
}

#[test]
fn a_missing_tensor_is_refused_naming_the_index_and_the_tensor() {
    for (drop, gguf) in [
        (
            "layers.2.attn.compressor.ape",
            "blk.2.attn_compressor_ape.weight",
        ),
        (
            "layers.4.ffn.experts.5.w3.weight",
            "blk.4.ffn_up_exps.weight",
        ),
        ("layers.0.ffn.gate.tid2eid", "blk.0.ffn_gate_tid2eid.weight"),
        (
            "layers.4.attn.indexer.weights_proj.weight",
            "blk.4.indexer.proj.weight",
        ),
        ("hc_head_scale", "output_hc_scale.weight"),
    ] {
        let dir = v4_checkpoint("missing", &["--drop", drop]);
        let (file, tensor, msg) = refusal(&dir);
        assert_eq!(file, dir.join(INDEX_FILE).display().to_string());
        assert_eq!(tensor, drop);
        assert!(msg.contains("missing from the checkpoint"), "{msg}");
        assert!(msg.contains(gguf), "{msg}");
    }
}

#[test]
fn a_missing_scale_is_refused_naming_the_weight() {
    let dir = v4_checkpoint("no-scale", &["--drop", "layers.1.attn.wq_b.scale"]);
    let (file, tensor, msg) = refusal(&dir);
    assert!(file.ends_with("model-00001-of-00003.safetensors"), "{file}");
    assert_eq!(tensor, "layers.1.attn.wq_b.weight");
    assert!(
        msg.contains("without its scale tensor layers.1.attn.wq_b.scale"),
        "{msg}"
    );
}

#[test]
fn a_wrong_shape_is_refused_naming_the_shard_and_both_shapes() {
    for (name, shard, got, want) in [
        (
            "layers.3.attn.wkv.weight",
            "model-00002-of-00003.safetensors",
            "shape [81, 256]",
            "implies [80, 256] for blk.3.attn_kv.weight",
        ),
        (
            "layers.5.ffn.experts.7.w2.weight",
            "model-00003-of-00003.safetensors",
            "shape [257, 256] (stored as packed FP4 [257, 128])",
            "implies [256, 256] for blk.5.ffn_down_exps.weight",
        ),
        (
            "embed.weight",
            "model-00001-of-00003.safetensors",
            "shape [513, 256]",
            "implies [512, 256] for token_embd.weight",
        ),
        (
            "layers.1.ffn.gate.tid2eid",
            "model-00001-of-00003.safetensors",
            "shape [513, 2]",
            "implies [512, 2] for blk.1.ffn_gate_tid2eid.weight",
        ),
        (
            "layers.2.attn.compressor.ape",
            "model-00002-of-00003.safetensors",
            "shape [5, 160]",
            "implies [4, 160] for blk.2.attn_compressor_ape.weight",
        ),
    ] {
        let dir = v4_checkpoint("reshaped", &["--reshape", name]);
        let (file, tensor, msg) = refusal(&dir);
        assert_eq!(file, dir.join(shard).display().to_string());
        assert_eq!(tensor, name);
        assert!(msg.contains(got) && msg.contains(want), "{msg}");
        assert!(msg.contains(CONFIG_FILE), "{msg}");
    }
}

#[test]
fn a_config_that_disagrees_with_the_tensors_is_refused() {
    let dir = v4_checkpoint("config", &[]);
    let path = dir.join(CONFIG_FILE);
    let mut c: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    c["index_head_dim"] = json!(64);
    std::fs::write(&path, serde_json::to_vec(&c).unwrap()).unwrap();
    let (file, tensor, msg) = refusal(&dir);
    assert!(file.ends_with("model-00002-of-00003.safetensors"), "{file}");
    assert_eq!(tensor, "layers.2.attn.indexer.wq_b.weight");
    assert!(msg.contains("shape [512, 64]"), "{msg}");
    assert!(
        msg.contains("implies [1024, 64] for blk.2.indexer.attn_q_b.weight"),
        "{msg}"
    );

    // A config.json without a key the directory needs names the file.
    c.as_object_mut().unwrap().remove("o_lora_rank");
    std::fs::write(&path, serde_json::to_vec(&c).unwrap()).unwrap();
    let ck = Checkpoint::open(&dir).unwrap();
    let e = Layout::for_checkpoint(&ck).err().unwrap().to_string();
    assert_eq!(e, format!("{}: no `o_lora_rank`", path.display()));
}

/// The metadata of `kvs` written through `GgufWriter` and opened again.
fn written(c: &V4Config) -> GgufFile {
    let mut w = GgufWriter::new();
    c.add_to(&mut w);
    GgufFile::from_vec(w.to_bytes().unwrap()).unwrap()
}

/// A file's metadata in order, without the tokenizer keys (which come from
/// `tokenizer.json`, not `config.json`).
fn model_kvs(f: &GgufFile) -> Vec<(String, MetaValue)> {
    f.metadata()
        .filter(|(k, _)| !k.starts_with("tokenizer."))
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

/// `got` and `want` hold the same keys in the same order with the same
/// typed values; a difference names the first key that differs.
fn assert_same_kvs(got: &[(String, MetaValue)], want: &[(String, MetaValue)]) {
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g, w, "key {i} differs");
    }
    let keys = |v: &[(String, MetaValue)]| v.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
    assert_eq!(keys(got), keys(want), "key lists differ");
}

#[test]
fn flash_metadata_is_the_published_header() {
    let c = V4Config::from_config(&flash_config(), Path::new(CONFIG_FILE), "DeepSeek V4 Flash")
        .unwrap();
    let dir = tmp("flash-metadata");
    let path = dir.join("flash-q2-sparse.gguf");
    let vocab = Vocab::load_default().expect("committed tokenizer.json");
    write_sparse_flash(&vocab, &path).unwrap();
    drop(vocab);
    let published = GgufFile::open(&path).unwrap();
    let want = model_kvs(&published);
    assert_eq!(
        want.len(),
        40,
        "general.architecture, general.name, 38 deepseek4.* keys"
    );
    assert_same_kvs(&c.kvs, &want);

    // Written and read back, it is what the loader reads from the header.
    let f = written(&c);
    assert_same_kvs(&model_kvs(&f), &want);
    let got = ModelConfig::from_gguf(&f).unwrap();
    assert_eq!(got, ModelConfig::from_gguf(&published).unwrap());
    assert_eq!(got, c.model);
    drop(published);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn tiny_checkpoint_metadata_is_the_tiny_models() {
    let dir = v4_checkpoint("metadata", &[]);
    let ck = Checkpoint::open(&dir).unwrap();
    let spec = TestModelSpec::tiny();
    let c = V4Config::from_config(ck.config(), &dir.join(CONFIG_FILE), &spec.core.name).unwrap();

    let gguf = dir.join("tiny.gguf");
    write_model(&spec, Variant::F32, &small_vocab(512), &gguf).unwrap();
    let tiny = GgufFile::open(&gguf).unwrap();
    // The loader's reader, on the metadata written through GgufWriter,
    // gives the generated tiny model's configuration.
    let f = written(&c);
    let want = ModelConfig::from_gguf(&tiny).unwrap();
    assert_eq!(ModelConfig::from_gguf(&f).unwrap(), want);
    assert_eq!(c.model, want);
    // And the metadata is the generator's, key by key.
    assert_same_kvs(&model_kvs(&f), &model_kvs(&tiny));
}

#[test]
fn an_inconsistent_config_is_refused_naming_the_file_and_the_key() {
    let dir = v4_checkpoint("inconsistent", &[]);
    let path = dir.join(CONFIG_FILE);
    let good: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    for (key, value, want) in [
        (
            "o_groups",
            json!(3),
            "`o_groups`: expected a divisor of `num_attention_heads` 4, found 3",
        ),
        (
            "num_experts_per_tok",
            json!(9),
            "`num_experts_per_tok`: expected ≤ `n_routed_experts` 8, found 9",
        ),
        (
            "index_head_dim",
            json!(48),
            "`index_head_dim`: expected a power of two, multiple of 32, found 48",
        ),
        (
            "rms_norm_eps",
            json!(0.0),
            "`rms_norm_eps`: expected positive epsilons",
        ),
        (
            "num_hash_layers",
            json!(7),
            "`num_hash_layers`: expected ≤ `num_hidden_layers` 6, found 7",
        ),
    ] {
        let mut c = good.clone();
        c[key] = value;
        std::fs::write(&path, serde_json::to_vec(&c).unwrap()).unwrap();
        let ck = Checkpoint::open(&dir).unwrap();
        let e = V4Config::from_config(ck.config(), &path, "x")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with(&format!("{}: ", path.display())), "{e}");
        assert!(e.contains(want), "{e:?} lacks {want:?}");
        // The name map refuses it the same way.
        let e2 = Layout::for_checkpoint(&ck).err().unwrap().to_string();
        assert_eq!(e2, e);
    }
}
