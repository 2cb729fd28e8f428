//! The tiny DeepSeek V4.1 model against its float64 goldens
//! (tests/golden/v41-tiny.json, made by tools/reference/make_v41_goldens.py
//! from the official inference/model.py semantics): the file the generator
//! writes is the one the goldens were made from, and the host-side Engram
//! hashing gives the reference's table rows at every position.

use std::path::PathBuf;

use ds4::model::v41::engram::{hash_rows, EngramHistory};
use ds4::model::v41::V41ModelFile;
use ds4::testmodel::v41::{write_v41_model, V41Spec};
use ds4::testmodel::Variant;
use ds4::testmodel::Vocab;
use serde_json::Value;
use sha2::{Digest, Sha256};

mod common;
use common::v41::ids_of;

fn golden() -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/v41-tiny.json");
    serde_json::from_slice(&std::fs::read(p).expect("committed golden")).unwrap()
}

fn tiny_model(tag: &str) -> (PathBuf, V41ModelFile) {
    let dir = std::env::temp_dir().join(format!("ds4-v41-golden-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tiny-v41.gguf");
    let vocab = Vocab::load_default().unwrap();
    write_v41_model(&V41Spec::tiny(), Variant::F32, &vocab, &path).unwrap();
    let m = V41ModelFile::open(&path).unwrap();
    (path, m)
}

#[test]
fn generator_writes_the_golden_file_and_engram_rows_match_the_reference() {
    let g = golden();
    let (path, m) = tiny_model("hash");
    let bytes = std::fs::read(&path).unwrap();
    let sha = format!("{:x}", Sha256::digest(&bytes));
    assert_eq!(
        sha,
        g["gguf"]["sha256"].as_str().unwrap(),
        "the generator no longer writes the file the goldens were made from"
    );
    let cfg = &m.config.engram;
    let mut checked = 0;
    for p in g["prompts"].as_array().unwrap() {
        let ids = ids_of(p);
        let mut h = EngramHistory::new(cfg);
        let rows = hash_rows(cfg, &mut h, &ids, None);
        let want: Vec<u32> = p["engram_rows"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|t| t.as_array().unwrap().iter())
            .flat_map(|l| l.as_array().unwrap().iter())
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(rows, want, "prompt {}", p["name"]);
        // Hashing token by token (decode) gives the same rows as the prompt at once.
        let mut h = EngramHistory::new(cfg);
        let one_by_one: Vec<u32> = ids
            .iter()
            .flat_map(|&t| hash_rows(cfg, &mut h, &[t], None))
            .collect();
        assert_eq!(one_by_one, want);
        checked += ids.len();
    }
    assert!(checked >= 80);
    drop(m);
    let _ = std::fs::remove_file(&path);
}
