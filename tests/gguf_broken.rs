//! Bad input never panics: a corpus of broken GGUFs, each giving its own
//! clear error; truncation at every header byte; random byte flips; and the
//! CLI's one-line error with exit status 1.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::process::Command;

use ds4::gguf::{GgufError, GgufFile, GgufWriter, MetaArray, MetaValue};
use ds4::model::{ModelConfig, Weights};
use ds4::quant::GgmlType;
use ds4::testmodel::{write_model, TestModelSpec, Variant, Vocab};

/// A small valid model: real layout, tiny widths, a 64-token vocabulary.
fn small_model_bytes() -> Vec<u8> {
    let mut spec = TestModelSpec::tiny();
    spec.core.n_embd = 64;
    spec.core.n_head = 2;
    spec.core.head_dim = 32;
    spec.core.q_lora_rank = 32;
    spec.core.o_lora_rank = 32;
    spec.core.o_groups = 1;
    spec.core.indexer_heads = 2;
    spec.core.n_expert = 4;
    spec.core.expert_ff = 32;
    spec.core.compress_ratios = vec![0, 4, 8];
    spec.n_hash_layers = 1;
    let mut tokens: Vec<String> = (0..56).map(|i| format!("t{i}")).collect();
    tokens.extend(ds4::tokenizer::CHAT_MARKERS.iter().map(|s| s.to_string()));
    tokens.push("x".into());
    let vocab = Vocab {
        token_types: vec![1; tokens.len()],
        tokens,
        merges: vec![],
    };
    let path = std::env::temp_dir().join(format!(
        "ds4-broken-base-{}-{:?}.gguf",
        std::process::id(),
        std::thread::current().id()
    ));
    write_model(&spec, Variant::F32, &vocab, &path).unwrap();
    let b = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).ok();
    b
}

/// Parses and validates in memory, turning a panic into a test failure.
fn load(bytes: Vec<u8>) -> Result<(), String> {
    let r = catch_unwind(AssertUnwindSafe(|| -> Result<(), String> {
        let f = GgufFile::from_vec(bytes).map_err(|e| format!("gguf: {e}"))?;
        let c = ModelConfig::from_gguf(&f).map_err(|e| format!("model: {e}"))?;
        Weights::bind(&f, &c).map_err(|e| format!("model: {e}"))?;
        Ok(())
    }));
    r.unwrap_or_else(|_| panic!("the loader panicked"))
}

fn gguf_err(bytes: Vec<u8>) -> GgufError {
    match GgufFile::from_vec(bytes) {
        Err(e) => e,
        Ok(_) => panic!("expected a GGUF error"),
    }
}

/// Rewrites a valid file with changed metadata and tensors.
fn rewrite(
    base: &[u8],
    edit: impl FnOnce(&mut Vec<(String, MetaValue)>, &mut Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>),
) -> Vec<u8> {
    let f = GgufFile::from_vec(base.to_vec()).unwrap();
    let mut kvs: Vec<(String, MetaValue)> = f
        .metadata()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    let mut ts: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)> = f
        .tensor_infos()
        .iter()
        .map(|t| {
            let v = f.view(t).unwrap();
            (t.name.clone(), t.ne.clone(), v.ty, v.data.to_vec())
        })
        .collect();
    edit(&mut kvs, &mut ts);
    let mut w = GgufWriter::new();
    for (k, v) in kvs {
        w.add_kv(&k, v);
    }
    for (n, ne, ty, d) in ts {
        w.add_tensor(&n, &ne, ty, d).unwrap();
    }
    w.to_bytes().unwrap()
}

/// A raw GGUF header with hand-made records (for what the writer refuses to make).
struct Raw(Vec<u8>);

