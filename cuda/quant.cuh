// Weight decoders over the GGUF bytes as stored (QUANTS.md). Every type is
// read in units of 32 consecutive values of a row (`unit` u covers values
// 32u..32u+32), so one lane of a warp decodes one unit. Type ids are GGUF's.
// Twins: quant::{f16, q8_0, q2_k, q4_k, iq2_xxs, mxfp4}::dequantize_row.

#define TY_F32 0
#define TY_F16 1
#define TY_Q8_0 8
#define TY_Q2_K 10
#define TY_Q4_K 12
#define TY_IQ2_XXS 16
#define TY_BF16 30
#define TY_MXFP4 39

// `a * b` rounded on its own: keeps `dl * q - ml` from being contracted into
// a fused multiply-add, so decoded values equal the CPU twins bit for bit.
#ifdef __CUDA_ARCH__
#define MUL_RN(a, b) __fmul_rn((a), (b))
#else
#define MUL_RN(a, b) ((a) * (b))
#endif

__device__ __forceinline__ u16 ld_u16(const u8* p) {
    return *(const u16*)p;  // every u16 field sits at an even offset
}

__device__ __forceinline__ u32 ld_u32_2(const u8* p) {
    // 2-byte aligned little-endian u32 (IQ2_XXS groups).
    return (u32)ld_u16(p) | ((u32)ld_u16(p + 2) << 16);
}

// The 16 bytes at p (16-byte aligned) as four little-endian u32 words, in
// one vector load.
struct Words4 {
    u32 w[4];
};

__device__ __forceinline__ Words4 ld_words4(const uint4* p) {
    const uint4 v = *p;
    return {{v.x, v.y, v.z, v.w}};
}

