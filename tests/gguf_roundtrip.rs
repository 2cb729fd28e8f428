//! The writer and the reader agree on every metadata type and on tensor layout.

use ds4::gguf::{GgufFile, GgufWriter, MetaArray, MetaValue};
use ds4::model::{ModelConfig, ModelFile};
use ds4::quant::GgmlType;
use ds4::testmodel::{write_model, TestModelSpec, Variant, Vocab};

#[test]
fn every_value_type_round_trips() {
    let values = vec![
        ("a.u8", MetaValue::U8(200)),
        ("a.i8", MetaValue::I8(-5)),
        ("a.u16", MetaValue::U16(60000)),
        ("a.i16", MetaValue::I16(-30000)),
        ("a.u32", MetaValue::U32(4_000_000_000)),
        ("a.i32", MetaValue::I32(-2_000_000_000)),
        ("a.f32", MetaValue::F32(1.5e-7)),
        ("a.bool", MetaValue::Bool(true)),
        ("a.str", MetaValue::String("héllo ｜DSML｜".into())),
        ("a.u64", MetaValue::U64(u64::MAX)),
        ("a.i64", MetaValue::I64(i64::MIN)),
        ("a.f64", MetaValue::F64(-2.25)),
        (
            "a.arr_i32",
            MetaValue::Array(MetaArray::I32(vec![0, 0, 4, 128])),
        ),
        (
            "a.arr_str",
            MetaValue::Array(MetaArray::String(vec!["x".into(), "".into(), "Ġy".into()])),
        ),
        (
            "a.nested",
            MetaValue::Array(MetaArray::Array(vec![
                MetaArray::F32(vec![1.0]),
                MetaArray::Bool(vec![false, true]),
            ])),
        ),
    ];
    let mut w = GgufWriter::new();
    for (k, v) in &values {
        w.add_kv(k, v.clone());
    }
    let t0: Vec<u8> = (0..34 * 3).map(|i| i as u8).collect();
    w.add_tensor("t.q8", &[32, 3], GgmlType::Q8_0, t0.clone())
        .unwrap();
    let t1: Vec<u8> = (0..4 * 5).map(|i| (i * 7) as u8).collect();
    w.add_tensor("t.f32", &[5], GgmlType::F32, t1.clone())
        .unwrap();
    let f = GgufFile::from_vec(w.to_bytes().unwrap()).unwrap();
    for (k, v) in &values {
        assert_eq!(f.get(k), Some(v), "{k}");
    }
    assert_eq!(f.metadata().count(), values.len());
    let q = f.tensor("t.q8").unwrap().unwrap();
    assert_eq!(
        (q.ty, q.dims(), q.data),
        (GgmlType::Q8_0, &[32u64, 3][..], &t0[..])
    );
    assert_eq!(q.row(2).unwrap(), &t0[68..102]);
    assert!(q.row(3).is_none());
    let t = f.tensor("t.f32").unwrap().unwrap();
    assert_eq!(t.data, &t1[..]);
    assert_eq!(f.data_offset() % 32, 0);
    assert!(f.tensor("missing").unwrap().is_none());
}

#[test]
fn alignment_key_is_honoured() {
    let mut w = GgufWriter::new();
    w.add_u32("general.alignment", 256);
    w.add_tensor("a", &[3], GgmlType::F32, vec![1; 12]).unwrap();
    w.add_tensor("b", &[3], GgmlType::F32, vec![2; 12]).unwrap();
    let f = GgufFile::from_vec(w.to_bytes().unwrap()).unwrap();
    assert_eq!(f.alignment(), 256);
    assert_eq!(f.data_offset() % 256, 0);
    assert_eq!(f.tensor_info("b").unwrap().offset, 256);
    assert_eq!(f.tensor("b").unwrap().unwrap().data, &[2u8; 12][..]);
}

