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
}  // namespace emu

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
