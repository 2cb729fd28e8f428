//! The server's worker in this process, for `warp::test` tests: one session
//! on the tiny model behind the request queue, as `ds4-server` builds it.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use ds4::server::job::KvCacheHook;
use ds4::server::metrics::Metrics;
use ds4::server::routes::{self, HttpOptions, State};
use ds4::server::worker::{self, Queue, WorkerConfig};
use ds4::session::{Session, SessionOptions};
use ds4::testmodel::Variant;
use ds4::Tokenizer;

/// The routes' state over a worker's `queue` and `metrics`: a context of
/// `ctx`, 24 tokens an answer unless asked, the rest as `opts` says.
pub fn routes_state(
    queue: Queue,
    metrics: Arc<Metrics>,
    ctx: usize,
    opts: HttpOptions,
) -> Arc<State> {
    Arc::new(State {
        queue,
        metrics,
        opts: HttpOptions {
            ctx,
            default_tokens: 24,
            ..opts
        },
        counter: AtomicU64::new(0),
    })
}

/// A POST of the JSON `body` to `path` on the server's routes over
/// `state`: the reply's status and body.
pub async fn post(state: &Arc<State>, path: &str, body: &serde_json::Value) -> (u16, String) {
    let r = warp::test::request()
        .method("POST")
        .path(path)
        .header("content-type", "application/json")
        .body(body.to_string())
        .reply(&routes::routes(state.clone()))
        .await;
    (
        r.status().as_u16(),
        String::from_utf8(r.body().to_vec()).unwrap(),
    )
}

/// The worker on a `ctx`-token session of the tiny model (24 tokens an
/// answer unless asked, exact DSML replay, a queue of 16) with the disk
/// cache `cache`; its queue, its metrics and the tokenizer.
pub fn tiny_worker(
    ctx: usize,
    cache: Box<dyn KvCacheHook>,
) -> (Queue, Arc<Metrics>, Arc<Tokenizer>) {
    tiny_worker_with(ctx, cache, None)
}

/// [`tiny_worker`] with speculative decoding by `spec` (issue 35).
pub fn tiny_worker_with(
    ctx: usize,
    cache: Box<dyn KvCacheHook>,
    spec: Option<ds4::speculate::Speculator>,
) -> (Queue, Arc<Metrics>, Arc<Tokenizer>) {
    let model = super::tiny_model(Variant::Q8);
    let sess = Session::new(
        model,
        SessionOptions {
            ctx,
            ..SessionOptions::default()
        },
    )
    .unwrap();
    worker_on(sess, cache, spec)
}

/// The serial worker over `sess` (its model's tokenizer), with `cache`
/// and the speculator `spec`.
pub fn worker_on(
    sess: Session,
    cache: Box<dyn KvCacheHook>,
    spec: Option<ds4::speculate::Speculator>,
) -> (Queue, Arc<Metrics>, Arc<Tokenizer>) {
    let tok = Arc::new(Tokenizer::from_gguf(sess.model().file()).unwrap());
    let metrics = Arc::new(Metrics::default());
    let queue = worker::start(
        sess,
        tok.clone(),
        WorkerConfig {
            queued_scripts: Vec::new(),
            trace: None,
            default_tokens: 24,
            exact_replay: true,
            tool_memory_max_ids: 1000,
            debug_panic_on_prompt: None,
        },
        metrics.clone(),
        16,
        cache,
        spec,
    );
    (queue, metrics, tok)
}
