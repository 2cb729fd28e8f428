//! The demo model of `--demo`: a tiny model with random weights, generated
//! once into the user cache, so every binary can run without a download.

use std::path::PathBuf;

/// Tokens the demo generates when no `-n` is given: enough to see the
/// engine stream, short enough to finish in seconds.
pub const DEMO_DEFAULT_TOKENS: usize = 64;

/// Path of the demo model, generated on first use (random weights).
pub fn demo_model() -> Result<PathBuf, String> {
    let base = crate::backend::options::user_cache_dir().unwrap_or_else(std::env::temp_dir);
    let dir = base.join("ds4");
    let path = dir.join("demo-tiny-q8.gguf");
    if !path.exists() {
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        crate::log_line!(
            "ds4: generating the demo model (random weights) at {}",
            path.display()
        );
        let vocab = crate::testmodel::Vocab::load_default()?;
        let tmp = dir.join(format!("demo-tiny-q8.{}.tmp", std::process::id()));
        let mut spec = crate::testmodel::TestModelSpec::tiny();
        spec.core.name = "ds4 demo model (RANDOM WEIGHTS, output is noise)".into();
        crate::testmodel::write_model(&spec, crate::testmodel::Variant::Q8, &vocab, &tmp)
            .map_err(|e| format!("{}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, &path).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    crate::log_line!(
        "ds4: DEMO MODE — tiny model with random weights; the text it writes is noise"
    );
    Ok(path)
}
