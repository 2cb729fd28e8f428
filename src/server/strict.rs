//! Strict tool schemas (OpenAI `"strict": true`): the DSML tool-call block
//! (PROMPT.md §5) written as a grammar in llguidance's Lark syntax, so the
//! arguments of a call match the tool's parameter schema by construction.
//!
//! A parameter whose schema is a plain string is written raw
//! (`string="true"`, as the model was trained); every other parameter,
//! constrained strings included, is written as JSON (`string="false"`)
//! under its own schema, which the DSML parser decodes alike. Parameters
//! come in the schema's order, the required ones always. Tools without
//! `strict` keep free parameters, but every invoke names a declared tool.
//!
//! `parallel_tool_calls: false` allows one invoke per block. Without a
//! forced call the grammar waits for the model's first
//! `｜DSML｜` token (the model may answer in text); `tool_choice`
//! `"required"` or a named function makes the block the whole answer.
//! The tags are spelled as the loaded model writes them: V4's
//! `<｜DSML｜tool_calls>`, or V4.1's `<｜DSML｜ calls>` (docs/V41.md).

use serde_json::{Map, Value};

use super::error::ApiError;
use crate::chat::Dialect;
use crate::constrain::{self, OutputGrammar};

#[derive(Clone, Debug, PartialEq)]
struct Param {
    name: String,
    schema: Value,
    required: bool,
    /// Written as raw text (`string="true"`).
    raw: bool,
}

#[derive(Clone, Debug, PartialEq)]
struct Tool {
    name: String,
    /// `None`: not strict, free parameters.
    params: Option<Vec<Param>>,
}

/// The tool-call grammar of one request.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolGrammar {
    tools: Vec<Tool>,
    /// The answer must be a tool block (`tool_choice` required / named).
    pub forced: bool,
    /// `parallel_tool_calls: false`: one invoke per block.
    single: bool,
}

/// The hosted `tool_search` tool as the prompt lists it: free parameters.
static TOOL_SEARCH: std::sync::LazyLock<Map<String, Value>> = std::sync::LazyLock::new(|| {
    let mut m = Map::new();
    m.insert("name".into(), Value::String("tool_search".into()));
    m
});

/// Keys that make a string schema more than "any text".
const STRING_LIMITS: [&str; 6] = [
    "enum",
    "const",
    "pattern",
    "format",
    "minLength",
    "maxLength",
];

fn invalid(at: &str, what: &str) -> ApiError {
    ApiError::invalid(&format!("{at}: {what}"))
}

/// The function object of a tool in any of the wire shapes: chat's
/// `{"type":"function","function":{…}}`, Responses' flat function and
/// Anthropic's `{name, input_schema}`.
fn function_of(t: &Value) -> Option<&Map<String, Value>> {
    let o = t.as_object()?;
    match o.get("function") {
        Some(Value::Object(f)) => Some(f),
        _ => Some(o),
    }
}

