//! `ds4-make-test-model`: writes deterministic DeepSeek V4 test GGUFs with the
//! real vocabulary (see tools/README.md).

use std::path::PathBuf;
use std::process::ExitCode;

use argh::FromArgs;
use ds4::testmodel::{self, TestModelSpec, Variant, Vocab};

/// Write deterministic DeepSeek V4 test models (random weights, real vocabulary)
/// in ds4's exact GGUF layout, or the full-shape Flash file with a hole for data.
#[derive(FromArgs)]
struct Args {
    /// output file (one variant) or directory (with --variant all)
    #[argh(option, short = 'o')]
    out: PathBuf,
    /// tensor types: f32, q8, q2 (ds4's q2 mix), q4, mxfp4 (ds4f-mxfp4's mix), or all
    /// (default f32; with --sparse-flash: q2, q4 or mxfp4, default q2)
    #[argh(option, default = "String::from(\"f32\")")]
    variant: String,
    /// start from the long-context model (ratios 0,0,4,128,4,128, window 128,
    /// indexer top-k 64 with 4 heads) instead of the tiny one; other options
    /// still apply on top
    #[argh(switch)]
    long_context: bool,
    /// per-layer compression ratios, e.g. 0,0,4,16,4,16 (default: the tiny schedule)
    #[argh(option)]
    ratios: Option<String>,
    /// embedding width (multiple of 256 for the q2/q4 variants)
    #[argh(option)]
    embd: Option<usize>,
    /// sliding window
    #[argh(option)]
    window: Option<usize>,
    /// indexer top-k (rows each CSA query attends to)
    #[argh(option)]
    top_k: Option<usize>,
    /// indexer top-k (same as --top-k)
    #[argh(option)]
    indexer_top_k: Option<usize>,
    /// indexer heads
    #[argh(option)]
    indexer_heads: Option<usize>,
    /// routed experts
    #[argh(option)]
    experts: Option<usize>,
    /// multiplier on every random matrix's standard deviation
    #[argh(option)]
    init_gain: Option<f32>,
    /// RNG seed
    #[argh(option)]
    seed: Option<u64>,
    /// also write the MTP draft file next to the output (OUT with extension .mtp.gguf)
    #[argh(switch)]
    mtp: bool,
    /// also write a DSpark drafter next to the output (OUT with extension .dspark.gguf)
    #[argh(switch)]
    dspark: bool,
    /// write the full-shape Flash header (q2 unless --variant q4/mxfp4) with a hole for data instead
    #[argh(switch)]
    sparse_flash: bool,
    /// tokenizer.json with the V4 vocabulary (default: the committed copy)
    #[argh(option)]
    tokenizer_json: Option<PathBuf>,
    /// model family: deepseek4 (default) or deepseek41 (V4.1: the tiny V4.1
    /// model in f32, or with --sparse-flash the full V4.1 Flash q2 header;
    /// --window, --init-gain and --seed apply, the other shape options do not)
    #[argh(option, default = "String::from(\"deepseek4\")")]
    arch: String,
    /// with --arch deepseek41: the Flash-width bench model of
    /// `cargo bench --bench v41` over this many layers (q2 recipe, random
    /// blocks; what `ds4-bench -m` runs), instead of the tiny model
    #[argh(option)]
    flash_bench: Option<usize>,
    /// with --flash-bench: where the Engram prime search starts (default
    /// 50000: 1.2 M-row tables; the release's 16000000 gives 384 M rows)
    #[argh(option)]
    engram_vocab: Option<u64>,
}