template <int TY>
__device__ __forceinline__ void decode32(const u8* row, u32 u, float* out) {
    if constexpr (TY == TY_F32) {
        const float4* p = (const float4*)(row + 128u * u);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            float4 v = p[i];
            out[4 * i] = v.x; out[4 * i + 1] = v.y; out[4 * i + 2] = v.z; out[4 * i + 3] = v.w;
        }
    } else if constexpr (TY == TY_F16 || TY == TY_BF16) {
        const uint4* p = (const uint4*)(row + 64u * u);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const Words4 v = ld_words4(p + i);
#pragma unroll
            for (int k = 0; k < 4; k++) {
                u16 lo = (u16)(v.w[k] & 0xffffu), hi = (u16)(v.w[k] >> 16);
                if constexpr (TY == TY_F16) {
                    out[8 * i + 2 * k] = f16_to_f32(lo);
                    out[8 * i + 2 * k + 1] = f16_to_f32(hi);
                } else {
                    out[8 * i + 2 * k] = bf16_to_f32(lo);
                    out[8 * i + 2 * k + 1] = bf16_to_f32(hi);
                }
            }
        }
    } else if constexpr (TY == TY_Q8_0) {
        const u8* b = row + 34u * u;
        float d = f16_to_f32(ld_u16(b));
        const u16* q = (const u16*)(b + 2);
#pragma unroll
        for (int i = 0; i < 16; i++) {
            u16 pair = q[i];
            out[2 * i] = (float)(signed char)(pair & 0xff) * d;
            out[2 * i + 1] = (float)(signed char)(pair >> 8) * d;
        }
    } else if constexpr (TY == TY_Q2_K) {
        // 84-byte block: scales[16], qs[64], d, dmin. Unit = 32 values =
        // (half, j) with half = sb/4, j = sb%4; two 16-value sub-blocks.
        const u8* b = row + 84u * (u >> 3);
        const u32 sb = u & 7, half = sb >> 2, j = sb & 3;
        float d = f16_to_f32(ld_u16(b + 80)), dmin = f16_to_f32(ld_u16(b + 82));
#pragma unroll
        for (int part = 0; part < 2; part++) {
            u8 s = b[8 * half + 2 * j + part];
            float dl = d * (float)(s & 15), ml = dmin * (float)(s >> 4);
            const u8* qs = b + 16 + 32 * half + 16 * part;
#pragma unroll
            for (int l = 0; l < 16; l++) {
                out[16 * part + l] = MUL_RN(dl, (float)((qs[l] >> (2 * j)) & 3)) - ml;
            }
        }
    } else if constexpr (TY == TY_Q4_K) {
        // 144-byte block: d, dmin, scales[12], qs[128]; sub-block sb: chunk
        // c = sb/2 of 32 bytes, low nibbles for even sb, high for odd.
        const u8* b = row + 144u * (u >> 3);
        const u32 sb = u & 7, c = sb >> 1, shift = 4 * (sb & 1);
        float d = f16_to_f32(ld_u16(b)), dmin = f16_to_f32(ld_u16(b + 2));
        const u8* s = b + 4;
        u32 sc, m;
        if (sb < 4) {
            sc = s[sb] & 63;
            m = s[sb + 4] & 63;
        } else {
            sc = (s[sb + 4] & 15) | ((s[sb - 4] >> 6) << 4);
            m = (s[sb + 4] >> 4) | ((s[sb] >> 6) << 4);
        }
        float dl = d * (float)sc, ml = dmin * (float)m;
        const uint4* qs = (const uint4*)(b + 16 + 32 * c);  // 16-byte aligned in the block
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const Words4 v = ld_words4(qs + i);
#pragma unroll
            for (int k = 0; k < 4; k++) {
#pragma unroll
                for (int by = 0; by < 4; by++) {
                    u32 q = ((v.w[k] >> (8 * by)) >> shift) & 15;
                    out[16 * i + 4 * k + by] = MUL_RN(dl, (float)q) - ml;
                }
            }
        }
    } else if constexpr (TY == TY_IQ2_XXS) {
        // 66-byte block: d, then 8 groups of (4 grid bytes, u32 signs+scale).
        const u8* b = row + 66u * (u >> 3);
        const u32 g = u & 7;
        float d = f16_to_f32(ld_u16(b));
        u32 a0 = ld_u32_2(b + 2 + 8 * g), a1 = ld_u32_2(b + 6 + 8 * g);
        float db = d * (0.5f + (float)(a1 >> 28)) * 0.25f;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            u64 grid = IQ2XXS_GRID[(a0 >> (8 * k)) & 0xff];
            u32 s7 = (a1 >> (7 * k)) & 127;
            u32 signs = s7 | ((__popc(s7) & 1) << 7);  // ksigns_iq2xs
#pragma unroll
            for (int i = 0; i < 8; i++) {
                float m = db * (float)((grid >> (8 * i)) & 0xff);
                out[8 * k + i] = ((signs >> i) & 1) ? -m : m;
            }
        }
    } else if constexpr (TY == TY_MXFP4) {
        // 17-byte block: E8M0 exponent, 16 bytes of nibbles (low: 0..16).
        const u8* b = row + 17u * u;
        u32 e = b[0];
        float d = __uint_as_float(e < 2 ? (0x00200000u << e) : ((e - 1) << 23));
        const float kv[16] = {0.f, 1.f, 2.f, 3.f, 4.f, 6.f, 8.f, 12.f,
                              0.f, -1.f, -2.f, -3.f, -4.f, -6.f, -8.f, -12.f};
#pragma unroll
        for (int i = 0; i < 16; i++) {
            u8 q = b[1 + i];
            out[i] = d * kv[q & 15];
            out[16 + i] = d * kv[q >> 4];
        }
    }
}

// One value of a row. Float types read it directly (any width, any
// alignment of 2 or 4 bytes); block types decode the unit around it (only
// used off the fast path: their rows are whole 32-value units).
template <int TY>
__device__ __forceinline__ float decode1(const u8* row, u32 i) {
    if constexpr (TY == TY_F32) {
        return ((const float*)row)[i];
    } else if constexpr (TY == TY_F16) {
        return f16_to_f32(((const u16*)row)[i]);
    } else if constexpr (TY == TY_BF16) {
        return bf16_to_f32(((const u16*)row)[i]);
    } else {
        float v[32];
        decode32<TY>(row, i / 32, v);
        return v[i % 32];
    }
}

// Dot of unit u of a weight row with 32 activations (16-byte aligned).
__device__ __forceinline__ float dot32(const float* w, const float* x) {
    const float4* x4 = (const float4*)x;
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        float4 v = x4[i];
        acc += w[4 * i] * v.x + w[4 * i + 1] * v.y + w[4 * i + 2] * v.z + w[4 * i + 3] * v.w;
    }
    return acc;
}

// Instantiates KERNEL(name, TY) for every weight type.
#define FOR_EACH_WEIGHT_TYPE(KERNEL) \
    KERNEL(f32, TY_F32)              \
    KERNEL(f16, TY_F16)              \
    KERNEL(bf16, TY_BF16)            \
    KERNEL(q8_0, TY_Q8_0)            \
    KERNEL(q2_k, TY_Q2_K)            \
    KERNEL(q4_k, TY_Q4_K)            \
    KERNEL(iq2_xxs, TY_IQ2_XXS)      \
    KERNEL(mxfp4, TY_MXFP4)
