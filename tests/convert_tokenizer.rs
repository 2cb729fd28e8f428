//! The tokenizer keys of the V4 converter (`ds4-quantize --hf DIR`,
//! `ds4::convert::tokenizer`, issue 37) on the checkpoints of
//! `tools/checkpoint/make_checkpoint.py --model v4`: with the official
//! 129,280-id tokenizer the converted file's `tokenizer.*` keys are those of
//! ds4's test-model GGUF (same vocabulary) plus the chat template, and it
//! tokenizes as the official tokenizer does (TOKENIZER.md §8) and as the
//! test model does; a tokenizer cut to 500 ids in a 512-id model is padded
//! with `[PAD{id}]` and tokenizes as ds4 reads that `tokenizer.json`
//! directly; `ds4` chats on a converted q8 file; a malformed, too large or
//! missing `tokenizer.json` exits 1 naming it and leaves no output.

mod common;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use common::checkpoint::make_checkpoint;
use common::fresh_dir;
use common::quantize::{convert, ds4_answers, s};
use ds4::gguf::{GgufFile, MetaArray, MetaValue};
use ds4::model::ModelFile;
use ds4::testmodel::{Variant, Vocab};
use ds4::tokenizer::Tokenizer;

/// The script's checkpoint with `args`, converted to q8 by the command,
/// once per `name`: (checkpoint, output).
fn converted(name: &str, args: &[&str]) -> (PathBuf, PathBuf) {
    let ck = fresh_dir("convert_tokenizer", &format!("{name}-ck"));
    let mut all = vec!["--model", "v4"];
    all.extend_from_slice(args);
    make_checkpoint(&ck, &all);
    let dir = fresh_dir("convert_tokenizer", &format!("{name}-out"));
    let out = dir.join("tiny-q8.gguf");
    let o = convert(&ck, "q8", &[], &out);
    assert!(
        o.status.success(),
        "{name}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    (ck, out)
}

/// The official tokenizer, at the test model's full vocabulary.
fn full() -> &'static (PathBuf, PathBuf) {
    static P: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    P.get_or_init(|| converted("full", &[]))
}

/// A 512-id model whose tokenizer is cut to 500 ids.
fn cut() -> &'static (PathBuf, PathBuf) {
    static P: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    P.get_or_init(|| converted("cut", &["--vocab", "512", "--tokenizer-vocab", "500"]))
}

/// The file's `tokenizer.*` keys, in order.
fn tokenizer_keys(f: &GgufFile) -> Vec<(String, MetaValue)> {
    f.metadata()
        .filter(|(k, _)| k.starts_with("tokenizer."))
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

fn chat_template(ck: &Path) -> String {
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ck.join("tokenizer_config.json")).unwrap()).unwrap();
    cfg["chat_template"].as_str().unwrap().to_string()
}

fn strings(f: &GgufFile, key: &str) -> Vec<String> {
    f.get_array(key).unwrap().as_strings().unwrap().to_vec()
}

/// Text to tokenize: markers, code, numbers, accents, CJK, emoji,
/// whitespace runs, and added tokens that are not chat markers.
const TEXTS: &[&str] = &[
    "<｜User｜>Hi<｜Assistant｜></think>",
    "<｜begin▁of▁sentence｜>You are helpful.<｜User｜>Write fizzbuzz in C.<｜Assistant｜><think>",
    "int main() {\n    return 0;\n}\n",
    "x = 12345; e.g. foo.bar()",
    "café über naïve — Ελληνικά, русский",
    "你好，世界。Hello こんにちは カタカナ",
    "a—b 😀 \t\n\n  x",
    "｜DSML｜<dsml:invoke name=\"f\"></dsml:invoke><|EOT|><｜fim▁hole｜>",
];

#[test]
fn full_vocabulary_keys_equal_the_test_models() {
    let (ck, out) = full();
    let m = ModelFile::open(out).unwrap();
    assert_eq!(m.config.n_vocab, 129280);
    let got = tokenizer_keys(&m.file);
    let reference = GgufFile::open(common::tiny_model_path(Variant::Q8)).unwrap();
    let mut want = tokenizer_keys(&reference);
    assert_eq!(want.len(), 7, "the test model's keys changed");
    want.push((
        "tokenizer.chat_template".into(),
        MetaValue::String(chat_template(ck)),
    ));
    let names = |kv: &[(String, MetaValue)]| kv.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
    assert_eq!(names(&got), names(&want));
    for ((k, g), (_, w)) in got.iter().zip(&want) {
        assert!(g == w, "{k} differs from the test model's");
    }
    assert_eq!(m.file.get_str("tokenizer.ggml.pre"), Some("joyai-llm"));
}

