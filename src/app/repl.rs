//! `ds4`'s interactive REPL (CLI.md §1.4): one transcript, one KV session;
//! each turn only evaluates what the session does not hold yet. Commands
//! change the thinking mode or the context, read a file as the message, and
//! save or load the conversation's KV state in a KVC file.

use std::io::{BufRead, IsTerminal, Write};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::terminal::{prefill, Generator};
use crate::chat::{self, ThinkMode};
use crate::session::Session;
use crate::tokenizer::Tokenizer;

const REPL_HELP: &str =
    "commands: /help, /think, /think-max, /nothink, /ctx N, /read FILE, /save FILE, /load FILE,\n\
    /quit (or /exit); /save and /load keep the conversation's KV state in a KVC file (the\n\
    server's disk-cache format)\n\
    anything else is sent as a user message; Ctrl+C stops an answer, Ctrl+D leaves";

/// The interactive REPL (CLI.md §1.4): one transcript, one KV session; each
/// turn only evaluates what the session does not hold yet. `make_session`
/// opens a session of another context size (`/ctx N`); `v41_level` is the
/// V4.1 thinking level (`None` on V4); `max_tokens` caps each answer.
pub fn repl(
    session: Session,
    make_session: &dyn Fn(usize) -> Result<Session, String>,
    gen: &mut Generator<'_>,
    system: &str,
    mode: ThinkMode,
    v41_level: Option<u8>,
    max_tokens: Option<usize>,
) -> Result<(), String> {
    let mut r = Repl {
        tok: gen.tok,
        head: Vec::new(),
        turns: Vec::new(),
        sess: session,
        make_session,
        system,
        mode,
        v41_level,
        max_tokens,
    };
    r.head = r.start();
    eprintln!("{REPL_HELP}");
    let stdin = std::io::stdin();
    let interactive = stdin.is_terminal();
    let mut lines = stdin.lock().lines();
    loop {
        if interactive {
            print!("ds4> ");
            let _ = std::io::stdout().flush();
        }
        gen.stop.store(false, Ordering::SeqCst);
        let Some(line) = lines.next() else { break };
        let line = line.map_err(|e| format!("stdin: {e}"))?;
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        match r.command(line) {
            Line::Quit => break,
            Line::Done => continue,
            Line::Send(text) => r.turn(gen, &text)?,
        }
    }
    Ok(())
}

/// What one input line asks for.
enum Line {
    /// `/quit`, `/exit`.
    Quit,
    /// A command that did its work (or said why not).
    Done,
    /// A user message, typed or read from a file.
    Send(String),
}

/// The REPL's conversation: the transcript start (system prompt and
/// thinking mode) and the turns since, in tokens, over one session.
struct Repl<'a> {
    tok: &'a Tokenizer,
    sess: Session,
    make_session: &'a dyn Fn(usize) -> Result<Session, String>,
    system: &'a str,
    mode: ThinkMode,
    v41_level: Option<u8>,
    max_tokens: Option<usize>,
    head: Vec<u32>,
    turns: Vec<u32>,
}

