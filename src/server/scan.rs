//! Incremental DSML detection for the token stream of a request with tools.
//! After every token the stream asks two questions about all the output so
//! far: is the next token inside DSML structure (greedy, PROMPT.md §9), and
//! has a tool block closed after the reasoning (generation ends)?
//! `dsml::structural_position` and a `</think>` search answer them from
//! scratch, which costs the whole output per token: quadratic over a long
//! answer or a large tool argument. [`ToolScan`] keeps where each search got
//! to and looks only at the bytes added since, with the same answers.
//!
//! Every search here is "the first occurrence at or after a position" in
//! an output that only grows, so a found position never moves and a search
//! resumes `needle.len() - 1` bytes before where it stopped.

use super::dsml;
use crate::generate::find;

/// The first occurrence of `needle` at or after `from` in a growing buffer.
#[derive(Clone, Debug)]
struct Finder {
    needle: &'static [u8],
    from: usize,
    scanned: usize,
    found: Option<usize>,
}

impl Finder {
    fn new(needle: &'static str, from: usize) -> Finder {
        Finder {
            needle: needle.as_bytes(),
            from,
            scanned: from,
            found: None,
        }
    }

    fn poll(&mut self, hay: &[u8]) -> Option<usize> {
        if self.found.is_none() && hay.len() > self.scanned {
            let start = self
                .scanned
                .saturating_sub(self.needle.len() - 1)
                .max(self.from);
            self.found = find(&hay[start..], self.needle).map(|i| start + i);
            self.scanned = hay.len();
        }
        self.found
    }
}

/// The block start in force: the first marker, in priority order, found
/// anywhere at or after `from` (as `dsml::block_start` on that region).
#[derive(Clone, Debug)]
struct Starts {
    markers: Vec<Finder>,
}

impl Starts {
    fn new(from: usize) -> Starts {
        Starts {
            markers: dsml::start_markers()
                .iter()
                .map(|m| Finder::new(m, from))
                .collect(),
        }
    }

    /// (position, variant), as `dsml::block_start`.
    fn poll(&mut self, hay: &[u8]) -> Option<(usize, usize)> {
        let mut best = None;
        for (i, m) in self.markers.iter_mut().enumerate() {
            // Every marker is polled so each stays caught up.
            if let Some(p) = m.poll(hay) {
                best = best.or(Some((p, i / 2)));
            }
        }
        best
    }
}

/// Where the structural walk of one block stands.
#[derive(Clone, Debug)]
struct Walk {
    block: (usize, usize),
    /// First close tag and first parameter tag after the last closed
    /// parameter.
    close: Finder,
    param: Finder,
    /// Inside a parameter: its `>` and then its body.
    tag_end: Option<Finder>,
    body: Option<Body>,
}

#[derive(Clone, Debug)]
struct Body {
    start: usize,
    string: bool,
    close: Finder,
    /// JSON string state over `start..json_scanned`.
    in_str: bool,
    esc: bool,
    json_scanned: usize,
}

impl Walk {
    fn new(block: (usize, usize), marker_len: usize) -> Walk {
        let rest = block.0 + marker_len;
        let v = block.1;
        Walk {
            block,
            close: Finder::new(dsml::block_close(v), rest),
            param: Finder::new(dsml::param_tags(v).0, rest),
            tag_end: None,
            body: None,
        }
    }

    /// `dsml::structural_position` for the block of this walk.
    fn structural(&mut self, hay: &[u8]) -> bool {
        let v = self.block.1;
        let (_, param_close) = dsml::param_tags(v);
        loop {
            let p = self.param.poll(hay);
            if let Some(c) = self.close.poll(hay) {
                if p.is_none_or(|p| c < p) {
                    return false;
                }
            }
            let Some(p) = p else { return true };
            let tag_end = self.tag_end.get_or_insert_with(|| Finder::new(">", p));
            let Some(gt) = tag_end.poll(hay) else {
                return true; // inside the tag
            };
            let body = self.body.get_or_insert_with(|| Body {
                start: gt + 1,
                string: dsml::string_param(&String::from_utf8_lossy(&hay[p..gt])),
                close: Finder::new(param_close, gt + 1),
                in_str: false,
                esc: false,
                json_scanned: gt + 1,
            });
            if let Some(e) = body.close.poll(hay) {
                // The parameter closed: the walk goes on after it.
                let rest = e + param_close.len();
                self.close = Finder::new(dsml::block_close(v), rest);
                self.param = Finder::new(dsml::param_tags(v).0, rest);
                self.tag_end = None;
                self.body = None;
                continue;
            }
            // Inside a body: a forming close tag is structural.
            let text = &hay[body.start..];
            let close = param_close.as_bytes();
            if (2..close.len()).any(|k| text.len() >= k && text.ends_with(&close[..k])) {
                return true;
            }
            if body.string {
                return false;
            }
            for &b in &hay[body.json_scanned..] {
                if body.in_str {
                    if body.esc {
                        body.esc = false;
                    } else if b == b'\\' {
                        body.esc = true;
                    } else if b == b'"' {
                        body.in_str = false;
                    }
                } else if b == b'"' {
                    body.in_str = true;
                }
            }
            body.json_scanned = hay.len();
            return !body.in_str;
        }
    }
}

