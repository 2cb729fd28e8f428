//! The greedy logprob dump of `ds4 --dump-logprobs` (CLI.md §1.6): at each
//! step the top-k alternatives with logits and log-probabilities, the argmax
//! taken, written as JSON in ds4's layout (`%.9g` numbers). The numbers are
//! [`LogSoftmax`], the same the server's `logprobs` report.

use std::path::Path;

use crate::sampler::{top_ids, LogSoftmax};
use crate::session::Session;
use crate::tokenizer::Tokenizer;

/// JSON string escaping of CLI.md §1.6.
pub fn json_text(bytes: &[u8]) -> String {
    let mut s = String::new();
    let valid = std::str::from_utf8(bytes).is_ok();
    let text: Vec<char> = if valid {
        String::from_utf8_lossy(bytes).chars().collect()
    } else {
        bytes.iter().map(|&b| b as char).collect()
    };
    for c in text {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            '\n' => s.push_str("\\n"),
            '\r' => s.push_str("\\r"),
            '\t' => s.push_str("\\t"),
            c if (c as u32) < 0x20 => s.push_str(&format!("\\u{:04x}", c as u32)),
            c if !valid && (c as u32) >= 0x80 => s.push_str(&format!("\\u{:04x}", c as u32)),
            c => s.push(c),
        }
    }
    s
}

/// `%.9g`
pub fn g9(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return format!("{x}");
    }
    let e = x.abs().log10().floor() as i32;
    if !(-5..9).contains(&e) {
        let s = format!("{:.8e}", x);
        let (m, ex) = s.split_once('e').unwrap_or((&s, "0"));
        let m = m.trim_end_matches('0').trim_end_matches('.');
        let ex: i32 = ex.parse().unwrap_or(0);
        format!("{m}e{}{:02}", if ex < 0 { '-' } else { '+' }, ex.abs())
    } else {
        let decimals = (8 - e).max(0) as usize;
        let s = format!("{:.*}", decimals, x);
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    }
}

pub fn token_json(tok: &Tokenizer, id: u32) -> String {
    let bytes = tok.token_bytes(id).unwrap_or(&[]);
    let list: Vec<String> = bytes.iter().map(|b| b.to_string()).collect();
    format!(
        "{{\"id\":{id},\"text\":\"{}\",\"bytes\":[{}]}}",
        json_text(bytes),
        list.join(",")
    )
}

pub fn dump_logprobs(
    sess: &mut Session,
    tok: &Tokenizer,
    prompt_len: usize,
    steps: usize,
    k: usize,
    path: &Path,
) -> Result<(), String> {
    let mut out = format!(
        "{{\n  \"source\":\"ds4\",\n  \"prompt_tokens\":{prompt_len},\n  \"ctx\":{},\n  \"top_k\":{k},\n  \"steps\":[\n",
        sess.ctx()
    );
    let eos = tok.specials().eos;
    for step in 0..steps {
        let logits = sess.logits();
        let ls = LogSoftmax::new(logits);
        let idx = top_ids(logits, k.max(1));
        let sel = idx[0] as u32;
        let tops: Vec<String> = idx[..k.min(idx.len())]
            .iter()
            .map(|&i| {
                format!(
                    "{{\"token\":{},\"logit\":{},\"logprob\":{}}}",
                    token_json(tok, i as u32),
                    g9(logits[i] as f64),
                    g9(ls.of(logits[i]))
                )
            })
            .collect();
        if step > 0 {
            out.push_str(",\n");
        }
        out.push_str(&format!(
            "    {{\"step\":{step},\"selected\":{},\"top_logprobs\":[{}]}}",
            token_json(tok, sel),
            tops.join(",")
        ));
        if sel == eos || step + 1 == steps {
            break;
        }
        sess.eval(sel).map_err(|e| e.to_string())?;
    }
    out.push_str("\n  ]\n}\n");
    std::fs::write(path, out).map_err(|e| format!("{}: {e}", path.display()))
}
