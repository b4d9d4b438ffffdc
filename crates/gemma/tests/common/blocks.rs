//! Random GGUF blocks for the tests of the kernels that read them.

use gemma::quant::GgufDtype;

/// Random blocks of `dtype` (seeded), their f16 scales small and finite.
pub fn random_blocks(dtype: GgufDtype, blocks: usize, seed: u64) -> Vec<u8> {
    let size = dtype.type_size() as usize;
    let scales: &[usize] = match dtype {
        GgufDtype::Q4_K | GgufDtype::Q5_K => &[0, 2],
        GgufDtype::Q6_K => &[208],
        _ => &[0],
    };
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut out = vec![0u8; blocks * size];
    for byte in out.iter_mut() {
        *byte = next() as u8;
    }
    for block in out.chunks_exact_mut(size) {
        for &at in scales {
            let v = ((next() % 2001) as f32 / 1000.0 - 1.0) * 0.004;
            block[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
        }
    }
    out
}
