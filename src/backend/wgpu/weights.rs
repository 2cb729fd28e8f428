//! Weight upload in chunks of whole rows (owned by the matmul work; see
//! docs/ARCHITECTURE.md).
