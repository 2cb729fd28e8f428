//! Our vocabulary as llguidance sees it: a token trie over the bytes each
//! token stands for ([`Tokenizer::token_bytes`]). Added tokens (the chat
//! markers, `<think>`, `｜DSML｜` …) are written the way toktrie marks
//! special tokens, a 0xFF byte before their text, so no grammar over text
//! ever allows one: a JSON string may contain the characters `</think>`,
//! never the token that would end a turn's reasoning.

use llguidance::toktrie::{TokRxInfo, TokTrie};

use crate::tokenizer::Tokenizer;

/// The trie of `tok`'s vocabulary, EOS as its end token.
pub fn token_trie(tok: &Tokenizer) -> TokTrie {
    let n = tok.vocab_size();
    let words: Vec<Vec<u8>> = (0..n as u32)
        .map(|id| {
            let bytes = tok.token_bytes(id).unwrap_or(&[]);
            if tok.is_added(id) {
                let mut w = Vec::with_capacity(bytes.len() + 1);
                w.push(TokTrie::SPECIAL_TOKEN_MARKER);
                w.extend_from_slice(bytes);
                w
            } else {
                bytes.to_vec()
            }
        })
        .collect();
    let info = TokRxInfo::new(n as u32, tok.specials().eos);
    TokTrie::from(&info, &words)
}
