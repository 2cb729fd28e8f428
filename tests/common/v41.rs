//! What the V4.1 golden tests share: the committed goldens, the tiny model
//! they were made from, and the float64 log-softmax they are compared in.

use std::path::PathBuf;
use std::sync::Arc;

use ds4::model::v41::V41ModelFile;
use serde_json::Value;

/// `tests/golden/<name>`.
pub fn golden(name: &str) -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    serde_json::from_slice(&std::fs::read(p).expect("committed golden")).unwrap()
}

/// The tiny V4.1 model (f32) the goldens were made from, generated once per
/// build tree.
pub fn tiny() -> Arc<V41ModelFile> {
    Arc::new(V41ModelFile::open(super::v41_model_path()).unwrap())
}

/// A golden prompt's token ids.
pub fn ids_of(p: &Value) -> Vec<u32> {
    p["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

/// Log-probabilities of a logit row, in f64 (the goldens are float64).
pub fn log_softmax(l: &[f32]) -> Vec<f64> {
    let m = l.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let s: f64 = l.iter().map(|&x| (x as f64 - m).exp()).sum();
    l.iter().map(|&x| x as f64 - m - s.ln()).collect()
}
