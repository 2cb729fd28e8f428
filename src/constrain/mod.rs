//! Grammar-constrained decoding (structured output): a JSON schema, or "any
//! JSON object", compiled by the `llguidance` crate into a matcher that says,
//! before each token, which tokens of our vocabulary keep the output inside
//! the grammar. The sampler then draws only among those (generate's
//! `Constrained` picker), so the finished output matches the schema by
//! construction. docs/STRUCTURED_OUTPUT.md says why llguidance and what is
//! supported.
//!
//! Two steps, as the crate intends: a [`GrammarEngine`] built once per
//! tokenizer (the token trie of [`vocab`] and llguidance's per-vocabulary
//! tables), then one [`Constraint`] per request, cheap to create. Schemas are
//! checked early with [`check`] (no tokenizer needed) so the server can turn
//! an unsupported one into a 400 before the request is queued.

pub mod vocab;

use std::sync::{Arc, OnceLock};

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, SimpleVob, TokEnv};
use llguidance::{JsonCompileOptions, Matcher, ParserFactory};
use serde_json::Value;

use crate::tokenizer::Tokenizer;

/// What the output must be.
#[derive(Clone, Debug, PartialEq)]
pub enum OutputGrammar {
    /// Any JSON object (OpenAI `{"type":"json_object"}`).
    JsonObject,
    /// JSON matching this schema (OpenAI `json_schema`).
    JsonSchema(Value),
    /// A grammar in llguidance's Lark syntax (the DSML tool-call block of
    /// strict tools, built by the server; it names token ids, so it is
    /// compiled against the real vocabulary only).
    Lark(String),
}

/// A grammar the engine cannot use; the text names the unsupported part
/// (llguidance's own words, e.g. `Unimplemented keys: ["not"]`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConstrainError(pub String);

impl ConstrainError {
    fn from_llg(e: impl std::fmt::Display) -> ConstrainError {
        ConstrainError(e.to_string())
    }
}

/// How JSON is laid out. Compact separators and no free whitespace: a model
/// cannot fill its token budget with blanks between the values (random test
/// models otherwise do), and OpenAI's own structured output is compact too.
fn json_options() -> JsonCompileOptions {
    JsonCompileOptions {
        item_separator: ",".into(),
        key_separator: ":".into(),
        whitespace_flexible: false,
        ..JsonCompileOptions::default()
    }
}

/// `schema` with the server's JSON layout attached (llguidance reads its
/// `x-guidance` member), for schemas embedded in a Lark grammar (`%json`).
pub fn with_layout(schema: &Value) -> Value {
    let mut s = schema.clone();
    if s.is_object() {
        json_options().apply_to(&mut s);
    }
    s
}

impl OutputGrammar {
    /// The llguidance grammar; our layout options replace any `x-guidance`
    /// a client sent (the layout is the server's choice, not the client's).
    pub(crate) fn top_level(&self) -> Result<TopLevelGrammar, ConstrainError> {
        let mut schema = match self {
            OutputGrammar::JsonObject => serde_json::json!({"type": "object"}),
            OutputGrammar::JsonSchema(v) => v.clone(),
            OutputGrammar::Lark(text) => return Ok(TopLevelGrammar::from_lark(text.clone())),
        };
        match &mut schema {
            Value::Object(_) => json_options().apply_to(&mut schema),
            // `true` is "any JSON value", the empty schema.
            Value::Bool(true) => {
                schema = serde_json::json!({});
                json_options().apply_to(&mut schema);
            }
            Value::Bool(false) => {
                return Err(ConstrainError(
                    "the schema `false` allows no value at all".into(),
                ))
            }
            _ => {
                return Err(ConstrainError(
                    "the schema must be a JSON object (or a boolean)".into(),
                ))
            }
        }
        Ok(TopLevelGrammar::from_json_schema(schema))
    }
}

