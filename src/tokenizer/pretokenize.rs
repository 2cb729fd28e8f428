//! The reference pre-tokenizer of the V4 `tokenizer.json` (TOKENIZER.md §2):
//! three regex splits with *Isolated* behaviour, hand-coded over Unicode
//! general categories. Each later split only re-splits the pieces of the
//! earlier one; unmatched text between matches is a piece of its own.

use unicode_general_category::{get_general_category, GeneralCategory as G};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    Letter,
    Mark,
    Number,
    Punct,
    Symbol,
    Space,
    Other,
}

fn class(c: char) -> Class {
    if c.is_ascii() {
        return match c {
            'a'..='z' | 'A'..='Z' => Class::Letter,
            '0'..='9' => Class::Number,
            ' ' | '\t' | '\n' | '\r' | '\x0b' | '\x0c' => Class::Space,
            '$' | '+' | '<' | '=' | '>' | '^' | '`' | '|' | '~' => Class::Symbol,
            '!'..='/' | ':'..='@' | '['..='_' | '{'..='}' => Class::Punct,
            _ => Class::Other,
        };
    }
    // `\s` is the White_Space property, which the general category does not
    // give (U+0085 is Cc, U+00A0 Zs, U+2028 Zl...).
    if is_white_space(c) {
        return Class::Space;
    }
    match get_general_category(c) {
        G::UppercaseLetter
        | G::LowercaseLetter
        | G::TitlecaseLetter
        | G::ModifierLetter
        | G::OtherLetter => Class::Letter,
        G::NonspacingMark | G::SpacingMark | G::EnclosingMark => Class::Mark,
        G::DecimalNumber | G::LetterNumber | G::OtherNumber => Class::Number,
        G::ConnectorPunctuation
        | G::DashPunctuation
        | G::OpenPunctuation
        | G::ClosePunctuation
        | G::InitialPunctuation
        | G::FinalPunctuation
        | G::OtherPunctuation => Class::Punct,
        G::MathSymbol | G::CurrencySymbol | G::ModifierSymbol | G::OtherSymbol => Class::Symbol,
        _ => Class::Other,
    }
}

fn is_white_space(c: char) -> bool {
    matches!(
        c,
        '\t'..='\r' | ' ' | '\u{85}' | '\u{A0}' | '\u{1680}' | '\u{2000}'..='\u{200A}' | '\u{2028}' | '\u{2029}' | '\u{202F}' | '\u{205F}' | '\u{3000}'
    )
}

fn is_newline(c: char) -> bool {
    c == '\n' || c == '\r'
}

fn is_cjk(c: char) -> bool {
    matches!(c, '\u{4E00}'..='\u{9FA5}' | '\u{3040}'..='\u{309F}' | '\u{30A0}'..='\u{30FF}')
}

/// Splits `text` into pre-tokenizer pieces, calling `out` with each.
pub fn split<'a>(text: &'a str, out: &mut impl FnMut(&'a str)) {
    // Step 1: runs of up to three numbers.
    isolate(text, &mut |p1| {
        // Step 2: CJK runs.
        isolate_cjk(p1, &mut |p2| split_main(p2, out))
    });
}

/// Step 1: `\p{N}{1,3}`.
fn isolate<'a>(text: &'a str, out: &mut impl FnMut(&'a str)) {
    let mut gap = 0;
    let mut it = text.char_indices().peekable();
    while let Some((i, c)) = it.next() {
        if class(c) != Class::Number {
            continue;
        }
        if gap < i {
            out(&text[gap..i]);
        }
        let mut end = i + c.len_utf8();
        for _ in 0..2 {
            match it.peek() {
                Some(&(j, d)) if class(d) == Class::Number => {
                    end = j + d.len_utf8();
                    it.next();
                }
                _ => break,
            }
        }
        out(&text[i..end]);
        gap = end;
    }
    if gap < text.len() {
        out(&text[gap..]);
    }
}

/// Step 2: `[一-龥぀-ゟ゠-ヿ]+`.
fn isolate_cjk<'a>(text: &'a str, out: &mut impl FnMut(&'a str)) {
    let mut gap = 0;
    let mut run: Option<usize> = None;
    for (i, c) in text.char_indices() {
        match (is_cjk(c), run) {
            (true, None) => {
                if gap < i {
                    out(&text[gap..i]);
                }
                run = Some(i);
            }
            (false, Some(s)) => {
                out(&text[s..i]);
                run = None;
                gap = i;
            }
            _ => {}
        }
    }
    match run {
        Some(s) => out(&text[s..]),
        None if gap < text.len() => out(&text[gap..]),
        None => {}
    }
}

