//! Tokenizer (placeholder, filled by the tokenizer work).