impl Raw {
    fn new(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
        let mut b = b"GGUF".to_vec();
        b.extend(version.to_le_bytes());
        b.extend(n_tensors.to_le_bytes());
        b.extend(n_kv.to_le_bytes());
        Raw(b)
    }
    fn str(mut self, s: &[u8]) -> Raw {
        self.0.extend((s.len() as u64).to_le_bytes());
        self.0.extend(s);
        self
    }
    fn u32(mut self, v: u32) -> Raw {
        self.0.extend(v.to_le_bytes());
        self
    }
    fn u64(mut self, v: u64) -> Raw {
        self.0.extend(v.to_le_bytes());
        self
    }
    fn tensor(self, name: &str, ne: &[u64], ty: u32, offset: u64) -> Raw {
        let mut r = self.str(name.as_bytes()).u32(ne.len() as u32);
        for &n in ne {
            r = r.u64(n);
        }
        r.u32(ty).u64(offset)
    }
    fn data(mut self, n: usize) -> Vec<u8> {
        let pad = self.0.len().div_ceil(32) * 32;
        self.0.resize(pad + n, 0);
        self.0
    }
}

#[test]
fn the_base_file_is_valid() {
    load(small_model_bytes()).unwrap();
}

#[test]
fn truncation_anywhere_is_an_error() {
    let base = small_model_bytes();
    let header_end = GgufFile::from_vec(base.clone()).unwrap().data_offset() as usize;
    // Every cut inside the header (covers every section boundary) ...
    for cut in 0..header_end {
        assert!(load(base[..cut].to_vec()).is_err(), "cut at {cut}");
    }
    // ... and cuts through the tensor data.
    for cut in (header_end..base.len()).step_by(97) {
        let e = load(base[..cut].to_vec()).unwrap_err();
        assert!(e.contains("past the end of the file"), "cut at {cut}: {e}");
    }
}

#[test]
fn header_level_corruption() {
    assert!(matches!(
        gguf_err(b"GGU".to_vec()),
        GgufError::TooShort { len: 3 }
    ));
    let mut b = small_model_bytes();
    b[0] = b'X';
    assert!(matches!(gguf_err(b), GgufError::BadMagic { .. }));
    for v in [1u32, 4, 0xFFFF_FFFF] {
        let mut b = small_model_bytes();
        b[4..8].copy_from_slice(&v.to_le_bytes());
        assert!(matches!(gguf_err(b), GgufError::BadVersion(x) if x == v));
    }
    let mut b = small_model_bytes();
    b[8..16].copy_from_slice(&(1u64 << 63).to_le_bytes());
    assert!(matches!(gguf_err(b), GgufError::CountTooLarge { .. }));
    let mut b = small_model_bytes();
    b[16..24].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert!(matches!(gguf_err(b), GgufError::CountTooLarge { .. }));
    // More records claimed than bytes present.
    let mut b = small_model_bytes();
    b[16..24].copy_from_slice(&100_000u64.to_le_bytes());
    assert!(matches!(gguf_err(b), GgufError::Truncated { .. }));
    // First key length absurd.
    let mut b = small_model_bytes();
    b[24..32].copy_from_slice(&(1u64 << 62).to_le_bytes());
    assert!(matches!(gguf_err(b), GgufError::StringTooLong { .. }));
}

