//! What a chat or completions request asks to be scored: `logprobs`,
//! `top_logprobs`, completions `echo` and a prompt of token ids
//! (docs/CLIENTS.md § Log-probabilities). The job's scoring itself is
//! `server/scoring.rs`.

use serde_json::{Map, Value};

use super::opt_bool_or_null;
use crate::server::error::ApiError;

/// What a chat or completions request asks to be scored (docs/CLIENTS.md
/// § Log-probabilities).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scoring {
    /// Log-probabilities wanted, with this many alternatives per token.
    pub top: Option<usize>,
    /// Completions `echo`: the prompt comes back before the completion,
    /// scored when `top` is set. Its text is then used raw, without the
    /// chat template.
    pub echo: bool,
    /// A completions prompt given as token ids, used as is (no template).
    pub prompt_ids: Option<Vec<u32>>,
}

impl Scoring {
    /// The prompt is the client's own tokens, not the single-turn chat.
    pub fn raw_prompt(&self) -> bool {
        self.echo || self.prompt_ids.is_some()
    }
}

/// Most alternatives per token a request may ask for (OpenAI's bound).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// A count of alternatives: an integer in `0..=20`, else a 400 naming `key`.
fn top_count(v: &Value, key: &str) -> Result<usize, ApiError> {
    let n = match v {
        Value::Number(n) => n.as_i64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && f.abs() < 1e15)
                .map(|f| f as i64)
        }),
        _ => None,
    };
    match n {
        Some(n) if (0..=MAX_TOP_LOGPROBS as i64).contains(&n) => Ok(n as usize),
        Some(n) => Err(ApiError::invalid(&format!(
            "{key} must be between 0 and {MAX_TOP_LOGPROBS}, got {n}"
        ))),
        None => Err(ApiError::invalid(&format!(
            "{key} must be an integer between 0 and {MAX_TOP_LOGPROBS}"
        ))),
    }
}

/// Chat: `logprobs` (bool) and `top_logprobs` (0..=20, only with
/// `logprobs: true`, as OpenAI requires).
pub(super) fn chat_scoring(m: &Map<String, Value>) -> Result<Scoring, ApiError> {
    let on = opt_bool_or_null(m, "logprobs")?.unwrap_or(false);
    let top = match m.get("top_logprobs") {
        None | Some(Value::Null) => None,
        Some(v) => Some(top_count(v, "top_logprobs")?),
    };
    if top.is_some() && !on {
        return Err(ApiError::invalid("top_logprobs needs logprobs: true"));
    }
    Ok(Scoring {
        top: on.then(|| top.unwrap_or(0)),
        ..Scoring::default()
    })
}

/// Completions: `logprobs` (0..=20 alternatives), `echo` and a prompt of
/// token ids.
pub(super) fn completion_scoring(m: &Map<String, Value>) -> Result<Scoring, ApiError> {
    let top = match m.get("logprobs") {
        None | Some(Value::Null) => None,
        Some(v) => Some(top_count(v, "logprobs")?),
    };
    Ok(Scoring {
        top,
        echo: opt_bool_or_null(m, "echo")?.unwrap_or(false),
        prompt_ids: prompt_ids(m.get("prompt"))?,
    })
}

/// A prompt of token ids: `[1, 2, 3]`, or `[[1, 2, 3]]` (one prompt per
/// request: a batch of several is refused rather than cut to its first).
fn prompt_ids(v: Option<&Value>) -> Result<Option<Vec<u32>>, ApiError> {
    let ids = |a: &[Value]| -> Result<Vec<u32>, ApiError> {
        a.iter()
            .map(|t| {
                t.as_u64()
                    .and_then(|t| u32::try_from(t).ok())
                    .ok_or_else(|| {
                        ApiError::invalid("prompt token ids must be non-negative integers")
                    })
            })
            .collect()
    };
    let Some(Value::Array(a)) = v else {
        return Ok(None);
    };
    match a.first() {
        Some(Value::Number(_)) => Ok(Some(ids(a)?)),
        Some(Value::Array(first)) if first.iter().all(Value::is_number) => {
            if a.len() > 1 {
                return Err(ApiError::invalid(
                    "one prompt per request: send each prompt of a batch in its own request",
                ));
            }
            Ok(Some(ids(first)?))
        }
        _ => Ok(None),
    }
}
