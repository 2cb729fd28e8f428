//! The DeepSeek V4 tokenizer, built from the vocabulary stored in the GGUF
//! (`tokenizer.ggml.tokens`, `merges`, `token_type`).
//!
//! Encoding follows the reference `tokenizer.json` exactly (TOKENIZER.md §2):
//! added tokens cut out first (leftmost-longest), then the three-step
//! pre-tokenizer ([`pretokenize`]), the byte-level alphabet ([`byte_level`])
//! and BPE ([`bpe`]). Three entry points: [`Tokenizer::encode`] (every added
//! token recognised, as HF does), [`Tokenizer::encode_plain`] (none) and
//! [`Tokenizer::encode_chat`] (only the seven chat markers, PROMPT.md §1.1,
//! plus V4.1's `<｜System｜>` where the vocabulary has it).

pub mod bpe;
pub mod byte_level;
mod decode;
pub mod pretokenize;
pub mod vocab;

use std::collections::HashMap;
use std::sync::Mutex;

use thiserror::Error;

use crate::gguf::GgufFile;

pub use decode::StreamDecoder;

#[derive(Debug, Error)]
pub enum TokenizerError {
    #[error("tokenizer: metadata {0} is missing or not a string array")]
    MissingArray(&'static str),
    #[error("tokenizer: {what} has {found} entries, expected {expected}")]
    BadLength {
        what: &'static str,
        found: usize,
        expected: usize,
    },
    #[error("tokenizer: special token {0:?} is not in the vocabulary")]
    MissingSpecial(String),
    #[error("tokenizer: merge {index} ({text:?}) is malformed: {why}")]
    BadMerge {
        index: usize,
        text: String,
        why: String,
    },
    #[error("tokenizer: byte {0:#04x} has no single-byte token")]
    MissingByte(u8),
    #[error("tokenizer: {0}")]
    Json(String),
}

/// Ids of the tokens ds4 looks up by text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpecialTokens {
    pub bos: u32,
    pub eos: u32,
    pub user: u32,
    pub assistant: u32,
    pub think_open: u32,
    pub think_close: u32,
    pub dsml: u32,
}

/// The seven chat markers, spelled once here (the lowest room that needs
/// them: the tokenizer matches them in rendered text). `chat::template`
/// re-exports them for the renderers.
pub mod markers {
    pub const BOS: &str = "<｜begin▁of▁sentence｜>";
    pub const EOS: &str = "<｜end▁of▁sentence｜>";
    pub const USER: &str = "<｜User｜>";
    pub const ASSISTANT: &str = "<｜Assistant｜>";
    pub const THINK_OPEN: &str = "<think>";
    pub const THINK_CLOSE: &str = "</think>";
    pub const DSML: &str = "｜DSML｜";
    /// V4.1's system marker: a chat marker only where the vocabulary has
    /// it as a token (the V4.1 tokenizer), plain text elsewhere.
    pub const SYSTEM: &str = "<｜System｜>";
}

/// The seven strings recognised inside rendered chat text, in the order they
/// are tested at each position (PROMPT.md §1.1).
pub const CHAT_MARKERS: [&str; 7] = [
    markers::BOS,
    markers::EOS,
    markers::USER,
    markers::ASSISTANT,
    markers::THINK_OPEN,
    markers::THINK_CLOSE,
    markers::DSML,
];

/// Piece cache size limit (entries) before it is cleared.
const CACHE_LIMIT: usize = 1 << 16;

pub struct Tokenizer {
    tokens: Vec<String>,
    token_bytes: Vec<Vec<u8>>,
    ids: HashMap<String, u32>,
    byte_ids: [u32; 256],
    merges: bpe::Merges,
    /// Added tokens by first char, longest first.
    added: HashMap<char, Vec<(String, u32)>>,
    /// The seven chat markers, then `<｜System｜>` where the vocabulary
    /// has it.
    chat: Vec<(String, u32)>,
    specials: SpecialTokens,
    cache: Mutex<HashMap<String, Vec<u32>>>,
}

