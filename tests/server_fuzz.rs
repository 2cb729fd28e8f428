//! Property test over the request parsers, the renderer and the DSML
//! parser: mutated valid bodies and random JSON never panic, and every
//! refusal is a 400 with the generic error body.

mod common;
use common::rng::Rng;

use ds4::server::dsml;
use ds4::server::render;
use ds4::server::request::{self, ParseContext};

const SEEDS: [&str; 4] = [
    r#"{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"hi"}]},{"role":"assistant","content":null,"reasoning_content":"r","tool_calls":[{"id":"call_1","type":"function","function":{"name":"bash","arguments":"{\"a\":1}"}}]},{"role":"tool","tool_call_id":"call_1","content":"ok"}],"tools":[{"type":"function","function":{"name":"bash","parameters":{}}}],"stop":["x",""],"stream":true,"stream_options":{"include_usage":true},"max_tokens":5,"temperature":0.5,"thinking":{"type":"enabled"},"reasoning_effort":"max"}"#,
    r#"{"prompt":["a"],"max_tokens":3,"seed":7,"top_k":4,"min_p":0.1,"think":false}"#,
    r#"{"system":[{"type":"text","text":"x-anthropic-billing"},"sys"],"max_tokens":9,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"</tool_result>"}]}]},{"role":"assistant","content":[{"type":"thinking","thinking":"t"},{"type":"tool_use","id":"t","name":"n","input":{"k":[1,{"z":null}]}}]}],"tool_choice":{"type":"none"},"output_config":{"effort":"low"}}"#,
    r#"{"input":[{"type":"reasoning","summary":[{"type":"summary_text","text":"r"}]},{"type":"function_call","call_id":"c","name":"f","namespace":"ns.","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":[{"type":"input_text","text":"o"}]},{"role":"user","content":"u"}],"instructions":"i","tools":[{"type":"namespace","name":"ns.","tools":[{"name":"f"}]},{"type":"tool_search"}],"reasoning":{"effort":"minimal","summary":"auto"},"max_output_tokens":4}"#,
];

const FRAGMENTS: [&str; 16] = [
    "null",
    "true",
    "1e400",
    "-1",
    "\"\"",
    "[]",
    "{}",
    "\"\u{1F600}\"",
    "[[[[[[",
    "}}}",
    ",",
    ":",
    "\"role\"",
    "\"tool_calls\"",
    "\"\\ud800\"",
    "0.5",
];

fn mutate(r: &mut Rng, s: &[u8]) -> Vec<u8> {
    let mut b = s.to_vec();
    for _ in 0..1 + r.below(4) {
        let at = r.below(b.len() + 1);
        match r.below(4) {
            0 if !b.is_empty() => {
                let i = at.min(b.len() - 1);
                b[i] = r.next_u64() as u8;
            }
            1 => b.truncate(at),
            2 => {
                let f = FRAGMENTS[r.below(FRAGMENTS.len())].as_bytes();
                b.splice(at..at, f.iter().copied());
            }
            _ => {
                let end = (at + r.below(8)).min(b.len());
                b.drain(at..end);
            }
        }
    }
    b
}

#[test]
fn parsers_never_panic_and_refuse_with_400() {
    let pc = ParseContext {
        ctx: 4096,
        allow_script: true,
    };
    let mut r = Rng(0x9E37_79B9_7F4A_7C15);
    let parsers: [fn(&[u8], ParseContext) -> _; 4] = [
        request::parse_chat,
        request::parse_completions,
        request::parse_messages,
        request::parse_responses,
    ];
    let mut ok = 0;
    for i in 0..4000 {
        let seed = SEEDS[i % SEEDS.len()].as_bytes();
        let body = if i % 10 == 0 {
            seed.to_vec()
        } else {
            mutate(&mut r, seed)
        };
        for p in parsers {
            match p(&body, pc) {
                Ok(req) => {
                    ok += 1;
                    let text = render::render(&req, &mut render::NoReplay);
                    assert!(text.starts_with(ds4::chat::template::BOS));
                }
                Err(e) => {
                    assert!(e.status == 400, "{}", e.body);
                    let v: serde_json::Value = serde_json::from_str(&e.body).unwrap();
                    assert!(v["error"]["message"].is_string());
                }
            }
        }
    }
    // The unmutated seeds parse with their own endpoint at least.
    assert!(ok >= 400, "{ok}");
}

#[test]
fn dsml_parser_never_panics_on_fragments() {
    let parts = [
        "<｜DSML｜tool_calls>",
        "</｜DSML｜tool_calls>",
        "<｜DSML｜invoke name=\"f\">",
        "</｜DSML｜invoke>",
        "<｜DSML｜parameter name=\"a\" string=\"true\">",
        "<｜DSML｜parameter name=\"b\" string=\"false\">",
        "<｜DSML｜parameter name=\"c\">",
        "</｜DSML｜parameter>",
        "</think>",
        "<think>",
        "\n\n",
        "x",
        "&amp;",
        "&",
        "\"",
        "é",
        "{",
        "[1,",
        "<tool_calls>",
        "<invoke name=\"g\">",
        "<parameter name=\"p\">",
        "</parameter>",
        "</invoke>",
        "</tool_calls>",
        "<",
        "</",
    ];
    let mut r = Rng(12345);
    for _ in 0..20000 {
        let n = 1 + r.below(14);
        let text: String = (0..n).map(|_| parts[r.below(parts.len())]).collect();
        for thinking in [false, true] {
            let p = dsml::parse_output(&text, thinking);
            for c in &p.calls {
                assert!(serde_json::from_str::<serde_json::Value>(&c.arguments)
                    .unwrap()
                    .is_object());
            }
            if !p.failed && p.calls.is_empty() {
                assert!(p.raw_dsml.is_none() || p.block_seen);
            }
        }
        for k in 0..=text.len() {
            if text.is_char_boundary(k) {
                dsml::structural_position(&text.as_bytes()[..k]);
            }
        }
    }
}
