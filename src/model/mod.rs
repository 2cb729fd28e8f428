//! Model configuration and weights (placeholder).