#[test]
fn metadata_level_corruption() {
    let e = gguf_err(Raw::new(3, 0, 1).str(b"k").u32(13).data(0));
    assert!(
        matches!(e, GgufError::BadValueType { type_id: 13, .. }),
        "{e}"
    );
    let e = gguf_err(Raw::new(3, 0, 1).str(b"\xff\xfe").u32(4).u32(1).data(0));
    assert!(matches!(e, GgufError::BadUtf8 { .. }), "{e}");
    // Array of 2^40 u8 elements in a tiny file.
    let e = gguf_err(
        Raw::new(3, 0, 1)
            .str(b"a")
            .u32(9)
            .u32(0)
            .u64(1 << 40)
            .data(0),
    );
    assert!(
        matches!(
            e,
            GgufError::CountTooLarge { .. } | GgufError::Truncated { .. }
        ),
        "{e}"
    );
    // Arrays nested nine deep.
    let mut r = Raw::new(3, 0, 1).str(b"deep").u32(9);
    for _ in 0..9 {
        r = r.u32(9).u64(1);
    }
    let e = gguf_err(r.u32(4).u64(0).data(0));
    assert!(matches!(e, GgufError::NestingTooDeep { .. }), "{e}");
    // Duplicate keys.
    let e = gguf_err(
        Raw::new(3, 0, 2)
            .str(b"k")
            .u32(4)
            .u32(1)
            .str(b"k")
            .u32(4)
            .u32(2)
            .data(0),
    );
    assert!(
        matches!(e, GgufError::DuplicateKey(ref k) if k == "k"),
        "{e}"
    );
    // Bad alignment values.
    for raw in [
        Raw::new(3, 0, 1).str(b"general.alignment").u32(4).u32(0),
        Raw::new(3, 0, 1).str(b"general.alignment").u32(4).u32(3),
        Raw::new(3, 0, 1).str(b"general.alignment").u32(10).u64(32),
    ] {
        assert!(matches!(gguf_err(raw.data(0)), GgufError::BadAlignment(_)));
    }
}

#[test]
fn tensor_directory_corruption() {
    let one = |name: &str, ne: &[u64], ty: u32, off: u64, data: usize| {
        gguf_err(Raw::new(3, 1, 0).tensor(name, ne, ty, off).data(data))
    };
    assert!(matches!(
        one("t", &[], 0, 0, 0),
        GgufError::BadDims { n_dims: 0, .. }
    ));
    assert!(matches!(
        one("t", &[1; 9], 0, 0, 4),
        GgufError::BadDims { n_dims: 9, .. }
    ));
    assert!(matches!(
        one("t", &[4, 0], 0, 0, 0),
        GgufError::ZeroDim { dim: 1, .. }
    ));
    assert!(matches!(
        one("t", &[1 << 40, 1 << 40], 0, 0, 0),
        GgufError::ElementOverflow { .. }
    ));
    assert!(matches!(
        one("t", &[33], 8, 0, 64),
        GgufError::BadRowSize { ne0: 33, .. }
    ));
    assert!(matches!(
        one("t", &[8], 0, 4096, 32),
        GgufError::TensorOutOfBounds { .. }
    ));
    assert!(matches!(
        one("t", &[8], 0, u64::MAX - 8, 32),
        GgufError::TensorOutOfBounds { .. }
    ));
    let e = gguf_err(
        Raw::new(3, 2, 0)
            .tensor("a", &[8], 0, 0)
            .tensor("b", &[8], 0, 16)
            .data(64),
    );
    assert!(matches!(e, GgufError::TensorOverlap { .. }), "{e}");
    let e = gguf_err(
        Raw::new(3, 2, 0)
            .tensor("a", &[8], 0, 0)
            .tensor("a", &[8], 0, 32)
            .data(64),
    );
    assert!(
        matches!(e, GgufError::DuplicateTensor(ref n) if n == "a"),
        "{e}"
    );
    // An unknown type id is accepted in the directory; a required tensor with
    // it is refused when the model binds.
    let f = GgufFile::from_vec(Raw::new(3, 1, 0).tensor("t", &[8], 99, 0).data(32)).unwrap();
    assert!(matches!(
        f.tensor("t"),
        Err(GgufError::UnknownTensorType { type_id: 99, .. })
    ));
}

fn model_err(bytes: Vec<u8>) -> String {
    let e = load(bytes).unwrap_err();
    assert!(e.starts_with("model: "), "{e}");
    e
}

fn set(kvs: &mut [(String, MetaValue)], key: &str, v: MetaValue) {
    kvs.iter_mut()
        .find(|(k, _)| k == key)
        .unwrap_or_else(|| panic!("{key}"))
        .1 = v;
}

