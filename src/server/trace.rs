//! `--trace FILE` (SERVER.md §11): a human-readable record of every request,
//! its cache decision and rendered prompt, then what it generated. The file
//! holds prompts and answers, so it is created readable by its owner only.

use std::fs::File;
use std::io::Write;
use std::path::Path;

use super::job::Final;
use super::request::{Api, GenRequest};

/// The trace file, or nothing (a failed open is reported once and the
/// server runs without a trace).
pub struct Trace(Option<File>);

/// The cache decision of one request, as the trace shows it.
pub struct Decision<'a> {
    pub seq: u64,
    pub prompt_tokens: usize,
    pub effective_tokens: usize,
    pub cached: usize,
    pub live_before: usize,
    pub source: &'a str,
}

impl Trace {
    /// Opens (truncates) `path` with mode 0600; an existing file keeps its
    /// mode, so it is narrowed to 0600 as well.
    pub fn open(path: Option<&Path>) -> Trace {
        let Some(p) = path else {
            return Trace(None);
        };
        let mut o = std::fs::OpenOptions::new();
        o.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
        let f = o.open(p).and_then(|f| {
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
            }
            Ok(f)
        });
        match f {
            Ok(f) => Trace(Some(f)),
            Err(e) => {
                crate::log_line!("ds4-server: --trace {}: {e}", p.display());
                Trace(None)
            }
        }
    }

    /// The request, before any work: its parameters, the cache decision,
    /// the raw JSON and the rendered prompt.
    pub fn request(&mut self, req: &GenRequest, d: &Decision<'_>, text: &str) {
        let Some(f) = self.0.as_mut() else { return };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let kind = if req.api == Api::Completions {
            "completion"
        } else {
            "chat"
        };
        let mode = match req.mode {
            crate::chat::ThinkMode::None => "none",
            crate::chat::ThinkMode::High => "high",
            crate::chat::ThinkMode::Max => "max",
        };
        let cached = d.cached;
        let source = d.source;
        let _ = write!(
            f,
            "\n===== request {} {} =====\nkind: {kind}\nmodel: {}\nstream: {}\ntools: {}\nthink_mode: {mode}\n\
             prompt_tokens: {}\neffective_prompt_tokens: {}\ncached_tokens: {cached}\nmax_tokens: {}\n\
             temperature: {:.3}\ntop_k: {}\ntop_p: {:.3}\nmin_p: {:.3}\nseed: {}\nstream_include_usage: {}\n\
             \n--- cache decision ---\nlive_tokens_before: {}\ncache_source: {source}\ncached_tokens: {cached}\n\
             \n--- raw request json ---\n{}\n\n--- rendered prompt ---\n{text}\n",
            d.seq,
            utc_stamp(now),
            req.model,
            req.stream as u8,
            req.tools_active() as u8,
            d.prompt_tokens,
            d.effective_tokens,
            req.max_tokens.map_or("default".to_string(), |n| n.to_string()),
            req.sampler.temperature,
            req.sampler.top_k,
            req.sampler.top_p,
            req.sampler.min_p,
            req.seed.unwrap_or(0),
            req.include_usage as u8,
            d.live_before,
            String::from_utf8_lossy(&req.raw),
        );
    }

    /// What request `seq` generated and how it was parsed.
    pub fn result(&mut self, seq: u64, fin: &Final, elapsed_s: f64) {
        let Some(f) = self.0.as_mut() else { return };
        let mut t = format!(
            "\n--- generated text ---\n{}\n\n--- parsed message ---\nfinish: {:?}\ngenerated_tokens: {}\nelapsed_sec: {:.3}\n",
            fin.text, fin.finish, fin.usage.completion, elapsed_s
        );
        if let Some(r) = &fin.reasoning {
            t.push_str(&format!("\nreasoning:\n{r}\n"));
        }
        if !fin.content.is_empty() {
            t.push_str(&format!("\ncontent:\n{}\n", fin.content));
        }
        for (i, c) in fin.calls.iter().enumerate() {
            t.push_str(&format!(
                "\ntool_call[{i}]:\nid: {}\nname: {}\narguments:\n{}\n",
                c.id, c.name, c.arguments
            ));
        }
        t.push_str(&format!("\n===== end request {seq} =====\n"));
        let _ = f.write_all(t.as_bytes());
    }
}

/// `YYYY-MM-DD HH:MM:SS` (UTC) of a Unix time.
pub fn utc_stamp(t: u64) -> String {
    let (days, secs) = ((t / 86400) as i64, t % 86400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_stamps() {
        assert_eq!(utc_stamp(0), "1970-01-01 00:00:00");
        assert_eq!(utc_stamp(1_767_225_600), "2026-01-01 00:00:00");
        assert_eq!(utc_stamp(951_827_696), "2000-02-29 12:34:56");
    }

    #[cfg(unix)]
    #[test]
    fn trace_files_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let p = std::env::temp_dir().join(format!("ds4-trace-{}.txt", std::process::id()));
        std::fs::write(&p, "old").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        let t = Trace::open(Some(&p));
        assert!(t.0.is_some());
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(std::fs::read(&p).unwrap(), b"");
        let _ = std::fs::remove_file(&p);
    }
}
