// Host stand-ins for the CUDA keywords and intrinsics that cuda/common.cuh
// and cuda/quant.cuh use, so their scalar helpers (weight decoders,
// small-float rounding) compile with a C++ compiler and can be checked
// against the CPU twins without a GPU (tests/cuda_host.rs). Warp and block
// collectives are stubs: only scalar functions are exercised.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define __device__
#define __global__
#define __constant__
#define __shared__
#define __forceinline__ inline

struct float4 { float x, y, z, w; };
struct uint4 { unsigned x, y, z, w; };
struct Dim3 { unsigned x, y, z; };
static Dim3 threadIdx, blockDim;
inline void __syncthreads() {}
template <typename T> inline T __shfl_xor_sync(unsigned, T v, int) { return v; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline float __int_as_float(int u) { float f; std::memcpy(&f, &u, 4); return f; }
inline int __popc(unsigned v) { return __builtin_popcount(v); }
template <typename T> inline T min(T a, T b) { return a < b ? a : b; }
template <typename T> inline T max(T a, T b) { return a < b ? b : a; }
using std::isnan;
