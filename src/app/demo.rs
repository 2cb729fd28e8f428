//! The demo model of `--demo`: a tiny model with random weights, generated
//! once into the user cache, so every binary can run without a download.

use std::path::{Path, PathBuf};

/// The model file a binary runs when `-m` is not given.
pub const DEFAULT_MODEL: &str = "ds4flash.gguf";

/// The model a binary runs: the demo model under `--demo`, else `-m`, else
/// `./ds4flash.gguf` when it exists; with none of them, an error that says
/// how to get one.
pub fn model_path(model: Option<&Path>, demo: bool) -> Result<PathBuf, String> {
    if demo {
        return demo_model();
    }
    match model {
        Some(p) => Ok(p.to_path_buf()),
        None if Path::new(DEFAULT_MODEL).exists() => Ok(PathBuf::from(DEFAULT_MODEL)),
        None => Err("no model: ./ds4flash.gguf not found and no -m given.\n\
            Get the real model (q2, 81 GB) with: tools/download_model.sh q2\n\
            or try the engine on a random tiny model with --demo"
            .to_string()),
    }
}

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
