//! Log-probabilities through the real `ds4-server` on the tiny model
//! (issue 21 item 1): completions `logprobs`/`echo` and chat
//! `logprobs`/`top_logprobs`, streaming and not, checked against the
//! engine itself — the `ds4 --dump-logprobs` file of the CLI, and a
//! `Session` on the same backend in this process, whose log-softmax the
//! server's numbers must equal bit for bit.

mod common;

use std::process::Command;

use common::server::{cpu_engine, json_body, post, start, status, temp_path};
use ds4::app::logprobs::g9;
use ds4::chat::{self, ThinkMode, DEFAULT_SYSTEM};
use ds4::sampler::LogSoftmax;
use ds4::testmodel::Variant;
use ds4::Tokenizer;
use serde_json::{json, Value};

/// Both the server and the CLI run the fast CPU backend (the default on a
/// machine without a GPU, named so a GPU machine checks the same thing).
const BACKEND: &[&str] = &["--backend", "cpu"];
const PROMPT: &str = "Name three colours.";
const STEPS: usize = 6;
const TOP: usize = 5;

/// The SSE `data:` objects of a streamed response.
fn sse_objects(resp: &str) -> Vec<Value> {
    resp.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}")))
        .collect()
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[test]
fn generated_logprobs_equal_the_cli_dump_and_the_engine_bit_for_bit() {
    let (mut sess, tok) = cpu_engine();
    let ptoks = chat::one_shot_prompt(&tok, DEFAULT_SYSTEM, PROMPT, ThinkMode::None);

    // The CLI's dump of the greedy continuation.
    let dump = temp_path("dump.json");
    let model = common::tiny_model_path(Variant::Q8);
    let out = Command::new(env!("CARGO_BIN_EXE_ds4"))
        .args(["-m", model.to_str().unwrap(), "--nothink", "-p", PROMPT])
        .args(BACKEND)
        .args(["--ctx", &common::server::CTX.to_string()])
        .args([
            "-n",
            &STEPS.to_string(),
            "--logprobs-top-k",
            &TOP.to_string(),
        ])
        .arg("--dump-logprobs")
        .arg(&dump)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dumped: Value = serde_json::from_str(&std::fs::read_to_string(&dump).unwrap()).unwrap();
    let _ = std::fs::remove_file(&dump);
    assert_eq!(dumped["prompt_tokens"], ptoks.len());
    let steps = dumped["steps"].as_array().unwrap();

    // The same prompt through the server: as text (the single-turn
    // template renders it to the CLI's tokens) and as those token ids.
    let s = start(BACKEND);
    let as_text = json!({"prompt": PROMPT, "think": false, "temperature": 0,
        "max_tokens": STEPS, "logprobs": TOP});
    let as_ids = json!({"prompt": ptoks, "temperature": 0, "max_tokens": STEPS, "logprobs": TOP});
    let a = json_body(&post(&s.addr, "/v1/completions", &as_text));
    let b = json_body(&post(&s.addr, "/v1/completions", &as_ids));
    assert_eq!(a["usage"]["prompt_tokens"], ptoks.len(), "{a}");
    assert_eq!(a["choices"][0]["logprobs"], b["choices"][0]["logprobs"]);
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);
    let lp = &a["choices"][0]["logprobs"];
    let tokens = lp["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), steps.len(), "{lp}");

    // The engine in this process, step by step as the CLI and the server.
    sess.sync(&ptoks, &mut |_, _| {}).unwrap();
    let mut chars = 0;
    let mut picked = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        let sel = &step["selected"];
        let id = sel["id"].as_u64().unwrap() as u32;
        let bytes = tok.token_bytes(id).unwrap().to_vec();
        assert_eq!(tokens[i], ds4::server::logprobs::token_text(&bytes));
        // Server against the engine: the same f64, bit for bit.
        let ls = LogSoftmax::new(sess.logits());
        let mine = ls.of(sess.logits()[id as usize]);
        let served = f(&lp["token_logprobs"][i]);
        assert_eq!(served.to_bits(), mine.to_bits(), "step {i}");
        picked.push((id, mine));
        // Server against the CLI dump: the dump's text, byte for byte.
        let tops = step["top_logprobs"].as_array().unwrap();
        assert_eq!(g9(served), g9(f(&tops[0]["logprob"])), "step {i}");
        let served_top = lp["top_logprobs"][i].as_object().unwrap();
        let dumped_top: Vec<(String, String)> = tops
            .iter()
            .map(|t| {
                let id = t["token"]["id"].as_u64().unwrap() as u32;
                let text = ds4::server::logprobs::token_text(tok.token_bytes(id).unwrap());
                (text, g9(f(&t["logprob"])))
            })
            .collect();
        let served_top: Vec<(String, String)> = served_top
            .iter()
            .map(|(k, v)| (k.clone(), g9(f(v))))
            .collect();
        // Distinct tokens of one spelling share a key: compare the spellings' best.
        let mut seen = std::collections::HashSet::new();
        let dumped_top: Vec<_> = dumped_top
            .into_iter()
            .filter(|(t, _)| seen.insert(t.clone()))
            .collect();
        assert_eq!(served_top, dumped_top, "step {i}");
        assert_eq!(lp["text_offset"][i].as_u64().unwrap() as usize, chars);
        chars += ds4::server::logprobs::chars(&bytes);
        if id != tok.specials().eos && i + 1 < steps.len() {
            sess.eval(id).unwrap();
        }
    }

    // The prompt and the dumped continuation scored in one go (`echo`,
    // `max_tokens: 0`): every position of the score graph gives the numbers
    // of the step-by-step decode, so the dump again.
    let mut all = ptoks.clone();
    all.extend(picked.iter().map(|p| p.0));
    let body = json!({"prompt": all, "echo": true, "max_tokens": 0, "logprobs": 1});
    let r = json_body(&post(&s.addr, "/v1/completions", &body));
    let scored = r["choices"][0]["logprobs"]["token_logprobs"]
        .as_array()
        .unwrap();
    assert_eq!(scored.len(), all.len());
    for (j, (_, mine)) in picked.iter().enumerate() {
        let served = f(&scored[ptoks.len() + j]);
        assert_eq!(served.to_bits(), mine.to_bits(), "echo step {j}");
        let dumped = &steps[j]["top_logprobs"][0]["logprob"];
        assert_eq!(g9(served), g9(f(dumped)), "echo step {j}");
    }
}

