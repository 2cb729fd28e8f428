//! The tokenizer over HTTP, in vLLM's shape (docs/CLIENTS.md): `GET
//! /tokenizer_info`, `POST /tokenize`, `POST /detokenize`. Evaluation
//! harnesses (lm-evaluation-harness's `tokenizer_backend=remote`) count
//! context tokens with them, so they split a text exactly as the engine
//! does, with no tokenizer download. Text is encoded as a raw completions
//! prompt is (`scoring::raw_prompt`): chat markers become their tokens.

use std::sync::Arc;

use serde_json::{json, Value};

use super::error::ApiError;
use crate::chat::template::{BOS, EOS};
use crate::tokenizer::Tokenizer;

/// The server's tokenizer, for the routes (a handle so that the options
/// stay `Debug`).
#[derive(Clone)]
pub struct SharedTokenizer(pub Arc<Tokenizer>);

impl std::fmt::Debug for SharedTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokenizer({} tokens)", self.0.vocab_size())
    }
}

fn bad() -> ApiError {
    ApiError::invalid("invalid JSON request")
}

/// `GET /tokenizer_info`.
pub fn info(tok: &Tokenizer, ctx: usize) -> String {
    let v = json!({"tokenizer_class": "ds4", "bos_token": BOS, "eos_token": EOS,
        "pad_token": null, "vocab_size": tok.vocab_size(), "model_max_length": ctx,
        "max_model_len": ctx});
    format!("{v}\n")
}

/// `POST /tokenize`: `{"prompt": TEXT, "add_special_tokens": BOOL}` (the
/// BOS first when true, the default as in vLLM) → `{"tokens", "count",
/// "max_model_len"}`.
pub fn tokenize(tok: &Tokenizer, ctx: usize, body: &[u8]) -> Result<String, ApiError> {
    let v: Value = serde_json::from_slice(body).map_err(|_| bad())?;
    let Some(text) = v.get("prompt").and_then(Value::as_str) else {
        return Err(ApiError::invalid("missing prompt (a string)"));
    };
    let special = match v.get("add_special_tokens") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad()),
    };
    let mut tokens = Vec::new();
    if special {
        tokens.push(tok.specials().bos);
    }
    tokens.extend(tok.encode_chat(text));
    let v = json!({"tokens": tokens, "count": tokens.len(), "max_model_len": ctx});
    Ok(format!("{v}\n"))
}

/// `POST /detokenize`: `{"tokens": [ID…]}` → `{"prompt": TEXT}`.
pub fn detokenize(tok: &Tokenizer, body: &[u8]) -> Result<String, ApiError> {
    let v: Value = serde_json::from_slice(body).map_err(|_| bad())?;
    let Some(list) = v.get("tokens").and_then(Value::as_array) else {
        return Err(ApiError::invalid("missing tokens (an array of token ids)"));
    };
    let vocab = tok.vocab_size();
    let ids = list
        .iter()
        .map(|t| {
            t.as_u64()
                .filter(|&t| t < vocab as u64)
                .map(|t| t as u32)
                .ok_or_else(|| {
                    ApiError::invalid(&format!(
                        "tokens must be ids below the vocabulary size ({vocab})"
                    ))
                })
        })
        .collect::<Result<Vec<u32>, ApiError>>()?;
    let text = String::from_utf8_lossy(&tok.decode(&ids)).into_owned();
    Ok(format!("{}\n", json!({ "prompt": text })))
}
