//! ggml's KV block formats on the GPU: the GPU's codecs write the bytes the
//! CPU's write and read back the same values, and a tiny model whose caches
//! hold blocks decodes on the GPU (eager, fixed-shape steps, compiled; with
//! our kernels, the fused layer kernel and the decode attention kernel
//! reading the blocks, and without) as on the CPU. One test, as its checks switch the process's default device
//! to the CPU and back; it needs a CUDA build of MLX (the GPU machine) and
//! elsewhere says so and returns.

mod common;

use common::fixed_steps::{max_diff, scheduled, tiny_model, Steps};
use common::gpu::{floats, on_gpu};
use gemma::cache::{BlockArray, CacheFormat, KvFormat};
use gemma::quant::{GgufDtype, QUANTIZABLE};
use mlx_core::device::set_default_device;
use mlx_core::{random, Device, Dtype};

/// The bytes of a block store's carrier array.
fn bytes(b: &BlockArray) -> Vec<u8> {
    let a = b
        .bytes
        .astype(Dtype::Int16)
        .unwrap()
        .to_vec::<i16>()
        .unwrap();
    match b.bytes.dtype() {
        Dtype::Int8 => a.iter().map(|&v| v as u8).collect(),
        _ => a.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

/// `f` with `device` as the default device, the GPU again after it.
fn on<T>(device: Device, f: impl FnOnce() -> T) -> T {
    set_default_device(device).unwrap();
    let out = f();
    set_default_device(Device::Gpu).unwrap();
    out
}

#[test]
fn block_caches_on_the_gpu_are_the_cpus() {
    if !on_gpu() {
        return;
    }
    the_gpu_writes_and_reads_the_cpus_blocks();
    a_model_with_block_caches_decodes_on_the_gpu_as_on_the_cpu();
}

fn the_gpu_writes_and_reads_the_cpus_blocks() {
    let key = random::key(3).unwrap();
    let x = random::normal(&[1, 2, 33, 256], Dtype::Float32, 0.0, 2.0, Some(&key)).unwrap();
    for dtype in [Dtype::Float32, Dtype::Bfloat16] {
        let x = x.astype(dtype).unwrap();
        for format in QUANTIZABLE {
            let cpu = on(Device::Cpu, || BlockArray::encode(&x, format).unwrap());
            let gpu = BlockArray::encode(&x, format).unwrap();
            assert_eq!(bytes(&gpu), bytes(&cpu), "{format} of {dtype:?}: blocks");
            let theirs = on(Device::Cpu, || floats(&cpu.decode(Dtype::Float32).unwrap()));
            let ours = floats(&gpu.decode(Dtype::Float32).unwrap());
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&ours), bits(&theirs), "{format} of {dtype:?}: values");
        }
    }
}

/// Largest |Δ logit| allowed between the devices, as a share of the
/// logits' spread, for keys stored in `keys`: the devices' float32
/// projections differ in their last bits (8-bit keys: 0.6 % of the spread
/// on the H100, 2026-12-06), and a 4-bit key level flips where a key lies
/// near a level's edge (`q4_0` keys: 2.2 %).
fn allowed(keys: GgufDtype) -> f32 {
    if keys == GgufDtype::Q8_0 {
        2e-2
    } else {
        5e-2
    }
}

fn a_model_with_block_caches_decodes_on_the_gpu_as_on_the_cpu() {
    let mut model = tiny_model(8);
    let block = KvFormat::Block;
    for (keys, values) in [
        (GgufDtype::Q8_0, GgufDtype::Q8_0),
        (GgufDtype::Q4_0, GgufDtype::Q8_0),
        (GgufDtype::IQ4_NL, GgufDtype::Q5_1),
    ] {
        let format = CacheFormat {
            keys: block(keys),
            values: block(values),
            ..CacheFormat::COMPUTE
        };
        let (theirs, _) = on(Device::Cpu, || scheduled(&model, format, 0, Steps::Eager));
        let spread = theirs.iter().fold(0f32, |m, v| m.max(v.abs()));
        for kernels in [false, true] {
            model.gpu_kernels = kernels;
            for steps in [
                Steps::Eager,
                Steps::Fixed { compiled: false },
                Steps::Fixed { compiled: true },
            ] {
                let (ours, _) = scheduled(&model, format, 0, steps);
                let d = max_diff(&ours, &theirs);
                eprintln!(
                    "{keys}/{values}, kernels {kernels}, {steps:?}: max |Δ logit| {d:e} of {spread}"
                );
                assert!(
                    d < allowed(keys) * spread,
                    "{keys}/{values}, kernels {kernels}, {steps:?}: {d}"
                );
            }
        }
    }
}
