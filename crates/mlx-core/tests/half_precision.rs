//! float16 and bfloat16: exact values survive, others round to nearest.

mod common;

use common::{f32s, read_f32};
use half::{bf16, f16};
use mlx_core::{Array, Dtype};

#[test]
fn bfloat16_values_that_are_exactly_representable_survive_astype() {
    // 8 significant bits: all of these are exact in bfloat16.
    let exact = [1.0f32, -0.5, 3.0, 0.0078125, 1.2676506e30, -255.0, 0.0];
    let back = f32s(&exact, &[7])
        .astype(Dtype::Bfloat16)
        .unwrap()
        .astype(Dtype::Float32)
        .unwrap();
    assert_eq!(read_f32(&back), exact);
}

#[test]
fn float16_values_that_are_exactly_representable_survive_astype() {
    // 65504 is float16's largest value, 2^-14 its smallest normal one.
    let exact = [0.5f32, -2.0, 1024.0, 65504.0, 6.1035156e-5, 0.333_251_95];
    let back = f32s(&exact, &[6])
        .astype(Dtype::Float16)
        .unwrap()
        .astype(Dtype::Float32)
        .unwrap();
    assert_eq!(read_f32(&back), exact);
}

#[test]
fn one_third_rounds_to_the_nearest_bfloat16() {
    // 1/3 in float32 is 0x3EAAAAAB; the top half is 0x3EAA and the dropped
    // half 0xAAAB is above 0x8000, so it rounds up to 0x3EAB.
    let third = f32s(&[1.0 / 3.0], &[1]).astype(Dtype::Bfloat16).unwrap();
    assert_eq!(third.dtype(), Dtype::Bfloat16);
    let bits: Vec<u16> = third
        .to_vec::<bf16>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect();
    assert_eq!(bits, vec![0x3EAB]);
    assert_eq!(bf16::from_f32(1.0 / 3.0).to_bits(), 0x3EAB);
}

#[test]
fn one_third_rounds_to_the_nearest_float16() {
    // 1/3 = 1.0101…₂ × 2⁻²: exponent 13 (0b01101), mantissa 0101010101, the
    // next bit is 0, so it rounds down: 0x3555.
    let third = f32s(&[1.0 / 3.0], &[1]).astype(Dtype::Float16).unwrap();
    assert_eq!(third.to_vec::<f16>().unwrap()[0].to_bits(), 0x3555);
}

#[test]
fn bfloat16_host_values_round_trip_bit_for_bit() {
    let bits = [0x3EABu16, 0x0001, 0x7F7F, 0x8000, 0xC2F7];
    let values: Vec<bf16> = bits.iter().map(|&b| bf16::from_bits(b)).collect();
    let a = Array::from_slice(&values, &[5]).unwrap();
    let back: Vec<u16> = a
        .to_vec::<bf16>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect();
    assert_eq!(back, bits);
}

#[test]
fn bfloat16_host_values_widen_to_the_same_float32() {
    let values = [bf16::from_bits(0x3EAB), bf16::from_bits(0xC2F7)];
    let widened = Array::from_slice(&values, &[2])
        .unwrap()
        .astype(Dtype::Float32)
        .unwrap();
    // 0x3EAB0000 and 0xC2F70000 as float32.
    assert_eq!(
        read_f32(&widened),
        vec![f32::from_bits(0x3EAB_0000), f32::from_bits(0xC2F7_0000)]
    );
    assert_eq!(read_f32(&widened)[1], -123.5);
}

#[test]
fn float32_to_bfloat16_and_back_has_relative_error_at_most_2_pow_minus_8() {
    // Round to nearest with 8 significant bits: |x̂ − x| ≤ 2⁻⁸ · |x|.
    let values: Vec<f32> = (1..=2000)
        .map(|i| {
            let t = i as f32;
            let sign = if i % 2 == 0 { 1.0 } else { -1.0 };
            sign * (t * 0.7371).powf(1.7) * 1e-3
        })
        .collect();
    let back = read_f32(
        &f32s(&values, &[2000])
            .astype(Dtype::Bfloat16)
            .unwrap()
            .astype(Dtype::Float32)
            .unwrap(),
    );
    let mut worst = 0.0f32;
    for (&x, &y) in values.iter().zip(&back) {
        worst = worst.max((y - x).abs() / x.abs());
    }
    assert!(worst <= 2f32.powi(-8), "worst relative error {worst}");
    assert!(
        worst > 2f32.powi(-10),
        "values were not rounded at all? {worst}"
    );
}
