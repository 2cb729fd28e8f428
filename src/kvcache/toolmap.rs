//! What goes into a checkpoint's KTM tool-id map (KVCACHE.md §4.5) and what
//! comes back out: the pairs (tool id, exact sampled DSML block) of the
//! caller's tool memory whose block occurs in the checkpoint's cache text.
//! A client that resends a conversation names its tool calls by id; with the
//! map a restarted server renders those calls with the exact sampled bytes
//! again (SERVER.md §7), so the rendered prompt is byte-identical to the
//! checkpoint's text and the disk lookup hits.
//!
//! The byte layout of the section is `file::encode_ktm` / `file::decode_ktm`;
//! this module only decides the entries.

use std::collections::{HashMap, HashSet};
use std::ops::Range;

use super::file::KtmEntry;

/// The caller's tool-call memory as the cache sees it (the server worker's
/// id → DSML block map).
pub trait ToolIds {
    /// Calls `f(id, block)` for every remembered id.
    fn for_each_tool_id(&self, f: &mut dyn FnMut(&[u8], &[u8]));
}

/// No tool memory (the CLI, ds4-bench, exact DSML replay disabled): no map.
pub struct NoToolIds;

impl ToolIds for NoToolIds {
    fn for_each_tool_id(&self, _f: &mut dyn FnMut(&[u8], &[u8])) {}
}

/// The DSML block forms ds4 scans a cache text for, in its order: each of
/// the three syntax variants (PROMPT.md §5.2) with the `\n\n` lead-in first,
/// so the `\n\n` form wins a tie at the same position.
const BLOCK_FORMS: [(&str, &str); 6] = [
    ("\n\n<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>"),
    ("<｜DSML｜tool_calls>", "</｜DSML｜tool_calls>"),
    ("\n\n<DSML｜tool_calls>", "</DSML｜tool_calls>"),
    ("<DSML｜tool_calls>", "</DSML｜tool_calls>"),
    ("\n\n<tool_calls>", "</tool_calls>"),
    ("<tool_calls>", "</tool_calls>"),
];

/// Id lengths ds4's reader accepts (longer or empty ids would stop it).
const MAX_ID_BYTES: usize = 256;

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The DSML tool-call blocks of `text`, in order, as ds4 finds them: the
/// earliest start of any form that has a close tag after it (ties: the
/// earlier form), the block ending just after that close tag; the scan goes
/// on after the block. Each form's next start is remembered between blocks
/// (and a form whose close tag no longer occurs is dropped), so an agent
/// transcript with many calls is scanned in about one pass per form, not
/// one per block.
pub fn dsml_blocks(text: &[u8]) -> Vec<Range<usize>> {
    // Per form: the next start at or after `p` (None: none left).
    let mut next: [Option<usize>; BLOCK_FORMS.len()] = [Some(0); BLOCK_FORMS.len()];
    let mut searched_from = [usize::MAX; BLOCK_FORMS.len()];
    let mut out = Vec::new();
    let mut p = 0;
    loop {
        let mut best: Option<Range<usize>> = None;
        for (i, (open, close)) in BLOCK_FORMS.iter().enumerate() {
            let s = match next[i] {
                Some(s) if s >= p && searched_from[i] != usize::MAX => s,
                Some(_) => {
                    searched_from[i] = p;
                    next[i] = find(&text[p..], open.as_bytes()).map(|s| p + s);
                    match next[i] {
                        Some(s) => s,
                        None => continue,
                    }
                }
                None => continue,
            };
            if best.as_ref().is_some_and(|b| s >= b.start) {
                continue;
            }
            let Some(e) = find(&text[s..], close.as_bytes()) else {
                // No close tag after this start: none after any later one.
                next[i] = None;
                continue;
            };
            best = Some(s..s + e + close.len());
        }
        match best {
            Some(b) => {
                p = b.end;
                out.push(b);
            }
            None => return out,
        }
    }
}

/// The KTM entries for a checkpoint with cache text `text`: for each
/// distinct block of [`dsml_blocks`] whose exact bytes the memory holds, one
/// entry per id that maps to it (ids sorted, blocks in text order). Empty
/// when nothing matches: then the file gets no section.
pub fn tool_map_for(text: &[u8], tools: &dyn ToolIds) -> Vec<KtmEntry> {
    let mut blocks: Vec<&[u8]> = Vec::new();
    let mut seen: HashSet<&[u8]> = HashSet::new();
    for r in dsml_blocks(text) {
        let b = &text[r];
        if seen.insert(b) {
            blocks.push(b);
        }
    }
    if blocks.is_empty() {
        return Vec::new();
    }
    let mut ids: HashMap<&[u8], Vec<Vec<u8>>> = HashMap::new();
    tools.for_each_tool_id(&mut |id, block| {
        if (1..=MAX_ID_BYTES).contains(&id.len()) {
            if let Some(b) = seen.get(block) {
                ids.entry(*b).or_default().push(id.to_vec());
            }
        }
    });
    let mut out = Vec::new();
    for b in blocks {
        let Some(mut v) = ids.remove(b) else {
            continue;
        };
        v.sort();
        out.extend(v.into_iter().map(|id| KtmEntry {
            id,
            dsml: b.to_vec(),
        }));
    }
    out
}

