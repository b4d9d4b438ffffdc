//! Custom GPU kernels written in CUDA source, compiled by MLX's CUDA backend
//! at first use (MLX's `fast::cuda_kernel`).

use std::ffi::CString;
use std::ptr;

use mlx_sys as sys;

use crate::array::take_vector;
use crate::error::{check, Error, Result};
use crate::{Array, Dtype};

/// A compile-time constant of a kernel: `constexpr int`, `constexpr bool`, or
/// a type alias for an MLX dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TemplateArg {
    /// `constexpr int NAME = value;`
    Int(i32),
    /// `constexpr bool NAME = value;`
    Bool(bool),
    /// `using NAME = <the CUDA type of the dtype>;`
    Dtype(Dtype),
}

/// What one output of a kernel call is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputSpec {
    /// The output's shape.
    pub shape: Vec<i32>,
    /// The output's dtype.
    pub dtype: Dtype,
}

/// How many threads a kernel call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launch {
    /// Threads in each dimension (rounded up to whole blocks).
    pub grid: [i32; 3],
    /// Threads per block in each dimension.
    pub block: [i32; 3],
}

/// A CUDA kernel whose body is given as source: inputs arrive as
/// `const T* name` and outputs as `T* name` (row-contiguous), with
/// `name_shape` / `name_strides` / `name_ndim` when the body mentions them.
pub struct CudaKernel {
    raw: sys::mlx_cuda_kernel,
}

// SAFETY: the handle owns an immutable function object; MLX calls it from
// whichever thread applies it.
unsafe impl Send for CudaKernel {}

// SAFETY: applying a kernel only reads the function object (its captured
// names and source); MLX builds a new graph node on each call.
unsafe impl Sync for CudaKernel {}

fn c_string(text: &str, what: &str) -> Result<CString> {
    CString::new(text).map_err(|_| Error::Host(format!("{what} contains a NUL byte: {text:?}")))
}

fn c_strings(texts: &[&str], what: &str) -> Result<Vec<CString>> {
    texts.iter().map(|t| c_string(t, what)).collect()
}

impl CudaKernel {
    /// A kernel named `name` with the given input and output names, `source`
    /// as its body and `header` before it. Nothing is compiled until the
    /// first [`CudaKernel::apply`] on a GPU stream.
    pub fn new(
        name: &str,
        inputs: &[&str],
        outputs: &[&str],
        source: &str,
        header: &str,
    ) -> Result<CudaKernel> {
        let name = c_string(name, "kernel name")?;
        let (inputs, outputs) = (
            c_strings(inputs, "input name")?,
            c_strings(outputs, "output name")?,
        );
        let input_ptrs: Vec<_> = inputs.iter().map(|s| s.as_ptr()).collect();
        let output_ptrs: Vec<_> = outputs.iter().map(|s| s.as_ptr()).collect();
        let (source, header) = (
            c_string(source, "kernel source")?,
            c_string(header, "kernel header")?,
        );
        let mut raw = ptr::null_mut();
        // SAFETY: NUL-terminated strings that outlive the call; one handle
        // out, owned by the result.
        check(unsafe {
            sys::mlx_cuda_kernel_new(
                &mut raw,
                name.as_ptr(),
                input_ptrs.as_ptr(),
                input_ptrs.len(),
                output_ptrs.as_ptr(),
                output_ptrs.len(),
                source.as_ptr(),
                header.as_ptr(),
                true,
                0,
            )
        })?;
        Ok(CudaKernel { raw })
    }

    /// Runs the kernel on `inputs` on the default stream, returning one array
    /// per output. Fails on a device or build without CUDA.
    pub fn apply(
        &self,
        inputs: &[&Array],
        outputs: &[OutputSpec],
        launch: Launch,
        template: &[(&str, TemplateArg)],
    ) -> Result<Vec<Array>> {
        let handles: Vec<sys::mlx_array> = inputs.iter().map(|a| a.raw()).collect();
        let shapes: Vec<i32> = outputs
            .iter()
            .flat_map(|o| o.shape.iter().copied())
            .collect();
        let ndims: Vec<usize> = outputs.iter().map(|o| o.shape.len()).collect();
        let dtypes: Vec<sys::mlx_dtype> = outputs.iter().map(|o| o.dtype.to_sys()).collect();
        let names = c_strings(
            &template.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            "template name",
        )?;
        let name_ptrs: Vec<_> = names.iter().map(|s| s.as_ptr()).collect();
        let (values, kinds): (Vec<i32>, Vec<sys::mlx_template_kind>) = template
            .iter()
            .map(|(_, arg)| match *arg {
                TemplateArg::Int(v) => (v, sys::MLX_TEMPLATE_INT),
                TemplateArg::Bool(b) => (b as i32, sys::MLX_TEMPLATE_BOOL),
                TemplateArg::Dtype(d) => (d.to_sys() as i32, sys::MLX_TEMPLATE_DTYPE),
            })
            .unzip();
        let mut vector = ptr::null_mut();
        // SAFETY: live kernel and array handles; every list's length is
        // passed with it; one vector out, freed by `take_vector`.
        check(unsafe {
            sys::mlx_cuda_kernel_apply(
                &mut vector,
                self.raw,
                handles.as_ptr(),
                handles.len(),
                shapes.as_ptr(),
                ndims.as_ptr(),
                dtypes.as_ptr(),
                dtypes.len(),
                launch.grid.as_ptr(),
                launch.block.as_ptr(),
                name_ptrs.as_ptr(),
                values.as_ptr(),
                kinds.as_ptr(),
                kinds.len(),
                ptr::null_mut(),
            )
        })?;
        take_vector(vector)
    }
}

impl Drop for CudaKernel {
    fn drop(&mut self) {
        // SAFETY: a live handle owned by this value.
        unsafe { sys::mlx_cuda_kernel_free(self.raw) }
    }
}
