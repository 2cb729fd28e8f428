//! V4.1 under `--numerics model`: which of the official graph's rounding
//! steps (docs/V41.md § Numerics) each backend runs. None does yet, so a
//! V4.1 session under `model` runs plain float math; the session names the
//! missing steps ([`crate::session::Session::numerics_notice`]) and the
//! binaries print that once at start, so `model` is never silently `plain`.

/// The official `inference/model.py` simulated quantisation steps of the
/// V4.1 graph, one line each, as the start-up warning names them.
pub const MODEL_STEPS: [&str; 4] = [
    "FP8 E4M3 round trip (blocks of 32, UE8M0 scales) of the inputs of wq_a, wq_b, wkv, wo_b, \
     indexer.wq_b, Engram wkv and the experts' w1/w2/w3",
    "FP8 round trip of the window KV rows after RoPE",
    "FP4 E2M1 round trip (blocks of 16, E4M3 scales) of the compressed latents after RoPE",
    "FP4 E2M1 round trip (blocks of 32, UE8M0 scales) of the indexer queries and index keys \
     after RoPE",
];

/// The steps of [`MODEL_STEPS`] that backend `backend` (`cpu-ref`, `cpu`,
/// `wgpu`, `cuda`) does not run under `--numerics model`. Today: all of
/// them, on every backend (issue 36); a backend that gains a step drops it
/// here, and the warning shrinks with it.
pub fn missing_model_steps(_backend: &str) -> &'static [&'static str] {
    &MODEL_STEPS
}

/// The start-up warning for a V4.1 session under `--numerics model` on
/// `backend` that lacks `missing` (non-empty): one line per step.
pub fn notice(backend: &str, missing: &[&str]) -> String {
    let what = if missing.len() == MODEL_STEPS.len() {
        "runs none of the official rounding steps yet: V4.1 gets plain f32 math".to_string()
    } else {
        format!(
            "does not run {} of the {} official rounding steps yet",
            missing.len(),
            MODEL_STEPS.len()
        )
    };
    let mut s = format!(
        "warning: --numerics model on DeepSeek V4.1: the {backend} backend {what} \
         (docs/V41.md § Numerics); missing:"
    );
    for m in missing {
        s.push_str("\n  - ");
        s.push_str(m);
    }
    s
}
