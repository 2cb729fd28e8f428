//! The tokenizer against the real V4 tokenizer (HF `tokenizers` on the
//! official tokenizer.json): every string of the corpus made by
//! tools/gen_tokenizer_corpus.py must give exactly the same ids.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;

use ds4::testmodel::vocab::default_tokenizer_json_bytes;
use ds4::tokenizer::{StreamDecoder, Tokenizer};

fn tokenizer() -> Tokenizer {
    Tokenizer::from_tokenizer_json(&default_tokenizer_json_bytes().unwrap()).unwrap()
}

fn corpus() -> Vec<(String, Vec<u32>)> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/tokenizer_corpus.jsonl.gz");
    let f = flate2::read::GzDecoder::new(std::fs::File::open(&p).unwrap());
    BufReader::new(f)
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(&l.unwrap()).unwrap();
            let ids = common::json_uints(&v["ids"])
                .into_iter()
                .map(|x| x as u32)
                .collect();
            (v["text"].as_str().unwrap().to_string(), ids)
        })
        .collect()
}

#[test]
fn corpus_matches_the_reference_tokenizer_exactly() {
    let tok = tokenizer();
    let corpus = corpus();
    assert!(corpus.len() >= 5000, "corpus has {} strings", corpus.len());
    let mut bad = Vec::new();
    let (mut bytes, mut tokens) = (0, 0);
    for (text, want) in &corpus {
        let got = tok.encode(text);
        bytes += text.len();
        tokens += want.len();
        if &got != want {
            bad.push((text.clone(), got, want.clone()));
        }
    }
    for (t, g, w) in bad.iter().take(10) {
        eprintln!("MISMATCH {t:?}\n  ours {g:?}\n  ref  {w:?}");
    }
    eprintln!(
        "{} strings, {bytes} bytes, {tokens} tokens, {} mismatches",
        corpus.len(),
        bad.len()
    );
    assert!(
        bad.is_empty(),
        "{} of {} strings differ",
        bad.len(),
        corpus.len()
    );
}

#[test]
fn decoding_reproduces_the_text() {
    let tok = tokenizer();
    for (text, ids) in corpus() {
        assert_eq!(tok.decode(&ids), text.as_bytes(), "{text:?}");
        let mut d = StreamDecoder::new();
        let mut out = String::new();
        for &id in &ids {
            out.push_str(&d.push(tok.token_bytes(id).unwrap()));
        }
        out.push_str(&d.finish());
        assert_eq!(out, text);
    }
}

#[test]
fn spec_test_vectors() {
    let tok = tokenizer();
    for (text, want) in common::TOKENIZER_VECTORS {
        assert_eq!(&tok.encode(text), want, "{text:?}");
    }
    let s = tok.specials();
    assert_eq!(
        (
            s.bos,
            s.eos,
            s.user,
            s.assistant,
            s.think_open,
            s.think_close,
            s.dsml
        ),
        (0, 1, 128803, 128804, 128821, 128822, 128825)
    );
}

#[test]
fn chat_and_plain_entry_points() {
    let tok = tokenizer();
    // Only the seven chat markers are special in rendered chat text.
    let rendered = "<｜begin▁of▁sentence｜>sys<｜User｜>hi <think>x</think><｜tool▁calls▁begin｜></｜DSML｜parameter><｜Assistant｜>";
    let chat = tok.encode_chat(rendered);
    assert_eq!(chat[0], 0);
    assert!(chat.contains(&128825) && chat.contains(&128821) && chat.contains(&128822));
    assert!(
        !chat.contains(&128806),
        "tool-calls marker is plain text in chat mode"
    );
    assert_eq!(tok.decode(&chat), rendered.as_bytes());
    // `</｜DSML｜parameter>` is `</` + DSML + `parameter>`.
    let d = tok.encode_chat("</｜DSML｜parameter>");
    assert_eq!(d[..2], [tok.encode_plain("</")[0], 128825][..]);
    // Plain text never yields added-token ids.
    let plain = tok.encode_plain(rendered);
    assert!(
        plain.iter().all(|&i| (3..128_000).contains(&i)),
        "{plain:?}"
    );
    assert_eq!(tok.decode(&plain), rendered.as_bytes());
}

#[test]
fn pathological_inputs_finish_and_round_trip() {
    let tok = tokenizer();
    for s in [
        " ".repeat(1 << 20),
        "a".repeat(1 << 20),
        "😀".repeat(100_000),
        "\n".repeat(200_000),
        "1".repeat(300_000),
    ] {
        let ids = tok.encode(&s);
        assert_eq!(tok.decode(&ids), s.as_bytes());
    }
}
