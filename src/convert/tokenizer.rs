//! The checkpoint's tokenizer (`tokenizer.json`, `tokenizer_config.json`,
//! in the HuggingFace `tokenizers` format DeepSeek publishes) as the
//! `tokenizer.*` keys of ds4's published files (GGUF.md §3, TOKENIZER.md §1;
//! docs/TOOLS.md, "The tokenizer").
//!
//! The keys, in the published files' order:
//!
//! * `tokenizer.ggml.model` `gpt2` and `tokenizer.ggml.pre` `joyai-llm`
//!   (the pre-tokenizer ds4 hard-codes);
//! * `tokenizer.ggml.tokens`: one string per id `0 .. vocab_size` of
//!   `config.json`: `model.vocab`'s token of that id, or the `added_tokens`
//!   entry's `content`; an id neither names is `[PAD{id}]`, as gguf-py's
//!   converter writes it (the padding rows of a model whose embedding is
//!   larger than its tokenizer). ids at or past `vocab_size` are an error;
//! * `tokenizer.ggml.merges`: `model.merges` in rank order as `"left right"`
//!   (either `"a b"` strings or `["a", "b"]` pairs in the file);
//! * `tokenizer.ggml.token_type`: 1 (normal) for `model.vocab` tokens, 3
//!   (control) for added tokens flagged `special` or spelled `<｜…｜>` /
//!   `<|…|>`, 4 (user-defined) for the other added tokens, and 5 (unused,
//!   gguf-py's type for its `[PAD{id}]` rows) for placeholders;
//! * `tokenizer.ggml.bos_token_id` / `eos_token_id`: the ids of
//!   `tokenizer_config.json`'s `bos_token` / `eos_token` (a string or an
//!   `AddedToken` object), or, without that file or key, of
//!   `<｜begin▁of▁sentence｜>` / `<｜end▁of▁sentence｜>`;
//! * `tokenizer.chat_template`: `tokenizer_config.json`'s `chat_template`
//!   where it has one (a string, or the `default` entry of a list of named
//!   templates).
//!
//! The result is then built into ds4's own [`Tokenizer`], so a tokenizer
//! ds4 could not use (a byte symbol missing, a merge of symbols it does not
//! have, no `<｜User｜>`) is refused before anything is written. Every
//! error names the file and the key.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::ConvertError;
use crate::gguf::{GgufWriter, MetaArray, MetaValue};
use crate::tokenizer::vocab::{TOKEN_TYPE_CONTROL, TOKEN_TYPE_NORMAL, TOKEN_TYPE_USER_DEFINED};
use crate::tokenizer::Tokenizer;

/// The checkpoint's tokenizer file.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// Its configuration (BOS, EOS, chat template); optional.
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";
/// `tokenizer.ggml.pre` of ds4's published files.
pub const PRE: &str = "joyai-llm";
/// Token type of the `[PAD{id}]` placeholders (llama.cpp's "unused").
pub const TOKEN_TYPE_UNUSED: i32 = 5;
/// The BOS and EOS strings used without `tokenizer_config.json`.
pub const BOS: &str = "<｜begin▁of▁sentence｜>";
pub const EOS: &str = "<｜end▁of▁sentence｜>";

/// The tokenizer keys of a converted file.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenizerKeys {
    pub tokens: Vec<String>,
    pub merges: Vec<String>,
    pub token_types: Vec<i32>,
    pub bos: u32,
    pub eos: u32,
    pub chat_template: Option<String>,
    /// How many ids got a `[PAD{id}]` placeholder.
    pub placeholders: usize,
}

fn input_err(file: &Path, msg: String) -> ConvertError {
    ConvertError::Input {
        file: file.display().to_string(),
        msg,
    }
}

/// Reads a JSON file; `None` if it does not exist and `optional`.
fn read_json(file: &Path, optional: bool) -> Result<Option<Value>, ConvertError> {
    let bytes = match std::fs::read(file) {
        Ok(b) => b,
        Err(e) if optional && e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(input_err(
                file,
                "not found: the converted file needs the checkpoint's tokenizer to \
                 tokenize text (copy tokenizer.json and tokenizer_config.json from the \
                 official release into the checkpoint folder)"
                    .into(),
            ))
        }
        Err(e) => return Err(input_err(file, format!("cannot read: {e}"))),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| input_err(file, format!("not JSON: {e}")))
}

