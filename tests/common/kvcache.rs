//! What the disk KV cache tests share: the tiny f32 model, its tokenizer,
//! sessions on it, and the files a cache folder holds.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use ds4::app::selfcheck::rng::Rng;
use ds4::model::ModelFile;
use ds4::session::{Session, SessionOptions};
use ds4::testmodel::Variant;
use ds4::tokenizer::Tokenizer;

/// The tiny f32 model, opened once per test binary.
pub fn model() -> Arc<ModelFile> {
    static M: OnceLock<Arc<ModelFile>> = OnceLock::new();
    M.get_or_init(|| super::tiny_model(Variant::F32)).clone()
}

pub fn tokenizer() -> Tokenizer {
    Tokenizer::from_gguf(&model().file).unwrap()
}

/// A session on [`model`] of context `ctx`, prefill in chunks of 64.
pub fn session(ctx: usize) -> Session {
    let opts = SessionOptions {
        ctx,
        prefill_chunk: 64,
        ..Default::default()
    };
    Session::new(model(), opts).unwrap()
}

/// Syncs `s` to the first `n` tokens of `p`; their text, as the cache keys
/// it.
pub fn sync_prefix(s: &mut Session, tok: &Tokenizer, p: &[u32], n: usize) -> Vec<u8> {
    s.sync(&p[..n], &mut |_, _| {}).unwrap();
    tok.decode(&p[..n])
}

/// `n` words drawn from `words` by `rng`, each followed by a space: ASCII
/// prose whose every token boundary is a character boundary.
pub fn random_words(words: &[&str], n: usize, rng: &mut Rng) -> String {
    let mut s = String::new();
    for _ in 0..n {
        s.push_str(words[rng.below(words.len())]);
        s.push(' ');
    }
    s
}

/// The names of the files in `dir`, sorted.
pub fn file_names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}