impl Tokenizer {
    /// Builds the tokenizer from GGUF-style lists. Tokens of type 3 (control)
    /// or 4 (user-defined) are the added tokens; without types, tokens spelled
    /// like DeepSeek's markers are.
    pub fn from_vocab(
        tokens: Vec<String>,
        merges: Vec<String>,
        token_types: Option<Vec<i32>>,
    ) -> Result<Tokenizer, TokenizerError> {
        if let Some(t) = &token_types {
            if t.len() != tokens.len() {
                return Err(TokenizerError::BadLength {
                    what: "tokenizer.ggml.token_type",
                    found: t.len(),
                    expected: tokens.len(),
                });
            }
        }
        let mut ids = HashMap::with_capacity(tokens.len());
        for (i, t) in tokens.iter().enumerate() {
            // First occurrence wins, as in ds4.
            ids.entry(t.clone()).or_insert(i as u32);
        }
        let table = byte_level::byte_to_char_table();
        let mut byte_ids = [0u32; 256];
        for b in 0..256 {
            let s = table[b].to_string();
            byte_ids[b] = *ids.get(&s).ok_or(TokenizerError::MissingByte(b as u8))?;
        }
        let mut pairs = HashMap::with_capacity(merges.len());
        for (rank, m) in merges.iter().enumerate() {
            let bad = |why: &str| TokenizerError::BadMerge {
                index: rank,
                text: m.clone(),
                why: why.to_string(),
            };
            let (l, r) = m
                .split_once(' ')
                .ok_or_else(|| bad("no space between the two symbols"))?;
            let lid = *ids
                .get(l)
                .ok_or_else(|| bad("left symbol not in the vocabulary"))?;
            let rid = *ids
                .get(r)
                .ok_or_else(|| bad("right symbol not in the vocabulary"))?;
            let merged = *ids
                .get(&format!("{l}{r}"))
                .ok_or_else(|| bad("merged symbol not in the vocabulary"))?;
            pairs.entry((lid, rid)).or_insert((rank as u32, merged));
        }
        let is_added = |i: usize, t: &str| match &token_types {
            Some(ty) => ty[i] == 3 || ty[i] == 4,
            None => {
                (t.starts_with("<｜") && t.ends_with("｜>"))
                    || (t.starts_with("<|") && t.ends_with("|>"))
                    || ["<think>", "</think>", "｜DSML｜", "<dsml:", "</dsml:"].contains(&t)
            }
        };
        let mut added: HashMap<char, Vec<(String, u32)>> = HashMap::new();
        for (i, t) in tokens.iter().enumerate() {
            if !t.is_empty() && is_added(i, t) && ids.get(t) == Some(&(i as u32)) {
                if let Some(c) = t.chars().next() {
                    added.entry(c).or_default().push((t.clone(), i as u32));
                }
            }
        }
        for v in added.values_mut() {
            v.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        }
        let find = |s: &str| {
            ids.get(s)
                .copied()
                .ok_or_else(|| TokenizerError::MissingSpecial(s.to_string()))
        };
        let mut chat = CHAT_MARKERS
            .iter()
            .map(|m| Ok((m.to_string(), find(m)?)))
            .collect::<Result<Vec<_>, TokenizerError>>()?;
        if let Some(&id) = ids.get(markers::SYSTEM) {
            chat.push((markers::SYSTEM.to_string(), id));
        }
        let specials = SpecialTokens {
            bos: chat[0].1,
            eos: chat[1].1,
            user: chat[2].1,
            assistant: chat[3].1,
            think_open: chat[4].1,
            think_close: chat[5].1,
            dsml: chat[6].1,
        };
        let token_bytes = tokens
            .iter()
            .map(|t| {
                if t.contains('｜') {
                    t.as_bytes().to_vec()
                } else {
                    // Added tokens without the bar are ASCII and decode to
                    // themselves either way; code points outside the
                    // alphabet are dropped (TOKENIZER.md §7).
                    t.chars().filter_map(byte_level::char_to_byte).collect()
                }
            })
            .collect();
        Ok(Tokenizer {
            tokens,
            token_bytes,
            ids,
            byte_ids,
            merges: bpe::Merges { pairs },
            added,
            chat,
            specials,
            cache: Mutex::new(HashMap::new()),
        })
    }

