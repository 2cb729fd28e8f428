//! What the batch tests share: their session options, and plans run
//! together on one batch as the server schedules them (the self-check's
//! schedule).

use ds4::app::selfcheck::batch::{self, Plan, StepSeen};
use ds4::backend::{BackendKind, BackendOptions};
use ds4::model::forward::Numerics;
use ds4::session::{Batch, SessionOptions};

/// Context `ctx`, prefill in chunks of 64, model numerics, `backend` with
/// its default options.
pub fn options(backend: BackendKind, ctx: usize) -> SessionOptions {
    SessionOptions {
        ctx,
        prefill_chunk: 64,
        numerics: Numerics::Model,
        backend,
        backend_options: BackendOptions::default(),
        ..Default::default()
    }
}

/// [`ds4::app::selfcheck::batch::run_plans`], failing the test on an error.
pub fn run_plans(
    b: &mut Batch,
    plans: &[Plan],
    all_logits: &dyn Fn(&Plan, usize) -> bool,
    seen: &mut StepSeen<'_>,
) {
    if let Err(e) = batch::run_plans(b, plans, all_logits, seen) {
        panic!("{e}");
    }
}
