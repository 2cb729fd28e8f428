//! The finish phase of a job, shared by the serial worker and the slot
//! scheduler: what generation produced ([`Decoded`], taken from the stream
//! observer with the decode metrics), then the finish reason, the DSML
//! block parsed into calls with ids (remembered for exact replay), the
//! bindings the next request on the slot may reuse (SERVER.md §9), the
//! trace, the log line and the `Done` event. `Decoded` lives here, with its
//! only reader: the phases read no field of it but `stop_hit`.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::core::{Bindings, Core, Prefilled};
use super::dsml::{self, Parsed};
use super::job::{Event, Final, FinishReason, OutCall, Usage};
use super::logprobs::TokenLogprob;
use super::memory::{random_hex, ProtocolBinding, VisibleBinding};
use super::render;
use super::request::{Api, GenRequest, Role};
use super::stream::Stream;
use crate::chat::template::EOS;
use crate::generate::Finish;
use crate::sampler::Rng;
use crate::speculate::SpecStats;

/// What generation produced.
pub(super) struct Decoded {
    tokens: usize,
    finish: Finish,
    thinking: bool,
    pub(super) stop_hit: bool,
    raw: String,
    saw_close: bool,
    live_ids: Vec<String>,
    live_closed: Vec<bool>,
    /// The grammar (response format, strict tools) was still open at the
    /// end: the output is not a complete match, so the finish is `length`.
    grammar_open: bool,
    /// The generated tokens scored, when log-probabilities were asked for.
    logprobs: Vec<TokenLogprob>,
    /// What speculative decoding did in this request (zeros when off).
    spec: SpecStats,
}

impl Decoded {
    /// Records what speculative decoding did in this request (and counts
    /// it in `/metrics`).
    pub(super) fn with_spec(mut self, st: SpecStats, metrics: &super::metrics::Metrics) -> Decoded {
        metrics.record_spec(&st);
        self.spec = st;
        self
    }
}

