//! Streaming decode: tokens can end inside a UTF-8 sequence (an emoji split
//! over two tokens), so text is released only up to the last complete
//! character.

/// Buffers token bytes and yields complete UTF-8 text.
#[derive(Default, Debug)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    pub fn new() -> StreamDecoder {
        StreamDecoder::default()
    }

    /// Adds a token's bytes; returns the text that is now complete. Bytes that
    /// can never become valid UTF-8 are replaced by U+FFFD.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let good = e.valid_up_to();
                    // SAFETY-free: the prefix was just validated.
                    out.push_str(std::str::from_utf8(&self.pending[..good]).unwrap_or_default());
                    match e.error_len() {
                        // Incomplete sequence at the end: wait for more bytes.
                        None => {
                            self.pending.drain(..good);
                            return out;
                        }
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            self.pending.drain(..good + bad);
                        }
                    }
                }
            }
        }
    }

    /// Flushes what is left (an unfinished sequence becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_emoji_is_released_whole() {
        let bytes = "a😀b".as_bytes();
        let mut d = StreamDecoder::new();
        let mut out = String::new();
        for chunk in [&bytes[..3], &bytes[3..5], &bytes[5..]] {
            out.push_str(&d.push(chunk));
            assert!(!out.contains('\u{FFFD}'));
        }
        assert_eq!(out, "a😀b");
        assert_eq!(d.finish(), "");
    }

    #[test]
    fn invalid_bytes_become_replacement_chars() {
        let mut d = StreamDecoder::new();
        assert_eq!(d.push(&[b'x', 0xFF, b'y']), "x\u{FFFD}y");
        assert_eq!(d.push(&[0xE2, 0x82]), "");
        assert_eq!(d.finish(), "\u{FFFD}");
    }
}