/// An id: a non-negative integer.
fn id_of(v: &Value) -> Option<usize> {
    v.as_u64().and_then(|x| usize::try_from(x).ok())
}

fn looks_control(s: &str) -> bool {
    (s.starts_with("<｜") && s.ends_with("｜>")) || (s.starts_with("<|") && s.ends_with("|>"))
}

/// A merge symbol: a non-empty string without a space.
fn symbol(v: &Value) -> Option<&str> {
    v.as_str().filter(|s| !s.is_empty() && !s.contains(' '))
}

impl TokenizerKeys {
    /// Reads `tokenizer.json` and (if present) `tokenizer_config.json` from
    /// the checkpoint folder `dir`, for a model of `n_vocab` ids
    /// (`config.json`'s `vocab_size`).
    pub fn read(dir: &Path, n_vocab: usize) -> Result<TokenizerKeys, ConvertError> {
        let file = dir.join(TOKENIZER_FILE);
        let cfg_file = dir.join(TOKENIZER_CONFIG_FILE);
        let json = read_json(&file, false)?.unwrap_or(Value::Null);
        let cfg = read_json(&cfg_file, true)?;
        TokenizerKeys::from_json(&json, &file, cfg.as_ref().map(|c| (c, cfg_file)), n_vocab)
    }

    /// [`TokenizerKeys::read`] on parsed files (`file` and the config's path
    /// name them in errors).
    pub fn from_json(
        json: &Value,
        file: &Path,
        config: Option<(&Value, PathBuf)>,
        n_vocab: usize,
    ) -> Result<TokenizerKeys, ConvertError> {
        let err = |msg: String| input_err(file, msg);
        let model = json
            .get("model")
            .filter(|m| m.is_object())
            .ok_or_else(|| err("no `model` object".into()))?;
        if let Some(t) = model.get("type") {
            if t.as_str() != Some("BPE") {
                return Err(err(format!(
                    "`model.type` is {t}: only byte-level BPE (\"BPE\") tokenizers convert"
                )));
            }
        }
        let mut slots = Slots::new(file, n_vocab);
        slots.vocab(model)?;
        slots.added(json)?;
        let (tokens, token_types, placeholders) = slots.finish();
        let merges = merges(model, file)?;

        // BOS and EOS: tokenizer_config.json's, else the V4 strings.
        let config = config.as_ref().map(|(c, f)| (*c, f.as_path()));
        let ids: HashMap<&str, u32> = (tokens.iter().enumerate().rev())
            .map(|(i, t)| (t.as_str(), i as u32))
            .collect();
        let bos = special_id(&ids, file, config, "bos_token", BOS)?;
        let eos = special_id(&ids, file, config, "eos_token", EOS)?;
        let chat_template = config.map(chat_template).transpose()?.flatten();
        drop(ids);

        // ds4's own tokenizer must accept it.
        Tokenizer::from_vocab(tokens.clone(), merges.clone(), Some(token_types.clone()))
            .map_err(|e| err(format!("ds4's tokenizer cannot use it: {e}")))?;
        Ok(TokenizerKeys {
            tokens,
            merges,
            token_types,
            bos,
            eos,
            chat_template,
            placeholders,
        })
    }

    /// The keys, in the order of ds4's published files.
    pub fn kvs(&self) -> Vec<(String, MetaValue)> {
        let mut kvs = vec![
            ("tokenizer.ggml.model", MetaValue::String("gpt2".into())),
            ("tokenizer.ggml.pre", MetaValue::String(PRE.into())),
            (
                "tokenizer.ggml.tokens",
                MetaValue::Array(MetaArray::String(self.tokens.clone())),
            ),
            (
                "tokenizer.ggml.merges",
                MetaValue::Array(MetaArray::String(self.merges.clone())),
            ),
            (
                "tokenizer.ggml.token_type",
                MetaValue::Array(MetaArray::I32(self.token_types.clone())),
            ),
            ("tokenizer.ggml.bos_token_id", MetaValue::U32(self.bos)),
            ("tokenizer.ggml.eos_token_id", MetaValue::U32(self.eos)),
        ];
        if let Some(t) = &self.chat_template {
            kvs.push(("tokenizer.chat_template", MetaValue::String(t.clone())));
        }
        kvs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
    }