impl Core {
    /// The stream observer's results and the decode metrics.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn decoded(
        &self,
        obs: &mut Stream,
        tokens: usize,
        finish: Finish,
        thinking: bool,
        grammar_open: bool,
        logprobs: Vec<TokenLogprob>,
        gen_s: f64,
        prefill_s: f64,
    ) -> Decoded {
        obs.flush();
        let d = Decoded {
            tokens,
            finish,
            thinking,
            stop_hit: obs.stop_hit,
            raw: String::from_utf8_lossy(&obs.raw).into_owned(),
            saw_close: obs.split.saw_close(),
            live_ids: std::mem::take(&mut obs.live_ids),
            live_closed: std::mem::take(&mut obs.live_closed),
            grammar_open,
            logprobs,
            spec: SpecStats::default(),
        };
        let m = &self.metrics;
        m.generated_tokens
            .fetch_add(d.tokens as u64, Ordering::Relaxed);
        m.record_speed(d.tokens, gen_s, prefill_s);
        d
    }

    /// Finish: the finish reason, the DSML parse and the call ids, the
    /// bindings the next request on this slot may reuse (`live_len` is the
    /// slot's length now), the trace and the log line.
    pub(super) fn finish(
        &mut self,
        p: Prefilled,
        mut d: Decoded,
        b: &mut Bindings,
        live_len: usize,
    ) {
        let Prefilled {
            req,
            events,
            text,
            prompt,
            cached,
            t0,
            seq,
            mut ids,
            lp,
            ..
        } = p;
        let mut fin = Final {
            finish: match d.finish {
                Finish::Eos | Finish::Stopped if d.grammar_open => FinishReason::Length,
                Finish::Eos => FinishReason::Stop,
                Finish::Length => FinishReason::Length,
                Finish::Stopped if d.stop_hit => FinishReason::Stop,
                Finish::Stopped => FinishReason::ToolCalls,
                Finish::Cancelled => FinishReason::Error,
            },
            text: match &lp.echo {
                Some(echo) => format!("{echo}{}", d.raw),
                None => d.raw.clone(),
            },
            reasoning: None,
            content: d.raw.clone(),
            calls: Vec::new(),
            saw_think_close: d.saw_close,
            usage: Usage {
                prompt,
                cached,
                completion: d.tokens,
                drafted: d.spec.drafted as usize,
                accepted: d.spec.accepted as usize,
            },
            logprobs: lp.finish(d.logprobs.clone(), d.raw.len(), self.tok.specials().eos),
        };
        if d.finish == Finish::Cancelled {
            self.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
        }
        if req.chat_style() {
            let raw_block = self.parse_calls(&req, &mut d, &mut fin, &mut ids);
            // SERVER.md §9.3: remember the visible transcript of a plain
            // thinking turn so the next request keeps the hidden reasoning.
            let tool_context = req.tools_active()
                || req
                    .messages
                    .iter()
                    .any(|m| !m.tool_calls.is_empty() || m.role == Role::Tool);
            if d.thinking
                && !tool_context
                && fin.saw_think_close
                && matches!(fin.finish, FinishReason::Stop)
                && !d.stop_hit
            {
                let base = text.strip_suffix("<think>").unwrap_or(&text);
                b.thinking_visible = Some(VisibleBinding {
                    text: format!("{base}</think>{}{EOS}", fin.content),
                    live_len,
                });
            }
            self.bind_protocol(
                b, live_len, &req, &text, &fin, raw_block, d.thinking, d.stop_hit,
            );
        }
        let elapsed = t0.elapsed().as_secs_f64();
        self.trace.result(seq, &fin, elapsed);
        let spec = if fin.usage.drafted > 0 {
            format!(
                " drafted={} accepted={}",
                fin.usage.drafted, fin.usage.accepted
            )
        } else {
            String::new()
        };
        crate::log_line!(
            "ds4-server: request {} {:?} stream={} prompt={} cached={} generated={}{} finish={:?} calls={} {:.2}s",
            seq,
            req.api,
            req.stream as u8,
            fin.usage.prompt,
            fin.usage.cached,
            fin.usage.completion,
            spec,
            fin.finish,
            fin.calls.len(),
            elapsed
        );
        let _ = events.send(Event::Done(Box::new(fin)));
    }

    /// The DSML block of a chat-style answer into calls with ids (the ids
    /// shown live are kept), remembered for exact replay; returns the raw
    /// sampled block.
    fn parse_calls(
        &mut self,
        req: &GenRequest,
        d: &mut Decoded,
        fin: &mut Final,
        ids: &mut Rng,
    ) -> Option<String> {
        let p: Parsed = dsml::parse_output(&d.raw, d.thinking);
        let raw_block = p.raw_dsml.clone();
        fin.reasoning = p.reasoning.filter(|r| !r.is_empty());
        fin.content = p.content.clone();
        if p.failed {
            if p.unterminated && fin.finish != FinishReason::Length {
                fin.finish = FinishReason::Error;
            } else if req.tools_active() && fin.finish == FinishReason::ToolCalls {
                fin.finish = FinishReason::Stop;
            }
        } else if !p.calls.is_empty() {
            fin.finish = FinishReason::ToolCalls;
            let prefix = if req.api == Api::Messages {
                "toolu_"
            } else {
                "call_"
            };
            let block = Arc::new(p.raw_dsml.clone().unwrap_or_default());
            for (i, c) in p.calls.into_iter().enumerate() {
                // The ids shown live are the ids of the parsed calls.
                let live = d.live_ids.get(i).cloned();
                let streamed = d.live_closed.get(i).copied().unwrap_or(false);
                let id = live.unwrap_or_else(|| loop {
                    let id = format!("{prefix}{}", random_hex(16, ids));
                    if !self.memory.contains(&id) {
                        break id;
                    }
                });
                if self.cfg.exact_replay {
                    self.memory
                        .insert(&id, block.clone(), self.cfg.tool_memory_max_ids);
                }
                fin.calls.push(OutCall {
                    id,
                    name: c.name,
                    arguments: c.arguments,
                    streamed,
                });
            }
        } else if fin.finish == FinishReason::ToolCalls {
            fin.finish = FinishReason::Stop;
        }
        raw_block
    }

    /// Records the Responses / Anthropic protocol state of a finished turn.
    #[allow(clippy::too_many_arguments)]
    fn bind_protocol(
        &mut self,
        b: &mut Bindings,
        live_len: usize,
        req: &GenRequest,
        prompt_text: &str,
        fin: &Final,
        raw_block: Option<String>,
        thinking: bool,
        stop_hit: bool,
    ) {
        if matches!(fin.finish, FinishReason::Error | FinishReason::Length) || stop_hit {
            return;
        }
        let ids: Vec<String> = fin.calls.iter().map(|c| c.id.clone()).collect();
        match req.api {
            Api::Responses => {
                let mut v = prompt_text.to_string();
                if thinking {
                    if req.reasoning_summary && !fin.calls.is_empty() {
                        v.push_str(fin.reasoning.as_deref().unwrap_or(""));
                    }
                    v.push_str("</think>");
                }
                v.push_str(&fin.content);
                if !fin.calls.is_empty() {
                    let block = if self.cfg.exact_replay {
                        raw_block.unwrap_or_default()
                    } else {
                        let calls: Vec<super::request::ToolCall> = fin
                            .calls
                            .iter()
                            .map(|c| super::request::ToolCall {
                                id: c.id.clone(),
                                name: c.name.clone(),
                                arguments: c.arguments.clone(),
                            })
                            .collect();
                        render::canonical_dsml_for(req, &calls)
                    };
                    v.push_str(&block);
                }
                v.push_str(EOS);
                b.protocol = Some(ProtocolBinding {
                    api: Api::Responses,
                    ids,
                    visible: Some(v),
                    live_len,
                });
            }
            Api::Messages if !ids.is_empty() => {
                b.protocol = Some(ProtocolBinding {
                    api: Api::Messages,
                    ids,
                    visible: None,
                    live_len,
                });
            }
            _ => {}
        }
    }
}