#[test]
fn echo_scores_the_prompt_as_the_engine_does() {
    let (mut sess, tok) = cpu_engine();
    let text = "The quick brown fox jumps over the lazy dog. Ünïcödé 色 too.";
    let ids = tok.encode_chat(text);
    let rows = sess.score(&ids).unwrap();
    let v = sess.n_vocab();
    let s = start(BACKEND);
    for prompt in [json!(text), json!(ids), json!([ids])] {
        let body = json!({"prompt": prompt, "echo": true, "max_tokens": 0, "logprobs": 3});
        let r = json_body(&post(&s.addr, "/v1/completions", &body));
        let c = &r["choices"][0];
        assert_eq!(c["text"], text, "{r}");
        assert_eq!(r["usage"]["completion_tokens"], 0);
        assert_eq!(c["finish_reason"], "length");
        let lp = &c["logprobs"];
        let got = lp["token_logprobs"].as_array().unwrap();
        assert_eq!(got.len(), ids.len());
        assert!(got[0].is_null() && lp["top_logprobs"][0].is_null());
        for i in 1..ids.len() {
            let row = &rows[(i - 1) * v..i * v];
            let want = LogSoftmax::new(row).of(row[ids[i] as usize]);
            assert_eq!(f(&got[i]).to_bits(), want.to_bits(), "position {i}");
            assert_eq!(lp["top_logprobs"][i].as_object().unwrap().len(), 3);
        }
        let joined: String = lp["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap().to_string())
            .collect();
        let offsets: Vec<u64> = lp["text_offset"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o.as_u64().unwrap())
            .collect();
        assert!(offsets.windows(2).all(|w| w[0] <= w[1]) && offsets[0] == 0);
        assert_eq!(
            *offsets.last().unwrap() as usize,
            text.chars().count() - tok_chars(&tok, *ids.last().unwrap())
        );
        if !joined.contains("bytes:") {
            assert_eq!(joined, text);
        }
    }
    // Echo with generation, streamed: the echo and its scores come first,
    // then the completion; the pieces add up to the unstreamed answer.
    let body = json!({"prompt": text, "echo": true, "max_tokens": 4, "logprobs": 2,
        "temperature": 0});
    let whole = json_body(&post(&s.addr, "/v1/completions", &body));
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let chunks = sse_objects(&post(&s.addr, "/v1/completions", &streamed));
    let mut text_s = String::new();
    let mut lps: Vec<Value> = Vec::new();
    let mut offs: Vec<Value> = Vec::new();
    for c in &chunks {
        let ch = &c["choices"][0];
        text_s.push_str(ch["text"].as_str().unwrap_or(""));
        if let Some(l) = ch.get("logprobs") {
            lps.extend(l["token_logprobs"].as_array().unwrap().iter().cloned());
            offs.extend(l["text_offset"].as_array().unwrap().iter().cloned());
        }
    }
    let w = &whole["choices"][0];
    assert_eq!(text_s, w["text"].as_str().unwrap());
    assert!(text_s.starts_with(text));
    assert_eq!(&lps, w["logprobs"]["token_logprobs"].as_array().unwrap());
    assert_eq!(&offs, w["logprobs"]["text_offset"].as_array().unwrap());
}

fn tok_chars(tok: &Tokenizer, id: u32) -> usize {
    ds4::server::logprobs::chars(tok.token_bytes(id).unwrap())
}

#[test]
fn chat_logprobs_in_openai_shape_streamed_and_not() {
    let s = start(BACKEND);
    let body = json!({"messages": [{"role": "user", "content": "Hi"}], "think": false,
        "temperature": 0, "max_tokens": 8, "logprobs": true, "top_logprobs": 2});
    let r = json_body(&post(&s.addr, "/v1/chat/completions", &body));
    let c = &r["choices"][0];
    let content = c["logprobs"]["content"].as_array().unwrap().clone();
    let n = r["usage"]["completion_tokens"].as_u64().unwrap() as usize;
    // One entry per generated token (plus the EOS, when one was picked).
    assert!(content.len() == n || content.len() == n + 1, "{r}");
    let mut bytes = Vec::new();
    for e in &content {
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 2);
        // Greedy: the pick is the likeliest token.
        assert_eq!(e["logprob"], top[0]["logprob"]);
        assert_eq!(e["bytes"], top[0]["bytes"]);
        assert!(f(&top[0]["logprob"]) >= f(&top[1]["logprob"]));
        assert!(f(&e["logprob"]) <= 0.0);
        bytes.extend(
            e["bytes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b.as_u64().unwrap() as u8),
        );
    }
    let content_text = c["message"]["content"].as_str().unwrap();
    assert!(String::from_utf8_lossy(&bytes).starts_with(content_text));

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let chunks = sse_objects(&post(&s.addr, "/v1/chat/completions", &streamed));
    let mut got = Vec::new();
    let mut text = String::new();
    for ch in &chunks {
        let choice = &ch["choices"][0];
        text.push_str(choice["delta"]["content"].as_str().unwrap_or(""));
        if let Some(l) = choice.get("logprobs") {
            got.extend(l["content"].as_array().unwrap().iter().cloned());
        }
    }
    assert_eq!(got, content);
    assert_eq!(text, content_text);

    // Thinking: the reasoning's tokens (to `</think>`) are listed apart.
    // The scripted test mode fixes the tokens; they are still scored.
    let body = json!({"messages": [{"role": "user", "content": "Hi"}], "logprobs": true,
        "top_logprobs": 1, "ds4_test_script": "Let me think.</think>Hi there"});
    let r = json_body(&post(&s.addr, "/v1/chat/completions", &body));
    let c = &r["choices"][0];
    assert_eq!(c["message"]["reasoning_content"], "Let me think.", "{r}");
    assert_eq!(c["message"]["content"], "Hi there");
    let spelled = |list: &Value| -> String {
        let bytes: Vec<u8> = list
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|e| {
                e["bytes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|b| b.as_u64().unwrap() as u8)
            })
            .collect();
        String::from_utf8(bytes).unwrap()
    };
    assert_eq!(
        spelled(&c["logprobs"]["reasoning_content"]),
        "Let me think.</think>"
    );
    // The script ends with the EOS it picks: the last entry.
    assert_eq!(
        spelled(&c["logprobs"]["content"]),
        format!("Hi there{}", ds4::chat::template::EOS)
    );

    // Without the fields the answer is as before: no logprobs key.
    let plain = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2});
    let r = json_body(&post(&s.addr, "/v1/chat/completions", &plain));
    assert!(r["choices"][0].get("logprobs").is_none(), "{r}");
}

