//! Browser-facing checks (docs/SECURITY.md): which `Host`, `Origin` and
//! `Content-Type` a request may carry before anything else is looked at, and
//! the CORS headers for the origins `--cors` names.
//!
//! A web page open in a local browser can reach `127.0.0.1`. Without an API
//! key, three things keep it out:
//! - **`Host`** must be a loopback name: a DNS-rebinding page (its own name
//!   re-pointed at 127.0.0.1) sends its own name there, so it cannot read
//!   answers. Non-browser clients that send no `Host` at all are served.
//! - **`Content-Type`** of a POST must be JSON: the requests a page may send
//!   cross-site without asking first (forms, `text/plain`, a bare byte body)
//!   never carry it, and a page that sets it must pass a preflight.
//! - **`Origin`** (sent by browsers on cross-site and on all POST requests)
//!   must be one that `--cors` names; that check holds with a key too.

use warp::http::header::{HeaderName, HeaderValue};
use warp::http::{HeaderMap, Method};

use super::error::ApiError;

/// The origins `--cors` allows (`*`: all; only with an API key).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CorsOrigins {
    any: bool,
    /// Lower case, no trailing `/`.
    list: Vec<String>,
}

impl CorsOrigins {
    /// Checks the `--cors` values: `*` (refused without a key: any page could
    /// then use the engine) or `scheme://host[:port]` as a browser sends it.
    pub fn parse(flags: &[String], keyed: bool) -> Result<CorsOrigins, String> {
        let mut out = CorsOrigins::default();
        for f in flags {
            let f = f.trim();
            if f == "*" {
                if !keyed {
                    return Err("--cors '*' lets every web page use the engine; it needs an API key (--api-key, --api-key-file or DS4_API_KEY)".into());
                }
                out.any = true;
                continue;
            }
            let o = f.trim_end_matches('/').to_ascii_lowercase();
            let ok = o.split_once("://").is_some_and(|(scheme, rest)| {
                !scheme.is_empty()
                    && scheme
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c))
                    && !rest.is_empty()
                    && !rest.contains(['/', '?', '#', ' '])
            });
            if !ok {
                return Err(format!(
                    "--cors {f:?}: expected an origin such as http://localhost:3000, or '*'"
                ));
            }
            out.list.push(o);
        }
        Ok(out)
    }

    fn allows(&self, origin: &str) -> bool {
        self.any
            || self
                .list
                .iter()
                .any(|o| o.eq_ignore_ascii_case(origin.trim_end_matches('/')))
    }

    /// Whether any origin is named (for the start-up banner).
    pub fn is_empty(&self) -> bool {
        !self.any && self.list.is_empty()
    }
}

/// `localhost`, a 127.0.0.0/8 address or `[::1]`, each with any port.
pub fn loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        let Some((ip, port)) = rest.split_once(']') else {
            return false;
        };
        if !port_ok(port) {
            return false;
        }
        return ip
            .parse::<std::net::Ipv6Addr>()
            .is_ok_and(|a| a.is_loopback());
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if port_ok(&format!(":{port}")) => name,
            Some(_) => return false,
            None => host,
        }
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|a| a.is_loopback())
}

/// Empty, or `:` and a port number.
fn port_ok(s: &str) -> bool {
    s.is_empty()
        || s.strip_prefix(':')
            .is_some_and(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()))
}

/// Whether `origin` is `http://` and the request's own `Host`.
fn same_origin(origin: &str, headers: &HeaderMap) -> bool {
    let Some(host) = headers.get("host").and_then(|h| h.to_str().ok()) else {
        return false;
    };
    origin
        .strip_prefix("http://")
        .is_some_and(|o| o.trim_end_matches('/').eq_ignore_ascii_case(host.trim()))
}

