//! CLI chat rendering (PROMPT.md §2, §10): exact bytes and thinking modes.

use ds4::chat::{one_shot_prompt, render_one_shot, ThinkMode, THINK_MAX_MIN_CTX, THINK_MAX_PREFIX};
use ds4::testmodel::vocab::default_tokenizer_json_bytes;
use ds4::tokenizer::Tokenizer;

#[test]
fn one_shot_tokens_decode_to_the_rendered_bytes() {
    let tok = Tokenizer::from_tokenizer_json(&default_tokenizer_json_bytes().unwrap()).unwrap();
    for mode in [ThinkMode::None, ThinkMode::High, ThinkMode::Max] {
        for system in ["", "You are a helpful assistant"] {
            let ids = one_shot_prompt(&tok, system, "What is 2+2?", mode);
            let text = render_one_shot(system, "What is 2+2?", mode);
            assert_eq!(tok.decode(&ids), text.as_bytes(), "{mode:?} {system:?}");
            let sp = tok.specials();
            assert_eq!(ids[0], sp.bos);
            let last = if mode == ThinkMode::None {
                sp.think_close
            } else {
                sp.think_open
            };
            assert_eq!(&ids[ids.len() - 2..], &[sp.assistant, last]);
        }
    }
    // Exact bytes of a non-thinking turn with the default system text.
    assert_eq!(
        render_one_shot("You are a helpful assistant", "Hi", ThinkMode::None),
        "<｜begin▁of▁sentence｜>You are a helpful assistant<｜User｜>Hi<｜Assistant｜></think>"
    );
}

#[test]
fn think_max_prefix_and_context_rule() {
    assert_eq!(THINK_MAX_PREFIX.len(), 476);
    assert!(THINK_MAX_PREFIX.ends_with("\n\n") && THINK_MAX_PREFIX.matches('\n').count() == 4);
    assert_eq!(
        ThinkMode::Max.effective(THINK_MAX_MIN_CTX - 1),
        ThinkMode::High
    );
    assert_eq!(ThinkMode::Max.effective(THINK_MAX_MIN_CTX), ThinkMode::Max);
    assert_eq!(ThinkMode::None.effective(1), ThinkMode::None);
    let s = render_one_shot("sys", "p", ThinkMode::Max);
    assert!(s.starts_with(&format!(
        "<｜begin▁of▁sentence｜>{THINK_MAX_PREFIX}sys<｜User｜>"
    )));
}

#[test]
fn a_prompt_starting_with_bos_is_used_as_rendered() {
    let tok = Tokenizer::from_tokenizer_json(&default_tokenizer_json_bytes().unwrap()).unwrap();
    let pre = "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜></think>";
    assert_eq!(
        one_shot_prompt(&tok, "ignored", pre, ThinkMode::High),
        tok.encode_chat(pre)
    );
}
