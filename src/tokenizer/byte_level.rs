//! The GPT-2 byte-level alphabet (TOKENIZER.md §4): every byte is written as
//! one printable code point so byte strings can live in a text vocabulary.

/// Code point of each byte.
pub fn byte_to_char_table() -> [char; 256] {
    let mut t = ['\0'; 256];
    let mut next = 0x100u32;
    for b in 0..256u32 {
        let printable =
            (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        let cp = if printable {
            b
        } else {
            next += 1;
            next - 1
        };
        t[b as usize] = char::from_u32(cp).unwrap_or('\0');
    }
    t
}

/// Byte of a code point of the alphabet, `None` outside it.
pub fn char_to_byte(c: char) -> Option<u8> {
    let cp = c as u32;
    let printable =
        (0x21..=0x7E).contains(&cp) || (0xA1..=0xAC).contains(&cp) || (0xAE..=0xFF).contains(&cp);
    if printable {
        return Some(cp as u8);
    }
    if !(0x100..0x100 + 68).contains(&cp) {
        return None;
    }
    // The 68 non-printable bytes in increasing order map to U+0100.. U+0143.
    let mut k = cp - 0x100;
    for b in 0..256u32 {
        let printable =
            (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        if !printable {
            if k == 0 {
                return Some(b as u8);
            }
            k -= 1;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alphabet_matches_the_spec_examples() {
        let t = byte_to_char_table();
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[b'\t' as usize], 'ĉ');
        assert_eq!(t[0xAD], '\u{143}');
        assert_eq!(t[b'a' as usize], 'a');
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(t[b as usize]), Some(b));
        }
        assert_eq!(char_to_byte('｜'), None);
    }
}
