//! Custom GPU kernels written in CUDA source. Each instance (the kernel with
//! its input types and template arguments) is compiled once with the NVRTC
//! that MLX's CUDA backend loaded, kept on disk ([`cache_dir`]) so later
//! processes load it instead of compiling, and run as MLX's precompiled
//! custom kernel.

mod cache;
mod program;

use std::collections::HashMap;
use std::ffi::CString;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::{env, ptr};

use mlx_sys as sys;

use crate::array::take_vector;
use crate::device::cuda_compute_capability;
use crate::error::{check, Error, Result};
use crate::{Array, Dtype};

pub use cache::cache_dir;
use program::{reads_shape, InputType, KernelText};

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
    /// Bytes of dynamic shared memory per block (`extern __shared__`); MLX
    /// raises the kernel's limit for more than 48,000.
    pub shared_bytes: i32,
}

/// A CUDA kernel whose body is given as source: inputs arrive as
/// `const T* name` and outputs as `T* name` (row-contiguous), and
/// `name_shape[i]` holds input `name`'s dimensions where the body reads it.
/// CUDA's `cuda_bf16.h` and `cuda_fp16.h`, the fixed-width integer types and
/// `INFINITY` are in scope; `header` comes before the kernel.
pub struct CudaKernel {
    name: String,
    inputs: Vec<String>,
    /// Whether the body reads each input's shape (passed at every call).
    shaped: Vec<bool>,
    outputs: Vec<String>,
    source: String,
    header: String,
    /// The compiled instances, by input types, output dtypes and template.
    instances: Mutex<HashMap<String, Arc<Instance>>>,
}

/// One compiled instance of a kernel.
struct Instance {
    binary: Binary,
    function: CString,
}

fn c_string(text: &str, what: &str) -> Result<CString> {
    CString::new(text).map_err(|_| Error::Host(format!("{what} contains a NUL byte: {text:?}")))
}

/// What programs are compiled for: the first GPU's architecture, with the
/// compiler and headers found here.
struct Target {
    /// Names all three; it opens every program, so binaries cached for
    /// another target are never taken.
    label: String,
    /// NVRTC's options.
    options: Vec<CString>,
}

/// The folder of CUDA's headers: under `CUDA_HOME`, `CUDA_PATH` or
/// `/usr/local/cuda`, as MLX's CUDA backend looks for them.
fn cuda_include_dir() -> Result<PathBuf> {
    ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(env::var_os)
        .map(PathBuf::from)
        .chain([PathBuf::from("/usr/local/cuda")])
        .map(|home| home.join("include"))
        .find(|include| include.join("cuda_bf16.h").is_file())
        .ok_or_else(|| {
            Error::Host(
                "CUDA's headers (cuda_bf16.h) are not in $CUDA_HOME/include, $CUDA_PATH/include \
                 or /usr/local/cuda/include; custom kernels are compiled against them, as MLX's \
                 own are: set CUDA_HOME to the CUDA toolkit"
                    .into(),
            )
        })
}

/// The target of this process, found at the first kernel call.
fn target() -> Result<&'static Target> {
    static TARGET: OnceLock<Target> = OnceLock::new();
    if let Some(target) = TARGET.get() {
        return Ok(target);
    }
    let (major, minor) = cuda_compute_capability()?;
    let (mut nvrtc_major, mut nvrtc_minor) = (0, 0);
    // SAFETY: two ints out.
    check(unsafe { sys::mlx_cuda_compiler_version(&mut nvrtc_major, &mut nvrtc_minor) })?;
    let include = cuda_include_dir()?;
    let target = Target {
        label: format!(
            "sm_{major}{minor}, NVRTC {nvrtc_major}.{nvrtc_minor}, headers of {}",
            include.display()
        ),
        options: vec![
            c_string(
                &format!("--gpu-architecture=sm_{major}{minor}"),
                "NVRTC option",
            )?,
            c_string(
                &format!("--include-path={}", include.display()),
                "NVRTC option",
            )?,
        ],
    };
    Ok(TARGET.get_or_init(|| target))
}

