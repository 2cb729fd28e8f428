//! `ds4-quantize`: tools around ds4's GGUF files and the official
//! checkpoints (docs/TOOLS.md).
//!
//! * [`safetensors`]: an official checkpoint (DeepSeek's safetensors
//!   shards, `model.safetensors.index.json`, `config.json`) mapped and
//!   checked, one tensor viewed at a time;
//! * [`decode`]: its number formats (FP8 E4M3 with E8M0 block scales, packed
//!   FP4 E2M1 with E8M0 scales per 32, BF16/F16/F32, integer tables) to f32
//!   exactly, a range of rows at a time, and the FP4 experts repacked into
//!   MXFP4 without loss;
//! * [`layout`]: the name map: from the configuration, ds4's `deepseek4`
//!   (V4) or `deepseek41` (V4.1: one builder, V4's parts shared, plus the
//!   V4.1 compressor, indexer key, image-span bias, Engram modules and
//!   tables) tensor directory (GGUF names and shapes, and the checkpoint
//!   tensors each comes from), and every source tensor of a checkpoint
//!   checked against it (present, dtype, shape, scale) before anything is
//!   written;
//! * [`metadata`]: which family a `config.json` is; a V4 one read into
//!   ds4's own `ModelConfig` through the loader's reader and checks, with
//!   the `deepseek4` metadata; a V4.1 one as the `deepseek41` metadata (the
//!   Engram layout from the official prime search, the token map and
//!   multipliers from `engram_tables.json`) read back by the V4.1 loader;
//! * [`tokenizer`]: the checkpoint's `tokenizer.json` and
//!   `tokenizer_config.json` as the `tokenizer.*` keys of ds4's published
//!   files (tokens padded to `vocab_size`, token types, merges, BOS/EOS,
//!   chat template), checked by building ds4's own tokenizer from them;
//! * [`imatrix`]: importance matrices in llama.cpp's formats (the GGUF
//!   `general.type = imatrix` files `llama-imatrix` writes, read and
//!   written; the legacy `.dat` files, read), checked against the name map
//!   and handed to the quantizers per tensor and per expert (`--imatrix`);
//! * [`compare`]: per-tensor errors between two GGUFs of the same model
//!   (`--compare`), and a file made of one's tensors with some taken from
//!   the other (`--splice`);
//! * [`recipe`]: `--recipe FILE`, a GGUF type per tensor-name pattern over
//!   a named base mix, checked with the loader's rules before writing;
//! * [`dspark`]: DeepSeek's DSpark drafter in a V4 or V4.1 checkpoint
//!   (`mtp.{k}.*` and the `dspark_*` keys of `config.json`) as ds4's
//!   `deepseek4-dspark` / `deepseek41-dspark` file (`--dspark-only`);
//! * [`output`]: the output written under a temporary name and renamed when
//!   complete, and tensor name patterns;
//! * [`write`]: a V4 or V4.1 checkpoint converted to a `deepseek4` or
//!   `deepseek41` GGUF in one of ds4's published mixes (`--hf DIR --recipe
//!   q8|mxfp4|q2|q4|f32|FILE`), dispatched by the family of its
//!   `config.json`; V4.1's Engram tables copied row by row without loss.
//!
//! What is not here yet: docs/TOOLS.md, "Not done yet" (issue 37).

pub mod compare;
pub mod decode;
pub mod dspark;
pub mod imatrix;
pub mod layout;
pub mod metadata;
pub mod output;
pub mod recipe;
pub mod safetensors;
pub mod tokenizer;
pub mod write;

/// Every failure of the tools; each names the file and, where there is one,
/// the tensor.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error("{file}: {msg}")]
    Input { file: String, msg: String },
    #[error("{file}: tensor {tensor}: {msg}")]
    Tensor {
        file: String,
        tensor: String,
        msg: String,
    },
    #[error("{file}: {msg}")]
    Output { file: String, msg: String },
    #[error("{0}")]
    Usage(String),
    #[error("interrupted")]
    Interrupted,
}
