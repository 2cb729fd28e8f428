//! Session snapshots: what both families' payloads share (the first word
//! names the family, so one is never loaded as the other; the reader and
//! writer of little-endian fields), and [`Session`]'s save and load, which
//! hand the payload itself to the family's net (`v4.rs`: ds4's layout,
//! `v41.rs`: our own).

use super::net::{Frame, Loading, Saving};
use super::{Session, SessionError};
use crate::backend::{state_desc, Backend};
use crate::graph::StateId;

/// `D S V 4` little-endian.
pub const SNAPSHOT_MAGIC: u32 = 0x3456_5344;
/// `D S 4 1` little-endian: the first word of a V4.1 session payload
/// (`session/v41.rs`).
pub const V41_SNAPSHOT_MAGIC: u32 = u32::from_le_bytes(*b"DS41");

/// Refuses a payload of the other family by its first word: `v41` says
/// whether the session is V4.1.
fn refuse_other_arch(magic: u32, v41: bool) -> Result<(), SessionError> {
    let (theirs, ours) = match (magic, v41) {
        (SNAPSHOT_MAGIC, true) => ("DeepSeek V4 (deepseek4)", "V4.1 (deepseek41)"),
        (V41_SNAPSHOT_MAGIC, false) => ("DeepSeek V4.1 (deepseek41)", "V4 (deepseek4)"),
        _ => return Ok(()),
    };
    Err(SessionError::Snapshot(format!(
        "this checkpoint holds a {theirs} session; the loaded model is {ours}: refused, nothing loaded"
    )))
}

/// A payload being read, with the position reached.
pub(super) struct Reader<'a> {
    pub b: &'a [u8],
    pub pos: usize,
}

impl<'a> Reader<'a> {
    /// Starts reading `payload`: its first `N` header words, refusing a
    /// payload of the other family by the first (`v41`: this session is V4.1).
    pub fn header<const N: usize>(
        payload: &'a [u8],
        v41: bool,
    ) -> Result<(Reader<'a>, [u32; N]), SessionError> {
        let mut r = Reader { b: payload, pos: 0 };
        let mut h = [0u32; N];
        for (i, f) in h.iter_mut().enumerate() {
            *f = r.u32(&format!("header field {i}"))?;
            if i == 0 {
                refuse_other_arch(*f, v41)?;
            }
        }
        Ok((r, h))
    }

    /// The `t` tokens and the logits over `vocab` after the header, each
    /// token checked against the vocabulary.
    pub fn tokens_and_logits(
        &mut self,
        t: usize,
        vocab: usize,
    ) -> Result<(Vec<u32>, Vec<f32>), SessionError> {
        let tokens: Vec<u32> = (0..t)
            .map(|i| self.u32(&format!("token {i}")))
            .collect::<Result<_, _>>()?;
        if let Some(&id) = tokens.iter().find(|&&x| x as usize >= vocab) {
            return Err(SessionError::BadToken { id, vocab });
        }
        Ok((tokens, self.f32s(vocab, "logits")?))
    }

    /// Fails unless the whole payload was read.
    pub fn end(&self) -> Result<(), SessionError> {
        match self.b.len() - self.pos {
            0 => Ok(()),
            n => Err(SessionError::Snapshot(format!(
                "{n} trailing payload bytes"
            ))),
        }
    }

    fn bytes(&mut self, n: usize, what: &str) -> Result<&[u8], SessionError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| {
                SessionError::Snapshot(format!("truncated payload while reading {what}"))
            })?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    pub fn u32(&mut self, what: &str) -> Result<u32, SessionError> {
        let b = self.bytes(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn f32s(&mut self, n: usize, what: &str) -> Result<Vec<f32>, SessionError> {
        let len = n
            .checked_mul(4)
            .ok_or_else(|| SessionError::Snapshot(format!("{what}: size overflows")))?;
        Ok(self
            .bytes(len, what)?
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }
}

impl Reader<'_> {
    /// Reads every row of state `s` from the payload into set `set`
    /// (`what` names it in an error).
    pub fn whole_state(
        &mut self,
        backend: &mut dyn Backend,
        set: usize,
        s: StateId,
        what: &str,
    ) -> Result<(), SessionError> {
        let d = state_desc(backend.state_layout(), s)?;
        let v = self.f32s(d.rows * d.cols, what)?;
        backend.write_set_rows(set, s, 0, &v)?;
        Ok(())
    }
}

/// Appends every row of state `s` of set `set`.
pub(super) fn put_whole_state(
    out: &mut Vec<u8>,
    backend: &dyn Backend,
    set: usize,
    s: StateId,
) -> Result<(), SessionError> {
    let d = state_desc(backend.state_layout(), s)?;
    put_f32s(out, &backend.read_set_rows(set, s, 0..d.rows)?);
    Ok(())
}

/// Refuses a payload of `t` tokens saved at context `saved_ctx` that a
/// session of context `ctx` cannot hold (or one that holds no tokens).
pub(super) fn check_fits(saved_ctx: usize, t: usize, ctx: usize) -> Result<(), SessionError> {
    if saved_ctx > ctx || t >= ctx || t == 0 {
        return Err(SessionError::Snapshot(format!(
            "saved with context {saved_ctx} and {t} tokens; this session's context is {ctx}"
        )));
    }
    Ok(())
}

pub(super) fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(super) fn put_f32s(out: &mut Vec<u8>, v: &[f32]) {
    for x in v {
        out.extend_from_slice(&x.to_le_bytes());
    }
}

/// A payload's start: its header words, the session's tokens and its
/// logits (a session that holds no tokens has nothing to save).
pub(super) fn begin_payload(
    header: &[u32],
    tokens: &[u32],
    logits: &[f32],
) -> Result<Vec<u8>, SessionError> {
    if tokens.is_empty() {
        return Err(SessionError::Snapshot("the session holds no tokens".into()));
    }
    let mut out = Vec::new();
    for &v in header.iter().chain(tokens) {
        put_u32(&mut out, v);
    }
    put_f32s(&mut out, logits);
    Ok(out)
}

impl Session {
    /// Serialises the whole session (tokens, logits, every KV state).
    pub fn save_snapshot(&self) -> Result<Vec<u8>, SessionError> {
        self.net.save(Saving {
            backend: self.backend.as_ref(),
            set: 0,
            tokens: &self.tokens,
            logits: &self.logits,
            frame: self.frame(),
        })
    }

    /// Replaces the session with a snapshot made by [`Session::save_snapshot`]
    /// for the same model. A payload of the other model family (V4 for a
    /// V4.1 session or the reverse) is refused by its first word. On error
    /// the session is left empty.
    pub fn load_snapshot(&mut self, payload: &[u8]) -> Result<(), SessionError> {
        let frame = self.frame();
        let at = Loading {
            backend: self.backend.as_mut(),
            set: 0,
            payload,
            frame,
        };
        match self.net.load(at) {
            Ok((tokens, logits)) => {
                self.tokens = tokens;
                self.logits = logits;
                Ok(())
            }
            Err(e) => {
                self.reset();
                Err(e)
            }
        }
    }

    fn frame(&self) -> Frame {
        Frame {
            ctx: self.opts.ctx,
            prefill_chunk: self.opts.prefill_chunk,
        }
    }
}
