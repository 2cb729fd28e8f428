// A CUDA-on-the-host emulator for the tests (tests/cuda_emu/mod.rs): the
// kernels of cuda/*.cu are compiled with the host C++ compiler into a fake
// libcuda.so (driver.cpp) that implements the driver calls the backend
// makes. Each CUDA thread of a block is a coroutine (ucontext) on one OS
// thread; __syncthreads and the warp shuffles are barriers between them, so
// block- and warp-level code runs with CUDA's semantics (blocks one after
// another, exited threads count as arrived). Shared memory is `static`
// storage (blocks never overlap). This checks the kernels' logic and the
// whole backend without a GPU; it says nothing about speed or the PTX.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#define __device__
#define __global__
#define __constant__
#define __shared__ static
#define __forceinline__ inline
#define __launch_bounds__(n)

struct float4 { float x, y, z, w; };
struct uint4 { unsigned x, y, z, w; };
struct Dim3 { unsigned x, y, z; };

namespace emu {
extern Dim3 threadIdx, blockIdx, blockDim, gridDim;
void sync_block();
// Exchanges 8 bytes with lane `src_lane` of the calling warp.
unsigned long long warp_exchange(unsigned long long v, unsigned src_lane);
// Every lane of the calling warp publishes `bytes` (at most 64); `all`
// receives lane 0's, then lane 1's, ... (all 32 lanes must take part).
void warp_gather(const void* mine, unsigned bytes, void* all);
}  // namespace emu

// mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 in software (d += A B):
// the warp's fragments are gathered, A (16x16) and B (16x8) rebuilt with the
// PTX ISA's fragment layout (see cuda/matmul.cu), and each lane computes its
// own four results in k order with f32 products and sums.
inline void emu_mma_16816(float* d, const unsigned* a, const unsigned* b) {
    unsigned mine[6] = {a[0], a[1], a[2], a[3], b[0], b[1]};
    unsigned all[32][6];
    emu::warp_gather(mine, sizeof mine, all);
    auto half = [](unsigned reg, int hi) {
        unsigned short h = (unsigned short)(hi ? reg >> 16 : reg & 0xffffu);
        _Float16 v;
        std::memcpy(&v, &h, 2);
        return (float)v;
    };
    float A[16][16], B[16][8];
    for (int lane = 0; lane < 32; lane++) {
        const int g = lane >> 2, q = lane & 3;
        for (int i = 0; i < 8; i++) {
            const int row = (i < 2 || (i >= 4 && i < 6)) ? g : g + 8;
            const int col = 2 * q + (i & 1) + (i >= 4 ? 8 : 0);
            A[row][col] = half(all[lane][i / 2], i & 1);
        }
        for (int i = 0; i < 4; i++) {
            const int k = 2 * q + (i & 1) + (i >= 2 ? 8 : 0);
            B[k][g] = half(all[lane][4 + i / 2], i & 1);
        }
    }
    const unsigned lane = emu::threadIdx.x & 31;
    const int g = lane >> 2, q = lane & 3;
    for (int i = 0; i < 4; i++) {
        const int row = g + (i >> 1) * 8, col = 2 * q + (i & 1);
        float s = 0.0f;
        for (int k = 0; k < 16; k++) s += A[row][k] * B[k][col];
        d[i] += s;
    }
}

#define threadIdx emu::threadIdx
#define blockIdx emu::blockIdx
#define blockDim emu::blockDim
#define gridDim emu::gridDim

inline void __syncthreads() { emu::sync_block(); }

template <typename T>
inline T __shfl_xor_sync(unsigned, T v, int o) {
    unsigned long long bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    bits = emu::warp_exchange(bits, (threadIdx.x & 31) ^ (unsigned)o);
    T r;
    std::memcpy(&r, &bits, sizeof(T));
    return r;
}

inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline float __int_as_float(int u) { float f; std::memcpy(&f, &u, 4); return f; }
inline int __popc(unsigned v) { return __builtin_popcount(v); }
// Coroutines switch only at barriers: a read-modify-write is atomic here.
inline unsigned atomicAdd(unsigned* p, unsigned v) { unsigned o = *p; *p = o + v; return o; }
template <typename T> inline T min(T a, T b) { return a < b ? a : b; }
template <typename T> inline T max(T a, T b) { return a < b ? b : a; }
using std::isnan;
