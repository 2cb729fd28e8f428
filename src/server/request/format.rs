//! Structured output: OpenAI `response_format` and Responses `text.format`
//! into the grammar the answer must match, compiled once at parse time so
//! an unsupported schema is a 400 (docs/STRUCTURED_OUTPUT.md).

use serde_json::{Map, Value};

use super::bad;
use crate::constrain::{self, OutputGrammar};
use crate::server::error::ApiError;

/// A structured-output grammar, compiled once here so an unsupported or
/// malformed schema is a 400 naming the part (`at` is where it sat in the
/// request).
fn checked(g: OutputGrammar, at: &str) -> Result<Option<OutputGrammar>, ApiError> {
    match constrain::check(&g) {
        Ok(()) => Ok(Some(g)),
        Err(e) => Err(ApiError::invalid(&format!("{at}: unsupported schema: {e}"))),
    }
}

/// OpenAI `response_format` (chat and completions): `text` (no grammar),
/// `json_object`, or `json_schema` with `{name, schema, strict}`. A
/// `json_schema` without a schema asks for any JSON object. `strict: false`
/// is constrained all the same: the server has no looser mode to offer.
pub(super) fn response_format(m: &Map<String, Value>) -> Result<Option<OutputGrammar>, ApiError> {
    let rf = match m.get("response_format") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(o)) => o,
        Some(_) => return Err(ApiError::invalid("response_format must be an object")),
    };
    match rf.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => checked(OutputGrammar::JsonObject, "response_format"),
        Some("json_schema") => {
            let js = match rf.get("json_schema") {
                Some(Value::Object(o)) => o,
                _ => {
                    return Err(ApiError::invalid(
                        "response_format.json_schema must be an object",
                    ))
                }
            };
            schema_grammar(js.get("schema"), "response_format.json_schema.schema")
        }
        Some(t) => Err(ApiError::invalid(&format!(
            "response_format.type {t:?} is not supported (text, json_object, json_schema)"
        ))),
        None => Err(ApiError::invalid("response_format.type is missing")),
    }
}

/// The `schema` member of a `json_schema` format.
fn schema_grammar(schema: Option<&Value>, at: &str) -> Result<Option<OutputGrammar>, ApiError> {
    match schema {
        None | Some(Value::Null) => checked(OutputGrammar::JsonObject, at),
        Some(v @ (Value::Object(_) | Value::Bool(_))) => {
            checked(OutputGrammar::JsonSchema(v.clone()), at)
        }
        Some(_) => Err(ApiError::invalid(&format!(
            "{at} must be a JSON schema object"
        ))),
    }
}

/// Responses `text.format`: `{"type":"text"}`, `{"type":"json_object"}` or
/// the flat `{"type":"json_schema","name":…,"schema":{…},"strict":…}`.
pub(super) fn text_format(m: &Map<String, Value>) -> Result<Option<OutputGrammar>, ApiError> {
    let f = match m.get("text") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(t)) => match t.get("format") {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::Object(f)) => f,
            Some(_) => return Err(ApiError::invalid("text.format must be an object")),
        },
        Some(_) => return Err(bad()),
    };
    match f.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => checked(OutputGrammar::JsonObject, "text.format"),
        Some("json_schema") => schema_grammar(f.get("schema"), "text.format.schema"),
        Some(t) => Err(ApiError::invalid(&format!(
            "text.format.type {t:?} is not supported (text, json_object, json_schema)"
        ))),
        None => Err(ApiError::invalid("text.format.type is missing")),
    }
}