#[test]
fn full_vocabulary_tokenizes_like_the_reference_and_the_test_model() {
    let conv = Tokenizer::from_gguf(&GgufFile::open(&full().1).unwrap()).unwrap();
    for (text, ids) in common::TOKENIZER_VECTORS {
        assert_eq!(conv.encode_chat(text), *ids, "{text:?}");
        assert_eq!(conv.decode(ids), text.as_bytes(), "{text:?}");
    }
    let test_model =
        Tokenizer::from_gguf(&GgufFile::open(common::tiny_model_path(Variant::Q8)).unwrap())
            .unwrap();
    for text in TEXTS {
        assert_eq!(conv.encode(text), test_model.encode(text), "{text:?}");
        assert_eq!(
            conv.encode_chat(text),
            test_model.encode_chat(text),
            "{text:?}"
        );
    }
    assert_eq!(conv.encode("<|EOT|>"), [128805]);
}

#[test]
fn a_cut_tokenizer_is_padded_and_tokenizes_like_its_tokenizer_json() {
    let (ck, out) = cut();
    let f = GgufFile::open(out).unwrap();
    let json = std::fs::read(ck.join("tokenizer.json")).unwrap();
    let v = Vocab::from_tokenizer_json(&json).unwrap();
    assert_eq!(v.tokens.len(), 500);
    let tokens = strings(&f, "tokenizer.ggml.tokens");
    assert_eq!(tokens.len(), 512);
    assert_eq!(tokens[..500], v.tokens[..]);
    for (id, t) in tokens.iter().enumerate().skip(500) {
        assert_eq!(*t, format!("[PAD{id}]"));
    }
    let types = f
        .get_array("tokenizer.ggml.token_type")
        .and_then(MetaArray::as_i64_vec)
        .unwrap();
    let want: Vec<i64> = v
        .token_types
        .iter()
        .map(|&t| t as i64)
        .chain([5; 12])
        .collect();
    assert_eq!(types, want);
    // The markers' types: bars (3), special (3), plain (4).
    assert_eq!(tokens[490], "<｜User｜>");
    assert_eq!((types[490], types[492], types[498]), (3, 4, 4));
    assert_eq!((types[497], types[0]), (3, 3));
    assert_eq!(strings(&f, "tokenizer.ggml.merges"), v.merges);
    assert!(v.merges.len() > 200, "{}", v.merges.len());
    assert_eq!(f.get_u32("tokenizer.ggml.bos_token_id"), Some(0));
    assert_eq!(f.get_u32("tokenizer.ggml.eos_token_id"), Some(1));

    let conv = Tokenizer::from_gguf(&f).unwrap();
    let reference = Tokenizer::from_tokenizer_json(&json).unwrap();
    for text in TEXTS {
        let ids = conv.encode(text);
        assert_eq!(ids, reference.encode(text), "{text:?}");
        assert_eq!(
            conv.encode_chat(text),
            reference.encode_chat(text),
            "{text:?}"
        );
        assert!(ids.iter().all(|&i| i < 500), "{text:?}: {ids:?}");
        assert_eq!(conv.decode(&ids), text.as_bytes(), "{text:?}");
    }
    assert_eq!(conv.encode_chat("<｜User｜>Hi<｜Assistant｜>")[0], 490);
}

#[test]
fn ds4_answers_a_prompt_on_the_converted_q8_file() {
    for out in [&full().1, &cut().1] {
        ds4_answers(out, "Hello, 世界");
    }
}

#[test]
fn a_bad_tokenizer_exits_1_naming_it_and_leaves_no_output() {
    // A 600-id tokenizer for a 512-id model, then not JSON, then missing.
    let ck = fresh_dir("convert_tokenizer", "bad-ck");
    make_checkpoint(
        &ck,
        &[
            "--model",
            "v4",
            "--vocab",
            "512",
            "--tokenizer-vocab",
            "600",
        ],
    );
    let file = ck.join("tokenizer.json");
    type Spoil = fn(&Path);
    let cases: [(&str, Spoil); 3] = [
        ("larger than the model's vocabulary", |_| {}),
        ("not JSON", |f| {
            std::fs::write(f, "{\"model\": {\"vocab\": ").unwrap()
        }),
        ("not found", |f| std::fs::remove_file(f).unwrap()),
    ];
    for (what, spoil) in cases {
        spoil(&file);
        let dir = fresh_dir("convert_tokenizer", "bad-out");
        let out = dir.join("x.gguf");
        let o = convert(&ck, "q8", &[], &out);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{what}: {err}");
        assert!(err.contains(s(&file)), "{what}: {err}");
        assert!(err.contains(what), "{what}: {err}");
        assert!(!err.contains("panicked"), "{what}: {err}");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "{what}");
    }
}
