//! The streaming side of one job: the [`Observer`] that sees every token
//! and turns raw bytes into events: stop sequences, the reasoning / text
//! split, the hold while a tool block may be forming, live tool-call events
//! (chat and Anthropic), the greedy DSML structure, and cancellation when
//! the client left.

use std::sync::Arc;

use tokio::sync::mpsc::UnboundedSender;

use super::dsml;
use super::job::{Event, KvCacheHook};
use super::memory::{id_rng, random_hex};
use super::request::{Api, GenRequest};
use super::scan::ToolScan;
use crate::generate::{self, Observer, Piece, Step, ThinkSplit};
use crate::kvcache::ToolIds;
use crate::sampler::Rng;
use crate::session::Session;
use crate::tokenizer::Tokenizer;

/// Observer of one job: stop sequences, reasoning/text split, the text hold
/// while a tool block may be forming, DSML greedy structure, cancellation.
pub(super) struct Stream {
    events: UnboundedSender<Event>,
    tok: Arc<Tokenizer>,
    pub(super) raw: Vec<u8>,
    /// Bytes of `raw` already given to the splitter.
    fed: usize,
    stop: Vec<String>,
    stop_hold: usize,
    scanned: usize,
    pub(super) stop_hit: bool,
    pub(super) split: ThinkSplit,
    tools: bool,
    /// Visible text not sent yet (tool hold).
    pending: String,
    in_block: bool,
    /// Live tool-call streaming (chat and Anthropic only).
    live: Option<dsml::LiveTools>,
    live_enabled: bool,
    id_prefix: &'static str,
    rng: Rng,
    pub(super) live_ids: Vec<String>,
    pub(super) live_closed: Vec<bool>,
    /// The per-token DSML questions, answered incrementally.
    scan: ToolScan,
}

/// Bytes searched back for a forming tool marker (PROMPT.md §8).
const TOOL_HOLD_WINDOW: usize = 80;

impl Stream {
    pub(super) fn new(
        req: &GenRequest,
        thinking: bool,
        events: UnboundedSender<Event>,
        tok: Arc<Tokenizer>,
        seq: u64,
    ) -> Stream {
        let stop_hold = req.stop.iter().map(|s| s.len()).max().unwrap_or(1) - 1;
        Stream {
            events,
            tok,
            raw: Vec::new(),
            fed: 0,
            stop: req.stop.clone(),
            stop_hold,
            scanned: 0,
            stop_hit: false,
            split: ThinkSplit::new(thinking),
            tools: req.chat_style() && req.tools_active(),
            pending: String::new(),
            in_block: false,
            live: None,
            live_enabled: matches!(req.api, Api::Chat | Api::Messages),
            id_prefix: if req.api == Api::Messages {
                "toolu_"
            } else {
                "call_"
            },
            rng: id_rng(seq),
            live_ids: Vec::new(),
            live_closed: Vec::new(),
            scan: ToolScan::new(thinking),
        }
    }

    /// Inside the DSML block of a request with tools: no continued save
    /// there (KVCACHE.md §5.2).
    pub(super) fn in_tool_block(&self) -> bool {
        self.tools && self.in_block
    }

    /// The token's bytes (EOS excluded).
    pub(super) fn token_bytes(&self, id: u32) -> &[u8] {
        self.tok.token_bytes(id).unwrap_or(&[])
    }

    fn live_text(&mut self, t: &str) {
        let Some(lt) = self.live.as_mut() else { return };
        for ev in lt.push(t) {
            let e = match ev {
                dsml::ToolEvent::Start(name) => {
                    let id = format!("{}{}", self.id_prefix, random_hex(16, &mut self.rng));
                    self.live_ids.push(id.clone());
                    self.live_closed.push(false);
                    Event::ToolStart {
                        index: self.live_ids.len() - 1,
                        id,
                        name,
                    }
                }
                dsml::ToolEvent::Args(args) => Event::ToolArgs {
                    index: self.live_ids.len().saturating_sub(1),
                    args,
                },
                dsml::ToolEvent::End => {
                    if let Some(c) = self.live_closed.last_mut() {
                        *c = true;
                    }
                    Event::ToolEnd {
                        index: self.live_ids.len().saturating_sub(1),
                    }
                }
            };
            let _ = self.events.send(e);
        }
    }

    fn send_pieces(&mut self, pieces: Vec<Piece>) {
        for p in pieces {
            match p {
                Piece::Reasoning(r) => {
                    let _ = self.events.send(Event::Reasoning(r));
                }
                Piece::Text(t) => self.text(t),
            }
        }
    }

