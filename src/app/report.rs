//! The configuration report of `ds4 --info`: file, metadata, the derived
//! model configuration and the tensor table (an MTP draft file gets its
//! tensor table only).

use std::path::Path;
use std::time::Instant;

use crate::model::ModelFile;

/// Bytes as KiB/MiB/GiB with two decimals.
pub fn human(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", b / (1u64 << 30) as f64)
    } else if b >= (1u64 << 20) as f64 {
        format!("{:.2} MiB", b / (1u64 << 20) as f64)
    } else {
        format!("{:.1} KiB", b / 1024.0)
    }
}

/// What `--list-devices` prints (`ds4`, `ds4-bench`): every wgpu adapter
/// with its index, then the CUDA devices or why there are none.
pub fn devices() -> String {
    let mut s = crate::backend::wgpu::gpu::devices_report();
    match crate::backend::cuda_device_lines() {
        Ok(lines) => lines.iter().for_each(|l| s.push_str(&format!("{l}\n"))),
        Err(e) => s.push_str(&format!("cuda: none ({e})\n")),
    }
    s
}

/// The V4.1 Engram reader's end-of-run line: bytes read per token and
/// the hot-row hit rate.
pub fn engram_line(st: &crate::model::v41::engram_reader::EngramStats) -> String {
    format!(
        "engram: {:.0} bytes read per token, hot-row hit rate {:.1} % ({} row lookups over {} tokens, {} read)",
        st.bytes_per_token(),
        100.0 * st.hit_rate(),
        st.rows_requested,
        st.tokens,
        human(st.bytes_read)
    )
}

/// Name, type, shape and bytes of every tensor in the directory.
fn print_tensor_table(f: &crate::gguf::GgufFile) {
    println!(
        "{:<44} {:<8} {:<24} {:>14}",
        "name", "type", "shape", "bytes"
    );
    for t in f.tensor_infos() {
        let ty =
            t.ty.map_or_else(|| format!("?{}", t.type_id), |t| t.name().to_string());
        println!(
            "{:<44} {:<8} {:<24} {:>14}",
            t.name,
            ty,
            format!("{:?}", t.ne),
            t.n_bytes
        );
    }
}

/// The tensor table, the bound-tensor type mix, the routed experts' types
/// and the total weight bytes: the part of the info page V4 and V4.1 share.
fn print_weights(
    f: &crate::gguf::GgufFile,
    n_bound: usize,
    mix_note: &str,
    mix: &[crate::model::weights::TypeShare],
    routed: &[([crate::quant::GgmlType; 3], usize)],
    total: u64,
) {
    println!("\n== tensors ==");
    print_tensor_table(f);
    println!(
        "\ntensors: {} in file, {n_bound} bound",
        f.tensor_infos().len()
    );
    println!("\n== type mix (bound tensors{mix_note}) ==");
    for share in mix {
        println!(
            "{:<8} {:>5} tensors {:>16} bytes ({:>10}, {:5.1} %)",
            share.ty.name(),
            share.tensors,
            share.bytes,
            human(share.bytes),
            100.0 * share.bytes as f64 / total.max(1) as f64
        );
    }
    for ([g, u, d], n) in routed {
        println!("routed experts: gate {g}, up {u}, down {d} ({n} layers)");
    }
    println!("total weight bytes:            {total} ({})", human(total));
}

/// `--info` on an MTP draft file: its tensor directory (its shapes are
/// validated against a main model when both are loaded).
fn info_mtp(path: &Path) -> Result<(), String> {
    let f = crate::gguf::GgufFile::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    println!(
        "file: {} ({}, GGUF v{}) — MTP draft model (speculative decoding; not used by this version yet)",
        path.display(),
        human(f.file_len()),
        f.version()
    );
    print_tensor_table(&f);
    Ok(())
}

/// The info page's first lines: the file, how long loading took, and every
/// metadata key.
fn print_file(
    file: &crate::gguf::GgufFile,
    path: &Path,
    family: &str,
    load: std::time::Duration,
    nothing_read: &str,
) {
    println!(
        "file: {} ({}, GGUF v{}, alignment {}){family}",
        path.display(),
        human(file.file_len()),
        file.version(),
        file.alignment()
    );
    println!(
        "loaded and validated in {:.1} ms (no tensor data read{nothing_read})",
        load.as_secs_f64() * 1e3
    );
    println!("\n== metadata ==");
    for (k, v) in file.metadata() {
        println!("{k:<48} {}", v.summary());
    }
}