#[test]
fn model_level_corruption() {
    let base = small_model_bytes();
    let e = model_err(rewrite(&base, |kvs, _| {
        kvs.retain(|(k, _)| k != "deepseek4.expert_count")
    }));
    assert!(e.contains("deepseek4.expert_count: missing"), "{e}");
    let e = model_err(rewrite(&base, |kvs, _| {
        set(kvs, "deepseek4.block_count", MetaValue::String("3".into()))
    }));
    assert!(
        e.contains("deepseek4.block_count") && e.contains("expected"),
        "{e}"
    );
    let cases: Vec<(&str, MetaValue, &str)> = vec![
        (
            "deepseek4.attention.head_count_kv",
            MetaValue::U32(2),
            "head_count_kv",
        ),
        (
            "deepseek4.attention.value_length",
            MetaValue::U32(16),
            "value_length",
        ),
        (
            "deepseek4.attention.compress_ratios",
            MetaValue::Array(MetaArray::I32(vec![0, 4])),
            "at least 3 entries",
        ),
        (
            "deepseek4.attention.compress_ratios",
            MetaValue::Array(MetaArray::I32(vec![0, -4, 8])),
            "compress_ratios",
        ),
        (
            "deepseek4.attention.compress_ratios",
            MetaValue::Array(MetaArray::I32(vec![0, 1, 8])),
            "compress_ratios",
        ),
        (
            "deepseek4.swiglu_clamp_exp",
            MetaValue::Array(MetaArray::F32(vec![10.0])),
            "swiglu_clamp_exp",
        ),
        (
            "deepseek4.expert_used_count",
            MetaValue::U32(9),
            "expert_used_count",
        ),
        (
            "deepseek4.hash_layer_count",
            MetaValue::U32(7),
            "hash_layer_count",
        ),
        (
            "deepseek4.attention.layer_norm_rms_epsilon",
            MetaValue::F32(f32::NAN),
            "layer_norm_rms_epsilon",
        ),
        (
            "general.architecture",
            MetaValue::String("llama".into()),
            "not a DeepSeek V4 model",
        ),
        // Sizes whose products would overflow 64 bits (found by a fuzzing helper).
        (
            "deepseek4.embedding_length",
            MetaValue::U64(1 << 40),
            "below 2^32",
        ),
        (
            "deepseek4.hyper_connection.count",
            MetaValue::U64(1 << 40),
            "below 2^32",
        ),
    ];
    for (key, v, want) in cases {
        let e = model_err(rewrite(&base, |kvs, _| set(kvs, key, v)));
        assert!(e.contains(want), "{key}: {e}");
    }
    let e = model_err(rewrite(&base, |_, ts| {
        ts.retain(|t| t.0 != "blk.1.attn_kv.weight")
    }));
    assert!(e.contains("tensor blk.1.attn_kv.weight: missing"), "{e}");
    let e = model_err(rewrite(&base, |_, ts| {
        let t = ts
            .iter_mut()
            .find(|t| t.0 == "blk.0.attn_q_a.weight")
            .unwrap();
        t.1 = vec![t.1[0], t.1[1] / 2];
        t.3.truncate(t.3.len() / 2);
    }));
    assert!(
        e.contains("blk.0.attn_q_a.weight: expected shape [64, 32], found [64, 16]"),
        "{e}"
    );
    // A norm stored as Q8_0; a matrix stored as I32.
    let e = model_err(rewrite(&base, |_, ts| {
        let t = ts
            .iter_mut()
            .find(|t| t.0 == "blk.0.attn_norm.weight")
            .unwrap();
        t.2 = GgmlType::Q8_0;
        t.3 = vec![0; 2 * 34];
    }));
    assert!(
        e.contains("blk.0.attn_norm.weight: type Q8_0 not accepted here (accepted: F32/F16)"),
        "{e}"
    );
    let e = model_err(rewrite(&base, |_, ts| {
        let t = ts.iter_mut().find(|t| t.0 == "output.weight").unwrap();
        t.2 = GgmlType::I32;
    }));
    assert!(e.contains("output.weight: type I32"), "{e}");
    // Compressor tensors on a window-only layer.
    let e = model_err(rewrite(&base, |kvs, _| {
        set(
            kvs,
            "deepseek4.attention.compress_ratios",
            MetaValue::Array(MetaArray::I32(vec![0, 0, 8])),
        )
    }));
    assert!(e.contains("compress_ratios[1] is 0"), "{e}");
    // An MTP-only file passed as the main model.
    let e = model_err(rewrite(&base, |_, ts| {
        ts.retain(|t| !t.0.starts_with("blk."));
        ts.push((
            "mtp.0.attn_norm.weight".into(),
            vec![64],
            GgmlType::F32,
            vec![0; 256],
        ));
    }));
    assert!(e.contains("MTP draft file"), "{e}");
}

