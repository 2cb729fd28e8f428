//! Structured output (issue 21): OpenAI `response_format` and Responses
//! `text.format` through ds4-server in process (`warp::test`) on the random
//! tiny model, whose unconstrained output is noise. 50 schemas
//! (tests/data/structured_schemas.json, from tools/gen_structured_schemas.py),
//! greedy and sampled: every answer is parsed and validated by a real
//! JSON-schema validator (Python `jsonschema`, tools/check_json_outputs.py).
//! Plus the bad input: unsupported or malformed schemas are 400s naming the
//! part, and a decode cut by `max_tokens` or a stop sequence ends as
//! `length` with the partial text.

mod common;

use common::in_process::tiny_worker;

use std::sync::Arc;

use ds4::server::job;
use ds4::server::routes::{self, HttpOptions, State};
use ds4::testmodel::Variant;
use ds4::Tokenizer;
use serde_json::{json, Value};

const CTX: usize = 1024;

fn server() -> Arc<State> {
    let (queue, metrics, _) = tiny_worker(CTX, Box::new(job::NoCache));
    let opts = HttpOptions {
        max_body_bytes: 1 << 20,
        ..HttpOptions::default()
    };
    common::in_process::routes_state(queue, metrics, CTX, opts)
}

async fn post(state: &Arc<State>, path: &str, body: &Value) -> (u16, Value) {
    let (status, text) = common::in_process::post(state, path, body).await;
    let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, v)
}

fn chat(format: Value, max_tokens: u32, sampled: Option<u64>) -> Value {
    let mut b = json!({
        "messages": [{"role": "user", "content": "Answer in JSON."}],
        "thinking": {"type": "disabled"},
        "max_tokens": max_tokens,
        "response_format": format,
    });
    match sampled {
        None => b["temperature"] = json!(0),
        Some(seed) => {
            b["temperature"] = json!(1.0);
            b["seed"] = json!(seed);
        }
    }
    b
}

fn schema_format(schema: &Value) -> Value {
    json!({"type": "json_schema", "json_schema": {"name": "t", "schema": schema, "strict": true}})
}

/// Validates `(name, schema, text)` with tools/check_json_outputs.py.
fn validate(cases: &[(String, Value, String)]) {
    let path = std::env::temp_dir().join(format!("ds4-structured-{}.json", std::process::id()));
    let list: Vec<Value> = cases
        .iter()
        .map(|(n, s, t)| json!({"name": n, "schema": s, "text": t}))
        .collect();
    std::fs::write(&path, serde_json::to_vec(&list).unwrap()).unwrap();
    let out = std::process::Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tools/check_json_outputs.py"
        ))
        .arg(&path)
        .output()
        .expect("python3 runs (CI installs the jsonschema package)");
    let _ = std::fs::remove_file(&path);
    assert!(
        out.status.success(),
        "validator: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn content(v: &Value) -> String {
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("no content: {v}"))
        .to_string()
}

fn finish(v: &Value) -> &str {
    v["choices"][0]["finish_reason"].as_str().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_schemas_valid_by_construction() {
    let state = server();
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/structured_schemas.json"
    );
    let list: Vec<Value> = serde_json::from_slice(&std::fs::read(fixture).unwrap()).unwrap();
    assert_eq!(list.len(), 50);

    // The model alone writes noise: the same request without a format is
    // not JSON, so what follows is the constraint's doing.
    let mut free = chat(json!(null), 40, None);
    free.as_object_mut().unwrap().remove("response_format");
    let (st, v) = post(&state, "/v1/chat/completions", &free).await;
    assert_eq!(st, 200, "{v}");
    assert!(serde_json::from_str::<Value>(&content(&v)).is_err(), "{v}");

    let mut cases = Vec::new();
    for (i, c) in list.iter().enumerate() {
        let name = c["name"].as_str().unwrap().to_string();
        let schema = c["schema"].clone();
        // Even cases greedy, odd ones sampled (a seed each).
        let sampled = (i % 2 == 1).then_some(i as u64 + 1);
        let (st, v) = post(
            &state,
            "/v1/chat/completions",
            &chat(schema_format(&schema), 400, sampled),
        )
        .await;
        assert_eq!(st, 200, "{name}: {v}");
        assert_eq!(finish(&v), "stop", "{name}: {v}");
        cases.push((name, schema, content(&v)));
    }
    validate(&cases);
}