/// Compiles `g` against a 256-token byte vocabulary: every schema error
/// llguidance reports (unsupported keywords, bad `$ref`, impossible bounds)
/// shows here, without the model's tokenizer and before any work is queued.
pub fn check(g: &OutputGrammar) -> Result<(), ConstrainError> {
    static BYTES: OnceLock<Result<ParserFactory, String>> = OnceLock::new();
    let factory = BYTES
        .get_or_init(|| {
            let env: TokEnv = ApproximateTokEnv::single_byte_env();
            quiet_factory(&env).map_err(|e| e.0)
        })
        .as_ref()
        .map_err(|e| ConstrainError(e.clone()))?;
    let parser = factory
        .create_parser(g.top_level()?)
        .map_err(ConstrainError::from_llg)?;
    let m = Matcher::new(Ok(parser));
    match m.get_error() {
        Some(e) => Err(ConstrainError(e)),
        None => Ok(()),
    }
}

/// A factory that reports errors to us, not to stderr.
fn quiet_factory(env: &TokEnv) -> Result<ParserFactory, ConstrainError> {
    let mut f = ParserFactory::new_simple(env).map_err(ConstrainError::from_llg)?;
    f.set_stderr_log_level(0);
    f.set_buffer_log_level(0);
    Ok(f)
}

/// llguidance's tables for one vocabulary; build once per tokenizer (about
/// a tenth of a second for the 129k V4 vocabulary) and share.
pub struct GrammarEngine {
    factory: ParserFactory,
    vocab_size: usize,
}

impl GrammarEngine {
    pub fn new(tok: &Tokenizer) -> Result<GrammarEngine, ConstrainError> {
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(vocab::token_trie(tok)));
        Ok(GrammarEngine {
            factory: quiet_factory(&env)?,
            vocab_size: tok.vocab_size(),
        })
    }

    /// A fresh matcher for one generation.
    pub fn constraint(&self, g: &OutputGrammar) -> Result<Constraint, ConstrainError> {
        let parser = self
            .factory
            .create_parser(g.top_level()?)
            .map_err(ConstrainError::from_llg)?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(ConstrainError(e));
        }
        Ok(Constraint {
            matcher,
            vocab_size: self.vocab_size,
        })
    }
}

/// The grammar state of one generation: which tokens may come next, and the
/// tokens taken so far.
pub struct Constraint {
    matcher: Matcher,
    vocab_size: usize,
}

impl Constraint {
    /// The tokens allowed next; EOS is among them exactly when the output so
    /// far is complete. Empty means a dead end (nothing can continue it).
    pub fn allowed(&mut self) -> Result<SimpleVob, ConstrainError> {
        self.matcher
            .compute_mask_or_eos()
            .map_err(ConstrainError::from_llg)
    }

    /// Writes `logits` into `out` with every token the grammar forbids set to
    /// −∞; returns whether any token is allowed.
    pub fn mask_logits(
        &mut self,
        logits: &[f32],
        out: &mut Vec<f32>,
    ) -> Result<bool, ConstrainError> {
        let allowed = self.allowed()?;
        out.clear();
        out.resize(logits.len(), f32::NEG_INFINITY);
        let mut any = false;
        let n = logits.len().min(self.vocab_size);
        // Walk the set bits a 32-bit word at a time: inside a JSON string
        // most of the vocabulary is allowed, elsewhere almost none of it.
        for (w, &word) in allowed.as_slice().iter().enumerate() {
            let mut bits = word;
            while bits != 0 {
                let i = w * 32 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if i < n {
                    out[i] = logits[i];
                    any = true;
                }
            }
        }
        Ok(any)
    }

    /// Advances the grammar past `token` (one the mask allowed).
    pub fn commit(&mut self, token: u32) -> Result<(), ConstrainError> {
        self.matcher
            .consume_token(token)
            .map_err(ConstrainError::from_llg)
    }

    /// The output so far is a complete match (it may stop here).
    pub fn accepting(&mut self) -> bool {
        self.matcher.is_stopped() && self.matcher.get_error().is_none()
            || self.matcher.is_accepting().unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unsupported_keyword_is_named() {
        let e = check(&OutputGrammar::JsonSchema(
            json!({"type":"object","properties":{"a":{"not":{"type":"string"}}}}),
        ))
        .unwrap_err();
        assert!(e.0.contains("not"), "{e}");
        assert!(check(&OutputGrammar::JsonSchema(json!([1, 2]))).is_err());
        assert!(check(&OutputGrammar::JsonObject).is_ok());
    }
}