impl CudaKernel {
    /// A kernel named `name` (a C identifier) with the given input and output
    /// names, `source` as its body and `header` before it. Nothing is
    /// compiled until the first [`CudaKernel::apply`].
    pub fn new(
        name: &str,
        inputs: &[&str],
        outputs: &[&str],
        source: &str,
        header: &str,
    ) -> Result<CudaKernel> {
        let identifier = |text: &str, what: &str| {
            let mut chars = text.chars();
            if chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
            {
                Ok(text.to_string())
            } else {
                Err(Error::Host(format!(
                    "{what} is not a C identifier: {text:?}"
                )))
            }
        };
        Ok(CudaKernel {
            name: identifier(name, "kernel name")?,
            inputs: inputs
                .iter()
                .map(|n| identifier(n, "input name"))
                .collect::<Result<_>>()?,
            shaped: inputs.iter().map(|n| reads_shape(source, n)).collect(),
            outputs: outputs
                .iter()
                .map(|n| identifier(n, "output name"))
                .collect::<Result<_>>()?,
            source: source.to_string(),
            header: header.to_string(),
            instances: Mutex::new(HashMap::new()),
        })
    }

    fn text(&self) -> KernelText<'_> {
        KernelText {
            name: &self.name,
            inputs: &self.inputs,
            shaped: &self.shaped,
            outputs: &self.outputs,
            source: &self.source,
            header: &self.header,
        }
    }

    /// The compiled instance for these types and template arguments: from
    /// this process's instances, else from the disk cache, else compiled
    /// (and stored there).
    fn instance(
        &self,
        input_types: &[InputType],
        output_dtypes: &[Dtype],
        template: &[(&str, TemplateArg)],
        threads_per_block: i32,
    ) -> Result<Arc<Instance>> {
        let key = format!("{input_types:?} {output_dtypes:?} {template:?} {threads_per_block}");
        let mut instances = self.instances.lock().map_err(|_| {
            Error::Host(format!(
                "kernel {}: the instance lock is poisoned",
                self.name
            ))
        })?;
        if let Some(instance) = instances.get(&key) {
            return Ok(instance.clone());
        }
        let target = target()?;
        let program = self.text().program(
            &target.label,
            input_types,
            output_dtypes,
            template,
            threads_per_block,
        )?;
        let dir = cache_dir();
        let cached = dir
            .as_deref()
            .and_then(|dir| cache::load(dir, &program.function, &program.source));
        let binary = match cached {
            Some(bytes) => Binary::from_bytes(&bytes)?,
            None => {
                let binary = Binary::compile(
                    &program.source,
                    &format!("{}.cu", program.function),
                    &target.options,
                )?;
                if let Some(dir) = dir.as_deref() {
                    // A cache that cannot be written costs a compile next
                    // time, nothing more.
                    let _ = cache::store(dir, &program.function, &program.source, binary.bytes()?);
                }
                binary
            }
        };
        let instance = Arc::new(Instance {
            binary,
            function: c_string(&program.function, "kernel name")?,
        });
        instances.insert(key, instance.clone());
        Ok(instance)
    }

    /// Runs the kernel on `inputs` on the default stream, returning one array
    /// per output; compiles it first where this instance is new. Fails where
    /// MLX does not compute on CUDA.
    pub fn apply(
        &self,
        inputs: &[&Array],
        outputs: &[OutputSpec],
        launch: Launch,
        template: &[(&str, TemplateArg)],
    ) -> Result<Vec<Array>> {
        let input_types: Vec<InputType> = inputs
            .iter()
            .map(|a| InputType {
                dtype: a.dtype(),
                ndim: a.ndim(),
            })
            .collect();
        let output_dtypes: Vec<Dtype> = outputs.iter().map(|o| o.dtype).collect();
        let [bx, by, bz] = launch.block;
        let instance = self.instance(&input_types, &output_dtypes, template, bx * by * bz)?;
        let scalars: Vec<i32> = self
            .shaped
            .iter()
            .zip(inputs)
            .filter(|(&shaped, _)| shaped)
            .flat_map(|(_, a)| a.shape())
            .collect();
        let handles: Vec<sys::mlx_array> = inputs.iter().map(|a| a.raw()).collect();
        let shapes: Vec<i32> = outputs
            .iter()
            .flat_map(|o| o.shape.iter().copied())
            .collect();
        let ndims: Vec<usize> = outputs.iter().map(|o| o.shape.len()).collect();
        let dtypes: Vec<sys::mlx_dtype> = output_dtypes.iter().map(|d| d.to_sys()).collect();
        let mut vector = ptr::null_mut();
        // SAFETY: live binary and array handles and a NUL-terminated name;
        // every list's length is passed with it; one vector out, freed by
        // `take_vector`.
        check(unsafe {
            sys::mlx_cuda_binary_apply(
                &mut vector,
                instance.binary.0,
                instance.function.as_ptr(),
                handles.as_ptr(),
                handles.len(),
                shapes.as_ptr(),
                ndims.as_ptr(),
                dtypes.as_ptr(),
                dtypes.len(),
                scalars.as_ptr(),
                scalars.len(),
                launch.grid.as_ptr(),
                launch.block.as_ptr(),
                launch.shared_bytes,
                ptr::null_mut(),
            )
        })?;
        take_vector(vector)
    }
}