/// JSON that always ends (issue 39): the 16 schemas of
/// `tests/data/structured_schemas_open.json` bound nothing but free strings
/// (numbers, arrays and formats are open, as clients write them). Before
/// the number cap, the random model wrote digits until `max_tokens` in most
/// of them. Even cases greedy, odd ones sampled: at least 80 % of the
/// answers must finish `stop`, and every `stop` must be valid JSON matching
/// its schema (a `length` is a cut answer, never claimed complete).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_schemas_end_with_stop() {
    let state = server();
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/structured_schemas_open.json"
    );
    let list: Vec<Value> = serde_json::from_slice(&std::fs::read(fixture).unwrap()).unwrap();
    assert_eq!(list.len(), 16);
    let (mut runs, mut cases, mut cut) = (0, Vec::new(), Vec::new());
    for (i, c) in list.iter().enumerate() {
        let name = c["name"].as_str().unwrap();
        let schema = c["schema"].clone();
        // Even cases greedy, odd ones sampled (a seed each).
        let sampled = (i % 2 == 1).then_some(i as u64 + 1);
        let (st, v) = post(
            &state,
            "/v1/chat/completions",
            &chat(schema_format(&schema), 128, sampled),
        )
        .await;
        assert_eq!(st, 200, "{name}: {v}");
        runs += 1;
        match finish(&v) {
            "stop" => cases.push((name.to_string(), schema, content(&v))),
            "length" => cut.push(format!("{name}: {}", content(&v))),
            other => panic!("{name}: finish {other}: {v}"),
        }
    }
    eprintln!("{} of {runs} answers finished `stop`; cut:", cases.len());
    for c in &cut {
        eprintln!("  {c}");
    }
    assert!(
        cases.len() * 5 >= runs * 4,
        "{} of {runs} finished: {cut:#?}",
        cases.len()
    );
    validate(&cases);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_object_and_responses_text_format() {
    let state = server();
    // Any object: its keys are free strings, which a random model may not
    // close within the budget. Each answer is then a complete object
    // (`stop`) or a cut one (`length`); some seeds must finish.
    let mut complete = 0;
    for seed in 1..=4 {
        let (st, v) = post(
            &state,
            "/v1/chat/completions",
            &chat(json!({"type": "json_object"}), 60, Some(seed)),
        )
        .await;
        assert_eq!(st, 200, "{v}");
        let text = content(&v);
        assert!(text.starts_with('{'), "{v}");
        if finish(&v) == "stop" {
            let obj: Value = serde_json::from_str(&text).unwrap();
            assert!(obj.is_object(), "{obj}");
            complete += 1;
        } else {
            assert_eq!(finish(&v), "length", "{v}");
            assert!(serde_json::from_str::<Value>(&text).is_err(), "{v}");
        }
    }
    assert!(complete > 0, "no seed closed its object in 60 tokens");

    let schema = json!({"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 8},
        "temp": {"type": "integer", "minimum": -40, "maximum": 50}},
        "required": ["city", "temp"], "additionalProperties": false});
    let (st, v) = post(
        &state,
        "/v1/responses",
        &json!({
            "input": "Weather as JSON.",
            "reasoning": {"effort": "none"},
            "max_output_tokens": 300,
            "text": {"format": {"type": "json_schema", "name": "w", "schema": schema, "strict": true}},
        }),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["status"], "completed", "{v}");
    let text = v["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["type"] == "message")
        .flat_map(|o| o["content"].as_array().unwrap())
        .filter_map(|c| c["text"].as_str())
        .collect::<String>();
    validate(&[("responses".into(), schema, text)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsupported_or_malformed_schema_is_400_naming_the_part() {
    let state = server();
    let cases = [
        (
            schema_format(
                &json!({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}),
            ),
            "not",
        ),
        (
            schema_format(&json!({"type": "string", "format": "credit-card", "pattern": "("})),
            "json_schema.schema",
        ),
        (
            schema_format(&json!({"$ref": "#/$defs/missing"})),
            "missing",
        ),
        (schema_format(&json!("a string")), "json_schema.schema"),
        (json!({"type": "xml"}), "xml"),
        (json!({"type": "json_schema"}), "json_schema"),
        (json!("json"), "response_format"),
    ];
    for (format, part) in cases {
        let (st, v) = post(
            &state,
            "/v1/chat/completions",
            &chat(format.clone(), 10, None),
        )
        .await;
        assert_eq!(st, 400, "{format}: {v}");
        let msg = v["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains(part), "{format}: {msg}");
    }
    let (st, v) = post(
        &state,
        "/v1/responses",
        &json!({"input": "x", "text": {"format": {"type": "json_schema", "schema": {"type": "object", "properties": {"a": {"not": {}}}}}}}),
    )
    .await;
    assert_eq!(st, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("text.format.schema"),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_is_length_with_the_partial_text() {
    let state = server();
    let schema = json!({"type": "object", "properties": {
        "items": {"type": "array", "minItems": 3, "items": {"type": "string", "maxLength": 6}}},
        "required": ["items"]});
    // max_tokens cuts the object open: `length`, the partial text, which
    // is the start of a valid answer but not one.
    let (st, v) = post(
        &state,
        "/v1/chat/completions",
        &chat(schema_format(&schema), 4, None),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(finish(&v), "length", "{v}");
    let partial = content(&v);
    assert!(partial.starts_with("{\"items\""), "{partial}");
    assert!(
        serde_json::from_str::<Value>(&partial).is_err(),
        "{partial}"
    );

    // A stop sequence inside the JSON cuts it too: still `length`.
    let mut b = chat(schema_format(&schema), 200, None);
    b["stop"] = json!(["["]);
    let (st, v) = post(&state, "/v1/chat/completions", &b).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(finish(&v), "length", "{v}");
    assert_eq!(content(&v), "{\"items\":");

    // Streaming: the last chunk says `length` as well.
    let mut b = chat(schema_format(&schema), 4, None);
    b["stream"] = json!(true);
    let r = warp::test::request()
        .method("POST")
        .path("/v1/chat/completions")
        .header("content-type", "application/json")
        .body(b.to_string())
        .reply(&routes::routes(state.clone()))
        .await;
    let body = String::from_utf8(r.body().to_vec()).unwrap();
    assert!(body.contains("\"finish_reason\":\"length\""), "{body}");
}

fn strict_tool(name: &str, params: Value) -> Value {
    json!({"type": "function", "function": {"name": name, "description": "t", "parameters": params, "strict": true}})
}

/// Strict tools with a forced call: the random model's answer is a DSML
/// block whose arguments match each tool's schema.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_tool_arguments_match_the_schema() {
    let state = server();
    let tools = [
        strict_tool(
            "bash",
            json!({"type": "object", "properties": {
                "command": {"type": "string", "maxLength": 20},
                "timeout": {"type": "integer", "minimum": 1, "maximum": 600}},
                "required": ["command", "timeout"], "additionalProperties": false}),
        ),
        strict_tool(
            "weather",
            json!({"type": "object", "properties": {
                "city": {"enum": ["Paris", "Oslo", "Lima"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "when": {"type": "string", "format": "date"}},
                "required": ["city", "days"], "additionalProperties": false}),
        ),
        strict_tool(
            "plan",
            json!({"type": "object", "properties": {
                "steps": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
                    "type": "object", "properties": {
                        "id": {"type": "integer", "minimum": 0, "maximum": 9},
                        "done": {"type": "boolean"}},
                    "required": ["id", "done"], "additionalProperties": false}},
                "owner": {"type": ["string", "null"], "maxLength": 6}},
                "required": ["steps", "owner"], "additionalProperties": false}),
        ),
    ];
    let mut cases = Vec::new();
    for (i, tool) in tools.iter().enumerate() {
        let name = tool["function"]["name"].as_str().unwrap();
        // Alternately forced by `required` (greedy) and by name (sampled).
        let (choice, sampled) = if i % 2 == 0 {
            (json!("required"), None)
        } else {
            (
                json!({"type": "function", "function": {"name": name}}),
                Some(i as u64 + 3),
            )
        };
        let mut b = chat(json!(null), 300, sampled);
        b.as_object_mut().unwrap().remove("response_format");
        b["tools"] = json!([tool]);
        b["tool_choice"] = choice.clone();
        // One call: a random model repeats invokes until the budget.
        b["parallel_tool_calls"] = json!(false);
        let (st, v) = post(&state, "/v1/chat/completions", &b).await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(finish(&v), "tool_calls", "{name} {choice}: {v}");
        let calls = v["choices"][0]["message"]["tool_calls"].as_array().unwrap();
        assert!(!calls.is_empty(), "{v}");
        for c in calls {
            assert_eq!(c["function"]["name"], name, "{v}");
            cases.push((
                format!("{name} {choice}"),
                tool["function"]["parameters"].clone(),
                c["function"]["arguments"].as_str().unwrap().to_string(),
            ));
        }
    }
    validate(&cases);

    // An unsupported parameter schema is a 400 naming the parameter.
    let mut b = chat(json!(null), 10, None);
    b.as_object_mut().unwrap().remove("response_format");
    b["tools"] = json!([strict_tool(
        "f",
        json!({"type": "object", "properties": {"x": {"not": {}}}, "required": ["x"]})
    )]);
    let (st, v) = post(&state, "/v1/chat/completions", &b).await;
    assert_eq!(st, 400, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("tools[0].properties.x") && msg.contains("not"),
        "{msg}"
    );
}

/// The lazy grammar (no forced call) over the real vocabulary: the DSML
/// block of PROMPT.md §5, raw string parameter included, is accepted token
/// by token after its first `｜DSML｜`; a block whose `timeout` breaks the
/// schema, or that names an undeclared tool, is refused where it goes wrong.
#[test]
fn the_dsml_grammar_takes_valid_blocks_and_refuses_bad_ones() {
    use ds4::constrain::{GrammarEngine, OutputGrammar};
    use ds4::server::strict;

    let model = common::tiny_model(Variant::Q8);
    let tok = Tokenizer::from_gguf(&model.file).unwrap();
    let engine = GrammarEngine::new(&tok).unwrap();
    let body = json!({"tools": [
        strict_tool("bash", json!({"type": "object", "properties": {
            "command": {"type": "string"},
            "timeout": {"type": "integer", "minimum": 1, "maximum": 600}},
            "required": ["command"]})),
        {"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}},
    ]});
    let g = strict::parse(body.as_object().unwrap()).unwrap().unwrap();
    assert!(!g.forced);
    let grammar = OutputGrammar::Lark(g.lark(tok.specials().dsml, ds4::chat::Dialect::V4));
    // How far `text` (what follows the block's first `｜DSML｜`) gets.
    let run = |text: &str| -> (usize, usize, bool) {
        let ids = tok.encode_chat(text);
        let mut c = engine.constraint(&grammar).unwrap();
        for (i, &t) in ids.iter().enumerate() {
            if !c.allowed().unwrap().is_allowed(t) {
                return (i, ids.len(), false);
            }
            c.commit(t).unwrap();
        }
        (ids.len(), ids.len(), c.accepting())
    };
    let good = "tool_calls>\n<｜DSML｜invoke name=\"bash\">\n<｜DSML｜parameter name=\"command\" string=\"true\">ls -la && echo \"</b>\" > x</｜DSML｜parameter>\n<｜DSML｜parameter name=\"timeout\" string=\"false\">10</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"read\">\n<｜DSML｜parameter name=\"paths\" string=\"false\">[\"a.c\",\"b.c\"]</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
    let (at, n, complete) = run(good);
    assert_eq!((at, complete), (n, true), "stopped at token {at} of {n}");
    for bad in [
        good.replace(">10<", ">9999<"),
        good.replace(">10<", ">\"10\"<"),
        good.replace("name=\"read\"", "name=\"write\""),
    ] {
        let (at, n, complete) = run(&bad);
        assert!(at < n && !complete, "{bad}: accepted");
    }
}

/// `ds4 --json-schema FILE` on the tiny model: the answer is JSON matching
/// the schema; a cut answer says so on stderr; an unsupported schema is a
/// one-line error before the model loads.
#[test]
fn cli_json_schema() {
    use std::process::Command;
    let model = common::tiny_model_path(Variant::Q8);
    let dir = std::env::temp_dir().join(format!("ds4-cli-schema-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let schema = json!({"type": "object", "properties": {
        "n": {"type": "integer", "minimum": 0, "maximum": 9},
        "tags": {"type": "array", "maxItems": 2, "items": {"enum": ["a", "b"]}}},
        "required": ["n", "tags"], "additionalProperties": false});
    let good = dir.join("good.json");
    std::fs::write(&good, schema.to_string()).unwrap();
    let bad = dir.join("bad.json");
    std::fs::write(&bad, r#"{"type":"object","properties":{"x":{"not":{}}}}"#).unwrap();
    let ds4 = |schema: &std::path::Path, n: &str| {
        Command::new(env!("CARGO_BIN_EXE_ds4"))
            .arg("-m")
            .arg(&model)
            .args([
                "-p",
                "JSON please",
                "--nothink",
                "--temp",
                "0",
                "-c",
                "256",
                "-n",
                n,
            ])
            .arg("--json-schema")
            .arg(schema)
            .output()
            .unwrap()
    };
    let o = ds4(&good, "100");
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{err}");
    let out = String::from_utf8(o.stdout).unwrap();
    validate(&[("cli".into(), schema.clone(), out.trim_end().to_string())]);
    assert!(!err.contains("was cut"), "{err}");

    let o = ds4(&good, "2");
    assert!(String::from_utf8_lossy(&o.stderr).contains("was cut before it completed"));

    let o = ds4(&bad, "5");
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("unsupported schema") && err.contains("not"),
        "{err}"
    );
    assert!(!err.contains("loaded"), "checked before loading: {err}");
    std::fs::remove_dir_all(&dir).ok();
}
