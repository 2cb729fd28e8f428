//! `ds4`'s terminal output: the prefill progress bar and the generator that
//! prints the library's generation loop as it goes (reasoning in grey on a
//! terminal, the `<think>`/`</think>` markers hidden, UTF-8 split across
//! tokens buffered), for one-shot runs and the REPL ([`super::repl`]).

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::constrain::{GrammarEngine, OutputGrammar};
use crate::generate::{
    generate_with, Constrained, Observer, Piece, Sampled, Step, ThinkSplit, TokenPicker,
};
use crate::session::{Session, SyncStats};
use crate::speculate::Speculator;
use crate::tokenizer::Tokenizer;

/// Brings the session to `tokens`, with a progress bar on stderr.
pub fn prefill(sess: &mut Session, tokens: &[u32]) -> Result<SyncStats, String> {
    let bar = indicatif::ProgressBar::new(tokens.len() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "processing {len} input tokens: {pos}/{len} {wide_bar} {percent}% {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let r = sess.sync(tokens, &mut |done, _| bar.set_position(done as u64));
    bar.finish_and_clear();
    r.map_err(|e| e.to_string())
}

/// Samples and prints tokens: reasoning in grey on a terminal, the
/// `<think>`/`</think>` markers hidden, UTF-8 split across tokens buffered.
pub struct Generator<'t> {
    pub(crate) tok: &'t Tokenizer,
    picker: Sampled,
    tty: bool,
    /// `--json-schema`: every answer is constrained to the schema.
    grammar: Option<(GrammarEngine, OutputGrammar)>,
    /// Set by Ctrl+C: the answer stops at the next token.
    pub(crate) stop: &'static AtomicBool,
    /// Speculative decoding (`--spec`, `--mtp`, `--dspark`), if on.
    spec: Option<Speculator>,
}

/// Prints the pieces of the library's generation loop as they come.
struct Printer<'o> {
    out: std::io::StdoutLock<'o>,
    split: ThinkSplit,
    tty: bool,
    grey: bool,
    last_byte: u8,
    stop: &'static AtomicBool,
}

impl Printer<'_> {
    fn print(&mut self, pieces: Vec<Piece>) {
        for p in pieces {
            let (text, reasoning) = match &p {
                Piece::Reasoning(s) => (s, true),
                Piece::Text(s) => (s, false),
            };
            if !reasoning && self.grey {
                self.end_reasoning();
            }
            let _ = self.out.write_all(text.as_bytes());
            if let Some(&b) = text.as_bytes().last() {
                self.last_byte = b;
            }
        }
        // The reasoning phase ended even if no text followed yet.
        if self.grey && !self.split.thinking() {
            self.end_reasoning();
        }
        let _ = self.out.flush();
    }

    fn end_reasoning(&mut self) {
        self.grey = false;
        if self.tty {
            let _ = write!(self.out, "\x1b[0m");
        }
        if self.last_byte != b'\n' {
            let _ = writeln!(self.out);
        }
        self.last_byte = b'\n';
    }
}

impl Observer for Printer<'_> {
    fn cancelled(&mut self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }
    fn token(&mut self, _id: u32, bytes: &[u8]) -> Step {
        let pieces = self.split.push(bytes);
        self.print(pieces);
        Step::Continue
    }
}

impl<'t> Generator<'t> {
    /// A generator printing to stdout (grey reasoning when `tty`), sampling
    /// with `picker`, constrained by `grammar` when given, stopped by `stop`.
    pub fn new(
        tok: &'t Tokenizer,
        picker: Sampled,
        tty: bool,
        grammar: Option<(GrammarEngine, OutputGrammar)>,
        stop: &'static AtomicBool,
    ) -> Generator<'t> {
        Generator {
            tok,
            picker,
            tty,
            grammar,
            stop,
            spec: None,
        }
    }

    /// Generates with `spec` drafting (speculative decoding) from now on.
    pub fn with_speculator(mut self, spec: Option<Speculator>) -> Self {
        self.spec = spec;
        self
    }

    /// The speculator, when speculative decoding is on.
    pub fn speculator(&self) -> Option<&Speculator> {
        self.spec.as_ref()
    }

    /// The tokenizer the generator decodes with.
    pub fn tokenizer(&self) -> &'t Tokenizer {
        self.tok
    }

    /// Generates up to `max_new` tokens; returns them (EOS excluded).
    /// Stops early on Ctrl+C or a full context.
    pub fn run(
        &mut self,
        sess: &mut Session,
        max_new: usize,
        thinking: bool,
    ) -> Result<Vec<u32>, String> {
        let mut p = Printer {
            out: std::io::stdout().lock(),
            split: ThinkSplit::new(thinking),
            tty: self.tty,
            grey: thinking,
            last_byte: b'\n',
            stop: self.stop,
        };
        if thinking && self.tty {
            let _ = write!(p.out, "\x1b[90m");
        }
        let mut cut = false;
        let r = match &self.grammar {
            None => generate_with(
                sess,
                self.tok,
                max_new,
                &mut self.picker,
                &mut p,
                self.spec.as_mut(),
            ),
            Some((engine, g)) => {
                let c = engine.constraint(g).map_err(|e| e.to_string())?;
                let sp = self.tok.specials();
                let gates = if thinking {
                    vec![sp.think_close]
                } else {
                    Vec::new()
                };
                let mut cp = Constrained::new(&mut self.picker, c, gates, true, sp.eos);
                let r = generate_with(sess, self.tok, max_new, &mut cp, &mut p, self.spec.as_mut());
                cut = cp.unfinished();
                if let Some(e) = &cp.error {
                    eprintln!("ds4: grammar engine: {e}");
                }
                r
            }
        };
        let tail = p.split.finish();
        p.print(tail);
        if p.grey && self.tty {
            let _ = write!(p.out, "\x1b[0m");
        }
        if p.last_byte != b'\n' {
            let _ = writeln!(p.out);
        }
        drop(p);
        if cut {
            eprintln!("ds4: the answer was cut before it completed the JSON schema");
        }
        r.map(|o| o.tokens).map_err(|e| e.to_string())
    }
}
