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

pub mod bounds;
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
/// `x-guidance` member) and its string formats bounded
/// ([`bounds::bound_formats`]), for schemas embedded in a Lark grammar
/// (`%json`).
pub fn with_layout(schema: &Value) -> Value {
    let mut s = schema.clone();
    bounds::bound_formats(&mut s);
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
            OutputGrammar::JsonSchema(v) => {
                let mut v = v.clone();
                bounds::bound_formats(&mut v);
                v
            }
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
    digits: Arc<Digits>,
}

/// What the number cap ([`bounds`]) needs of the vocabulary.
struct Digits {
    env: TokEnv,
    /// Leading ASCII digits of each token.
    lead: Vec<u8>,
    /// The most leading digits any token has.
    most: u32,
}

impl GrammarEngine {
    pub fn new(tok: &Tokenizer) -> Result<GrammarEngine, ConstrainError> {
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(vocab::token_trie(tok)));
        let trie = env.tok_trie();
        let (lead, most) = bounds::lead_digits(|t| trie.token(t).to_vec(), trie.vocab_size());
        Ok(GrammarEngine {
            factory: quiet_factory(&env)?,
            vocab_size: tok.vocab_size(),
            digits: Arc::new(Digits { env, lead, most }),
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
        // The number cap follows JSON text; a Lark grammar (the DSML tool
        // block) has raw text that is not JSON.
        let json = !matches!(g, OutputGrammar::Lark(_));
        Ok(Constraint {
            matcher,
            vocab_size: self.vocab_size,
            digits: json.then(|| (self.digits.clone(), bounds::DigitRun::default())),
        })
    }
}

/// The grammar state of one generation: which tokens may come next, and the
/// tokens taken so far.
pub struct Constraint {
    matcher: Matcher,
    vocab_size: usize,
    /// The number cap of a JSON grammar, where its text stands.
    digits: Option<(Arc<Digits>, bounds::DigitRun)>,
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
        let n = logits.len().min(self.vocab_size);
        // The cap can bite only near the end of a long run of digits.
        let cap = match &self.digits {
            Some((d, at)) if d.most > at.room() => Some((&d.lead, at)),
            _ => None,
        };
        if let Some((lead, at)) = cap {
            let keep = |i: usize| !at.too_long(lead.get(i).copied().unwrap_or(0));
            if fill_allowed(&allowed, logits, n, out, keep) {
                return Ok(true);
            }
            // Only over-long runs may continue: the schema needs the digits.
        }
        Ok(fill_allowed(&allowed, logits, n, out, |_| true))
    }

    /// Advances the grammar past `token` (one the mask allowed).
    pub fn commit(&mut self, token: u32) -> Result<(), ConstrainError> {
        self.matcher
            .consume_token(token)
            .map_err(ConstrainError::from_llg)?;
        if let Some((d, at)) = &mut self.digits {
            at.advance(d.env.tok_trie().token(token));
        }
        Ok(())
    }

    /// The output so far is a complete match (it may stop here).
    pub fn accepting(&mut self) -> bool {
        self.matcher.is_stopped() && self.matcher.get_error().is_none()
            || self.matcher.is_accepting().unwrap_or(false)
    }
}

/// Copies into `out` (all −∞) the logits of the tokens `allowed` has and
/// `keep` accepts, below `n`; returns whether there was any.
fn fill_allowed(
    allowed: &SimpleVob,
    logits: &[f32],
    n: usize,
    out: &mut [f32],
    keep: impl Fn(usize) -> bool,
) -> bool {
    let mut any = false;
    // Walk the set bits a 32-bit word at a time: inside a JSON string most
    // of the vocabulary is allowed, elsewhere almost none of it.
    for (w, &word) in allowed.as_slice().iter().enumerate() {
        let mut bits = word;
        while bits != 0 {
            let i = w * 32 + bits.trailing_zeros() as usize;
            bits &= bits - 1;
            if i < n && keep(i) {
                out[i] = logits[i];
                any = true;
            }
        }
    }
    any
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