    /// Reads the vocabulary from a model's metadata.
    pub fn from_gguf(f: &GgufFile) -> Result<Tokenizer, TokenizerError> {
        let strings = |k: &'static str| {
            f.get_array(k)
                .and_then(|a| a.as_strings())
                .map(|s| s.to_vec())
                .ok_or(TokenizerError::MissingArray(k))
        };
        let tokens = strings("tokenizer.ggml.tokens")?;
        let merges = strings("tokenizer.ggml.merges")?;
        let types = f
            .get_array("tokenizer.ggml.token_type")
            .and_then(|a| a.as_i64_vec())
            .map(|v| v.into_iter().map(|x| x as i32).collect());
        Tokenizer::from_vocab(tokens, merges, types)
    }

    /// From a HF `tokenizer.json` (tests and tools).
    pub fn from_tokenizer_json(bytes: &[u8]) -> Result<Tokenizer, TokenizerError> {
        let v = vocab::Vocab::from_tokenizer_json(bytes).map_err(TokenizerError::Json)?;
        Tokenizer::from_vocab(v.tokens, v.merges, Some(v.token_types))
    }

    /// Forgets cached piece encodings (benchmarks measure cold encoding).
    pub fn clear_cache(&self) {
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    pub fn specials(&self) -> &SpecialTokens {
        &self.specials
    }

    pub fn token_id(&self, s: &str) -> Option<u32> {
        self.ids.get(s).copied()
    }

    /// The raw vocabulary string (byte-level alphabet; markers literal).
    pub fn token_str(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(|s| s.as_str())
    }

    /// An added token (chat marker, `<think>`, DSML …): matched in rendered
    /// text, never produced by BPE (the grammar engine keeps them out of
    /// constrained text).
    pub fn is_added(&self, id: u32) -> bool {
        self.token_str(id)
            .and_then(|s| s.chars().next())
            .and_then(|c| self.added.get(&c))
            .is_some_and(|v| v.iter().any(|(_, i)| *i == id))
    }

    /// The bytes a token stands for.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.token_bytes.get(id as usize).map(|b| b.as_slice())
    }

    pub fn decode(&self, ids: &[u32]) -> Vec<u8> {
        ids.iter()
            .filter_map(|&i| self.token_bytes(i))
            .flatten()
            .copied()
            .collect()
    }

    /// Reference encoding: every added token is recognised in the text.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        self.encode_between(text, |rest| {
            let c = rest.chars().next()?;
            let cands = self.added.get(&c)?;
            cands.iter().find(|(s, _)| rest.starts_with(s.as_str()))
        })
    }

    /// No added tokens: marker strings in the text are ordinary BPE text.
    pub fn encode_plain(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        self.encode_plain_into(text, &mut out);
        out
    }

    /// Rendered-chat encoding: only the seven chat markers are special.
    pub fn encode_chat(&self, text: &str) -> Vec<u32> {
        self.encode_between(text, |rest| {
            // A quick test first: every chat marker starts with '<' or a
            // fullwidth character (lead byte 0xEF).
            if !rest.starts_with('<') && rest.as_bytes()[0] != 0xEF {
                return None;
            }
            self.chat.iter().find(|(s, _)| rest.starts_with(s.as_str()))
        })
    }

    /// Encodes `text` as the special tokens `special` recognises (asked at
    /// every char boundary, with the rest of the text, for the token that
    /// starts there) and the BPE pieces of the plain text between them.
    fn encode_between<'a>(
        &self,
        text: &str,
        special: impl Fn(&str) -> Option<&'a (String, u32)>,
    ) -> Vec<u32> {
        let mut out = Vec::new();
        let mut plain_start = 0;
        let mut i = 0;
        while let Some(c) = text[i..].chars().next() {
            match special(&text[i..]) {
                Some((s, id)) => {
                    self.encode_plain_into(&text[plain_start..i], &mut out);
                    out.push(*id);
                    i += s.len();
                    plain_start = i;
                }
                None => i += c.len_utf8(),
            }
        }
        self.encode_plain_into(&text[plain_start..], &mut out);
        out
    }

    fn encode_plain_into(&self, text: &str, out: &mut Vec<u32>) {
        if text.is_empty() {
            return;
        }
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() > CACHE_LIMIT {
            cache.clear();
        }
        let mut syms = Vec::new();
        pretokenize::split(text, &mut |piece| {
            if let Some(ids) = cache.get(piece) {
                out.extend_from_slice(ids);
                return;
            }
            syms.clear();
            syms.extend(piece.bytes().map(|b| self.byte_ids[b as usize]));
            self.merges.apply(&mut syms);
            out.extend_from_slice(&syms);
            if piece.len() <= 256 {
                cache.insert(piece.to_string(), syms.clone());
            }
        });
    }
}
