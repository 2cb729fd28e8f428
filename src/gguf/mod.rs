//! GGUF reader (placeholder).
