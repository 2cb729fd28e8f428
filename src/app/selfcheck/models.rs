//! The generated models the checks run: the tiny V4 model of each variant,
//! the long-context model and the tiny V4.1 model, written once into a
//! folder (the self-check's work folder, or the tests' build tree) and
//! reused. The generator is deterministic, so a file written earlier is the
//! file a fresh run would write; each name carries what it was made from.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::model::{AnyModel, ModelFile};
use crate::testmodel::v41::{write_v41_model, V41Spec};
use crate::testmodel::{write_model, TestModelSpec, Variant, Vocab};

/// The generated models in one folder.
pub struct Models {
    dir: PathBuf,
    /// One writer at a time within a process (other processes: the
    /// temporary name and the rename).
    lock: Mutex<Option<Vocab>>,
}

impl Models {
    pub fn new(dir: impl Into<PathBuf>) -> Models {
        Models {
            dir: dir.into(),
            lock: Mutex::new(None),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `dir/name`, written by `write` unless it is there: under a
    /// temporary name first, then renamed, so that concurrent processes
    /// never see half a file.
    fn file(
        &self,
        name: &str,
        write: &dyn Fn(&Vocab, &Path) -> std::io::Result<()>,
    ) -> Result<PathBuf, String> {
        let mut vocab = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let path = self.dir.join(name);
        if path.exists() {
            return Ok(path);
        }
        std::fs::create_dir_all(&self.dir).map_err(|e| format!("{}: {e}", self.dir.display()))?;
        if vocab.is_none() {
            *vocab = Some(Vocab::load_default()?);
        }
        let tmp = self.dir.join(format!("{name}.{}.tmp", std::process::id()));
        let written = write(vocab.as_ref().expect("loaded above"), &tmp)
            .and_then(|_| std::fs::rename(&tmp, &path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(format!("writing {}: {e}", path.display()));
        }
        Ok(path)
    }

    /// The tiny V4 model of `variant` (`TestModelSpec::tiny`).
    pub fn tiny_path(&self, variant: Variant) -> Result<PathBuf, String> {
        self.file(&format!("tiny-{}.gguf", variant.name()), &|vocab, p| {
            write_model(&TestModelSpec::tiny(), variant, vocab, p)
        })
    }

    pub fn tiny(&self, variant: Variant) -> Result<Arc<ModelFile>, String> {
        open_v4(&self.tiny_path(variant)?)
    }

    /// The long-context test model of `variant` (f32 or q8: its embedding
    /// of 64 is not a multiple of the K-quant blocks), named after its spec
    /// so that a changed spec never reads a stale file.
    pub fn long_context_path(&self, variant: Variant) -> Result<PathBuf, String> {
        let spec = TestModelSpec::long_context();
        let key = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            format!("{spec:?}").hash(&mut h);
            h.finish()
        };
        let name = format!("long-context-{}-{key:016x}.gguf", variant.name());
        self.file(&name, &|vocab, p| write_model(&spec, variant, vocab, p))
    }

    pub fn long_context(&self, variant: Variant) -> Result<Arc<ModelFile>, String> {
        open_v4(&self.long_context_path(variant)?)
    }

    /// The tiny DeepSeek V4.1 model (`V41Spec::tiny`, f32).
    pub fn v41_path(&self) -> Result<PathBuf, String> {
        self.file("tiny-v41.gguf", &|vocab, p| {
            write_v41_model(&V41Spec::tiny(), Variant::F32, vocab, p)
        })
    }

    pub fn v41(&self) -> Result<AnyModel, String> {
        let p = self.v41_path()?;
        AnyModel::open(&p).map_err(|e| format!("{}: {e}", p.display()))
    }
}

fn open_v4(path: &Path) -> Result<Arc<ModelFile>, String> {
    Ok(Arc::new(
        ModelFile::open(path).map_err(|e| format!("{}: {e}", path.display()))?,
    ))
}
