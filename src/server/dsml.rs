//! Generated DSML back into tool calls (PROMPT.md §7), the block-start
//! detection used while streaming (§8) and the structure tracker that makes
//! DSML tags greedy while payloads stay sampled (§9).

use serde_json::Value;

use crate::generate::find;

/// Block start markers in priority order (PROMPT.md §7 step 2), two per
/// variant of [`VARIANTS`]. The last pair is DeepSeek V4.1's spelling
/// (`<｜DSML｜ calls>`, docs/V41.md): it comes after every V4 spelling, and
/// no V4 marker is a part of it, so V4 output parses as before.
const STARTS: [&str; 8] = [
    "\n\n<｜DSML｜tool_calls>",
    "<｜DSML｜tool_calls>",
    "\n\n<DSML｜tool_calls>",
    "<DSML｜tool_calls>",
    "\n\n<tool_calls>",
    "<tool_calls>",
    "\n\n<｜DSML｜ calls>",
    "<｜DSML｜ calls>",
];

/// The tag spellings of one syntax variant.
#[derive(Clone, Copy)]
struct Tags {
    open: &'static str,
    close: &'static str,
    invoke: &'static str,
    invoke_close: &'static str,
    param: &'static str,
    param_close: &'static str,
    /// String bodies carry entity escapes (`&lt;`…) to decode: V4's
    /// prompt asks for them; V4.1's says "as is".
    entities: bool,
}

const VARIANTS: [Tags; 4] = [
    Tags {
        open: "<｜DSML｜tool_calls>",
        close: "</｜DSML｜tool_calls>",
        invoke: "<｜DSML｜invoke",
        invoke_close: "</｜DSML｜invoke>",
        param: "<｜DSML｜parameter",
        param_close: "</｜DSML｜parameter>",
        entities: true,
    },
    Tags {
        open: "<DSML｜tool_calls>",
        close: "</DSML｜tool_calls>",
        invoke: "<DSML｜invoke",
        invoke_close: "</DSML｜invoke>",
        param: "<DSML｜parameter",
        param_close: "</DSML｜parameter>",
        entities: true,
    },
    Tags {
        open: "<tool_calls>",
        close: "</tool_calls>",
        invoke: "<invoke",
        invoke_close: "</invoke>",
        param: "<parameter",
        param_close: "</parameter>",
        entities: true,
    },
    Tags {
        open: crate::chat::v41::CALLS_OPEN,
        close: crate::chat::v41::CALLS_CLOSE,
        invoke: crate::chat::v41::INVOKE_OPEN,
        invoke_close: crate::chat::v41::INVOKE_CLOSE,
        param: crate::chat::v41::PARAM_OPEN,
        param_close: crate::chat::v41::PARAM_CLOSE,
        entities: false,
    },
];

/// First block start in `text`: (match position, variant index).
pub fn block_start(text: &[u8]) -> Option<(usize, usize)> {
    STARTS
        .iter()
        .enumerate()
        .find_map(|(i, s)| find(text, s.as_bytes()).map(|p| (p, i / 2)))
}

/// The open tag of the block variant `v`.
pub fn block_open(v: usize) -> &'static str {
    VARIANTS[v].open
}

/// The close tag of the block variant `v`.
pub fn block_close(v: usize) -> &'static str {
    VARIANTS[v].close
}

/// The block start markers in priority order, for the stream's incremental
/// scanner (`server/scan.rs`), which must agree with [`block_start`].
pub(crate) fn start_markers() -> &'static [&'static str] {
    &STARTS
}

/// The parameter open and close tags of the block variant `v`.
pub(crate) fn param_tags(v: usize) -> (&'static str, &'static str) {
    (VARIANTS[v].param, VARIANTS[v].param_close)
}

