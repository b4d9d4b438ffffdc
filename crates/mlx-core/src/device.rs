//! Devices and streams.

use std::ptr;

use mlx_sys as sys;

use crate::error::{check, Error, Result};

/// Where arrays are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Device {
    /// The CPU.
    Cpu,
    /// The first GPU (CUDA or Metal, whichever MLX was built with).
    Gpu,
}

impl Device {
    fn sys_type(self) -> sys::mlx_device_type {
        match self {
            Device::Cpu => sys::MLX_DEVICE_CPU,
            Device::Gpu => sys::MLX_DEVICE_GPU,
        }
    }

    /// The lower-case name ("cpu" or "gpu").
    pub fn name(self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Gpu => "gpu",
        }
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A device handle for one C call, freed on drop.
struct DeviceHandle(sys::mlx_device);

impl DeviceHandle {
    fn new(device: Device) -> Result<Self> {
        let mut raw = ptr::null_mut();
        // SAFETY: plain values in, one handle out (owned by the result).
        check(unsafe { sys::mlx_device_new(&mut raw, device.sys_type(), 0) })?;
        Ok(DeviceHandle(raw))
    }
}

impl Drop for DeviceHandle {
    fn drop(&mut self) {
        // SAFETY: a live handle owned by this value.
        unsafe { sys::mlx_device_free(self.0) }
    }
}

/// Whether this MLX build can compute on `device`.
pub fn is_available(device: Device) -> Result<bool> {
    let handle = DeviceHandle::new(device)?;
    let mut out = false;
    // SAFETY: live handle in, one bool out.
    check(unsafe { sys::mlx_device_is_available(&mut out, handle.0) })?;
    Ok(out)
}

/// The number of streaming multiprocessors of the first CUDA GPU, from the
/// CUDA driver MLX loaded; an error where MLX does not compute on CUDA.
pub fn cuda_multiprocessor_count() -> Result<i32> {
    cuda_attribute(sys::MLX_CUDA_MULTIPROCESSOR_COUNT)
}

/// The compute capability (major, minor) of the first CUDA GPU, from the
/// CUDA driver MLX loaded; an error where MLX does not compute on CUDA.
pub fn cuda_compute_capability() -> Result<(i32, i32)> {
    Ok((
        cuda_attribute(sys::MLX_CUDA_COMPUTE_CAPABILITY_MAJOR)?,
        cuda_attribute(sys::MLX_CUDA_COMPUTE_CAPABILITY_MINOR)?,
    ))
}

fn cuda_attribute(attribute: sys::mlx_cuda_attribute) -> Result<i32> {
    let mut out = 0;
    // SAFETY: one int out.
    check(unsafe { sys::mlx_cuda_device_attribute(&mut out, 0, attribute) })?;
    Ok(out)
}

/// Makes `device` the default for every following operation.
pub fn set_default_device(device: Device) -> Result<()> {
    if !is_available(device)? {
        return Err(Error::Host(format!(
            "device {device} is not available in this MLX build (backend without it)"
        )));
    }
    let handle = DeviceHandle::new(device)?;
    // SAFETY: live handle in.
    check(unsafe { sys::mlx_set_default_device(handle.0) })
}

/// The current default device.
pub fn default_device() -> Result<Device> {
    let mut raw = ptr::null_mut();
    // SAFETY: one handle out, owned below.
    check(unsafe { sys::mlx_get_default_device(&mut raw) })?;
    let handle = DeviceHandle(raw);
    let mut kind = sys::MLX_DEVICE_CPU;
    // SAFETY: live handle in, one value out.
    check(unsafe { sys::mlx_device_get_type(&mut kind, handle.0) })?;
    Ok(if kind == sys::MLX_DEVICE_GPU {
        Device::Gpu
    } else {
        Device::Cpu
    })
}

/// Waits until all queued work on every stream is done.
pub fn synchronize() -> Result<()> {
    // SAFETY: NULL means every stream.
    check(unsafe { sys::mlx_synchronize(ptr::null_mut()) })
}

/// MLX's version string (e.g. "0.32.4").
pub fn mlx_version() -> String {
    // SAFETY: returns a static NUL-terminated string.
    unsafe { std::ffi::CStr::from_ptr(sys::mlx_version()) }
        .to_string_lossy()
        .into_owned()
}

/// A queue of work on one device; freed on drop.
pub struct Stream {
    raw: sys::mlx_stream,
}

impl Stream {
    /// A new stream on `device`.
    pub fn new(device: Device) -> Result<Stream> {
        let handle = DeviceHandle::new(device)?;
        let mut raw = ptr::null_mut();
        // SAFETY: live handle in, one stream out (owned by the result).
        check(unsafe { sys::mlx_stream_new(&mut raw, handle.0) })?;
        Ok(Stream { raw })
    }

    /// The default stream of `device`.
    pub fn default_for(device: Device) -> Result<Stream> {
        let handle = DeviceHandle::new(device)?;
        let mut raw = ptr::null_mut();
        // SAFETY: live handle in, one stream out (owned by the result).
        check(unsafe { sys::mlx_stream_default(&mut raw, handle.0) })?;
        Ok(Stream { raw })
    }

    /// The handle, for a C call.
    pub(crate) fn raw(&self) -> sys::mlx_stream {
        self.raw
    }

    /// The device the stream runs on.
    pub fn device(&self) -> Result<Device> {
        let mut raw = ptr::null_mut();
        // SAFETY: live stream in, one device handle out, owned below.
        check(unsafe { sys::mlx_stream_get_device(&mut raw, self.raw) })?;
        let handle = DeviceHandle(raw);
        let mut kind = sys::MLX_DEVICE_CPU;
        // SAFETY: live handle in, one value out.
        check(unsafe { sys::mlx_device_get_type(&mut kind, handle.0) })?;
        Ok(if kind == sys::MLX_DEVICE_GPU {
            Device::Gpu
        } else {
            Device::Cpu
        })
    }

    /// Waits until the work queued on this stream is done.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: live stream in.
        check(unsafe { sys::mlx_synchronize(self.raw) })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: a live handle owned by this value.
        unsafe { sys::mlx_stream_free(self.raw) }
    }
}