/// The two per-token DSML questions of a request with tools, answered in
/// time proportional to the bytes added since the last question.
#[derive(Clone, Debug)]
pub struct ToolScan {
    thinking: bool,
    /// Block starts over the whole output (the greedy structure).
    starts: Starts,
    walk: Option<Walk>,
    /// `</think>`: the last one seen, and how far the search got.
    think_end: usize,
    think_scanned: usize,
    /// Block starts after the last `</think>` and the close search of the
    /// block in force there.
    region: Starts,
    region_close: Option<((usize, usize), Finder)>,
}

const THINK_CLOSE: &[u8] = b"</think>";

impl ToolScan {
    pub fn new(thinking: bool) -> ToolScan {
        ToolScan {
            thinking,
            starts: Starts::new(0),
            walk: None,
            think_end: 0,
            think_scanned: 0,
            region: Starts::new(0),
            region_close: None,
        }
    }

    /// Whether the next token of `out` is DSML structure (as
    /// `dsml::structural_position(out)`).
    pub fn structural(&mut self, out: &[u8]) -> bool {
        let Some(block) = self.starts.poll(out) else {
            return false;
        };
        if self.walk.as_ref().is_none_or(|w| w.block != block) {
            // A marker of higher priority appeared: walk from it.
            let marker = dsml::start_markers()
                .iter()
                .enumerate()
                .find(|(i, m)| i / 2 == block.1 && out[block.0..].starts_with(m.as_bytes()))
                .map_or(0, |(_, m)| m.len());
            self.walk = Some(Walk::new(block, marker));
        }
        self.walk.as_mut().is_some_and(|w| w.structural(out))
    }

    /// Whether a tool block closed after the reasoning (after the last
    /// `</think>` when thinking).
    pub fn block_closed(&mut self, out: &[u8]) -> bool {
        if self.thinking {
            let from = self.think_scanned.saturating_sub(THINK_CLOSE.len() - 1);
            if let Some(i) = out[from..]
                .windows(THINK_CLOSE.len())
                .rposition(|w| w == THINK_CLOSE)
            {
                let end = from + i + THINK_CLOSE.len();
                if end > self.think_end {
                    self.think_end = end;
                    self.region = Starts::new(end);
                    self.region_close = None;
                }
            }
            self.think_scanned = out.len();
            if self.think_end == 0 {
                return false;
            }
        }
        let Some(block) = self.region.poll(out) else {
            return false;
        };
        if self.region_close.as_ref().is_none_or(|(b, _)| *b != block) {
            self.region_close = Some((block, Finder::new(dsml::block_close(block.1), block.0)));
        }
        self.region_close
            .as_mut()
            .is_some_and(|(_, f)| f.poll(out).is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::Rng;

    /// The answers the stream used to compute from scratch.
    fn batch_closed(out: &[u8], thinking: bool) -> bool {
        let region = if thinking {
            match out.windows(8).rposition(|w| w == b"</think>") {
                Some(i) => &out[i + 8..],
                None => return false,
            }
        } else {
            out
        };
        match dsml::block_start(region) {
            Some((p, v)) => find(&region[p..], dsml::block_close(v).as_bytes()).is_some(),
            None => false,
        }
    }

    /// Outputs built from DSML fragments, fed in random chunks: after every
    /// chunk the incremental answers equal the from-scratch ones.
    #[test]
    fn incremental_answers_equal_the_full_rescan() {
        const PARTS: [&str; 22] = [
            "text ",
            "é😀",
            "</think>",
            "\n\n",
            "<｜DSML｜tool_calls>",
            "</｜DSML｜tool_calls>",
            "<｜DSML｜invoke name=\"bash\">",
            "</｜DSML｜invoke>",
            "<｜DSML｜parameter name=\"cmd\" string=\"true\">",
            "<｜DSML｜parameter name=\"n\" string=\"false\">",
            "</｜DSML｜parameter>",
            "</｜DSML｜param",
            "{\"a\": \"x\\\"}\"}",
            "\"",
            "<tool_calls>",
            "</tool_calls>",
            "<parameter name=\"x\">",
            "</parameter>",
            "<DSML｜tool_calls>",
            "</DSML｜tool_calls>",
            "<",
            ">",
        ];
        let mut rng = Rng::new(17);
        for round in 0..400 {
            let thinking = round % 2 == 0;
            let n = 1 + (rng.next_u64() % 30) as usize;
            let out: Vec<u8> = (0..n)
                .flat_map(|_| PARTS[(rng.next_u64() % PARTS.len() as u64) as usize].bytes())
                .collect();
            let mut scan = ToolScan::new(thinking);
            let mut end = 0;
            while end < out.len() {
                end = (end + 1 + (rng.next_u64() % 7) as usize).min(out.len());
                let o = &out[..end];
                assert_eq!(
                    scan.structural(o),
                    dsml::structural_position(o),
                    "structural {:?}",
                    String::from_utf8_lossy(o)
                );
                assert_eq!(
                    scan.block_closed(o),
                    batch_closed(o, thinking),
                    "closed {:?}",
                    String::from_utf8_lossy(o)
                );
            }
        }
    }
}