fn params_of(at: &str, f: &Map<String, Value>) -> Result<Vec<Param>, ApiError> {
    let schema = f
        .get("parameters")
        .or_else(|| f.get("input_schema"))
        .ok_or_else(|| invalid(at, "a strict tool needs parameters"))?;
    let Some(s) = schema.as_object() else {
        return Err(invalid(at, "parameters must be a JSON schema object"));
    };
    if s.get("type").and_then(Value::as_str) != Some("object") {
        return Err(invalid(
            at,
            "strict parameters must be {\"type\":\"object\"}",
        ));
    }
    let props = match s.get("properties") {
        None => return Ok(Vec::new()),
        Some(Value::Object(p)) => p,
        Some(_) => return Err(invalid(at, "properties must be an object")),
    };
    let required: Vec<&str> = match s.get("required") {
        None => Vec::new(),
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
        Some(_) => return Err(invalid(at, "required must be an array")),
    };
    let mut out = Vec::new();
    for (name, sub) in props {
        let mut sub = sub.clone();
        // A `$ref` inside a parameter points into the top-level `$defs`;
        // each parameter is compiled on its own, so it carries them along.
        if let Value::Object(o) = &mut sub {
            for k in ["$defs", "definitions"] {
                if let Some(d) = s.get(k) {
                    o.entry(k.to_string()).or_insert_with(|| d.clone());
                }
            }
        }
        let raw = sub.get("type").and_then(Value::as_str) == Some("string")
            && STRING_LIMITS.iter().all(|k| sub.get(*k).is_none());
        let pat = format!("{at}.properties.{name}");
        if name.contains(['"', '<', '>', '\n']) {
            return Err(invalid(
                &pat,
                "a parameter name cannot hold '\"', '<', '>' or a newline",
            ));
        }
        constrain::check(&OutputGrammar::JsonSchema(sub.clone()))
            .map_err(|e| invalid(&pat, &format!("unsupported schema: {e}")))?;
        out.push(Param {
            name: name.clone(),
            schema: sub,
            required: required.contains(&name.as_str()),
            raw,
        });
    }
    Ok(out)
}

/// The tool grammar of a request, if any tool is strict or a call is
/// forced; the request's `tools` and `tool_choice` members.
pub fn parse(m: &Map<String, Value>) -> Result<Option<ToolGrammar>, ApiError> {
    let Some(Value::Array(list)) = m.get("tools") else {
        return Ok(None);
    };
    let (forced, only) = match m.get("tool_choice") {
        Some(Value::String(s)) if s == "required" || s == "any" => (true, None),
        Some(Value::Object(o)) if o.get("type").and_then(Value::as_str) == Some("any") => {
            (true, None)
        }
        Some(Value::Object(o)) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .or_else(|| o.get("name"))
                .and_then(Value::as_str);
            (name.is_some(), name.map(String::from))
        }
        _ => (false, None),
    };
    let mut tools = Vec::new();
    let mut any_strict = false;
    // (path in the request, the function object, name prefix)
    let mut fns = Vec::new();
    for (i, t) in list.iter().enumerate() {
        match t.get("type").and_then(Value::as_str) {
            // Responses namespaces: one prompt tool per inner function,
            // named namespace + name (PROMPT.md §4.1).
            Some("namespace") => {
                let ns = t.get("name").and_then(Value::as_str).unwrap_or("");
                for (j, inner) in t
                    .get("tools")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .enumerate()
                {
                    if let Some(f) = inner.as_object() {
                        fns.push((format!("tools[{i}].tools[{j}]"), f, ns));
                    }
                }
            }
            Some("tool_search") => fns.push((format!("tools[{i}]"), &TOOL_SEARCH, "")),
            _ => {
                if let Some(f) = function_of(t) {
                    fns.push((format!("tools[{i}]"), f, ""));
                }
            }
        }
    }
    for (at, f, prefix) in fns {
        let Some(name) = f
            .get("name")
            .and_then(Value::as_str)
            .map(|n| format!("{prefix}{n}"))
        else {
            continue;
        };
        let name = name.as_str();
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        if name.contains(['"', '<', '>', '\n']) {
            return Err(invalid(
                &at,
                "a tool name cannot hold '\"', '<', '>' or a newline",
            ));
        }
        let strict = f.get("strict").and_then(Value::as_bool) == Some(true);
        any_strict |= strict;
        tools.push(Tool {
            name: name.into(),
            params: if strict {
                Some(params_of(&at, f)?)
            } else {
                None
            },
        });
    }
    if let Some(o) = &only {
        if tools.is_empty() {
            return Err(ApiError::invalid(&format!(
                "tool_choice names {o:?}, which is not among the tools"
            )));
        }
    }
    if tools.is_empty() || !(any_strict || forced) {
        return Ok(None);
    }
    let single = m.get("parallel_tool_calls") == Some(&Value::Bool(false));
    Ok(Some(ToolGrammar {
        tools,
        forced,
        single,
    }))
}