/// A compiled CUDA program (a cubin) held by the C API.
struct Binary(sys::mlx_cuda_binary);

// SAFETY: the handle owns immutable bytes; MLX only reads them.
unsafe impl Send for Binary {}

// SAFETY: as for Send: nothing mutates the bytes after creation.
unsafe impl Sync for Binary {}

impl Binary {
    /// Compiles the whole program `source` with NVRTC and `options`.
    fn compile(source: &str, program_name: &str, options: &[CString]) -> Result<Binary> {
        let source = c_string(source, "kernel source")?;
        let program_name = c_string(program_name, "program name")?;
        let option_ptrs: Vec<_> = options.iter().map(|o| o.as_ptr()).collect();
        let mut raw = ptr::null_mut();
        // SAFETY: NUL-terminated strings that outlive the call; one handle
        // out, owned by the result.
        check(unsafe {
            sys::mlx_cuda_compile(
                &mut raw,
                source.as_ptr(),
                program_name.as_ptr(),
                option_ptrs.as_ptr(),
                option_ptrs.len(),
            )
        })?;
        Ok(Binary(raw))
    }

    /// A binary from its bytes.
    fn from_bytes(bytes: &[u8]) -> Result<Binary> {
        let mut raw = ptr::null_mut();
        // SAFETY: a live slice and its length; the bytes are copied; one
        // handle out, owned by the result.
        check(unsafe { sys::mlx_cuda_binary_from_bytes(&mut raw, bytes.as_ptr(), bytes.len()) })?;
        Ok(Binary(raw))
    }

    /// The binary's bytes.
    fn bytes(&self) -> Result<&[u8]> {
        let (mut data, mut size) = (ptr::null(), 0usize);
        // SAFETY: a live handle; two values out.
        check(unsafe { sys::mlx_cuda_binary_bytes(&mut data, &mut size, self.0) })?;
        if size == 0 {
            return Ok(&[]);
        }
        // SAFETY: the C API's bytes live, unchanged, as long as the handle,
        // which this borrow of `self` outlives.
        Ok(unsafe { std::slice::from_raw_parts(data, size) })
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        // SAFETY: a live handle owned by this value.
        unsafe { sys::mlx_cuda_binary_free(self.0) }
    }
}