impl Repl<'_> {
    /// The thinking mode as written: V4.1 has no Think Max context rule
    /// (its levels are written as given).
    fn effective(&self) -> ThinkMode {
        match self.v41_level {
            Some(_) => self.mode,
            None => self.mode.effective(self.sess.ctx()),
        }
    }

    /// The transcript start for the current mode and context.
    fn start(&self) -> Vec<u32> {
        let tok = self.tok;
        match self.v41_level {
            Some(l) => chat::v41::transcript_start(tok, self.system, self.mode.v41_level(l)),
            None => chat::transcript_start(tok, self.system, self.mode.effective(self.sess.ctx())),
        }
    }

    /// One input line: a command, or the text of a user message.
    fn command(&mut self, line: &str) -> Line {
        match line
            .split_once(' ')
            .map_or((line, ""), |(c, r)| (c, r.trim()))
        {
            ("/quit" | "/exit", _) => Line::Quit,
            ("/help", _) => {
                eprintln!("{REPL_HELP}");
                Line::Done
            }
            (cmd @ ("/think" | "/nothink" | "/think-max"), rest) => {
                self.set_mode(cmd, rest);
                Line::Done
            }
            ("/ctx", n) => {
                self.set_ctx(n);
                Line::Done
            }
            ("/save", f) if !f.is_empty() => {
                self.save(f);
                Line::Done
            }
            ("/load", f) if !f.is_empty() => {
                self.load(f);
                Line::Done
            }
            (cmd @ ("/save" | "/load"), _) => {
                eprintln!("ds4: {cmd}: expected a file name");
                Line::Done
            }
            ("/read", f) => match std::fs::read(f).map(String::from_utf8) {
                Ok(Ok(t)) => Line::Send(t),
                Ok(Err(_)) => {
                    eprintln!("ds4: {f}: not valid UTF-8");
                    Line::Done
                }
                Err(e) => {
                    eprintln!("ds4: {f}: {e}");
                    Line::Done
                }
            },
            (c, _) if c.starts_with('/') => {
                eprintln!("ds4: unknown command: {c} (try /help)");
                Line::Done
            }
            _ => Line::Send(line.to_string()),
        }
    }

    /// `/think`, `/nothink`, `/think-max`.
    fn set_mode(&mut self, cmd: &str, rest: &str) {
        if !rest.is_empty() {
            eprintln!("ds4: {cmd} takes no argument (try /help)");
            return;
        }
        self.mode = match cmd {
            "/think" => ThinkMode::High,
            "/nothink" => ThinkMode::None,
            _ => ThinkMode::Max,
        };
        // Only the transcript start changes (Think Max prefix); the
        // next sync notices the KV no longer matches (PROMPT.md §10).
        self.head = self.start();
        match (self.mode, self.effective()) {
            (ThinkMode::Max, ThinkMode::High) => println!(
                "Thinking mode: high (ctx below {}).",
                chat::THINK_MAX_MIN_CTX
            ),
            (_, ThinkMode::Max) => println!("Thinking mode: max."),
            (_, ThinkMode::High) => println!("Thinking mode: high."),
            (_, ThinkMode::None) => println!("Thinking mode: none."),
        }
    }

    /// `/ctx N`: a new KV of the new size; the conversation restarts.
    fn set_ctx(&mut self, n: &str) {
        match n.parse::<usize>() {
            Ok(n) if n >= 2 => match (self.make_session)(n) {
                Ok(s) => {
                    self.sess = s;
                    self.turns.clear();
                    self.head = self.start();
                    eprintln!("ds4: context is now {n} tokens (conversation cleared)");
                }
                Err(e) => eprintln!("ds4: /ctx {n}: {e}"),
            },
            _ => eprintln!("ds4: /ctx: expected a number of tokens ≥ 2, got {n:?}"),
        }
    }

    /// `/save FILE`: the same KVC file and session payload as the server's
    /// disk cache (docs/KVCACHE.md), keyed by the rendered transcript. The
    /// reply's closing EOS is not evaluated yet: sync first so the file
    /// holds the whole transcript and /load can go on.
    fn save(&mut self, f: &str) {
        let mut transcript = self.head.clone();
        transcript.extend(&self.turns);
        if let Err(e) = prefill(&mut self.sess, &transcript) {
            eprintln!("ds4: /save {f}: {e}");
            return;
        }
        let text = self.tok.decode(self.sess.tokens());
        match crate::kvcache::save_file(
            Path::new(f),
            &self.sess,
            &text,
            crate::kvcache::SaveReason::Unknown,
        ) {
            Ok(bytes) => eprintln!(
                "ds4: saved {} tokens to {f} ({})",
                self.sess.tokens().len(),
                super::report::human(bytes)
            ),
            Err(e) => eprintln!("ds4: /save {f}: {e}"),
        }
    }

    /// `/load FILE`: the file must hold this chat's transcript start (same
    /// system prompt and thinking mode) to go on.
    fn load(&mut self, f: &str) {
        match crate::kvcache::load_file(Path::new(f), &mut self.sess) {
            Ok(_) => {
                let toks = self.sess.tokens();
                if toks.starts_with(&self.head) {
                    self.turns = toks[self.head.len()..].to_vec();
                    eprintln!("ds4: loaded {} tokens from {f}", toks.len());
                } else {
                    // Not this chat's: the current conversation goes
                    // on (the next turn prefills it again).
                    self.sess.reset();
                    eprintln!(
                        "ds4: /load {f}: saved with another system prompt or thinking mode; not loaded"
                    );
                }
            }
            Err(e) => {
                // The session is untouched or empty; either way the
                // next turn syncs the current conversation again.
                eprintln!("ds4: /load: {e}");
            }
        }
    }

    /// One user message: prefill what the session lacks, answer, and keep
    /// the turn (unless Ctrl+C stopped it before any token).
    fn turn(&mut self, gen: &mut Generator<'_>, text: &str) -> Result<(), String> {
        let eff = self.effective();
        let turn = chat::user_turn(self.tok, text, eff);
        let mut transcript = self.head.clone();
        transcript.extend(&self.turns);
        transcript.extend(&turn);
        let sess = &mut self.sess;
        if transcript.len() + 1 >= sess.ctx() {
            eprintln!(
                "ds4: the conversation no longer fits the context of {} tokens",
                sess.ctx()
            );
            return Ok(());
        }
        let t = Instant::now();
        let stats = match prefill(sess, &transcript) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("ds4: {e}");
                return Ok(());
            }
        };
        eprintln!(
            "ds4: prefill {} new tokens ({} reused) at {:.1} t/s",
            stats.evaluated,
            stats.reused,
            stats.evaluated as f64 / t.elapsed().as_secs_f64().max(1e-9)
        );
        let room = sess.ctx() - transcript.len() - 1;
        let generated = gen.run(
            sess,
            self.max_tokens.unwrap_or(room).min(room),
            eff.thinks(),
        )?;
        if generated.is_empty() && gen.stop.load(Ordering::SeqCst) {
            // Interrupted before any token: the turn is dropped.
            sess.reset();
            return Ok(());
        }
        self.turns.extend(&turn);
        self.turns.extend(&generated);
        self.turns.push(self.tok.specials().eos);
        Ok(())
    }
}
