//! Shared test helpers: generated tiny models cached under target/.

#![allow(dead_code)]

pub mod batch;
pub mod checkpoint;
pub mod draft;
pub mod in_process;
pub mod kvcache;
pub mod process;
pub mod quantize;
pub mod rng;
pub mod server;
pub mod v41;

use std::path::PathBuf;
use std::sync::Arc;

use ds4::backend::{BackendKind, BackendOptions};
use ds4::kvcache::file::{self, KvcHeader, NewCheckpoint, SaveReason};
use ds4::kvcache::KvCacheConfig;
use ds4::model::forward::Numerics;
use ds4::model::ModelFile;
use ds4::quant::GgmlType;
use ds4::session::{Session, SessionOptions};
use ds4::testmodel::Variant;

/// The weight formats the matrix-product kernels compute with.
pub const COMPUTE_TYPES: [GgmlType; 8] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Bf16,
    GgmlType::Q8_0,
    GgmlType::Q2K,
    GgmlType::Q4K,
    GgmlType::Iq2Xxs,
    GgmlType::Mxfp4,
];

/// TOKENIZER.md §8: texts and the official tokenizer's ids for them (HF
/// `tokenizers` on the official tokenizer.json).
pub const TOKENIZER_VECTORS: &[(&str, &[u32])] = &[
    ("Hello world", &[19923, 2058]),
    ("  hello", &[223, 44388]),
    (
        "int main() {\n    return 0;\n}\n",
        &[650, 1840, 1393, 875, 361, 1354, 223, 18, 510, 1778],
    ),
    ("x = 12345;", &[90, 438, 223, 6895, 1883, 29]),
    ("café über naïve", &[69, 2797, 619, 13785, 112752]),
    ("你好，世界。Hello", &[30594, 303, 3427, 320, 19923]),
    (
        "<｜User｜>Hi<｜Assistant｜></think>",
        &[128803, 23166, 128804, 128822],
    ),
    ("a—b 😀", &[67, 965, 68, 53769, 225]),
    ("   \n\n  x", &[92687, 223, 1527]),
    ("e.g. foo.bar()", &[71, 3588, 16, 52735, 6229, 287, 1393]),
];

/// A JSON array of unsigned integers (a golden's token ids, shapes,
/// positions).
pub fn json_uints(v: &serde_json::Value) -> Vec<usize> {
    v.as_array()
        .expect("a JSON array")
        .iter()
        .map(|x| x.as_u64().expect("an unsigned integer") as usize)
        .collect()
}

/// A fresh, empty folder `group/name` under the build tree's temporary
/// folder.
pub fn fresh_dir(group: &str, name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(group)
        .join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The disk KV cache in `dir` as the cache tests use it: checkpoints from
/// 16 tokens on, cold saves up to `cold_max_tokens`.
pub fn disk_cache_config(dir: &std::path::Path, cold_max_tokens: usize) -> KvCacheConfig {
    KvCacheConfig {
        kv_disk_dir: Some(dir.to_path_buf()),
        kv_cache_min_tokens: 16,
        kv_cache_cold_max_tokens: cold_max_tokens,
        ..KvCacheConfig::default()
    }
}

/// A synthetic checkpoint of `payload` filler bytes for `text` in `dir`
/// (eviction reads only headers and sizes); its name, the text's SHA-1.
pub fn synthetic_checkpoint(
    dir: &std::path::Path,
    ctx: usize,
    text: &str,
    tokens: u32,
    hits: u32,
    used: u64,
    payload: usize,
) -> String {
    let payload = vec![7u8; payload];
    let sha = file::sha1_hex(text.as_bytes());
    let c = NewCheckpoint {
        header: KvcHeader {
            quant_bits: 2,
            reason: SaveReason::Cold,
            ext_flags: 0,
            tokens,
            hits,
            ctx: ctx as u32,
            created: used,
            last_used: used,
            payload_bytes: payload.len() as u64,
            checksum: Some(file::checksum(text.as_bytes(), &payload)),
            arch: ds4::model::Arch::V4,
        },
        text: text.as_bytes(),
        payload: &payload,
        tool_map: &[],
    };
    file::write_atomic(&dir.join(format!("{sha}.kv")), &c, None).unwrap();
    sha
}

/// The generated models of the tests, once per build tree (the library's
/// generator and names, as `ds4-bench --check` uses them).
pub fn models() -> &'static ds4::app::selfcheck::models::Models {
    static M: std::sync::OnceLock<ds4::app::selfcheck::models::Models> = std::sync::OnceLock::new();
    M.get_or_init(|| {
        ds4::app::selfcheck::models::Models::new(
            PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("test-models"),
        )
    })
}

