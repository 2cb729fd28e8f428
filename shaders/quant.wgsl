// Block decoders for the weight types ds4 reads (docs/QUANTS.md), working on
// the GGUF bytes exactly as stored. The module that includes this file
// declares `W` (the weight chunk, `array<u32>`), `IQ2_GRID` (the IQ2_XXS
// grid, 512 words generated from src/quant/iq2xxs_tables.rs) and the
// override constant `WTYPE` (the GGUF type id of `W`).
//
// Q8_0 (34 B), IQ2_XXS (66 B) and MXFP4 (17 B) blocks are not 4-byte
// aligned, so every multi-byte field is assembled from u32 words
// (`w_word` takes any byte offset). The unit of decoding is 32 consecutive
// elements of one row: one Q8_0 / MXFP4 block, one IQ2_XXS group, one
// 32-element slice of a Q2_K / Q4_K super-block, 32 float values.

const TYPE_F32: u32 = 0u;
const TYPE_F16: u32 = 1u;
const TYPE_Q8_0: u32 = 8u;
const TYPE_Q2_K: u32 = 10u;
const TYPE_Q4_K: u32 = 12u;
const TYPE_IQ2_XXS: u32 = 16u;
const TYPE_BF16: u32 = 30u;
const TYPE_MXFP4: u32 = 39u;

// Byte `b` of the weight chunk.
fn w_byte(b: u32) -> u32 {
    return (W[b >> 2u] >> ((b & 3u) * 8u)) & 0xffu;
}

// Little-endian u32 starting at any byte offset `b`. The shift by 32 is
// avoided because WGSL takes shift amounts modulo 32.
fn w_word(b: u32) -> u32 {
    let i = b >> 2u;
    let sh = (b & 3u) * 8u;
    if (sh == 0u) {
        return W[i];
    }
    return (W[i] >> sh) | (W[i + 1u] << (32u - sh));
}

// The f16 at even byte offset `b` (never straddles a word).
fn w_f16(b: u32) -> f32 {
    return unpack2x16float(W[b >> 2u] >> ((b & 2u) * 8u)).x;
}

// Signed byte `k` (0..3) of word `q`.
fn sbyte(q: u32, k: u32) -> f32 {
    return f32(bitcast<i32>(q << (24u - 8u * k)) >> 24u);
}

// MXFP4 / E2M1 doubled value of nibble `n`: 0,1,2,3,4,6,8,12, bit 3 = sign.
fn e2m1x2(n: u32) -> f32 {
    let m = n & 7u;
    var v = m;
    if (m >= 4u) {
        v = (2u + (m & 1u)) << ((m >> 1u) - 1u);
    }
    return select(f32(v), -f32(v), (n & 8u) != 0u);
}