#[test]
fn random_byte_flips_never_panic() {
    let base = small_model_bytes();
    let header_end = GgufFile::from_vec(base.clone()).unwrap().data_offset() as usize;
    let mut x: u64 = 0x5EED;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let (mut ok, mut err) = (0, 0);
    for _ in 0..3000 {
        let mut b = base.clone();
        for _ in 0..1 + next() % 4 {
            let i = (next() % header_end as u64) as usize;
            b[i] = next() as u8;
        }
        match load(b) {
            Ok(()) => ok += 1,
            Err(_) => err += 1,
        }
    }
    eprintln!("3000 mutated headers: {ok} still valid, {err} rejected, 0 panics");
}

#[test]
fn cli_reports_one_line_and_exits_1() {
    let base = small_model_bytes();
    let dir = std::env::temp_dir().join(format!("ds4-broken-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut files: Vec<(String, Vec<u8>)> = vec![
        ("empty".into(), vec![]),
        ("magic".into(), b"NOPE0000000000000000000000000000".to_vec()),
        ("version".into(), {
            let mut b = base.clone();
            b[4] = 9;
            b
        }),
        ("truncated-header".into(), base[..200].to_vec()),
        ("truncated-data".into(), base[..base.len() - 100].to_vec()),
        ("huge-count".into(), {
            let mut b = base.clone();
            b[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
            b
        }),
        (
            "overlap".into(),
            Raw::new(3, 2, 0)
                .tensor("a", &[8], 0, 0)
                .tensor("b", &[8], 0, 16)
                .data(64),
        ),
        (
            "missing-key".into(),
            rewrite(&base, |kvs, _| {
                kvs.retain(|(k, _)| k != "deepseek4.block_count")
            }),
        ),
        (
            "missing-tensor".into(),
            rewrite(&base, |_, ts| ts.retain(|t| t.0 != "output.weight")),
        ),
        (
            "wrong-arch".into(),
            rewrite(&base, |kvs, _| {
                set(
                    kvs,
                    "general.architecture",
                    MetaValue::String("qwen".into()),
                )
            }),
        ),
    ];
    files.push(("directory".into(), vec![]));
    for (name, bytes) in &files {
        let path = dir.join(format!("{name}.gguf"));
        if name == "directory" {
            std::fs::create_dir_all(&path).unwrap();
        } else {
            std::fs::write(&path, bytes).unwrap();
        }
        let o = Command::new(env!("CARGO_BIN_EXE_ds4"))
            .args(["-m", path.to_str().unwrap(), "--info"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{name}: {err}");
        assert_eq!(err.lines().count(), 1, "{name}: {err}");
        assert!(
            err.starts_with("ds4: ") && !err.contains("panicked"),
            "{name}: {err}"
        );
        eprintln!("{name:>16}: {}", err.trim_end());
    }
    let o = Command::new(env!("CARGO_BIN_EXE_ds4"))
        .args(["-m", "/nonexistent.gguf", "--info"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn hash_table_entries_outside_the_experts_are_refused() {
    use std::sync::Arc;
    let base = small_model_bytes();
    let bad = rewrite(&base, |_, ts| {
        let t = ts
            .iter_mut()
            .find(|t| t.0 == "blk.0.ffn_gate_tid2eid.weight")
            .unwrap();
        t.3[8..12].copy_from_slice(&99i32.to_le_bytes());
    });
    let path = std::env::temp_dir().join(format!("ds4-bad-tid2eid-{}.gguf", std::process::id()));
    std::fs::write(&path, &bad).unwrap();
    // Loading reads no data, so it succeeds; the session refuses the table.
    let m = Arc::new(ds4::ModelFile::open(&path).unwrap());
    let e = match ds4::Session::new(m, ds4::SessionOptions::default()) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a table naming expert 99 of 4 must be refused"),
    };
    assert!(
        e.contains("blk.0.ffn_gate_tid2eid.weight") && e.contains("expert 99"),
        "{e}"
    );
    std::fs::remove_file(&path).ok();
}

/// MXFP4 (type 39, 32 values in 17 bytes): the routed experts of ds4f-mxfp4
/// load; a row length that is not whole blocks, data that does not fit its
/// shape, and MXFP4 on a tensor ds4's files never store that way are clear
/// errors naming the tensor.
#[test]
fn mxfp4_tensors() {
    let mx = GgmlType::Mxfp4.id();
    let e = gguf_err(
        Raw::new(3, 1, 0)
            .tensor("blk.0.ffn_down_exps.weight", &[48, 2], mx, 0)
            .data(64),
    );
    assert!(
        matches!(
            e,
            GgufError::BadRowSize {
                ne0: 48,
                block: 32,
                ..
            }
        ),
        "{e}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("blk.0.ffn_down_exps.weight") && msg.contains("MXFP4"),
        "{msg}"
    );
    // [64, 2] is 4 blocks = 68 bytes; the file holds 64.
    let e = gguf_err(
        Raw::new(3, 1, 0)
            .tensor("blk.0.ffn_up_exps.weight", &[64, 2], mx, 0)
            .data(64),
    );
    assert!(
        matches!(e, GgufError::TensorOutOfBounds { ref name, end, file_len }
            if name == "blk.0.ffn_up_exps.weight" && end == file_len + 4),
        "{e}"
    );
    // A 34-byte MXFP4 row and a tensor placed 32 bytes after it: the MXFP4
    // data runs into its neighbour.
    let e = gguf_err(
        Raw::new(3, 2, 0)
            .tensor("a", &[64], mx, 0)
            .tensor("b", &[8], 0, 32)
            .data(96),
    );
    assert!(matches!(e, GgufError::TensorOverlap { .. }), "{e}");

    // Routed experts as MXFP4 load (the base model has ne0 = 64 and 32).
    let base = small_model_bytes();
    let to_mxfp4 = |t: &mut (String, Vec<u64>, GgmlType, Vec<u8>)| {
        let vals: Vec<f32> =
            t.3.chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
        t.2 = GgmlType::Mxfp4;
        t.3 = ds4::testmodel::encode_tensor(GgmlType::Mxfp4, t.1[0] as usize, &vals).unwrap();
    };
    let experts = rewrite(&base, |_, ts| {
        for t in ts.iter_mut().filter(|t| t.0.contains("_exps.")) {
            to_mxfp4(t);
        }
    });
    load(experts).unwrap();
    // MXFP4 where ds4's files never put it: a dense projection, the head, a
    // shared expert, a norm.
    for (name, want) in [
        (
            "blk.0.attn_q_a.weight",
            "blk.0.attn_q_a.weight: type MXFP4 not accepted here (accepted: F32/F16/BF16/Q8_0)",
        ),
        ("output.weight", "output.weight: type MXFP4 not accepted"),
        (
            "blk.1.ffn_gate_shexp.weight",
            "blk.1.ffn_gate_shexp.weight: type MXFP4 not accepted",
        ),
        (
            "blk.2.attn_norm.weight",
            "blk.2.attn_norm.weight: type MXFP4 not accepted here (accepted: F32/F16)",
        ),
    ] {
        let e = model_err(rewrite(&base, |_, ts| {
            to_mxfp4(ts.iter_mut().find(|t| t.0 == name).unwrap())
        }));
        assert!(e.contains(want), "{name}: {e}");
    }
}