    /// Adds the keys to `w`, in order.
    pub fn add_to(&self, w: &mut GgufWriter) {
        for (k, v) in self.kvs() {
            w.add_kv(&k, v);
        }
    }
}

/// The token of each id and its type, filled from `model.vocab` and the
/// added tokens of `tokenizer.json` (`file`), for `n` ids.
struct Slots<'f> {
    file: &'f Path,
    slots: Vec<Option<(String, i32)>>,
}

impl<'f> Slots<'f> {
    fn new(file: &'f Path, n: usize) -> Slots<'f> {
        Slots {
            file,
            slots: vec![None; n],
        }
    }

    fn err(&self, msg: String) -> ConvertError {
        input_err(self.file, msg)
    }

    /// An id past the model's vocabulary.
    fn too_big(&self, id: usize, what: &str) -> ConvertError {
        self.err(format!(
            "{what} has id {id}, but config.json's `vocab_size` is {}: the \
             tokenizer is larger than the model's vocabulary",
            self.slots.len()
        ))
    }

    /// `model.vocab`: token → id, every token normal.
    fn vocab(&mut self, model: &Value) -> Result<(), ConvertError> {
        let vocab = model
            .get("vocab")
            .and_then(Value::as_object)
            .ok_or_else(|| self.err("no `model.vocab` object".into()))?;
        for (tok, v) in vocab {
            let id = id_of(v)
                .ok_or_else(|| self.err(format!("`model.vocab`: `{tok}` has id {v}, not an id")))?;
            if id >= self.slots.len() {
                return Err(self.too_big(id, &format!("`model.vocab` token `{tok}`")));
            }
            if let Some((other, _)) = &self.slots[id] {
                return Err(self.err(format!(
                    "`model.vocab`: id {id} is both `{other}` and `{tok}`"
                )));
            }
            self.slots[id] = Some((tok.clone(), TOKEN_TYPE_NORMAL));
        }
        Ok(())
    }

    /// `added_tokens`: control tokens (flagged special, or spelled as
    /// markers) and user-defined ones.
    fn added(&mut self, json: &Value) -> Result<(), ConvertError> {
        let added = json
            .get("added_tokens")
            .map(|a| {
                a.as_array()
                    .ok_or_else(|| self.err(format!("`added_tokens` is {a}, not a list")))
            })
            .transpose()?;
        let mut seen: HashMap<usize, &str> = HashMap::new();
        for (i, a) in added.into_iter().flatten().enumerate() {
            let at = |msg: String| self.err(format!("`added_tokens[{i}]`: {msg}"));
            let id = a
                .get("id")
                .and_then(id_of)
                .ok_or_else(|| at("no `id` (a non-negative integer)".into()))?;
            let content = a
                .get("content")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .ok_or_else(|| at("no `content` (a non-empty string)".into()))?;
            let special = match a.get("special") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(v) => return Err(at(format!("`special` is {v}, not true or false"))),
            };
            if id >= self.slots.len() {
                return Err(self.too_big(id, &format!("added token `{content}`")));
            }
            if let Some(prev) = seen.insert(id, content) {
                if prev != content {
                    return Err(at(format!("id {id} is both `{prev}` and `{content}`")));
                }
            }
            if let Some((tok, ty)) = &self.slots[id] {
                if *ty == TOKEN_TYPE_NORMAL && tok != content {
                    return Err(at(format!(
                        "`{content}` has id {id}, which `model.vocab` gives to `{tok}`"
                    )));
                }
            }
            let ty = if special || looks_control(content) {
                TOKEN_TYPE_CONTROL
            } else {
                TOKEN_TYPE_USER_DEFINED
            };
            self.slots[id] = Some((content.to_string(), ty));
        }
        Ok(())
    }

    /// The tokens, their types and the count of ids with neither (given a
    /// `[PAD{id}]` placeholder of type unused, as gguf-py does).
    fn finish(self) -> (Vec<String>, Vec<i32>, usize) {
        let mut placeholders = 0;
        let (tokens, types) = (self.slots.into_iter().enumerate())
            .map(|(id, s)| {
                s.unwrap_or_else(|| {
                    placeholders += 1;
                    (format!("[PAD{id}]"), TOKEN_TYPE_UNUSED)
                })
            })
            .unzip();
        (tokens, types, placeholders)
    }
}