/// Keeps the entries read from a checkpoint's KTM section whose block is a
/// DSML block of the checkpoint's cache text — the writer only maps blocks
/// of that text — and returns how many were dropped. ds4 leaves the section
/// unchecked; its reader only stops at impossible lengths. The text is
/// verified (its SHA-1 is the file name), so this catches a damaged block,
/// which would otherwise be rendered into a prompt as the exact "sampled"
/// bytes, without changing the layout.
pub fn entries_in_text(entries: Vec<KtmEntry>, text: &[u8]) -> (Vec<KtmEntry>, usize) {
    if entries.is_empty() {
        return (entries, 0);
    }
    let blocks: HashSet<&[u8]> = dsml_blocks(text).into_iter().map(|r| &text[r]).collect();
    let n = entries.len();
    let kept: Vec<KtmEntry> = entries
        .into_iter()
        .filter(|e| blocks.contains(&e.dsml[..]))
        .collect();
    let dropped = n - kept.len();
    (kept, dropped)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Mem(Vec<(&'static str, &'static str)>);

    impl ToolIds for Mem {
        fn for_each_tool_id(&self, f: &mut dyn FnMut(&[u8], &[u8])) {
            for (id, b) in &self.0 {
                f(id.as_bytes(), b.as_bytes());
            }
        }
    }

    const A: &str = "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";
    const B: &str = "<tool_calls><invoke name=\"g\"></invoke></tool_calls>";

    #[test]
    fn blocks_earliest_start_and_the_blank_line_form_first() {
        let text = format!("x{A}<｜end▁of▁sentence｜>y{B} z <tool_calls> unclosed");
        let r = dsml_blocks(text.as_bytes());
        assert_eq!(r.len(), 2);
        assert_eq!(&text.as_bytes()[r[0].clone()], A.as_bytes());
        assert_eq!(&text.as_bytes()[r[1].clone()], B.as_bytes());
        // An open tag without its close tag is no block.
        assert!(dsml_blocks(b"<tool_calls> no close").is_empty());
    }

    /// ds4's scan as written: every form searched again after each block.
    fn naive(text: &[u8]) -> Vec<Range<usize>> {
        let mut out = Vec::new();
        let mut p = 0;
        loop {
            let mut best: Option<Range<usize>> = None;
            for (open, close) in BLOCK_FORMS {
                let Some(s) = find(&text[p..], open.as_bytes()).map(|s| p + s) else {
                    continue;
                };
                if best.as_ref().is_some_and(|b| s >= b.start) {
                    continue;
                }
                let Some(e) = find(&text[s..], close.as_bytes()) else {
                    continue;
                };
                best = Some(s..s + e + close.len());
            }
            match best {
                Some(b) => {
                    p = b.end;
                    out.push(b);
                }
                None => return out,
            }
        }
    }

    #[test]
    fn the_remembered_scan_equals_ds4s_scan() {
        let pieces = [
            A,
            B,
            "<tool_calls>",
            "</tool_calls>",
            "\n\n<DSML｜tool_calls>",
            "</DSML｜tool_calls>",
            "<｜DSML｜tool_calls>",
            "</｜DSML｜tool_calls>",
            "\n",
            "text ",
        ];
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for len in [0, 1, 7, 40, 300] {
            for _ in 0..50 {
                let mut t = String::new();
                for _ in 0..len {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    t.push_str(pieces[(x % pieces.len() as u64) as usize]);
                }
                assert_eq!(dsml_blocks(t.as_bytes()), naive(t.as_bytes()), "{t:?}");
            }
        }
    }

    #[test]
    fn entries_for_distinct_blocks_in_memory_only() {
        let text = format!("a{A}b{A}c{B}");
        let mem = Mem(vec![
            ("call_2", A),
            ("call_1", A),
            ("call_9", "\n\n<tool_calls>other</tool_calls>"),
            ("toolu_b", B),
            ("", B),
        ]);
        let m = tool_map_for(text.as_bytes(), &mem);
        let got: Vec<(&[u8], &[u8])> = m.iter().map(|e| (&e.id[..], &e.dsml[..])).collect();
        assert_eq!(
            got,
            vec![
                (&b"call_1"[..], A.as_bytes()),
                (&b"call_2"[..], A.as_bytes()),
                (&b"toolu_b"[..], B.as_bytes()),
            ]
        );
        assert!(tool_map_for(b"no blocks", &mem).is_empty());
        assert!(tool_map_for(text.as_bytes(), &NoToolIds).is_empty());
        // Read back: an entry whose block is not in the text is dropped.
        let mut back = m.clone();
        back[1].dsml[30] ^= 1;
        let (kept, dropped) = entries_in_text(back, text.as_bytes());
        assert_eq!((kept, dropped), (vec![m[0].clone(), m[2].clone()], 1));
    }
}
