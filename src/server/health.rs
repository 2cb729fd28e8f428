//! The worker's health as `/health` reports it (issue 25 item 2): whether
//! the worker thread still runs, and the panics its jobs caused. A job that
//! panics fails alone; a worker thread that is gone makes `/health` 503 so
//! a supervisor restarts the server.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::trace::utc_stamp;

/// A panic caught in a job (issue 25 item 2).
#[derive(Clone, Debug)]
pub struct PanicRecord {
    pub message: String,
    /// Unix seconds.
    pub at: u64,
    /// The request sequence number of the job.
    pub request: u64,
}

/// What `/health` reads about the worker thread: whether it still runs,
/// and the panics its jobs caused.
#[derive(Debug, Default)]
pub struct WorkerHealth {
    pub(super) alive: AtomicBool,
    panics: AtomicU64,
    last_panic: Mutex<Option<PanicRecord>>,
}

impl WorkerHealth {
    pub fn alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    pub fn panics(&self) -> u64 {
        self.panics.load(Ordering::SeqCst)
    }

    pub fn last_panic(&self) -> Option<PanicRecord> {
        self.last_panic
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(super) fn record_panic(&self, message: String, request: u64) {
        self.panics.fetch_add(1, Ordering::SeqCst);
        *self.last_panic.lock().unwrap_or_else(|e| e.into_inner()) = Some(PanicRecord {
            message,
            at: unix_now(),
            request,
        });
    }

    /// `/health`'s body; the status is 503 when the worker is gone.
    pub fn report(&self) -> (u16, serde_json::Value) {
        let alive = self.alive();
        let last = self.last_panic().map(|p| {
            serde_json::json!({"message": p.message, "request": p.request,
                "time": format!("{} UTC", utc_stamp(p.at)), "unix_time": p.at})
        });
        let body = serde_json::json!({
            "status": if alive { "ok" } else { "unavailable" },
            "worker": {"alive": alive, "panics": self.panics(), "last_panic": last},
        });
        (if alive { 200 } else { 503 }, body)
    }
}

/// Marks the worker dead when its thread ends, however it ends.
pub(super) struct AliveGuard(pub(super) Arc<WorkerHealth>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.alive.store(false, Ordering::SeqCst);
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The text of a panic payload (`panic!` with a literal or a format).
pub(super) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}
