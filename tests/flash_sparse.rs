//! Loading and validating at real scale: files with the exact header of the
//! published Flash q2 and mxfp4 GGUFs whose data region is a hole.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ds4::model::{AttentionKind, ModelFile};
use ds4::quant::GgmlType;
use ds4::testmodel::{write_sparse_flash, write_sparse_flash_variant, Variant, Vocab};

fn rss_kib() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The sparse file `name` that `write` writes in the folder `dir` (under
/// the temporary folder), opened and validated, timed: the model, how long
/// that took, and the folder to remove.
fn write_and_open(
    dir: &str,
    name: &str,
    label: &str,
    write: impl FnOnce(&Vocab, &Path) -> std::io::Result<()>,
) -> (ModelFile, Duration, PathBuf) {
    let dir = std::env::temp_dir().join(format!("{dir}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    let vocab = Vocab::load_default().expect("committed tokenizer.json");
    write(&vocab, &path).unwrap();
    drop(vocab);

    let rss_before = rss_kib();
    let t0 = Instant::now();
    let m = ModelFile::open(&path)
        .unwrap_or_else(|e| panic!("the full-shape {label} file validates: {e}"));
    let elapsed = t0.elapsed();
    let rss_after = rss_kib();
    eprintln!(
        "sparse {label} load + validate: {:.1} ms",
        elapsed.as_secs_f64() * 1e3
    );
    // Touching the data region (80 GiB and more) would fault in zero pages
    // and grow the resident set by far more than the header (a few MiB of
    // vocabulary).
    if let (Some(a), Some(b)) = (rss_before, rss_after) {
        let grew_mib = b.saturating_sub(a) / 1024;
        assert!(
            grew_mib < 256,
            "resident memory grew by {grew_mib} MiB while loading"
        );
    }
    (m, elapsed, dir)
}

#[test]
fn sparse_flash_file_loads_and_validates_without_reading_data() {
    let (m, elapsed, dir) = write_and_open(
        "ds4-flash-sparse",
        "flash-q2-sparse.gguf",
        "Flash",
        write_sparse_flash,
    );

    // The published q2 file: 1,328 tensors, 80.76 GiB.
    assert_eq!(m.file.tensor_infos().len(), 1328);
    assert_eq!(m.weights.all().len(), 1328);
    let gib = m.file.file_len() as f64 / (1u64 << 30) as f64;
    assert!((gib - 80.76).abs() < 0.01, "file is {gib:.3} GiB");

    let c = &m.config;
    assert_eq!(
        (c.n_layer, c.n_embd, c.n_vocab, c.n_head, c.head_dim),
        (43, 4096, 129280, 64, 512)
    );
    assert_eq!(
        (c.q_lora_rank, c.o_lora_rank, c.o_groups, c.sliding_window),
        (1024, 1024, 8, 128)
    );
    assert_eq!(
        (c.indexer_heads, c.indexer_head_dim, c.indexer_top_k),
        (64, 128, 512)
    );
    assert_eq!(
        (c.n_expert, c.n_expert_used, c.expert_ff, c.n_hash_layers),
        (256, 6, 2048, 3)
    );
    let layers_of = |kind| m.weights.layers.iter().filter(|l| l.kind == kind).count();
    assert_eq!(
        (
            layers_of(AttentionKind::Csa { ratio: 4 }),
            layers_of(AttentionKind::Hca { ratio: 128 })
        ),
        (21, 20)
    );
    let l2 = &m.weights.layers[2];
    assert_eq!(l2.ffn.gate_exps.ty, GgmlType::Iq2Xxs);
    assert_eq!(l2.ffn.down_exps.ty, GgmlType::Q2K);
    assert_eq!(l2.attn.q_b.ty, GgmlType::Q8_0);
    // Expert slab sizes from GGUF.md §4.
    assert_eq!(l2.ffn.gate_exps.n_bytes / 256, 2_162_688);
    assert_eq!(l2.ffn.down_exps.n_bytes / 256, 2_752_512);

    // A generous guard against pathological behaviour, not a speed test
    // (`ds4 --info` prints the load time; docs/PERFORMANCE.md records it).
    assert!(elapsed.as_secs_f64() < 5.0);
    std::fs::remove_dir_all(&dir).ok();
}

/// ds4f-mxfp4's layout: the q2 file's tensor directory with all 129 routed
/// expert tensors in MXFP4 (docs/QUANTS.md "ds4f-mxfp4").
#[test]
fn sparse_flash_mxfp4_file_loads_and_validates_without_reading_data() {
    let (m, elapsed, dir) = write_and_open(
        "ds4-flash-sparse-mx",
        "flash-mxfp4-sparse.gguf",
        "Flash MXFP4",
        |vocab, path| write_sparse_flash_variant(vocab, Variant::Mxfp4, path),
    );

    assert_eq!(m.file.tensor_infos().len(), 1328);
    assert_eq!(m.weights.all().len(), 1328);
    // The published file is 155,976,458,848 bytes (145.27 GiB); ours differs
    // only by metadata strings (a few KiB), the tensor bytes are the same.
    let len = m.file.file_len();
    assert!(
        len.abs_diff(155_976_458_848) < 64 * 1024,
        "file is {len} bytes"
    );
    let mut experts = 0;
    for l in &m.weights.layers {
        for t in [&l.ffn.gate_exps, &l.ffn.up_exps, &l.ffn.down_exps] {
            assert_eq!(t.ty, GgmlType::Mxfp4, "{}", t.name);
            // One expert's [4096 x 2048] matrix: 2048 rows of 128 blocks of 17 bytes.
            assert_eq!(t.n_bytes / 256, 4_456_448, "{}", t.name);
            assert_eq!(t.n_bytes % 256, 0);
            experts += 1;
        }
        assert_eq!(l.attn.q_b.ty, GgmlType::Q8_0);
        assert_eq!(
            l.ffn.shared.as_ref().map(|s| s.gate.ty),
            Some(GgmlType::Q8_0)
        );
    }
    assert_eq!(experts, 129);
    assert_eq!(
        m.weights.layers[0].ffn.down_exps.row_bytes(),
        2048 / 32 * 17
    );
    let mix = m.weights.type_mix();
    assert_eq!(mix[0].ty, GgmlType::Mxfp4);
    assert_eq!(mix[0].tensors, 129);
    assert_eq!(mix[0].bytes, 129 * 256 * 4_456_448);
    assert_eq!(
        m.weights.routed_expert_types(),
        vec![([GgmlType::Mxfp4; 3], 43)]
    );
    // Active bytes per token: 6 of 256 experts' slabs plus everything dense.
    let active = m.weights.active_bytes_per_token(&m.config);
    let dense = m.weights.total_bytes() - mix[0].bytes;
    assert!(active > 129 * 6 * 4_456_448 && active < dense + 129 * 6 * 4_456_448);
    assert!(elapsed.as_secs_f64() < 1.0, "took {elapsed:?}");
    std::fs::remove_dir_all(&dir).ok();
}