/// The configuration both families have, with the family's own lines for
/// its layers (after the window) and its index (after the indexer), and
/// the end of the experts line.
fn print_core(
    c: &crate::model::config::CoreConfig,
    layers: &[String],
    index: &[String],
    experts: &str,
) {
    println!("\n== configuration ==");
    println!("name                 {}", c.name);
    println!("layers               {}", c.n_layer);
    println!("embedding            {}", c.n_embd);
    println!("vocab                {}", c.n_vocab);
    println!(
        "heads                {} × {} (kv heads {}, rotary dims {})",
        c.n_head, c.head_dim, c.n_head_kv, c.n_rot
    );
    println!("q low rank           {}", c.q_lora_rank);
    println!(
        "output groups        {} × rank {}",
        c.o_groups, c.o_lora_rank
    );
    println!("sliding window       {}", c.sliding_window);
    for l in layers {
        println!("{l}");
    }
    println!(
        "indexer              {} heads × {}, top-k {}",
        c.indexer_heads, c.indexer_head_dim, c.indexer_top_k
    );
    for l in index {
        println!("{l}");
    }
    println!(
        "hyper-connections    {} streams, {} Sinkhorn iterations, eps {:e}",
        c.hc_count, c.hc_sinkhorn_iters, c.hc_eps
    );
    println!("rms eps              {:e}", c.rms_eps);
    println!(
        "rope                 base {} (window layers), {} (compressed layers)",
        c.rope_base, c.compress_rope_base
    );
    match c.yarn {
        Some(y) => println!(
            "yarn                 factor {}, original context {}, beta fast {} slow {}",
            y.factor, y.original_context, y.beta_fast, y.beta_slow
        ),
        None => println!("yarn                 off"),
    }
    println!(
        "experts              {} routed, {} used, ff {}, {experts}",
        c.n_expert, c.n_expert_used, c.expert_ff
    );
    println!(
        "routing              weights scale {}, normalised {}",
        c.expert_weights_scale, c.expert_weights_norm
    );
}

