//! Devices and streams on the CPU build of MLX.

use mlx_core::device::{
    cuda_multiprocessor_count, default_device, is_available, mlx_version, set_default_device,
    synchronize,
};
use mlx_core::{Array, Device, Dtype, Stream};

#[test]
fn mlx_version_is_0_32_4() {
    assert_eq!(mlx_version(), "0.32.4");
}

#[test]
fn the_default_device_is_the_cpu_on_this_build() {
    assert_eq!(default_device().unwrap(), Device::Cpu);
    assert!(is_available(Device::Cpu).unwrap());
}

#[test]
fn the_gpu_is_unavailable_and_cannot_become_the_default() {
    assert!(!is_available(Device::Gpu).unwrap());
    let err = set_default_device(Device::Gpu).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("gpu") && text.contains("not available"),
        "{text}"
    );
    assert_eq!(default_device().unwrap(), Device::Cpu);
    // Setting the CPU again is fine.
    set_default_device(Device::Cpu).unwrap();
    assert_eq!(default_device().unwrap(), Device::Cpu);
}

#[test]
fn the_multiprocessor_count_says_no_cuda_driver_is_loaded() {
    let err = cuda_multiprocessor_count().unwrap_err().to_string();
    assert!(err.contains("no CUDA driver is loaded"), "{err}");
}

#[test]
fn a_new_cpu_stream_reports_its_device_and_synchronizes() {
    let stream = Stream::new(Device::Cpu).unwrap();
    assert_eq!(stream.device().unwrap(), Device::Cpu);
    let a = Array::scalar(3.0, Dtype::Float32)
        .unwrap()
        .square()
        .unwrap();
    mlx_core::async_eval(&[&a]).unwrap();
    stream.synchronize().unwrap();
    synchronize().unwrap();
    assert_eq!(a.item::<f32>().unwrap(), 9.0);
}

#[test]
fn the_default_cpu_stream_synchronizes() {
    let stream = Stream::default_for(Device::Cpu).unwrap();
    assert_eq!(stream.device().unwrap(), Device::Cpu);
    stream.synchronize().unwrap();
}

#[test]
fn device_names() {
    assert_eq!(Device::Cpu.to_string(), "cpu");
    assert_eq!(Device::Gpu.name(), "gpu");
}
