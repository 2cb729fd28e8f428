//! Matrix-product kernels (owned by the matmul work; see docs/ARCHITECTURE.md).