// Decodes elements 32u .. 32u+31 of the row starting at byte `rb` into `w`.
// Float rows whose length is not a multiple of 32 decode a partial last unit;
// the caller uses only the elements inside the row.
fn decode32(rb: u32, u: u32, w: ptr<function, array<f32, 32>>) {
    switch WTYPE {
        case 0u: { // F32
            let base = (rb >> 2u) + 32u * u;
            for (var i = 0u; i < 32u; i++) {
                (*w)[i] = bitcast<f32>(W[base + i]);
            }
        }
        case 1u: { // F16
            let b = rb + 64u * u;
            for (var i = 0u; i < 16u; i++) {
                let v = unpack2x16float(w_word(b + 4u * i));
                (*w)[2u * i] = v.x;
                (*w)[2u * i + 1u] = v.y;
            }
        }
        case 30u: { // BF16: the upper half of an f32
            let b = rb + 64u * u;
            for (var i = 0u; i < 16u; i++) {
                let v = w_word(b + 4u * i);
                (*w)[2u * i] = bitcast<f32>(v << 16u);
                (*w)[2u * i + 1u] = bitcast<f32>(v & 0xffff0000u);
            }
        }
        case 8u: { // Q8_0: d (f16), 32 × i8
            let b = rb + 34u * u;
            let d = w_f16(b);
            for (var i = 0u; i < 8u; i++) {
                let q = w_word(b + 2u + 4u * i);
                for (var k = 0u; k < 4u; k++) {
                    (*w)[4u * i + k] = sbyte(q, k) * d;
                }
            }
        }
        case 10u: { // Q2_K: scales[16], qs[64], d, dmin
            let b = rb + 84u * (u >> 3u);
            let s = u & 7u;           // 32-element slice of the super-block
            let half = s >> 2u;
            let j = s & 3u;           // bit pair
            let dm = unpack2x16float(w_word(b + 80u));
            let sc0 = w_byte(b + 2u * s);
            let sc1 = w_byte(b + 2u * s + 1u);
            let dl0 = dm.x * f32(sc0 & 15u);
            let ml0 = dm.y * f32(sc0 >> 4u);
            let dl1 = dm.x * f32(sc1 & 15u);
            let ml1 = dm.y * f32(sc1 >> 4u);
            for (var i = 0u; i < 8u; i++) {
                let q = w_word(b + 16u + 32u * half + 4u * i);
                for (var k = 0u; k < 4u; k++) {
                    let l = 4u * i + k;
                    let v = f32((q >> (8u * k + 2u * j)) & 3u);
                    if (l < 16u) {
                        (*w)[l] = dl0 * v - ml0;
                    } else {
                        (*w)[l] = dl1 * v - ml1;
                    }
                }
            }
        }
        case 12u: { // Q4_K: d, dmin, scales[12], qs[128]
            let b = rb + 144u * (u >> 3u);
            let j = u & 7u;           // sub-block
            let dm = unpack2x16float(w_word(b));
            let sw = array<u32, 3>(w_word(b + 4u), w_word(b + 8u), w_word(b + 12u));
            var sc: u32;
            var mn: u32;
            if (j < 4u) {
                sc = (sw[0] >> (8u * j)) & 63u;
                mn = (sw[1] >> (8u * j)) & 63u;
            } else {
                let hi = (sw[2] >> (8u * (j - 4u))) & 0xffu;  // s[j+4]
                let lo_a = (sw[0] >> (8u * (j - 4u))) & 0xffu; // s[j-4]
                let lo_b = (sw[1] >> (8u * (j - 4u))) & 0xffu; // s[j]
                sc = (hi & 15u) | ((lo_a >> 6u) << 4u);
                mn = (hi >> 4u) | ((lo_b >> 6u) << 4u);
            }
            let dl = dm.x * f32(sc);
            let ml = dm.y * f32(mn);
            let shift = (j & 1u) * 4u;
            let qb = b + 16u + 32u * (j >> 1u);
            for (var i = 0u; i < 8u; i++) {
                let q = w_word(qb + 4u * i);
                for (var k = 0u; k < 4u; k++) {
                    (*w)[4u * i + k] = dl * f32((q >> (8u * k + shift)) & 15u) - ml;
                }
            }
        }
        case 16u: { // IQ2_XXS: d, then one 8-byte group per 32 values
            let b = rb + 66u * (u >> 3u);
            let g = b + 2u + 8u * (u & 7u);
            let a0 = w_word(g);
            let a1 = w_word(g + 4u);
            let db = w_f16(b) * (0.5 + f32(a1 >> 28u)) * 0.25;
            for (var k = 0u; k < 4u; k++) {
                let idx = (a0 >> (8u * k)) & 255u;
                let sg = (a1 >> (7u * k)) & 127u;
                // ksigns_iq2xs: the 8th sign bit is the parity of the other 7.
                let signs = sg | ((countOneBits(sg) & 1u) << 7u);
                let lo = IQ2_GRID[2u * idx];
                let hi = IQ2_GRID[2u * idx + 1u];
                for (var i = 0u; i < 8u; i++) {
                    let word = select(hi, lo, i < 4u);
                    let mag = f32((word >> (8u * (i & 3u))) & 255u);
                    let v = db * mag;
                    (*w)[8u * k + i] = select(v, -v, ((signs >> i) & 1u) != 0u);
                }
            }
        }
        case 39u: { // MXFP4: e (E8M0), 16 bytes of nibble pairs
            let b = rb + 17u * u;
            let e = w_byte(b);
            var d: f32;
            if (e < 2u) {
                d = bitcast<f32>(0x00200000u << e);
            } else {
                d = bitcast<f32>((e - 1u) << 23u);
            }
            for (var i = 0u; i < 4u; i++) {
                let q = w_word(b + 1u + 4u * i);
                for (var k = 0u; k < 4u; k++) {
                    let byte = (q >> (8u * k)) & 0xffu;
                    (*w)[4u * i + k] = d * e2m1x2(byte & 15u);
                    (*w)[4u * i + k + 16u] = d * e2m1x2(byte >> 4u);
                }
            }
        }
        default: {
            for (var i = 0u; i < 32u; i++) {
                (*w)[i] = 0.0;
            }
        }
    }
}
