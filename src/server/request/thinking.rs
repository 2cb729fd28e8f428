//! The thinking mode of a request and the V4.1 thinking level it names
//! (SERVER.md §4.2): `thinking`, `think`, the effort fields, the model-name
//! defaults and the Think Max context rule.

use serde_json::{Map, Value};

use super::{bad, opt_bool, Api, ThinkLevel};
use crate::chat::ThinkMode;
use crate::server::error::ApiError;

/// What the thinking fields said so far.
struct Thinking {
    enabled: bool,
    max: bool,
    none_effort: bool,
    explicit: bool,
    /// The V4.1 level of the last effort given.
    level: Option<u8>,
}

impl Thinking {
    fn new() -> Thinking {
        Thinking {
            enabled: true,
            max: false,
            none_effort: false,
            explicit: false,
            level: None,
        }
    }

    /// `thinking`: bool, `{"type":"enabled"|"disabled"}`, or null.
    fn thinking_field(&mut self, m: &Map<String, Value>) -> Result<(), ApiError> {
        match m.get("thinking") {
            None => {}
            Some(Value::Bool(b)) => {
                self.enabled = *b;
                self.explicit = true;
            }
            Some(Value::Null) => self.explicit = true,
            Some(Value::Object(o)) => {
                match o.get("type").and_then(Value::as_str) {
                    Some("enabled") => self.enabled = true,
                    Some("disabled") => self.enabled = false,
                    _ => {}
                }
                self.explicit = true;
            }
            Some(_) => return Err(bad()),
        }
        Ok(())
    }

    /// An effort name (SERVER.md §4.2); null leaves things unchanged.
    fn effort(&mut self, v: Option<&Value>) -> Result<(), ApiError> {
        match v {
            None | Some(Value::Null) => Ok(()),
            Some(Value::String(s)) => {
                self.level = crate::chat::v41::level_of_name(s);
                match s.as_str() {
                    "max" => {
                        self.max = true;
                        self.none_effort = false
                    }
                    "xhigh" | "high" | "medium" | "low" | "minimal" => {
                        self.max = false;
                        self.none_effort = false
                    }
                    "none" => self.none_effort = true,
                    _ => return Err(bad()),
                }
                Ok(())
            }
            // A V4.1 level, 0 (none) to 100 (max), as the official encoder
            // takes it; on V4 it picks none, high or max.
            Some(Value::Number(n)) => {
                let l = n
                    .as_u64()
                    .filter(|&l| l <= 100)
                    .ok_or_else(|| ApiError::invalid("reasoning effort must be 0..100"))?
                    as u8;
                self.level = Some(l);
                self.none_effort = l == 0;
                self.max = l >= 100;
                Ok(())
            }
            Some(_) => Err(bad()),
        }
    }

    fn think_level(&self) -> ThinkLevel {
        ThinkLevel {
            effort: self.level,
            explicit: self.explicit || self.level.is_some(),
        }
    }

    fn mode(&self, model: &str, ctx: usize) -> ThinkMode {
        let mut enabled = self.enabled;
        if !self.explicit && model == "deepseek-chat" {
            enabled = false;
        }
        if !self.explicit && model == "deepseek-reasoner" {
            enabled = true;
        }
        let mode = if !enabled || self.none_effort {
            ThinkMode::None
        } else if self.max {
            ThinkMode::Max
        } else {
            ThinkMode::High
        };
        mode.effective(ctx)
    }
}

/// The thinking mode of a request, from the fields its API reads
/// (SERVER.md §4.2), plus whether a Responses client opted into reasoning
/// summaries. Chat and completions read `thinking`, `think` and
/// `reasoning_effort`; Anthropic reads `thinking`, `output_config.effort`
/// and `reasoning_effort`; Responses reads only `reasoning.effort` and
/// `reasoning.summary`. The model-name defaults and the Think Max context
/// rule then apply alike.
pub(super) fn thinking(
    m: &Map<String, Value>,
    model: &str,
    api: Api,
    ctx: usize,
) -> Result<(ThinkMode, bool, ThinkLevel), ApiError> {
    let mut th = Thinking::new();
    let mut summary = false;
    if api == Api::Responses {
        match m.get("reasoning") {
            None | Some(Value::Null) => {}
            Some(Value::Object(r)) => {
                if let Some(e) = r.get("effort").filter(|e| !e.is_null()) {
                    th.explicit = true;
                    if e.as_str() == Some("none") {
                        th.enabled = false;
                    }
                    th.effort(Some(e))?;
                }
                summary = matches!(
                    r.get("summary").and_then(Value::as_str),
                    Some("auto" | "concise" | "detailed")
                );
            }
            Some(_) => return Err(bad()),
        }
        return Ok((th.mode(model, ctx), summary, th.think_level()));
    }
    th.thinking_field(m)?;
    if api == Api::Messages {
        if let Some(Value::Object(oc)) = m.get("output_config") {
            th.effort(oc.get("effort"))?;
        }
    } else if let Some(b) = opt_bool(m, "think")? {
        th.enabled = b;
        th.explicit = true;
    }
    th.effort(m.get("reasoning_effort"))?;
    Ok((th.mode(model, ctx), summary, th.think_level()))
}
