//! Fuzzes the worker's live-reuse planner (`ds4::server::plan`) with pairs
//! of histories: a live transcript cut at an arbitrary byte (often inside a
//! multi-byte character, as a reply cut by `max_tokens` is) and a request
//! that resends it, completed or changed, with more text. The planner must
//! never panic, must only reuse at a character boundary of the request, and
//! must reuse every whole-character prefix (falling back to cold otherwise).
#![no_main]

use ds4::server::plan::{plan_live, Live, LivePlan};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Layout: [cut, mode, a.., 0xff, b..]: `a` is the live history, `b`
    // what the request adds or changes.
    let [cut, mode, rest @ ..] = data else { return };
    let (a, b) = match rest.iter().position(|&x| x == 0xff) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    let history = String::from_utf8_lossy(a).into_owned();
    let added = String::from_utf8_lossy(b).into_owned();
    let cut = if history.is_empty() {
        0
    } else {
        *cut as usize % (history.len() + 1)
    };
    let decoded = history.as_bytes()[..cut].to_vec();
    let text = match mode % 3 {
        // The history resent whole, then a new turn.
        0 => format!("{history}{added}"),
        // A changed history: the new text replaces the cut-off tail.
        1 => format!("{}{added}", String::from_utf8_lossy(&decoded)),
        // Something unrelated.
        _ => added.clone(),
    };
    let visible = (mode & 4 != 0).then_some(history.as_str());
    let live = Live {
        tokens: &[1, 2, 3],
        thinking_visible: visible,
    };
    match plan_live(&live, &text, &[4], || decoded.clone()) {
        LivePlan::Append { from, source } => {
            // The slice the worker takes must be valid.
            let rest = &text[from..];
            assert_eq!(from + rest.len(), text.len());
            let prefix: &[u8] = if source == "thinking-visible" {
                history.as_bytes()
            } else {
                &decoded
            };
            assert_eq!(&text.as_bytes()[..from], prefix);
        }
        LivePlan::Cold => {
            assert!(
                !(text.as_bytes().starts_with(&decoded) && text.is_char_boundary(decoded.len())),
                "a whole-character prefix was refused"
            );
        }
        LivePlan::Tokens => panic!("the token prefix cannot match [4]"),
    }
});
