//! A HF `tokenizer.json` read into the form GGUF stores a vocabulary
//! (`tokenizer.ggml.tokens`, `merges`, `token_type`): what
//! [`super::Tokenizer::from_tokenizer_json`] and the test-model writer
//! (`testmodel::write_model`) both start from.

use std::collections::HashMap;

use serde_json::Value;

/// Token-type values of the llama.cpp convention.
pub const TOKEN_TYPE_NORMAL: i32 = 1;
pub const TOKEN_TYPE_CONTROL: i32 = 3;
pub const TOKEN_TYPE_USER_DEFINED: i32 = 4;

#[derive(Clone, Debug)]
pub struct Vocab {
    pub tokens: Vec<String>,
    pub merges: Vec<String>,
    pub token_types: Vec<i32>,
}

impl Vocab {
    pub fn from_tokenizer_json(bytes: &[u8]) -> Result<Vocab, String> {
        let j: Value = serde_json::from_slice(bytes).map_err(|e| format!("tokenizer.json: {e}"))?;
        let model = &j["model"];
        let vocab = model["vocab"]
            .as_object()
            .ok_or("tokenizer.json: model.vocab missing")?;
        let mut by_id: HashMap<usize, String> = HashMap::new();
        for (tok, id) in vocab {
            let id = id.as_u64().ok_or("tokenizer.json: non-integer vocab id")? as usize;
            by_id.insert(id, tok.clone());
        }
        let mut added: Vec<(usize, String, bool)> = Vec::new();
        for a in j["added_tokens"]
            .as_array()
            .ok_or("tokenizer.json: added_tokens missing")?
        {
            let id = a["id"]
                .as_u64()
                .ok_or("tokenizer.json: added token without id")? as usize;
            let content = a["content"]
                .as_str()
                .ok_or("tokenizer.json: added token without content")?;
            added.push((
                id,
                content.to_string(),
                a["special"].as_bool().unwrap_or(false),
            ));
            by_id.insert(id, content.to_string());
        }
        let n = by_id.keys().max().map_or(0, |m| m + 1);
        let mut tokens = Vec::with_capacity(n);
        for id in 0..n {
            tokens.push(
                by_id
                    .remove(&id)
                    .ok_or_else(|| format!("tokenizer.json: id {id} has no token"))?,
            );
        }
        let mut token_types = vec![TOKEN_TYPE_NORMAL; n];
        for (id, content, special) in &added {
            let bars = (content.starts_with("<｜") && content.ends_with("｜>"))
                || (content.starts_with("<|") && content.ends_with("|>"));
            token_types[*id] = if *special || bars {
                TOKEN_TYPE_CONTROL
            } else {
                TOKEN_TYPE_USER_DEFINED
            };
        }
        let merges = model["merges"]
            .as_array()
            .ok_or("tokenizer.json: model.merges missing")?
            .iter()
            .map(|m| match m {
                Value::String(s) => Ok(s.clone()),
                Value::Array(p) if p.len() == 2 => Ok(format!(
                    "{} {}",
                    p[0].as_str().unwrap_or_default(),
                    p[1].as_str().unwrap_or_default()
                )),
                _ => Err("tokenizer.json: malformed merge".to_string()),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Vocab {
            tokens,
            merges,
            token_types,
        })
    }
}