/// Whether a parameter tag's body is a string (not `string="false"`).
pub(crate) fn string_param(tag: &str) -> bool {
    attr_value(tag, "string").as_deref() != Some("false")
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedCall {
    pub name: String,
    /// Compact JSON object text (SERVER.md §6).
    pub arguments: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Parsed {
    pub reasoning: Option<String>,
    pub content: String,
    pub calls: Vec<ParsedCall>,
    /// The sampled block, from the match to the end of the close tag.
    pub raw_dsml: Option<String>,
    /// A block start was seen (parsed or not).
    pub block_seen: bool,
    /// A block was opened but has no close tag.
    pub unterminated: bool,
    /// The block did not parse: the raw text was returned as content.
    pub failed: bool,
}

fn split_reasoning(text: &str, thinking: bool) -> (Option<String>, String) {
    if !thinking {
        return (None, text.to_string());
    }
    let t = text.strip_prefix("<think>").unwrap_or(text);
    match t.find("</think>") {
        Some(i) => (Some(t[..i].to_string()), t[i + 8..].to_string()),
        None => (None, t.to_string()),
    }
}

/// Parses the whole generated text of a chat-style response.
pub fn parse_output(text: &str, thinking: bool) -> Parsed {
    let region_start = if thinking {
        match text.rfind("</think>") {
            Some(i) => i + 8,
            None => {
                let (reasoning, content) = split_reasoning(text, thinking);
                return Parsed {
                    reasoning,
                    content,
                    ..Default::default()
                };
            }
        }
    } else {
        0
    };
    let Some((pos, v)) = block_start(&text.as_bytes()[region_start..]) else {
        let (reasoning, content) = split_reasoning(text, thinking);
        return Parsed {
            reasoning,
            content,
            ..Default::default()
        };
    };
    let start = region_start + pos;
    let tags = VARIANTS[v];
    let open_at = start + text[start..].find(tags.open).unwrap_or(0);
    let after_open = open_at + tags.open.len();
    let pre = text[..start].trim_end_matches(|c: char| c.is_ascii_whitespace());
    let (reasoning, content) = split_reasoning(pre, thinking);
    let failed = |unterminated: bool| Parsed {
        reasoning: None,
        content: text.to_string(),
        calls: Vec::new(),
        raw_dsml: None,
        block_seen: true,
        unterminated,
        failed: true,
    };
    match parse_block(&text[after_open..], &tags) {
        Ok((calls, used)) => Parsed {
            reasoning,
            content,
            calls,
            raw_dsml: Some(text[start..after_open + used].to_string()),
            block_seen: true,
            unterminated: false,
            failed: false,
        },
        Err(()) => failed(!text[after_open..].contains(tags.close)),
    }
}

fn skip_ws(s: &str) -> &str {
    s.trim_start_matches(|c: char| c.is_ascii_whitespace())
}

fn entity_decode(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&amp;", "&")
}

fn attr_value(tag: &str, name: &str) -> Option<String> {
    let key = format!("{name}=\"");
    let i = tag.find(&key)? + key.len();
    let j = tag[i..].find('"')? + i;
    Some(entity_decode(&tag[i..j]))
}

/// Minifies JSON text: whitespace outside strings removed.
fn minify(s: &str) -> String {
    let mut out = String::new();
    let (mut in_str, mut esc) = (false, false);
    for c in s.chars() {
        if in_str {
            out.push(c);
            if esc {
                esc = false;
            } else if c == '\\' {
                esc = true;
            } else if c == '"' {
                in_str = false;
            }
        } else if c == '"' {
            in_str = true;
            out.push(c);
        } else if !c.is_whitespace() {
            out.push(c);
        }
    }
    out
}

fn json_str(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

/// Deepest parameter nesting [`parse_output`] accepts. The text it parses
/// is model output, which a client can steer (or script in tests), and the
/// nested-parameter parse recurses once per level: without a bound, 100k
/// nested tags overflow the worker's stack. Deeper blocks fail to parse and
/// come back as plain content, like any other malformed block. The value
/// stays below serde_json's own nesting limit (128), so every accepted
/// block also survives `compact_arguments`.
pub const MAX_PARAM_DEPTH: usize = 100;

/// One parameter (leaf or nested object) → (name, JSON value text, rest).
/// `depth` counts the enclosing parameters.
fn parse_param<'a>(s: &'a str, t: &Tags, depth: usize) -> Result<(String, String, &'a str), ()> {
    if depth >= MAX_PARAM_DEPTH {
        return Err(());
    }
    let s = s.strip_prefix(t.param).ok_or(())?;
    let gt = s.find('>').ok_or(())?;
    let tag = &s[..gt];
    let name = attr_value(tag, "name").ok_or(())?;
    let string = attr_value(tag, "string");
    let body = &s[gt + 1..];
    if string.is_none() && skip_ws(body).starts_with(t.param) {
        let mut rest = skip_ws(body);
        let mut members = Vec::new();
        while rest.starts_with(t.param) {
            let (n, v, r) = parse_param(rest, t, depth + 1)?;
            members.push(format!("{}:{v}", json_str(&n)));
            rest = skip_ws(r);
        }
        if let Some(r) = rest.strip_prefix(t.param_close) {
            rest = r;
        }
        return Ok((name, format!("{{{}}}", members.join(",")), rest));
    }
    let end = body.find(t.param_close).ok_or(())?;
    let raw = &body[..end];
    let value = if string.as_deref().unwrap_or("true") == "true" {
        if t.entities {
            json_str(&entity_decode(raw))
        } else {
            json_str(raw)
        }
    } else {
        let m = minify(raw);
        if m.is_empty() {
            "null".into()
        } else {
            m
        }
    };
    Ok((name, value, &body[end + t.param_close.len()..]))
}

/// Parses after the open tag; returns the calls and the bytes consumed
/// through the close tag.
fn parse_block(s: &str, t: &Tags) -> Result<(Vec<ParsedCall>, usize), ()> {
    let mut rest = s;
    let mut calls = Vec::new();
    loop {
        rest = skip_ws(rest);
        if let Some(r) = rest.strip_prefix(t.close) {
            return Ok((calls, s.len() - r.len()));
        }
        let r = rest.strip_prefix(t.invoke).ok_or(())?;
        let gt = r.find('>').ok_or(())?;
        let name = attr_value(&r[..gt], "name").ok_or(())?;
        rest = &r[gt + 1..];
        let mut members = Vec::new();
        loop {
            rest = skip_ws(rest);
            if let Some(r) = rest.strip_prefix(t.invoke_close) {
                rest = r;
                break;
            }
            let (n, v, r) = parse_param(rest, t, 0)?;
            members.push(format!("{}:{}", json_str(&n), v));
            rest = r;
        }
        calls.push(ParsedCall {
            name,
            arguments: compact_arguments(&format!("{{{}}}", members.join(","))),
        });
    }
}

/// SERVER.md §6: arguments re-serialised compactly; `{}` if not an object.
pub fn compact_arguments(text: &str) -> String {
    match serde_json::from_str::<Value>(text) {
        Ok(v @ Value::Object(_)) => v.to_string(),
        _ => "{}".into(),
    }
}

/// What live tool streaming reports (PROMPT.md §8 "tool mode").
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolEvent {
    /// An invoke tag completed: a new call with this name; arguments `{`
    /// follow as the first `Args`.
    Start(String),
    /// An argument fragment (the fragments concatenate to a JSON object).
    Args(String),
    /// The invoke closed (`}` was the last fragment).
    End,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Live {
    Between,
    InInvoke { first: bool },
    InParam { string: bool },
    Done,
    Broken,
}

/// Incremental DSML → tool-call fragments, fed the text after the block
/// open tag. Holds back a forming tag, a forming entity and (by taking
/// `&str`) never splits a character.
pub struct LiveTools {
    t: Tags,
    buf: String,
    state: Live,
}

const ENTITIES: [(&str, char); 5] = [
    ("&amp;", '&'),
    ("&lt;", '<'),
    ("&gt;", '>'),
    ("&quot;", '"'),
    ("&apos;", '\''),
];

impl LiveTools {
    pub fn new(variant: usize) -> LiveTools {
        LiveTools {
            t: VARIANTS[variant],
            buf: String::new(),
            state: Live::Between,
        }
    }

    /// Live streaming stopped (unexpected text, a parameter tag without a
    /// `string` attribute); the final parse decides what the calls are.
    pub fn broken(&self) -> bool {
        self.state == Live::Broken
    }

    pub fn push(&mut self, text: &str) -> Vec<ToolEvent> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        loop {
            let before = (self.buf.len(), self.state);
            self.step(&mut out);
            if (self.buf.len(), self.state) == before {
                return out;
            }
        }
    }

    /// True if `buf` could still grow into `tag` (or starts with it).
    fn may_be(buf: &str, tag: &str) -> bool {
        tag.starts_with(buf) || buf.starts_with(tag)
    }

    fn step(&mut self, out: &mut Vec<ToolEvent>) {
        let t = self.t;
        match self.state {
            Live::Done | Live::Broken => self.buf.clear(),
            Live::Between => {
                let b = skip_ws(&self.buf).to_string();
                self.buf = b;
                if self.buf.is_empty() {
                    return;
                }
                if self.buf.starts_with(t.close) {
                    self.state = Live::Done;
                } else if self.buf.starts_with(t.invoke) {
                    if let Some(gt) = self.buf.find('>') {
                        match attr_value(&self.buf[..gt], "name") {
                            Some(name) => {
                                out.push(ToolEvent::Start(name));
                                out.push(ToolEvent::Args("{".into()));
                                self.buf.drain(..gt + 1);
                                self.state = Live::InInvoke { first: true };
                            }
                            None => self.state = Live::Broken,
                        }
                    }
                } else if !Self::may_be(&self.buf, t.close) && !Self::may_be(&self.buf, t.invoke) {
                    self.state = Live::Broken;
                }
            }
            Live::InInvoke { first } => {
                let b = skip_ws(&self.buf).to_string();
                self.buf = b;
                if self.buf.is_empty() {
                    return;
                }
                if let Some(r) = self.buf.strip_prefix(t.invoke_close) {
                    self.buf = r.to_string();
                    out.push(ToolEvent::Args("}".into()));
                    out.push(ToolEvent::End);
                    self.state = Live::Between;
                } else if self.buf.starts_with(t.param) {
                    if let Some(gt) = self.buf.find('>') {
                        let tag = self.buf[..gt].to_string();
                        let (Some(name), Some(string)) =
                            (attr_value(&tag, "name"), attr_value(&tag, "string"))
                        else {
                            self.state = Live::Broken;
                            return;
                        };
                        let string = string == "true";
                        let mut frag = String::new();
                        if !first {
                            frag.push(',');
                        }
                        frag.push_str(&json_str(&name));
                        frag.push(':');
                        if string {
                            frag.push('"');
                        }
                        out.push(ToolEvent::Args(frag));
                        self.buf.drain(..gt + 1);
                        self.state = Live::InParam { string };
                    }
                } else if !Self::may_be(&self.buf, t.invoke_close)
                    && !Self::may_be(&self.buf, t.param)
                {
                    self.state = Live::Broken;
                }
            }
            Live::InParam { string } => {
                let (body_end, closed) = match self.buf.find(t.param_close) {
                    Some(i) => (i, true),
                    None => {
                        // Hold a forming close tag and (strings) a forming entity.
                        let mut keep = self.buf.len();
                        for k in (1..t.param_close.len()).rev() {
                            if self.buf.len() >= k
                                && self.buf.is_char_boundary(self.buf.len() - k)
                                && t.param_close.starts_with(&self.buf[self.buf.len() - k..])
                            {
                                keep = self.buf.len() - k;
                                break;
                            }
                        }
                        if string && t.entities {
                            if let Some(amp) = self.buf[..keep].rfind('&') {
                                let tail = &self.buf[amp..keep];
                                if ENTITIES
                                    .iter()
                                    .any(|(e, _)| e.starts_with(tail) && e.len() > tail.len())
                                {
                                    keep = amp;
                                }
                            }
                        }
                        (keep, false)
                    }
                };
                let body: String = self.buf.drain(..body_end).collect();
                let mut frag = if string {
                    let decoded = if t.entities {
                        entity_decode(&body)
                    } else {
                        body
                    };
                    let q = json_str(&decoded);
                    q[1..q.len() - 1].to_string()
                } else {
                    body
                };
                if closed {
                    self.buf.drain(..t.param_close.len());
                    if string {
                        frag.push('"');
                    }
                    self.state = Live::InInvoke { first: false };
                }
                if !frag.is_empty() {
                    out.push(ToolEvent::Args(frag));
                }
            }
        }
    }
}

/// Whether the next token sits in a DSML structural position (PROMPT.md
/// §9) and must be sampled greedily. Scans the generated text from the start.
pub fn structural_position(text: &[u8]) -> bool {
    let Some((pos, v)) = block_start(text) else {
        return false;
    };
    let t = VARIANTS[v];
    let s = &text[pos..];
    let Some(o) = find(s, t.open.as_bytes()) else {
        return false;
    };
    let mut rest = &s[o + t.open.len()..];
    loop {
        // Between tags: structural, unless the block closed.
        if let Some(c) = find(rest, t.close.as_bytes()) {
            let p = find(rest, t.param.as_bytes());
            if p.is_none_or(|p| c < p) {
                return false;
            }
        }
        let Some(p) = find(rest, t.param.as_bytes()) else {
            return true;
        };
        let after = &rest[p..];
        let Some(gt) = after.iter().position(|&b| b == b'>') else {
            return true; // inside the tag
        };
        let tag = String::from_utf8_lossy(&after[..gt]);
        let string = attr_value(&tag, "string").as_deref() != Some("false");
        let body = &after[gt + 1..];
        match find(body, t.param_close.as_bytes()) {
            Some(e) => rest = &body[e + t.param_close.len()..],
            None => {
                // Inside a body: a forming close tag is structural.
                let close = t.param_close.as_bytes();
                let tail_is_close =
                    (2..close.len()).any(|k| body.len() >= k && body.ends_with(&close[..k]));
                if tail_is_close {
                    return true;
                }
                if string {
                    return false;
                }
                return !in_json_string(body);
            }
        }
    }
}

fn in_json_string(body: &[u8]) -> bool {
    let (mut in_str, mut esc) = (false, false);
    for &b in body {
        if in_str {
            if esc {
                esc = false;
            } else if b == b'\\' {
                esc = true;
            } else if b == b'"' {
                in_str = false;
            }
        } else if b == b'"' {
            in_str = true;
        }
    }
    in_str
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "Need to list.</think>Sure.\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"bash\">\n<｜DSML｜parameter name=\"command\" string=\"true\">ls &amp;&amp; pwd</｜DSML｜parameter>\n<｜DSML｜parameter name=\"timeout\" string=\"false\">10</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>";

    #[test]
    fn parses_the_spec_example() {
        let p = parse_output(SAMPLE, true);
        assert_eq!(p.reasoning.as_deref(), Some("Need to list."));
        assert_eq!(p.content, "Sure.");
        assert_eq!(
            p.calls,
            vec![ParsedCall {
                name: "bash".into(),
                arguments: r#"{"command":"ls && pwd","timeout":10}"#.into()
            }]
        );
        assert!(p.raw_dsml.unwrap().starts_with("\n\n<｜DSML｜tool_calls>"));
    }

    #[test]
    fn nested_and_variants_and_failures() {
        let t = "<tool_calls><invoke name=\"f\"><parameter name=\"o\"><parameter name=\"a\" string=\"false\">[1, 2]</parameter></parameter></invoke></tool_calls>";
        let p = parse_output(t, false);
        assert_eq!(p.calls[0].arguments, r#"{"o":{"a":[1,2]}}"#);
        let p = parse_output("x<｜DSML｜tool_calls><｜DSML｜invoke name=\"f\">", false);
        assert!(p.failed && p.unterminated);
        assert_eq!(
            p.content,
            "x<｜DSML｜tool_calls><｜DSML｜invoke name=\"f\">"
        );
        // Inside reasoning tool blocks do not count.
        let p = parse_output("<｜DSML｜tool_calls></｜DSML｜tool_calls>", true);
        assert!(p.calls.is_empty() && !p.block_seen);
    }

    #[test]
    fn live_fragments_concatenate_to_the_arguments() {
        let open = "<｜DSML｜tool_calls>";
        let i = SAMPLE.find(open).unwrap() + open.len();
        let body = &SAMPLE[i..];
        // Every split of the text into two pushes gives the same fragments.
        for cut in (0..=body.len()).filter(|&c| body.is_char_boundary(c)) {
            let mut lt = LiveTools::new(0);
            let mut ev = lt.push(&body[..cut]);
            ev.extend(lt.push(&body[cut..]));
            assert!(!lt.broken());
            assert_eq!(ev[0], ToolEvent::Start("bash".into()));
            assert_eq!(ev.last(), Some(&ToolEvent::End));
            let args: String = ev
                .iter()
                .filter_map(|e| match e {
                    ToolEvent::Args(a) => Some(a.as_str()),
                    _ => None,
                })
                .collect();
            assert_eq!(args, r#"{"command":"ls && pwd","timeout":10}"#, "cut {cut}");
        }
        let mut lt = LiveTools::new(0);
        lt.push("<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"x\">");
        assert!(lt.broken());
    }

    #[test]
    fn structure_is_greedy_payload_is_not() {
        let cut = |needle: &str| {
            let i = SAMPLE.find(needle).unwrap() + needle.len();
            structural_position(&SAMPLE.as_bytes()[..i])
        };
        assert!(!cut("Sure."));
        assert!(cut("<｜DSML｜tool_calls>\n<｜DSML｜inv"));
        assert!(!cut("string=\"true\">ls"));
        assert!(cut("pwd</"));
        assert!(cut("string=\"false\">1"));
        assert!(!cut("</｜DSML｜tool_calls>"));
    }
}
