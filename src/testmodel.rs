//! Test-model generator (placeholder).
