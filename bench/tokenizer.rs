//! Tokenizer encode throughput on a ~25k-token agent prompt, one thread
//! (`cargo bench --bench tokenizer`). Reports cold (empty piece cache) and
//! warm (cache filled by a previous encode of the same prompt) figures.

use std::time::Instant;

use ds4::testmodel::vocab::default_tokenizer_json_bytes;
use ds4::tokenizer::Tokenizer;

/// A deterministic coding-agent prompt: system text, tool schemas, a file
/// listing, source code, a conversation with tool results.
fn agent_prompt() -> String {
    let mut s = String::from(
        "You are an expert coding agent. You can read and edit files, run shell commands and search the web. \
         Always explain what you are about to do before calling a tool, keep diffs minimal, and never invent APIs.\n\n## Tools\n\n",
    );
    for (name, desc) in [
        (
            "read_file",
            "Read a file from the workspace and return its contents with line numbers.",
        ),
        (
            "write_file",
            "Create or overwrite a file with the given contents.",
        ),
        (
            "edit_file",
            "Replace an exact snippet in a file with new text; fails if the snippet is not unique.",
        ),
        (
            "run_shell",
            "Run a shell command in the workspace root with a timeout in seconds.",
        ),
        (
            "grep",
            "Search the workspace for a regular expression and return matching lines.",
        ),
        (
            "list_dir",
            "List the entries of a directory, recursively up to a depth.",
        ),
    ] {
        s.push_str(&format!(
            "{{\"type\":\"function\",\"function\":{{\"name\":\"{name}\",\"description\":\"{desc}\",\"parameters\":{{\"type\":\"object\",\"properties\":{{\"path\":{{\"type\":\"string\",\"description\":\"Path relative to the workspace root\"}},\"timeout\":{{\"type\":\"integer\",\"minimum\":1,\"maximum\":600}}}},\"required\":[\"path\"]}}}}}}\n"
        ));
    }
    let code = "impl Session {\n    /// Brings the session to exactly `tokens`, reusing the longest prefix.\n    pub fn sync(&mut self, tokens: &[u32]) -> Result<SyncStats, SessionError> {\n        let common = self.tokens.iter().zip(tokens).take_while(|(a, b)| a == b).count();\n        if common == tokens.len() {\n            return Ok(SyncStats { reused: common, evaluated: 0 });\n        }\n        self.eval_tokens(&tokens[common..])?;\n        Ok(SyncStats { reused: common, evaluated: tokens.len() - common })\n    }\n}\n\n";
    let talk = "User: The build fails on the CI machine with `error[E0382]: borrow of moved value: buf` in src/backend/cpu.rs line 214. Can you look?\n\
        Assistant: I'll read the file around that line first, then check where `buf` is moved.\n\
        Tool result: 210 |     let buf = g.take(o.out);\n211 |     o.cpu(file, g.get(o.x), &mut buf);\n212 |     g.put(o.out, buf);\n213 |     // later\n214 |     eprintln!(\"{:?}\", buf.len());\n\n";
    let mut i = 0;
    while s.len() < 84_000 {
        s.push_str(&format!("=== src/module_{i}.rs ===\n"));
        s.push_str(code);
        s.push_str(talk);
        s.push_str(&format!("{{\"step\": {i}, \"status\": \"ok\", \"elapsed_ms\": {}, \"files\": [\"a/{i}.rs\", \"b/{i}.toml\"]}}\n", i * 37 % 1000));
        i += 1;
    }
    s
}

fn main() {
    let tok = Tokenizer::from_tokenizer_json(&default_tokenizer_json_bytes().unwrap())
        .expect("tokenizer");
    let text = agent_prompt();
    let n_tokens = tok.encode(&text).len();
    let reps = 20;
    let mb = text.len() as f64 / 1e6;
    let t = Instant::now();
    for _ in 0..reps {
        tok.clear_cache();
        std::hint::black_box(tok.encode(&text));
    }
    let cold = t.elapsed().as_secs_f64() / reps as f64;
    let t = Instant::now();
    for _ in 0..reps {
        std::hint::black_box(tok.encode(&text));
    }
    let warm = t.elapsed().as_secs_f64() / reps as f64;
    println!("agent prompt: {} bytes, {n_tokens} tokens", text.len());
    println!(
        "cold cache: {:.2} MB/s, {:.0} tokens/s",
        mb / cold,
        n_tokens as f64 / cold
    );
    println!(
        "warm cache: {:.2} MB/s, {:.0} tokens/s",
        mb / warm,
        n_tokens as f64 / warm
    );
}
