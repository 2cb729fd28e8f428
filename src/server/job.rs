//! The contract between the HTTP layer and the worker thread: a [`Job`] in,
//! [`Event`]s back (accepted, deltas, the [`Final`] answer), and the hook a
//! disk KV cache plugs into ([`KvCacheHook`]). The wire formats (openai,
//! anthropic, responses) read only these types, never the worker itself.

use tokio::sync::mpsc::UnboundedSender;

use super::error::ApiError;
use super::logprobs::TokenLogprob;
use super::request::GenRequest;
use crate::kvcache::{KtmEntry, ToolIds};
use crate::session::Session;
use crate::tokenizer::Tokenizer;

/// Token counts of one response (SERVER.md §4.8).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt: usize,
    pub cached: usize,
    pub completion: usize,
    /// Speculative decoding: tokens drafted and kept (0 when off).
    pub drafted: usize,
    pub accepted: usize,
}

impl Usage {
    pub fn cache_write(&self) -> usize {
        self.prompt - self.cached.min(self.prompt)
    }

    /// A usage object gains `"speculative": {"drafted", "accepted"}` when
    /// speculative decoding drafted in this request (absent otherwise, so
    /// responses without it are unchanged).
    pub fn add_speculative(&self, usage: &mut serde_json::Value) {
        if self.drafted > 0 {
            usage["speculative"] =
                serde_json::json!({"drafted": self.drafted, "accepted": self.accepted});
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
    ToolCalls,
    Error,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
    /// Already sent whole as live events (header, fragments, end).
    pub streamed: bool,
}

/// The end of a job.
#[derive(Clone, Debug)]
pub struct Final {
    pub finish: FinishReason,
    /// Raw generated text (stop sequences cut), for completions.
    pub text: String,
    pub reasoning: Option<String>,
    pub content: String,
    pub calls: Vec<OutCall>,
    /// Whether `</think>` was generated.
    pub saw_think_close: bool,
    pub usage: Usage,
    /// Log-probabilities, when the request asked for them (`logprobs.rs`).
    pub logprobs: Option<Vec<TokenLogprob>>,
}

/// What a job sends back, in this order: `Accepted` (or `Rejected`), then
/// deltas, then `Done` (or `Failed`).
#[derive(Clone, Debug)]
pub enum Event {
    Accepted {
        prompt_tokens: usize,
        cached: usize,
    },
    Rejected(ApiError),
    Reasoning(String),
    Text(String),
    /// A tool call recognised live (chat and Anthropic): its header, then
    /// argument fragments, then its end.
    ToolStart {
        index: usize,
        id: String,
        name: String,
    },
    ToolArgs {
        index: usize,
        args: String,
    },
    ToolEnd {
        index: usize,
    },
    /// Scored tokens (prompt echo or generated), sent before their text.
    Logprobs(Vec<TokenLogprob>),
    Done(Box<Final>),
    Failed(String),
}

pub struct Job {
    pub req: GenRequest,
    pub events: UnboundedSender<Event>,
}

/// What the queue carries.
pub(super) enum Work {
    /// Boxed: a request is a few hundred bytes and every queue slot would
    /// otherwise be that large.
    Gen(Box<Job>),
    /// Ends the worker after the jobs queued before it; acknowledged once
    /// the cache had its shutdown call.
    Shutdown(std::sync::mpsc::Sender<()>),
}

/// Which remembered transcript a visible cache key is (KVCACHE.md §5.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VisibleKind {
    Responses,
    Thinking,
}

/// A disk hit: the effective prompt, the cached count and the checkpoint's
/// KTM tool-id map (for the tool memory, KVCACHE.md §7 step 5).
pub struct DiskResumed {
    pub effective: Vec<u32>,
    pub cached: usize,
    pub tool_map: Vec<KtmEntry>,
}

/// Where a disk KV cache hooks into the worker (KVCACHE.md §2 rule 7 and
/// §5's save moments). The shape follows `kvcache::SaveMoments`; the
/// defaults are "no cache", so without one the server behaves as with
/// `--kv-disk-dir` unset. Every call that may store a checkpoint gets the
/// worker's tool memory (`tools`), whose ids for the tool calls in the
/// checkpoint's text go into its KTM map (§4.5).
pub trait KvCacheHook: Send {
    /// Rules 1-6 found nothing: save the live session (evict), then bring
    /// it to the longest stored prefix of `rendered`. Returns the effective
    /// prompt and the cached count on a hit. `visible` is the transcript
    /// remembered at the live length, if any.
    fn resume(
        &mut self,
        _sess: &mut Session,
        _tok: &Tokenizer,
        _rendered: &str,
        _visible: Option<(&[u8], VisibleKind)>,
        _tools: &dyn ToolIds,
    ) -> Option<DiskResumed> {
        None
    }
    /// Replaces `Session::sync` (cold and continued saves on the way).
    fn prefill(
        &mut self,
        sess: &mut Session,
        _tok: &Tokenizer,
        prompt: &[u32],
        _cached: usize,
        progress: &mut dyn FnMut(usize, usize),
        _tools: &dyn ToolIds,
    ) -> Result<crate::session::SyncStats, crate::session::SessionError> {
        sess.sync(prompt, progress)
    }
    /// Before each decode step (continued saves); not called inside the
    /// DSML block of a request with tools.
    fn before_decode(&mut self, _sess: &Session, _tok: &Tokenizer, _tools: &dyn ToolIds) {}
    /// The next live length above `live` at which `before_decode` may
    /// store (speculative steps never jump over it); `None`: none.
    fn next_checkpoint(&self, _live: usize) -> Option<usize> {
        None
    }
    /// Clean shutdown, after the last request (§5.4).
    fn shutdown(
        &mut self,
        _sess: &Session,
        _tok: &Tokenizer,
        _visible: Option<(&[u8], VisibleKind)>,
        _tools: &dyn ToolIds,
    ) {
    }
    /// Tool-id prefetch (§7, last paragraph): the (id, DSML block) pairs
    /// stored in any checkpoint's KTM map whose id `wanted` accepts. Called
    /// before a request is rendered, for ids the tool memory lacks.
    fn prefetch_tool_ids(&mut self, _wanted: &dyn Fn(&[u8]) -> bool) -> Vec<KtmEntry> {
        Vec::new()
    }
}

/// No disk cache.
pub struct NoCache;

impl KvCacheHook for NoCache {}
