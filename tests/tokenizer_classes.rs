//! Pre-tokenizer character classes against the reference, code point by code
//! point: tests/data/pretokenizer_classes.txt.gz (tools/gen_pretokenizer_classes.py)
//! holds, for every selected code point, the piece lengths the reference
//! pre-tokenizer gives in a few contexts. This pins the Unicode version of the
//! general categories, White_Space and the CJK ranges.

use std::io::Read;

use ds4::tokenizer::pretokenize;

fn pieces(s: &str) -> Vec<&str> {
    let mut v = Vec::new();
    pretokenize::split(s, &mut |p| v.push(p));
    v
}

/// Must match CONTEXTS in tools/gen_pretokenizer_classes.py.
const CONTEXTS: [&str; 9] = [
    "a{}b",
    "a{}\n",
    " {}{}x",
    "{}\u{301}a",
    ",{}.",
    "1{}2",
    "\u{3042}{}\u{30a2}",
    "{}",
    " {}",
];

/// Must match `selected` in tools/gen_pretokenizer_classes.py.
fn selected(cp: u32) -> bool {
    !(0xD800..0xE000).contains(&cp)
        && (cp < 0x40000 || (0xE0000..0xE1000).contains(&cp) || cp % 97 == 0)
}

fn signature(c: char) -> String {
    let mut buf = [0u8; 4];
    let c = c.encode_utf8(&mut buf);
    CONTEXTS
        .iter()
        .map(|ctx| {
            let s = ctx.replace("{}", c);
            pieces(&s)
                .iter()
                .map(|p| p.chars().count().to_string())
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect::<Vec<_>>()
        .join(";")
}

#[test]
fn every_code_point_splits_like_the_reference() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/pretokenizer_classes.txt.gz"
    );
    let gz = std::fs::read(path).expect("pretokenizer_classes.txt.gz");
    let mut text = String::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_string(&mut text)
        .unwrap();
    let mut checked = 0usize;
    let mut bad = Vec::new();
    for line in text.lines() {
        let mut f = line.splitn(3, ' ');
        let first = u32::from_str_radix(f.next().unwrap(), 16).unwrap();
        let last = u32::from_str_radix(f.next().unwrap(), 16).unwrap();
        let want = f.next().unwrap();
        for cp in (first..=last).filter(|&cp| selected(cp)) {
            let c = char::from_u32(cp).unwrap();
            let got = signature(c);
            if got != want && bad.len() < 20 {
                bad.push(format!("U+{cp:04X}: want {want} got {got}"));
            }
            checked += 1;
        }
    }
    assert!(checked > 270_000, "checked only {checked} code points");
    assert!(bad.is_empty(), "pieces differ:\n{}", bad.join("\n"));
}