/// `application/json`, any parameters (`; charset=utf-8`), any case.
pub fn json_content_type(headers: &HeaderMap) -> bool {
    headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

/// The checks that come before the API key and the body: `Host` (without a
/// key) and `Origin`. `Ok(Some(v))`: a browser origin `--cors` allows; `v`
/// is its `Access-Control-Allow-Origin`.
pub fn admit(
    headers: &HeaderMap,
    keyed: bool,
    cors: &CorsOrigins,
) -> Result<Option<HeaderValue>, ApiError> {
    if !keyed {
        if let Some(h) = headers.get("host") {
            let h = String::from_utf8_lossy(h.as_bytes());
            if !loopback_host(&h) {
                return Err(ApiError::new(
                    403,
                    &format!("Host {h:?} is not a loopback name: without an API key ds4-server answers only Host localhost, 127.0.0.1 or [::1] (a guard against DNS rebinding); start it with --api-key to serve other names"),
                ));
            }
        }
    }
    let Some(origin) = headers.get("origin") else {
        return Ok(None);
    };
    let o = String::from_utf8_lossy(origin.as_bytes());
    // The chat page at `/` calls from this server's own origin (its `Host`,
    // already checked above when there is no key): same-origin needs no
    // CORS headers.
    if same_origin(&o, headers) {
        return Ok(None);
    }
    if !cors.allows(&o) {
        return Err(ApiError::new(
            403,
            &format!("Origin {o:?} is not allowed: web pages may call ds4-server only from the origins named by --cors"),
        ));
    }
    Ok(Some(if cors.any {
        HeaderValue::from_static("*")
    } else {
        origin.clone()
    }))
}

/// How long a browser may cache a preflight answer, in seconds.
const PREFLIGHT_MAX_AGE: &str = "600";

/// Adds the CORS headers for an allowed origin; on a preflight (`OPTIONS`
/// with `Access-Control-Request-Method`) also the methods and the request
/// headers the page asked for (`authorization`, `content-type`, an SDK's own).
pub fn add_cors(
    out: &mut HeaderMap,
    allow_origin: HeaderValue,
    method: &Method,
    request: &HeaderMap,
) {
    out.insert("access-control-allow-origin", allow_origin);
    out.append("vary", HeaderValue::from_static("origin"));
    if method == Method::OPTIONS && request.contains_key("access-control-request-method") {
        out.insert(
            "access-control-allow-methods",
            HeaderValue::from_static("GET, POST, OPTIONS"),
        );
        if let Some(h) = request.get("access-control-request-headers") {
            out.insert(
                HeaderName::from_static("access-control-allow-headers"),
                h.clone(),
            );
        }
        out.insert(
            "access-control-max-age",
            HeaderValue::from_static(PREFLIGHT_MAX_AGE),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names() {
        for h in [
            "localhost",
            "LOCALHOST:8000",
            "127.0.0.1",
            "127.0.0.1:80",
            "127.1.2.3:9",
            "[::1]",
            "[::1]:8000",
        ] {
            assert!(loopback_host(h), "{h}");
        }
        for h in [
            "evil.example",
            "evil.example:8000",
            "localhost.evil.example",
            "192.168.1.2:8000",
            "[::2]:80",
            "[::1]x",
            "localhost:",
            "localhost:80:80",
            "localhost:abc",
            "",
            "x",
        ] {
            assert!(!loopback_host(h), "{h}");
        }
    }

    #[test]
    fn cors_flags() {
        assert!(CorsOrigins::parse(&["*".into()], false).is_err());
        assert!(CorsOrigins::parse(&["*".into()], true)
            .unwrap()
            .allows("https://a.b"));
        let c = CorsOrigins::parse(&["http://localhost:3000/".into()], false).unwrap();
        assert!(c.allows("http://LOCALHOST:3000"));
        assert!(!c.allows("http://localhost:3001"));
        for bad in ["localhost:3000", "http://a/b", "://a", "http://"] {
            assert!(CorsOrigins::parse(&[bad.into()], true).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_servers_own_origin_passes_without_cors() {
        let h = |host: &str, origin: &str| {
            let mut m = HeaderMap::new();
            m.insert("host", host.parse().unwrap());
            m.insert("origin", origin.parse().unwrap());
            m
        };
        let none = CorsOrigins::default();
        // The chat page at http://127.0.0.1:8000/ calling its server.
        assert_eq!(
            admit(&h("127.0.0.1:8000", "http://127.0.0.1:8000"), false, &none),
            Ok(None)
        );
        // Another port, another scheme or another host is another origin.
        for o in [
            "http://127.0.0.1:8001",
            "https://127.0.0.1:8000",
            "http://localhost:8000",
        ] {
            assert!(admit(&h("127.0.0.1:8000", o), false, &none).is_err(), "{o}");
        }
        // A rebinding page names itself in Host: refused without a key.
        assert!(admit(
            &h("evil.example:8000", "http://evil.example:8000"),
            false,
            &none
        )
        .is_err());
    }

    #[test]
    fn content_types() {
        let mut h = HeaderMap::new();
        assert!(!json_content_type(&h));
        h.insert("content-type", HeaderValue::from_static("text/plain"));
        assert!(!json_content_type(&h));
        h.insert(
            "content-type",
            HeaderValue::from_static("Application/JSON; charset=utf-8"),
        );
        assert!(json_content_type(&h));
    }
}
