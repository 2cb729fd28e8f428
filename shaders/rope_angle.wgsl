// RoPE angles from the host's frequencies (MODEL.md 3.4.1), for rope and
// both compressors; the including module declares `consts`, which holds the
// table (3 floats per rotated pair).
//
// The angle pos * freq must be good at large positions, where an f32 product
// is off by pos * 2^-24 radians. The host stores each frequency as turns per
// position split in three parts (hi and mid with 12 significant bits, lo the
// rest; rope_table in src/backend/wgpu/params.rs); with pos split in 12-bit
// halves every partial product is exact in f32, and only the reduced
// fractions are summed.

fn centered_fract(v: f32) -> f32 {
    return v - round(v);
}

// (cos, sin) of 2*pi*pos*turns, turns = hi + mid + lo.
fn turns_cos_sin(hi: f32, mid: f32, lo: f32, pos: u32) -> vec2<f32> {
    let ph = f32(pos >> 12u);
    let pl = f32(pos & 0xfffu);
    var turns = centered_fract(ph * hi * 4096.0) + centered_fract(ph * mid * 4096.0)
        + centered_fract(pl * hi) + centered_fract(pl * mid) + centered_fract(f32(pos) * lo);
    turns = centered_fract(turns);
    let a = turns * 6.283185307179586;
    return vec2<f32>(cos(a), sin(a));
}

// (cos, sin) of pair k at `pos` from the table at consts[tab..].
fn cos_sin(k: u32, pos: u32, tab: u32) -> vec2<f32> {
    return turns_cos_sin(consts[tab + 3u * k], consts[tab + 3u * k + 1u], consts[tab + 3u * k + 2u], pos);
}
