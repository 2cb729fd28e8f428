//! Shared test helpers: generated tiny models cached under target/.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Arc;

use ds4::model::ModelFile;
use ds4::testmodel::{write_model, TestModelSpec, Variant, Vocab};

/// The tiny model of `variant`, generated once per build tree (the generator
/// is deterministic, so a cached file is identical to a fresh one).
pub fn tiny_model_path(variant: Variant) -> PathBuf {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("test-models");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("tiny-{}.gguf", variant.name()));
    if !path.exists() {
        let tmp = dir.join(format!(
            "tiny-{}.{}.tmp",
            variant.name(),
            std::process::id()
        ));
        let vocab = Vocab::load_default().expect("tests/data/deepseek-v4-tokenizer.json");
        write_model(&TestModelSpec::tiny(), variant, &vocab, &tmp).unwrap();
        // Atomic publish: concurrent test binaries never see a partial file.
        std::fs::rename(&tmp, &path).unwrap();
    }
    path
}

pub fn tiny_model(variant: Variant) -> Arc<ModelFile> {
    Arc::new(ModelFile::open(tiny_model_path(variant)).unwrap())
}

/// Deterministic pseudo-random token ids below `vocab` (avoids the added-token
/// range so the hash layers see ordinary ids too).
pub fn tokens(n: usize, seed: u64) -> Vec<u32> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 128_000) as u32
        })
        .collect()
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}