/// The tiny model of `variant`, generated once per build tree (the generator
/// is deterministic, so a cached file is identical to a fresh one).
pub fn tiny_model_path(variant: Variant) -> PathBuf {
    models().tiny_path(variant).unwrap()
}

/// The long-context test model (`ds4-make-test-model --long-context`:
/// Flash's ratio schedule, window 128, the indexer choosing 64 rows with 4
/// heads), f32, generated once per build tree.
pub fn long_context_model() -> Arc<ModelFile> {
    long_context_model_of(Variant::F32)
}

/// The long-context test model of `variant` (f32 or q8: its embedding of
/// 128 is not a multiple of the K-quant blocks).
pub fn long_context_model_of(variant: Variant) -> Arc<ModelFile> {
    models().long_context(variant).unwrap()
}

/// The tiny V4.1 model (f32), generated once per build tree.
pub fn v41_model_path() -> PathBuf {
    models().v41_path().unwrap()
}

pub fn tiny_model(variant: Variant) -> Arc<ModelFile> {
    Arc::new(ModelFile::open(tiny_model_path(variant)).unwrap())
}

// Each test binary uses some of these.
#[allow(unused_imports)]
pub use ds4::app::selfcheck::e2e::{argmax, log_softmax, max_dlogprob, tokens};

/// log Σ exp over a logit row, in f64 (the goldens are float64): a
/// log-prob is a logit minus it.
pub fn log_sum_exp(logits: &[f32]) -> f64 {
    let m = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    m + logits
        .iter()
        .map(|&x| (x as f64 - m).exp())
        .sum::<f64>()
        .ln()
}

/// Two sessions holding the same tokens, fed `decode` token by token: the
/// largest |Δ log-prob| of `got`'s logits against `want`'s, before the
/// first token and after each.
pub fn decode_max_dlogprob(got: &mut Session, want: &mut Session, decode: &[u32]) -> f32 {
    let vocab = want.n_vocab();
    let mut worst = max_dlogprob(got.logits(), want.logits(), vocab);
    for &t in decode {
        want.eval(t).unwrap();
        got.eval(t).unwrap();
        worst = worst.max(max_dlogprob(got.logits(), want.logits(), vocab));
    }
    worst
}

/// The shared wgpu device (lavapipe in CI), or `None` (skip) where no
/// adapter opens; with `CI` set, a failure rather than a skip.
pub fn shared_gpu() -> Option<Arc<ds4::backend::wgpu::Gpu>> {
    match ds4::backend::wgpu::Gpu::shared(&BackendOptions::from_env(), true) {
        Ok(g) => Some(g),
        Err(e) => {
            if std::env::var_os("CI").is_some() {
                panic!("CI is set but no wgpu adapter opened: {e}");
            }
            eprintln!("skipping wgpu: {e}");
            None
        }
    }
}

/// Whether the wgpu half runs ([`shared_gpu`]), naming the device.
pub fn have_wgpu() -> bool {
    shared_gpu()
        .map(|g| eprintln!("wgpu device: {}", g.describe()))
        .is_some()
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// A session on the tiny model of `variant` for the end-to-end backend
/// comparisons: context `ctx`, prefill in chunks of `chunk`, the backend
/// opened as the environment says (CI picks wgpu features that way).
pub fn session_on(
    variant: Variant,
    numerics: Numerics,
    backend: BackendKind,
    ctx: usize,
    chunk: usize,
) -> Session {
    session_with(
        variant,
        numerics,
        backend,
        ctx,
        chunk,
        BackendOptions::from_env(),
    )
}

/// [`session_on`] with the backend opened as `backend_options` says.
pub fn session_with(
    variant: Variant,
    numerics: Numerics,
    backend: BackendKind,
    ctx: usize,
    chunk: usize,
    backend_options: BackendOptions,
) -> Session {
    let opts = SessionOptions {
        ctx,
        prefill_chunk: chunk,
        numerics,
        backend,
        backend_options,
        ..Default::default()
    };
    Session::new(tiny_model(variant), opts).unwrap_or_else(|e| panic!("{backend:?}: {e}"))
}

/// The streaming exactness tests' set-ups for `k` experts per token (the
/// library's: `ds4-bench --check` runs them too).
#[allow(unused_imports)]
pub use ds4::app::selfcheck::streaming::streaming_cases;

/// The slot count of a [`streaming_cases`] set-up.
pub fn case_slots(o: &ds4::backend::options::StreamingOptions) -> usize {
    ds4::app::selfcheck::streaming::case_slots(o)
        .unwrap_or_else(|| panic!("the cases name slots, not {:?}", o.budget))
}
