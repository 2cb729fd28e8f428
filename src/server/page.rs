//! The chat page at `/` (docs/CLIENTS.md § The chat page): one HTML file
//! with its script and styles, embedded in the binary, served to anyone who
//! passes the `Host` check. The page holds no secret; what it does goes
//! through `/v1/chat/completions`, which asks for the API key as for any
//! client. Its Content-Security-Policy lets it reach nothing but this
//! server, so "no external requests" holds by construction.

use warp::http::Response;
use warp::hyper::Body;

/// The page, as committed in `page/index.html`.
pub const INDEX_HTML: &str = include_str!("page/index.html");

/// Inline script and styles, `fetch` to this origin only, images only as
/// `data:` (the empty favicon), no framing.
pub const CSP: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// `GET /`.
pub fn response() -> Response<Body> {
    Response::builder()
        .header("content-type", "text/html; charset=utf-8")
        .header("content-security-policy", CSP)
        .header("x-content-type-options", "nosniff")
        .header("cache-control", "no-cache")
        .body(Body::from(INDEX_HTML))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_names_no_other_host() {
        // Everything it loads or calls is relative to this server.
        for needle in ["http://", "https://", "//cdn", "@import", "src=\"http"] {
            assert!(!INDEX_HTML.contains(needle), "{needle}");
        }
        assert!(INDEX_HTML.contains("/v1/chat/completions"));
        // The model line's source; tests/chat_page.rs drives the rest.
        assert!(INDEX_HTML.contains("fetch(\"/v1/models\""));
    }
}
