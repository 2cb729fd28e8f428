//! The tool schema lines of a request (PROMPT.md §4.1), copied from the
//! request bytes so the prompt shows each schema exactly as the client
//! sent it; Responses namespaces and `tool_search` are flattened here.

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::bad;
use crate::server::error::ApiError;

#[derive(Deserialize)]
struct RawTools<'a> {
    #[serde(borrow, default)]
    tools: Option<Vec<&'a RawValue>>,
}

#[derive(Deserialize)]
struct RawFunction<'a> {
    #[serde(borrow)]
    function: &'a RawValue,
}

/// Schema lines of PROMPT.md §4.1, copied from the request bytes.
pub(super) fn tool_lines(body: &[u8]) -> Result<Vec<String>, ApiError> {
    let text = std::str::from_utf8(body).map_err(|_| bad())?;
    let raw: RawTools = serde_json::from_str(text).map_err(|_| bad())?;
    let mut out = Vec::new();
    for t in raw.tools.unwrap_or_default() {
        let v: Value = serde_json::from_str(t.get()).map_err(|_| bad())?;
        let Value::Object(o) = &v else {
            return Err(bad());
        };
        if o.contains_key("function") {
            let f: RawFunction = serde_json::from_str(t.get()).map_err(|_| bad())?;
            out.push(f.function.get().to_string());
        } else if o.get("type").and_then(Value::as_str) == Some("namespace") {
            let ns = o.get("name").and_then(Value::as_str).unwrap_or("");
            for inner in o
                .get("tools")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let name = inner.get("name").and_then(Value::as_str).unwrap_or("");
                let desc = inner
                    .get("description")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let params = inner
                    .get("parameters")
                    .or_else(|| inner.get("input_schema"));
                out.push(schema_line(&format!("{ns}{name}"), desc, params));
            }
        } else if o.get("type").and_then(Value::as_str) == Some("tool_search") {
            let desc = o
                .get("description")
                .and_then(Value::as_str)
                .unwrap_or("Search available tools.");
            out.push(schema_line("tool_search", desc, o.get("parameters")));
        } else {
            out.push(t.get().to_string());
        }
    }
    Ok(out)
}

/// The schema line of a tool the request does not give as a `function`
/// object: its name, description and parameters (an empty object schema
/// when absent), in that order.
fn schema_line(name: &str, desc: &str, params: Option<&Value>) -> String {
    let params = params
        .map(|p| p.to_string())
        .unwrap_or_else(|| r#"{"type":"object","properties":{}}"#.into());
    format!(
        "{{\"name\":{},\"description\":{},\"parameters\":{}}}",
        Value::String(name.into()),
        Value::String(desc.into()),
        params
    )
}