fn run(a: Args) -> Result<(), String> {
    let vocab = match &a.tokenizer_json {
        Some(p) => Vocab::from_tokenizer_json(
            &std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()))?,
        )?,
        None => Vocab::load_default()?,
    };
    match a.arch.as_str() {
        "deepseek4" if a.flash_bench.is_some() || a.engram_vocab.is_some() => {
            return Err("--flash-bench and --engram-vocab need --arch deepseek41".into())
        }
        "deepseek4" => {}
        "deepseek41" => return run_v41(&a, &vocab),
        other => return Err(format!("--arch: unknown {other:?} (deepseek4, deepseek41)")),
    }
    if a.sparse_flash {
        let variant = match a.variant.as_str() {
            // The default (f32) has no published counterpart: q2 then.
            "f32" => Variant::Q2,
            v => Variant::parse(v).ok_or_else(|| format!("--variant: unknown {v:?}"))?,
        };
        testmodel::write_sparse_flash_variant(&vocab, variant, &a.out)
            .map_err(|e| format!("{}: {e}", a.out.display()))?;
        eprintln!(
            "wrote {} (full Flash shape, data region is a hole)",
            a.out.display()
        );
        return Ok(());
    }
    let mut spec = if a.long_context {
        TestModelSpec::long_context()
    } else {
        TestModelSpec::tiny()
    };
    if let Some(r) = &a.ratios {
        spec.core.compress_ratios = r
            .split(',')
            .map(|x| {
                x.trim()
                    .parse::<usize>()
                    .map_err(|_| format!("--ratios: bad entry {x:?}"))
            })
            .collect::<Result<_, _>>()?;
        spec.n_hash_layers = spec.n_hash_layers.min(spec.core.compress_ratios.len());
    }
    if let Some(v) = a.embd {
        spec.core.n_embd = v;
    }
    if let Some(v) = a.window {
        spec.core.sliding_window = v;
    }
    if let Some(v) = a.top_k.or(a.indexer_top_k) {
        spec.core.indexer_top_k = v;
    }
    if let Some(v) = a.indexer_heads {
        spec.core.indexer_heads = v;
    }
    if let Some(v) = a.experts {
        spec.core.n_expert = v;
    }
    if let Some(v) = a.init_gain {
        spec.core.init_gain = v;
    }
    if let Some(v) = a.seed {
        spec.core.seed = v;
    }
    let variants: Vec<Variant> = if a.variant == "all" {
        Variant::ALL.to_vec()
    } else {
        vec![Variant::parse(&a.variant).ok_or_else(|| {
            format!(
                "--variant: unknown {:?} (f32, q8, q2, q4, mxfp4, all)",
                a.variant
            )
        })?]
    };
    for v in variants {
        let path = if a.variant == "all" {
            std::fs::create_dir_all(&a.out).map_err(|e| format!("{}: {e}", a.out.display()))?;
            a.out.join(format!("tiny-{}.gguf", v.name()))
        } else {
            a.out.clone()
        };
        testmodel::write_model(&spec, v, &vocab, &path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        eprintln!("wrote {}", path.display());
        if a.mtp {
            let mtp = path.with_extension("mtp.gguf");
            testmodel::write_mtp(&spec, v, &mtp).map_err(|e| format!("{}: {e}", mtp.display()))?;
            eprintln!("wrote {}", mtp.display());
        }
        if a.dspark {
            let ds = path.with_extension("dspark.gguf");
            let d = testmodel::dspark::DsparkSpec::for_model(&spec);
            testmodel::dspark::write_dspark(&spec, &d, v, vocab.tokens.len(), &ds)
                .map_err(|e| format!("{}: {e}", ds.display()))?;
            eprintln!("wrote {}", ds.display());
        }
    }
    Ok(())
}

/// `--arch deepseek41`: the tiny V4.1 model (testmodel::v41) or the sparse
/// full-shape V4.1 Flash file.
fn run_v41(a: &Args, vocab: &Vocab) -> Result<(), String> {
    use testmodel::v41::{write_sparse_v41_flash, write_v41_bench_model, write_v41_model, V41Spec};
    if let Some(layers) = a.flash_bench {
        if layers < 2 {
            return Err("--flash-bench: at least 2 layers".into());
        }
        if a.sparse_flash || a.variant != "f32" || a.window.is_some() || a.ratios.is_some() {
            return Err("--flash-bench takes --engram-vocab and --seed only".into());
        }
        let mut spec = V41Spec::flash_bench(layers, a.engram_vocab.unwrap_or(50_000));
        if let Some(v) = a.seed {
            spec.core.seed = v;
        }
        write_v41_bench_model(&spec, vocab, &a.out)
            .map_err(|e| format!("{}: {e}", a.out.display()))?;
        eprintln!("wrote {} ({})", a.out.display(), spec.core.name);
        return Ok(());
    }
    if a.engram_vocab.is_some() {
        return Err("--engram-vocab needs --flash-bench".into());
    }
    if a.sparse_flash {
        write_sparse_v41_flash(vocab, &a.out).map_err(|e| format!("{}: {e}", a.out.display()))?;
        eprintln!(
            "wrote {} (full V4.1 Flash q2 shape, data region is a hole)",
            a.out.display()
        );
        return Ok(());
    }
    if a.variant != "f32" {
        return Err("--arch deepseek41: only --variant f32 is generated".into());
    }
    let unsupported = a.ratios.is_some()
        || a.embd.is_some()
        || a.top_k.is_some()
        || a.indexer_top_k.is_some()
        || a.indexer_heads.is_some()
        || a.experts.is_some()
        || a.long_context
        || a.mtp;
    if unsupported {
        return Err(
            "--arch deepseek41 takes --window, --init-gain, --seed and --dspark only".into(),
        );
    }
    let mut spec = V41Spec::tiny();
    if let Some(v) = a.window {
        spec.core.sliding_window = v;
    }
    if let Some(v) = a.init_gain {
        spec.core.init_gain = v;
    }
    if let Some(v) = a.seed {
        spec.core.seed = v;
    }
    write_v41_model(&spec, ds4::testmodel::Variant::F32, vocab, &a.out)
        .map_err(|e| format!("{}: {e}", a.out.display()))?;
    eprintln!("wrote {}", a.out.display());
    if a.dspark {
        let ds = a.out.with_extension("dspark.gguf");
        let d = testmodel::dspark::DsparkSpec::for_v41(&spec);
        let v = ds4::testmodel::Variant::F32;
        testmodel::dspark::write_v41_dspark(&spec, &d, v, vocab.tokens.len(), &ds)
            .map_err(|e| format!("{}: {e}", ds.display()))?;
        eprintln!("wrote {}", ds.display());
    }
    Ok(())
}

fn main() -> ExitCode {
    match run(argh::from_env()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ds4-make-test-model: {e}");
            ExitCode::FAILURE
        }
    }
}