/// `model.merges` as `"left right"` strings, from either JSON form.
fn merges(model: &Value, file: &Path) -> Result<Vec<String>, ConvertError> {
    let err = |msg: String| input_err(file, msg);
    model
        .get("merges")
        .and_then(Value::as_array)
        .ok_or_else(|| err("no `model.merges` list".into()))?
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let pair = match m {
                Value::String(s) => {
                    let mut parts = s.split(' ');
                    match (parts.next(), parts.next(), parts.next()) {
                        (Some(l), Some(r), None) if !l.is_empty() && !r.is_empty() => {
                            Some(s.clone())
                        }
                        _ => None,
                    }
                }
                Value::Array(p) if p.len() == 2 => match (symbol(&p[0]), symbol(&p[1])) {
                    (Some(l), Some(r)) => Some(format!("{l} {r}")),
                    _ => None,
                },
                _ => None,
            };
            pair.ok_or_else(|| {
                err(format!(
                    "`model.merges[{i}]` is {m}: expected \"left right\" or \
                     [\"left\", \"right\"] (two non-empty symbols without spaces)"
                ))
            })
        })
        .collect()
}

/// The id of `key` (`bos_token`, `eos_token`): the token tokenizer_config.json
/// names (`config`: its contents and path), else `default`'s.
fn special_id(
    ids: &HashMap<&str, u32>,
    file: &Path,
    config: Option<(&Value, &Path)>,
    key: &str,
    default: &str,
) -> Result<u32, ConvertError> {
    let Some((c, cfile)) = config else {
        return ids.get(default).copied().ok_or_else(|| {
            input_err(
                file,
                format!("no token `{default}` for `{key}` (and no {TOKENIZER_CONFIG_FILE})"),
            )
        });
    };
    let text = match c.get(key) {
        None | Some(Value::Null) => default,
        Some(Value::String(s)) => s.as_str(),
        Some(v @ Value::Object(o)) => o
            .get("content")
            .and_then(Value::as_str)
            .ok_or_else(|| input_err(cfile, format!("`{key}` is {v}, without `content`")))?,
        Some(v) => {
            return Err(input_err(
                cfile,
                format!("`{key}` is {v}, not a string or an AddedToken object"),
            ))
        }
    };
    ids.get(text).copied().ok_or_else(|| {
        input_err(
            cfile,
            format!("`{key}` `{text}` is not a token of {}", file.display()),
        )
    })
}