    fn text(&mut self, t: String) {
        if !self.tools {
            let _ = self.events.send(Event::Text(t));
            return;
        }
        if self.in_block {
            self.live_text(&t);
            return;
        }
        self.pending.push_str(&t);
        if let Some((p, v)) = dsml::block_start(self.pending.as_bytes()) {
            let before = self.pending[..p].trim_end_matches(|c: char| c.is_ascii_whitespace());
            if !before.is_empty() {
                let _ = self.events.send(Event::Text(before.to_string()));
            }
            let open = dsml::block_open(v);
            let rest = self.pending[p..]
                .find(open)
                .map(|i| self.pending[p + i + open.len()..].to_string())
                .unwrap_or_default();
            self.pending.clear();
            self.in_block = true;
            if self.live_enabled {
                self.live = Some(dsml::LiveTools::new(v));
                self.live_text(&rest);
            }
            return;
        }
        // Hold trailing whitespace and a `<` near the end (a marker may form).
        let mut window = self.pending.len().saturating_sub(TOOL_HOLD_WINDOW);
        while !self.pending.is_char_boundary(window) {
            window -= 1;
        }
        let cut = match self.pending[window..].rfind('<') {
            Some(lt) => window + lt,
            None => self.pending.len(),
        };
        let keep = self.pending[..cut]
            .trim_end_matches(|c: char| c.is_ascii_whitespace())
            .len();
        if keep > 0 {
            let out: String = self.pending.drain(..keep).collect();
            let _ = self.events.send(Event::Text(out));
        }
    }

    pub(super) fn flush(&mut self) {
        let rest = self.raw[self.fed..].to_vec();
        self.fed = self.raw.len();
        let mut pieces = self.split.push(&rest);
        pieces.extend(self.split.finish());
        self.send_pieces(pieces);
        if !self.in_block && !self.pending.is_empty() {
            let out = std::mem::take(&mut self.pending);
            let _ = self.events.send(Event::Text(out));
        }
    }
}

/// The serial worker's observer: the stream plus the disk cache's continued
/// saves before each step.
pub(super) struct WithCache<'c> {
    pub(super) stream: &'c mut Stream,
    pub(super) cache: &'c mut dyn KvCacheHook,
    /// The tool memory, for the KTM map of continued saves.
    pub(super) tools: &'c dyn ToolIds,
    pub(super) tok: &'c Tokenizer,
}

impl Observer for WithCache<'_> {
    fn before_step(&mut self, sess: &Session) {
        if !self.stream.in_tool_block() {
            self.cache.before_decode(sess, self.tok, self.tools);
        }
    }

    fn greedy_next(&mut self) -> bool {
        self.stream.greedy_next()
    }

    fn next_checkpoint(&mut self, live: usize) -> Option<usize> {
        self.cache.next_checkpoint(live)
    }

    fn cancelled(&mut self) -> bool {
        self.stream.cancelled()
    }

    fn token(&mut self, id: u32, bytes: &[u8]) -> Step {
        self.stream.token(id, bytes)
    }
}

/// The stream alone (the slot scheduler calls the disk cache itself).
impl Observer for Stream {
    fn greedy_next(&mut self) -> bool {
        self.tools && self.scan.structural(&self.raw)
    }

    fn cancelled(&mut self) -> bool {
        self.events.is_closed()
    }

    fn token(&mut self, _id: u32, bytes: &[u8]) -> Step {
        let before = self.raw.len();
        self.raw.extend_from_slice(bytes);
        if !self.stop.is_empty() {
            let from = self.scanned.min(before).saturating_sub(self.stop_hold);
            let hit = self
                .stop
                .iter()
                .filter_map(|s| generate::find(&self.raw[from..], s.as_bytes()).map(|i| from + i))
                .min();
            self.scanned = self.raw.len();
            if let Some(at) = hit {
                self.raw.truncate(at);
                self.stop_hit = true;
                return Step::Stop;
            }
        }
        let safe = self.raw.len().saturating_sub(self.stop_hold).max(self.fed);
        let chunk = self.raw[self.fed..safe].to_vec();
        self.fed = safe;
        let pieces = self.split.push(&chunk);
        self.send_pieces(pieces);
        // A tool block closed after the reasoning: generation ends.
        if self.tools && self.scan.block_closed(&self.raw) {
            return Step::Stop;
        }
        Step::Continue
    }
}