#[test]
fn tiny_model_config_comes_from_metadata() {
    let dir = std::env::temp_dir().join(format!("ds4-roundtrip-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tiny.gguf");
    let mut spec = TestModelSpec::tiny();
    // A shape unlike Flash in every dimension the config reads.
    spec.core.compress_ratios = vec![0, 8, 32, 8];
    spec.csa_ratio = 8;
    spec.n_hash_layers = 1;
    spec.core.n_head = 2;
    spec.core.o_groups = 1;
    spec.core.sliding_window = 7;
    spec.core.indexer_top_k = 5;
    spec.core.n_expert = 5;
    spec.core.n_expert_used = 3;
    write_model(&spec, Variant::F32, &Vocab::load_default().unwrap(), &path).unwrap();
    let m = ModelFile::open(&path).unwrap();
    let c: &ModelConfig = &m.config;
    assert_eq!(c.n_layer, 4);
    assert_eq!(c.compress_ratios, vec![0, 8, 32, 8]);
    assert_eq!(
        (c.n_head, c.o_groups, c.sliding_window, c.indexer_top_k),
        (2, 1, 7, 5)
    );
    assert_eq!((c.n_expert, c.n_expert_used, c.n_hash_layers), (5, 3, 1));
    use ds4::model::AttentionKind::*;
    let kinds: Vec<_> = m.weights.layers.iter().map(|l| l.kind).collect();
    assert_eq!(
        kinds,
        vec![
            Window,
            Csa { ratio: 8 },
            Hca { ratio: 32 },
            Csa { ratio: 8 }
        ]
    );
    assert!(m.weights.layers[0].ffn.tid2eid.is_some() && m.weights.layers[1].ffn.tid2eid.is_none());
    assert!(m.weights.layers[1].ffn.bias.is_some());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn mtp_file_is_recognised_and_binds_against_the_main_config() {
    use ds4::gguf::GgufFile;
    use ds4::model::{ModelError, MtpWeights};
    use ds4::testmodel::write_mtp;
    let dir = std::env::temp_dir().join(format!("ds4-mtp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (main, mtp) = (dir.join("main.gguf"), dir.join("main.mtp.gguf"));
    let spec = TestModelSpec::tiny();
    write_model(&spec, Variant::F32, &Vocab::load_default().unwrap(), &main).unwrap();
    write_mtp(&spec, Variant::F32, &mtp).unwrap();
    let m = ModelFile::open(&main).unwrap();
    let f = GgufFile::open(&mtp).unwrap();
    let w = MtpWeights::bind(&f, &m.config, 0).unwrap();
    assert!(
        w.block.ffn.bias.is_some() && w.block.ffn.tid2eid.is_none() && w.block.compressor.is_none()
    );
    // Passed as a main model, it is named for what it is.
    match ModelFile::open(&mtp) {
        Err(ModelError::WrongKind(msg)) => assert!(msg.contains("MTP draft file"), "{msg}"),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("an MTP file must not load as a main model"),
    }
    // And the main model is not an MTP file.
    assert!(matches!(
        MtpWeights::bind(&m.file, &m.config, 0),
        Err(ModelError::WrongKind(_))
    ));
    // Attached, the MTP tensors are read through the main file at offsets
    // past its end, byte for byte what the MTP file holds; the main
    // file's own tensors read as before.
    let mut both = ModelFile::open(&main).unwrap();
    both.attach_mtp(&mtp).unwrap();
    let attached = both.mtp.as_ref().unwrap();
    let main_len = both.file.file_len();
    for (a, alone) in [
        (&attached.e_proj, &w.e_proj),
        (&attached.block.attn.q_a, &w.block.attn.q_a),
        (&attached.block.ffn.down_exps, &w.block.ffn.down_exps),
    ] {
        assert!(a.offset >= main_len && a.offset % (1 << 20) == alone.offset % (1 << 20));
        assert!(!a.bytes(&both.file).is_empty());
        assert_eq!(a.bytes(&both.file), alone.bytes(&f), "{}", a.name);
    }
    let e = &both.weights.token_embd;
    assert_eq!(e.bytes(&both.file), e.bytes(&m.file));
    // A second attach is refused.
    assert!(both.attach_mtp(&mtp).is_err());
    std::fs::remove_dir_all(&dir).ok();
}