/// tokenizer_config.json's `chat_template`: a string, or the `default` of
/// a list of named templates.
fn chat_template((c, cfile): (&Value, &Path)) -> Result<Option<String>, ConvertError> {
    Ok(match c.get("chat_template") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(list)) => Some(
            list.iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                .and_then(|t| t.get("template"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    input_err(
                        cfile,
                        "`chat_template` is a list without a `default` template".into(),
                    )
                })?
                .to_string(),
        ),
        Some(v) => {
            return Err(input_err(
                cfile,
                format!("`chat_template` is {v}, not a string"),
            ))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A small consistent tokenizer: the 256 byte symbols, `Ġt` and `he`
    /// merged, and ds4's chat markers as added tokens.
    fn small() -> Value {
        let table = crate::tokenizer::byte_level::byte_to_char_table();
        let mut vocab = serde_json::Map::new();
        vocab.insert(BOS.into(), json!(0));
        vocab.insert(EOS.into(), json!(1));
        for (b, c) in table.iter().enumerate() {
            vocab.insert(c.to_string(), json!(2 + b));
        }
        vocab.insert("Ġt".into(), json!(258));
        vocab.insert("he".into(), json!(259));
        let mut added = vec![
            json!({"id": 0, "content": BOS, "special": true}),
            json!({"id": 1, "content": EOS, "special": true}),
        ];
        let markers = [
            "<｜User｜>",
            "<｜Assistant｜>",
            "<think>",
            "</think>",
            "｜DSML｜",
        ];
        for (k, m) in markers.iter().enumerate() {
            added.push(json!({"id": 260 + k, "content": m, "special": false}));
        }
        json!({"model": {"type": "BPE", "vocab": vocab, "merges": ["Ġ t", ["h", "e"]]},
               "added_tokens": added})
    }

    fn keys(j: &Value, n: usize) -> Result<TokenizerKeys, ConvertError> {
        TokenizerKeys::from_json(j, Path::new("ck/tokenizer.json"), None, n)
    }

    fn refused(j: &Value, n: usize, what: &str) {
        let e = keys(j, n).unwrap_err().to_string();
        assert!(e.starts_with("ck/tokenizer.json: "), "{e}");
        assert!(e.contains(what), "{what}: {e}");
    }

    #[test]
    fn a_small_tokenizer_maps_as_the_spec_says() {
        let k = keys(&small(), 270).unwrap();
        assert_eq!(k.tokens.len(), 270);
        assert_eq!(k.merges, ["Ġ t", "h e"]);
        assert_eq!(k.tokens[260], "<｜User｜>");
        assert_eq!(k.token_types[0], TOKEN_TYPE_CONTROL);
        assert_eq!(k.token_types[2], TOKEN_TYPE_NORMAL);
        assert_eq!(k.token_types[260], TOKEN_TYPE_CONTROL); // bars
        assert_eq!(k.token_types[262], TOKEN_TYPE_USER_DEFINED); // <think>
        assert_eq!(k.tokens[265], "[PAD265]");
        assert_eq!(k.token_types[269], TOKEN_TYPE_UNUSED);
        assert_eq!(k.placeholders, 5);
        assert_eq!((k.bos, k.eos), (0, 1));
        assert_eq!(k.chat_template, None);
        let names: Vec<String> = k.kvs().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names[..2], ["tokenizer.ggml.model", "tokenizer.ggml.pre"]);
        assert_eq!(names.len(), 7);
    }

    #[test]
    fn bos_eos_and_template_come_from_tokenizer_config() {
        let cfg = json!({"bos_token": {"content": "<｜User｜>"}, "eos_token": "</think>",
                         "chat_template": [{"name": "tool_use", "template": "x"},
                                           {"name": "default", "template": "{{ y }}"}]});
        let p = PathBuf::from("ck/tokenizer_config.json");
        let k = TokenizerKeys::from_json(
            &small(),
            Path::new("ck/tokenizer.json"),
            Some((&cfg, p.clone())),
            265,
        )
        .unwrap();
        assert_eq!((k.bos, k.eos), (260, 263));
        assert_eq!(k.chat_template.as_deref(), Some("{{ y }}"));
        for (bad, what) in [
            (
                json!({"eos_token": "nope"}),
                "`eos_token` `nope` is not a token",
            ),
            (json!({"bos_token": 3}), "`bos_token` is 3"),
            (json!({"chat_template": 3}), "`chat_template` is 3"),
            (json!({"chat_template": []}), "without a `default`"),
        ] {
            let e = TokenizerKeys::from_json(
                &small(),
                Path::new("ck/tokenizer.json"),
                Some((&bad, p.clone())),
                265,
            )
            .unwrap_err()
            .to_string();
            assert!(e.starts_with("ck/tokenizer_config.json: "), "{e}");
            assert!(e.contains(what), "{what}: {e}");
        }
    }

    #[test]
    fn bad_tokenizers_are_refused_naming_the_key() {
        refused(&small(), 264, "larger than the model's vocabulary");
        refused(&json!({}), 300, "no `model` object");
        let mut j = small();
        j["model"]["type"] = json!("Unigram");
        refused(&j, 300, "`model.type`");
        let mut j = small();
        j["model"]["merges"] = json!(["Ġ t", "a b c"]);
        refused(&j, 300, "`model.merges[1]`");
        let mut j = small();
        j["model"]["merges"] = json!([["Ġ", 3]]);
        refused(&j, 300, "`model.merges[0]`");
        let mut j = small();
        j["model"]["merges"] = json!(["x y"]);
        refused(&j, 300, "ds4's tokenizer cannot use it");
        let mut j = small();
        j["model"]["vocab"]["Ġt"] = json!(-1);
        refused(&j, 300, "`model.vocab`: `Ġt` has id -1");
        let mut j = small();
        j["model"]["vocab"]["Ġt"] = json!(259);
        refused(&j, 300, "id 259 is both");
        let mut j = small();
        j["added_tokens"][2]["special"] = json!("no");
        refused(&j, 300, "`added_tokens[2]`: `special`");
        let mut j = small();
        j["added_tokens"][2]["id"] = json!(5);
        refused(&j, 300, "`added_tokens[2]`: `<｜User｜>` has id 5");
        let mut j = small();
        j["added_tokens"].as_array_mut().unwrap().remove(2);
        refused(&j, 300, "<｜User｜>");
    }
}