#[test]
fn bad_logprob_fields_are_400s_that_say_why() {
    let s = start(&[]);
    let chat = |extra: Value| {
        let mut b = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        post(&s.addr, "/v1/chat/completions", &b)
    };
    for (extra, says) in [
        (
            json!({"logprobs": true, "top_logprobs": 21}),
            "top_logprobs must be between 0 and 20",
        ),
        (
            json!({"logprobs": true, "top_logprobs": -1}),
            "top_logprobs must be between 0 and 20",
        ),
        (
            json!({"logprobs": true, "top_logprobs": 2.5}),
            "top_logprobs must be an integer",
        ),
        (
            json!({"logprobs": true, "top_logprobs": "3"}),
            "top_logprobs must be an integer",
        ),
        (
            json!({"top_logprobs": 3}),
            "top_logprobs needs logprobs: true",
        ),
        (json!({"logprobs": 3}), "invalid JSON request"),
    ] {
        let r = chat(extra.clone());
        assert_eq!(status(&r), 400, "{extra}: {r}");
        assert!(r.contains(says), "{extra}: {r}");
    }
    let comp = |b: Value| post(&s.addr, "/v1/completions", &b);
    for (body, says) in [
        (
            json!({"prompt": "x", "logprobs": 21}),
            "logprobs must be between 0 and 20",
        ),
        (
            json!({"prompt": "x", "logprobs": -2}),
            "logprobs must be between 0 and 20",
        ),
        (
            json!({"prompt": "x", "echo": "yes"}),
            "invalid JSON request",
        ),
        (
            json!({"prompt": [1, -5]}),
            "prompt token ids must be non-negative integers",
        ),
        (json!({"prompt": [[1, 2], [3]]}), "one prompt per request"),
        (
            json!({"prompt": [4_000_000_000u64]}),
            "outside the vocabulary",
        ),
        (json!({"prompt": "", "echo": true}), "empty prompt"),
    ] {
        let r = comp(body.clone());
        assert_eq!(status(&r), 400, "{body}: {r}");
        assert!(r.contains(says), "{body}: {r}");
    }
    // The server is still fine.
    let r = json_body(&comp(
        json!({"prompt": [1, 2, 3], "echo": true, "max_tokens": 0, "logprobs": 0}),
    ));
    assert_eq!(
        r["choices"][0]["logprobs"]["token_logprobs"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
}

#[test]
fn tokenizer_endpoints_speak_vllms_shape() {
    let model = common::tiny_model(Variant::Q8);
    let tok = Tokenizer::from_gguf(&model.file).unwrap();
    let s = start(&["--api-key", "k"]);
    let with_key = |path: &str, body: &Value| {
        let b = body.to_string();
        common::server::raw(
            &s.addr,
            format!(
                "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer k\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{b}",
                b.len()
            )
            .as_bytes(),
            false,
        )
    };
    // Behind the key like every endpoint.
    let r = post(&s.addr, "/tokenize", &json!({"prompt": "x"}));
    assert_eq!(status(&r), 401, "{r}");
    let text = "Hello, 世界 <｜end▁of▁sentence｜>";
    let ids = tok.encode_chat(text);
    let r = json_body(&with_key(
        "/tokenize",
        &json!({"prompt": text, "add_special_tokens": false}),
    ));
    assert_eq!(r["tokens"], json!(ids));
    assert_eq!(r["count"], ids.len());
    let r = json_body(&with_key("/tokenize", &json!({"prompt": text})));
    assert_eq!(r["tokens"][0], tok.specials().bos);
    let r = json_body(&with_key("/detokenize", &json!({"tokens": ids})));
    assert_eq!(r["prompt"], text);
    for (path, body) in [
        ("/tokenize", json!({"prompt": 5})),
        (
            "/tokenize",
            json!({"prompt": "x", "add_special_tokens": "no"}),
        ),
        ("/detokenize", json!({"tokens": [1, -1]})),
        ("/detokenize", json!({"tokens": [u32::MAX]})),
        ("/detokenize", json!({})),
    ] {
        assert_eq!(status(&with_key(path, &body)), 400, "{path} {body}");
    }
    let info = common::server::raw(
        &s.addr,
        b"GET /tokenizer_info HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer k\r\nConnection: close\r\n\r\n",
        false,
    );
    let info = json_body(&info);
    assert_eq!(info["eos_token"], ds4::chat::template::EOS);
    assert_eq!(info["bos_token"], ds4::chat::template::BOS);
    assert_eq!(info["max_model_len"], common::server::CTX);
}