/// A Lark string literal.
fn lit(s: &str) -> String {
    Value::String(s.into()).to_string()
}

/// The words after `｜DSML｜` in a dialect's tags: V4 writes
/// `<｜DSML｜tool_calls>`, V4.1 `<｜DSML｜ calls>` (a space, another word;
/// `chat::v41`), and likewise for `invoke` and `parameter`, so a forced or
/// strict call comes out in the spelling the model was trained on and its
/// parser reads back (`server::dsml`).
struct Words {
    calls: &'static str,
    invoke: &'static str,
    param: &'static str,
}

fn words(dialect: Dialect) -> Words {
    match dialect {
        Dialect::V4 => Words {
            calls: "tool_calls",
            invoke: "invoke",
            param: "parameter",
        },
        Dialect::V41 { .. } => Words {
            calls: " calls",
            invoke: " invoke",
            param: " parameter",
        },
    }
}

impl ToolGrammar {
    /// The grammar, `dsml` being the `｜DSML｜` token id, in the tag
    /// spelling of `dialect`. Forced: the whole block from its `<`;
    /// otherwise what follows the first `｜DSML｜`.
    pub fn lark(&self, dsml: u32, dialect: Dialect) -> String {
        let w = words(dialect);
        let d = format!("<[{dsml}]>");
        let mut g = String::new();
        let head = if self.forced {
            format!("\"<\" {d} ")
        } else {
            String::new()
        };
        let invokes = if self.single { "invoke" } else { "invoke+" };
        g += &format!(
            "start: {head}{} {invokes} \"</\" {d} {}\n",
            lit(&format!("{}>\n", w.calls)),
            lit(&format!("{}>", w.calls))
        );
        let alts: Vec<String> = (0..self.tools.len()).map(|i| format!("t{i}")).collect();
        g += &format!(
            "invoke: \"<\" {d} {} ({})\n",
            lit(&format!("{} name=\"", w.invoke)),
            alts.join(" | ")
        );
        // Raw text ends at the `</` before the closing `｜DSML｜` token;
        // no text can hold that token, so the end is unambiguous.
        g += "RAW: /(?s:.*<\\/)/\n";
        g += "NAME: /[^\"<>\\n]{1,64}/\n";
        g += &format!(
            "free: \"<\" {d} {} NAME {} (\"true\" | \"false\") {} RAW {d} {}\n",
            lit(&format!("{} name=\"", w.param)),
            lit("\" string=\""),
            lit("\">"),
            lit(&format!("{}>\n", w.param))
        );
        for (i, t) in self.tools.iter().enumerate() {
            let close = format!("\"</\" {d} {}", lit(&format!("{}>\n", w.invoke)));
            let open = lit(&format!("{}\">\n", t.name));
            match &t.params {
                None => g += &format!("t{i}: {open} free* {close}\n"),
                Some(ps) => {
                    let mut seq = Vec::new();
                    for (j, p) in ps.iter().enumerate() {
                        let rule = format!("t{i}p{j}");
                        let value = if p.raw {
                            format!(
                                "{} RAW {d} {}",
                                lit(&format!("{} name=\"{}\" string=\"true\">", w.param, p.name)),
                                lit(&format!("{}>\n", w.param))
                            )
                        } else {
                            format!(
                                "{} %json {} \"</\" {d} {}",
                                lit(&format!(
                                    "{} name=\"{}\" string=\"false\">",
                                    w.param, p.name
                                )),
                                constrain::with_layout(&p.schema),
                                lit(&format!("{}>\n", w.param))
                            )
                        };
                        g += &format!("{rule}: \"<\" {d} {value}\n");
                        seq.push(if p.required { rule } else { format!("{rule}?") });
                    }
                    g += &format!("t{i}: {open} {} {close}\n", seq.join(" "));
                }
            }
        }
        g
    }
}