/// Step 3: the six-alternative regex, tried in order at each position.
fn split_main<'a>(text: &'a str, out: &mut impl FnMut(&'a str)) {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let n = chars.len();
    let at = |k: usize| if k < n { chars[k].0 } else { text.len() };
    let cls: Vec<Class> = chars.iter().map(|&(_, c)| class(c)).collect();
    let mut i = 0;
    let mut gap = 0; // char index where the current unmatched gap starts
    while i < n {
        match match_at(&chars, &cls, i) {
            Some(end) => {
                if gap < i {
                    out(&text[at(gap)..at(i)]);
                }
                out(&text[at(i)..at(end)]);
                i = end;
                gap = end;
            }
            None => i += 1,
        }
    }
    if gap < n {
        out(&text[at(gap)..]);
    }
}

/// End (char index, exclusive) of the regex match starting at `i`, if any.
fn match_at(chars: &[(usize, char)], cls: &[Class], i: usize) -> Option<usize> {
    let n = chars.len();
    let c = chars[i].1;
    let letter_or_mark = |k: usize| k < n && matches!(cls[k], Class::Letter | Class::Mark);
    let run = |mut k: usize, f: &dyn Fn(usize) -> bool| {
        while k < n && f(k) {
            k += 1;
        }
        k
    };
    // a. one ASCII punctuation/symbol, then ASCII letters.
    if c.is_ascii_punctuation() && i + 1 < n && chars[i + 1].1.is_ascii_alphabetic() {
        return Some(run(i + 1, &|k| chars[k].1.is_ascii_alphabetic()));
    }
    // b. optional one char not CR/LF/L/P/S, then letters/marks.
    let opt_ok = !is_newline(c) && !matches!(cls[i], Class::Letter | Class::Punct | Class::Symbol);
    if opt_ok && letter_or_mark(i + 1) {
        return Some(run(i + 1, &letter_or_mark));
    }
    if letter_or_mark(i) {
        return Some(run(i, &letter_or_mark));
    }
    // c. optional space, punctuation/symbols, then CR/LF.
    let ps = |k: usize| k < n && matches!(cls[k], Class::Punct | Class::Symbol);
    let start = if c == ' ' && ps(i + 1) { i + 1 } else { i };
    if ps(start) {
        let e = run(start, &ps);
        return Some(run(e, &|k| is_newline(chars[k].1)));
    }
    if cls[i] != Class::Space {
        return None;
    }
    let ws_end = run(i, &|k| cls[k] == Class::Space);
    // d. whitespace up to the last CR/LF of the run.
    if let Some(last_nl) = (i..ws_end).rev().find(|&k| is_newline(chars[k].1)) {
        return Some(last_nl + 1);
    }
    // e. whitespace not followed by a non-space; f. any whitespace.
    if ws_end == n || ws_end - i == 1 {
        Some(ws_end)
    } else {
        Some(ws_end - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(s: &str) -> Vec<&str> {
        let mut v = Vec::new();
        split(s, &mut |p| v.push(p));
        v
    }

    #[test]
    fn reference_pieces_from_the_spec() {
        assert_eq!(pieces("Hello world"), ["Hello", " world"]);
        assert_eq!(pieces("  hello"), [" ", " hello"]);
        assert_eq!(pieces("x = 12345;"), ["x", " =", " ", "123", "45", ";"]);
        assert_eq!(pieces("word—word"), ["word", "—", "word"]);
        assert_eq!(pieces("你好。Hello"), ["你好", "。", "Hello"]);
        assert_eq!(pieces("abc你好"), ["abc", "你好"]);
        assert_eq!(pieces("a 你好"), ["a", " ", "你好"]);
        assert_eq!(pieces("x²+y²"), ["x", "²", "+y", "²"]);
        assert_eq!(pieces("１２３４"), ["１２３", "４"]);
        assert_eq!(pieces("😀x"), ["😀", "x"]);
        assert_eq!(pieces("   \n\n  x"), ["   \n\n", " ", " x"]);
        assert_eq!(pieces("int main() {\n"), ["int", " main", "()", " {\n"]);
        assert_eq!(
            pieces("e.g. foo.bar()"),
            ["e", ".g", ".", " foo", ".bar", "()"]
        );
    }
}