/// `--info`: the file, its configuration and weights; with a backend, also
/// the decode roofline of the device that backend would use.
pub fn info(
    path: &Path,
    roofline_for: Option<(crate::backend::BackendKind, &crate::backend::BackendOptions)>,
) -> Result<(), String> {
    let t0 = Instant::now();
    if crate::gguf::GgufFile::open(path)
        .ok()
        .and_then(|f| crate::model::Arch::of(&f).ok())
        == Some(crate::model::Arch::V41)
    {
        return info_v41(path, roofline_for);
    }
    let m = match ModelFile::open(path) {
        Ok(m) => m,
        Err(crate::model::ModelError::WrongKind(_))
            if crate::gguf::GgufFile::open(path)
                .is_ok_and(|f| f.tensor_info("mtp.0.attn_norm.weight").is_some()) =>
        {
            return info_mtp(path)
        }
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let load = t0.elapsed();
    let c = &m.config;
    print_file(&m.file, path, "", load, "");
    let kinds: Vec<String> = m
        .weights
        .layers
        .iter()
        .map(|l| match l.kind {
            crate::model::AttentionKind::Window => "W".to_string(),
            crate::model::AttentionKind::Csa { ratio } => format!("C{ratio}"),
            crate::model::AttentionKind::Hca { ratio } => format!("H{ratio}"),
        })
        .collect();
    let layers = [format!(
        "layer kinds          {} (W window, C csa, H hca; number = ratio)",
        kinds.join(" ")
    )];
    let experts = format!(
        "{} shared, {} hash layers",
        c.n_expert_shared, c.n_hash_layers
    );
    print_core(c, &layers, &[], &experts);
    println!(
        "swiglu clamp         {:?}",
        &c.swiglu_clamp[..c.swiglu_clamp.len().min(8)]
    );
    if let Some(ctx) = c.context_length {
        println!("trained context      {ctx}");
    }
    let total = m.weights.total_bytes();
    let active = m.weights.active_bytes_per_token(c);
    print_weights(
        &m.file,
        m.weights.all().len(),
        "",
        &m.weights.type_mix(),
        &m.weights.routed_expert_types(),
        total,
    );
    println!(
        "active weight bytes per token: {active} ({})",
        human(active)
    );
    if let Some((kind, opts)) = roofline_for {
        decode_roofline(kind, opts, active);
    }
    Ok(())
}

/// A V4.1 layer's role in a word: `W` window, `S2` kv/index source of ratio
/// 2, `R2<20` reindexing over source 20's keys, `U2<20/24` reusing source
/// 20's rows and index source 24's top-k.
pub fn v41_role(r: crate::model::v41::LayerRole) -> String {
    use crate::model::v41::LayerRole;
    match r {
        LayerRole::Window => "W".into(),
        LayerRole::Source { ratio } => format!("S{ratio}"),
        LayerRole::Reindex { ratio, kv_source } => format!("R{ratio}<{kv_source}"),
        LayerRole::Reuse {
            ratio,
            kv_source,
            index_source,
        } => format!("U{ratio}<{kv_source}/{index_source}"),
    }
}

/// Engram bytes a token reads from the file when no row is cached: one
/// row per hash column per Engram layer.
pub fn v41_engram_cold_bytes(c: &crate::model::v41::V41Config) -> u64 {
    let eg = &c.engram;
    (eg.cols() * eg.row_bytes() * eg.layer_ids.len()) as u64
}

/// `--info` on a DeepSeek V4.1 file: shape, layer roles, the Engram tables
/// (which stay on disk), the type mix, what is resident and the decode
/// roofline.
fn info_v41(
    path: &Path,
    roofline_for: Option<(crate::backend::BackendKind, &crate::backend::BackendOptions)>,
) -> Result<(), String> {
    let t0 = Instant::now();
    let m = crate::model::v41::V41ModelFile::open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let load = t0.elapsed();
    let c = &m.config;
    print_file(
        &m.file,
        path,
        " — DeepSeek V4.1 (general.architecture deepseek41)",
        load,
        ", the Engram tables included",
    );
    let roles: Vec<String> = c.roles.iter().map(|&r| v41_role(r)).collect();
    let count =
        |f: fn(&crate::model::v41::LayerRole) -> bool| c.roles.iter().filter(|r| f(r)).count();
    let layers = [
        format!(
            "layer roles          {} (W window, S kv/index source, R reindex < kv source, U reuse < kv/index source; number = ratio)",
            roles.join(" ")
        ),
        format!(
            "                     {} window, {} source, {} reindex, {} reuse; kv sources {:?}, index sources {:?}",
            count(|r| matches!(r, crate::model::v41::LayerRole::Window)),
            count(|r| matches!(r, crate::model::v41::LayerRole::Source { .. })),
            count(|r| matches!(r, crate::model::v41::LayerRole::Reindex { .. })),
            count(|r| matches!(r, crate::model::v41::LayerRole::Reuse { .. })),
            c.kv_source_layers,
            c.index_source_layers
        ),
    ];
    let candidates = [match c.candidate_source {
        Some(l) => format!(
            "candidate blocks     from layer {l}: top {} blocks of {}",
            c.candidate_topk_blocks, c.candidate_block_size
        ),
        None => "candidate blocks     none".into(),
    }];
    print_core(
        c,
        &layers,
        &candidates,
        &format!("{} shared", c.n_expert_shared),
    );
    println!("swiglu limit         {}", c.swiglu_clamp[0]);
    if let Some(ctx) = c.context_length {
        println!("trained context      {ctx}");
    }
    let cold = print_v41_engram(&m);
    print_v41_weights(&m, cold, roofline_for);
    Ok(())
}

/// The Engram section of the V4.1 info page: layers, rows, tables and
/// what a token reads; returns the bytes a token reads when no row is
/// cached.
fn print_v41_engram(m: &crate::model::v41::V41ModelFile) -> u64 {
    let (c, w) = (&m.config, &m.weights);
    let eg = &c.engram;
    println!("\n== engram (tables stay on disk; rows read per step, behind a hot-row cache) ==");
    println!(
        "layers               {:?}; n-grams 2..={}, {} heads: {} hash columns per token and layer",
        eg.layer_ids,
        eg.max_ngram,
        eg.n_heads,
        eg.cols()
    );
    println!(
        "rows                 {} E4M3 codes and {} E8M0 scale bytes = {} bytes each",
        eg.head_dim,
        eg.head_dim / 32,
        eg.row_bytes()
    );
    println!(
        "compressed vocab     {} ids (pad {})",
        eg.compressed_vocab, eg.pad_id
    );
    for &l in &eg.layer_ids {
        if let Some(e) = w.layers.get(l).and_then(|x| x.engram.as_ref()) {
            println!(
                "table blk.{l:<3}        {} rows, {} bytes ({}) at file offset {}",
                e.table.ne[1],
                e.table.n_bytes,
                human(e.table.n_bytes),
                e.table.offset
            );
        }
    }
    let tables = w.engram_table_bytes();
    let cold = v41_engram_cold_bytes(c);
    println!(
        "tables total         {tables} bytes ({}, {:.1} % of the file), never mapped or uploaded",
        human(tables),
        100.0 * tables as f64 / m.file.file_len().max(1) as f64
    );
    println!(
        "read per token       at most {cold} bytes ({} columns × {} bytes × {} layers; cached rows are not read again)",
        eg.cols(),
        eg.row_bytes(),
        eg.layer_ids.len()
    );
    cold
}

/// The V4.1 weights: tensor table and type mix, what is resident and what
/// a token reads (`cold`: its Engram bytes at most), and the roofline.
fn print_v41_weights(
    m: &crate::model::v41::V41ModelFile,
    cold: u64,
    roofline_for: Option<(crate::backend::BackendKind, &crate::backend::BackendOptions)>,
) {
    let (c, w) = (&m.config, &m.weights);
    let total: u64 = w.all().iter().map(|t| t.n_bytes).sum();
    print_weights(
        &m.file,
        w.all().len(),
        "; the Engram tables are the I8",
        &w.type_mix(),
        &w.routed_expert_types(),
        total,
    );
    let resident = w.resident_bytes();
    let active = w.active_bytes_per_token(c);
    println!(
        "resident weight bytes:         {resident} ({}; all but the Engram tables)",
        human(resident)
    );
    println!(
        "active weight bytes per token: {active} ({}) + Engram rows from disk (at most {cold} bytes)",
        human(active)
    );
    if let Some((kind, opts)) = roofline_for {
        // The Engram rows come from the file (or the page cache), not
        // device memory: the ceiling counts the weights only.
        decode_roofline(kind, opts, active);
    }
}

/// (device, read bytes/s) of the CUDA device (backend/cuda/bandwidth.rs).
#[cfg(feature = "cuda")]
fn cuda_read(opts: &crate::backend::BackendOptions, bytes: u64) -> Result<(String, f64), String> {
    use crate::backend::cuda::bandwidth::Bench;
    let b = Bench::open(opts).map_err(|e| format!("cuda: {e}"))?;
    let m = b.device_read(bytes, 3).map_err(|e| format!("cuda: {e}"))?;
    Ok((b.describe(), m.bytes as f64 / m.seconds))
}

#[cfg(not(feature = "cuda"))]
fn cuda_read(_opts: &crate::backend::BackendOptions, _bytes: u64) -> Result<(String, f64), String> {
    Err("cuda: this binary was built without CUDA support (cargo build --features cuda)".into())
}

/// The read bandwidth of the device `kind` would run on, measured:
/// (device, bytes/s). Host memory for the CPU backends (and for `auto`
/// without a real GPU); the reason when the device cannot be measured.
pub fn read_bandwidth_for(
    kind: crate::backend::BackendKind,
    opts: &crate::backend::BackendOptions,
) -> Result<(String, f64), String> {
    use crate::backend::wgpu::{bandwidth, gpu, Gpu};
    use crate::backend::BackendKind;
    const PROBE: u64 = 256 << 20;
    let host = || {
        let m = bandwidth::host_read(PROBE, 3);
        (
            "host memory (cpu backends)".to_string(),
            m.bytes as f64 / m.seconds,
        )
    };
    match kind {
        BackendKind::Cpu | BackendKind::CpuRef => Ok(host()),
        BackendKind::Cuda => cuda_read(opts, PROBE),
        BackendKind::Wgpu | BackendKind::Auto => {
            // An explicit wgpu choice may measure a CPU emulator; auto only a real GPU.
            match Gpu::open(opts, kind == BackendKind::Wgpu) {
                Ok(g) => match bandwidth::device_read(&g, PROBE, 3) {
                    Ok(m) => Ok((gpu::describe(&g.info), m.bytes as f64 / m.seconds)),
                    Err(e) => Err(format!("wgpu: {e}")),
                },
                Err(_) if kind == BackendKind::Auto => Ok(host()),
                Err(e) => Err(format!("wgpu: {e}")),
            }
        }
    }
}

/// The decode ceiling on the device `kind` would run on: measured read
/// bandwidth ÷ active weight bytes per token (KV reads add to it at long
/// context). A device that cannot be measured is named with the reason.
pub fn decode_roofline(
    kind: crate::backend::BackendKind,
    opts: &crate::backend::BackendOptions,
    active: u64,
) {
    println!("\n== decode roofline ==");
    match read_bandwidth_for(kind, opts) {
        Ok((device, bw)) => {
            println!("device                        {device}");
            println!("read bandwidth (measured)     {:.2} GB/s", bw / 1e9);
            println!(
                "decode ceiling                {:.2} tokens/s (active weight bytes / bandwidth; KV reads add to it at long context)",
                bw / active.max(1) as f64
            );
        }
        Err(why) => println!("not measured: {why}"),
    }
}
