//! The complete CUDA program of one kernel instance: a prelude of CUDA's own
//! headers, the kernel's header, and an `extern "C"` function whose body is
//! the kernel's source with its template arguments and input shapes set.

use std::fmt::Write;
use std::hash::Hasher;

use fnv::FnvHasher;

use crate::error::{Error, Result};
use crate::Dtype;

use super::TemplateArg;

/// What every program starts with: CUDA's half and bfloat16 types, the
/// fixed-width integers MLX's dtypes map to, and `INFINITY`.
const PRELUDE: &str = r#"#include <cuda_bf16.h>
#include <cuda_fp16.h>

typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;

#define INFINITY __int_as_float(0x7f800000)
"#;

/// One input as a kernel instance sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InputType {
    /// The input's dtype (its pointer's element type).
    pub dtype: Dtype,
    /// The input's number of dimensions.
    pub ndim: usize,
}

/// A kernel instance's program and the name of its function, which is
/// unique to the program's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Program {
    /// The `extern "C"` function's name: the kernel's name and a hash of the
    /// rest of the program.
    pub function: String,
    /// The whole CUDA source, ready for NVRTC.
    pub source: String,
}

/// The CUDA type MLX's CUDA backend gives `dtype`.
fn cuda_type(dtype: Dtype) -> Result<&'static str> {
    Ok(match dtype {
        Dtype::Bool => "bool",
        Dtype::Uint8 => "uint8_t",
        Dtype::Uint16 => "uint16_t",
        Dtype::Uint32 => "uint32_t",
        Dtype::Uint64 => "uint64_t",
        Dtype::Int8 => "int8_t",
        Dtype::Int16 => "int16_t",
        Dtype::Int32 => "int32_t",
        Dtype::Int64 => "int64_t",
        Dtype::Float16 => "__half",
        Dtype::Float32 => "float",
        Dtype::Float64 => "double",
        Dtype::Bfloat16 => "__nv_bfloat16",
        Dtype::Complex64 => {
            return Err(Error::Host(
                "custom CUDA kernels take no complex64 arrays".into(),
            ))
        }
    })
}

/// Whether the kernel body `source` reads input `name`'s shape
/// (`name_shape[i]`).
pub(crate) fn reads_shape(source: &str, name: &str) -> bool {
    source.contains(&format!("{name}_shape"))
}

/// What a kernel is: its name, inputs (with whether the body reads each
/// one's shape, [`reads_shape`]), outputs, body and header.
pub(crate) struct KernelText<'a> {
    pub name: &'a str,
    pub inputs: &'a [String],
    pub shaped: &'a [bool],
    pub outputs: &'a [String],
    pub source: &'a str,
    pub header: &'a str,
}

impl KernelText<'_> {
    /// The program of this kernel for inputs of `input_types`, outputs of
    /// `output_dtypes` and `template` arguments, launched in blocks of
    /// `threads_per_block` (its launch bound: the compiler keeps each
    /// thread's registers within what that many threads may hold, so the
    /// launch never fails for want of them). `target` (the GPU and the
    /// compiler) opens the program as a comment, so a cached binary is only
    /// found for the same target. Input `x`'s shape, where the body reads
    /// it, arrives as `ndim` int parameters after the outputs and is
    /// gathered into `const int x_shape[ndim]`.
    pub fn program(
        &self,
        target: &str,
        input_types: &[InputType],
        output_dtypes: &[Dtype],
        template: &[(&str, TemplateArg)],
        threads_per_block: i32,
    ) -> Result<Program> {
        if input_types.len() != self.inputs.len() || output_dtypes.len() != self.outputs.len() {
            return Err(Error::Host(format!(
                "kernel {} takes {} inputs and {} outputs, given {} and {}",
                self.name,
                self.inputs.len(),
                self.outputs.len(),
                input_types.len(),
                output_dtypes.len()
            )));
        }
        let mut parameters = Vec::new();
        let mut shape_parameters = Vec::new();
        let mut shapes = String::new();
        for ((name, input), &shaped) in self.inputs.iter().zip(input_types).zip(self.shaped) {
            parameters.push(format!("const {}* {name}", cuda_type(input.dtype)?));
            if shaped {
                let dims: Vec<String> = (0..input.ndim)
                    .map(|d| format!("{name}_shape_{d}"))
                    .collect();
                shape_parameters.extend(dims.iter().map(|d| format!("int {d}")));
                // A zero-dimensional input still gets an array of one element.
                let _ = writeln!(
                    shapes,
                    "  const int {name}_shape[{}] = {{{}}};",
                    input.ndim.max(1),
                    if dims.is_empty() {
                        "0".to_string()
                    } else {
                        dims.join(", ")
                    }
                );
            }
        }
        for (name, dtype) in self.outputs.iter().zip(output_dtypes) {
            parameters.push(format!("{}* {name}", cuda_type(*dtype)?));
        }
        parameters.extend(shape_parameters);
        let mut constants = String::new();
        for (name, arg) in template {
            let _ = match arg {
                TemplateArg::Int(v) => writeln!(constants, "  constexpr int {name} = {v};"),
                TemplateArg::Bool(b) => writeln!(constants, "  constexpr bool {name} = {b};"),
                TemplateArg::Dtype(d) => {
                    writeln!(constants, "  using {name} = {};", cuda_type(*d)?)
                }
            };
        }
        let render = |function: &str| {
            format!(
                "// {target}\n{PRELUDE}\n{}\n\nextern \"C\" __global__ void __launch_bounds__({threads_per_block}) {function}(\n    {}) {{\n{shapes}{constants}\n{}\n}}\n",
                self.header,
                parameters.join(",\n    "),
                self.source
            )
        };
        let mut hasher = FnvHasher::default();
        hasher.write(render(self.name).as_bytes());
        let function = format!("{}_{:016x}", self.name, hasher.finish());
        Ok(Program {
            source: render(&function),
            function,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_program_declares_typed_pointers_shapes_and_constants() {
        let (inputs, outputs) = (names(&["x", "w"]), names(&["y"]));
        let source = "const int N = w_shape[0];";
        let shaped: Vec<bool> = inputs.iter().map(|n| reads_shape(source, n)).collect();
        assert_eq!(shaped, [false, true]);
        let text = KernelText {
            name: "gemv",
            inputs: &inputs,
            shaped: &shaped,
            outputs: &outputs,
            source,
            header: "__device__ int helper();",
        };
        let program = text
            .program(
                "sm_90",
                &[
                    InputType {
                        dtype: Dtype::Bfloat16,
                        ndim: 1,
                    },
                    InputType {
                        dtype: Dtype::Bfloat16,
                        ndim: 2,
                    },
                ],
                &[Dtype::Float32],
                &[
                    ("T", TemplateArg::Dtype(Dtype::Bfloat16)),
                    ("K", TemplateArg::Int(4)),
                    ("F", TemplateArg::Bool(false)),
                ],
                256,
            )
            .unwrap();
        assert!(
            program.function.starts_with("gemv_"),
            "{}",
            program.function
        );
        let expected = format!(
            "extern \"C\" __global__ void __launch_bounds__(256) {}(\n    const __nv_bfloat16* x,\n    const __nv_bfloat16* w,\n    float* y,\n    int w_shape_0,\n    int w_shape_1) {{\n  const int w_shape[2] = {{w_shape_0, w_shape_1}};\n  using T = __nv_bfloat16;\n",
            program.function
        );
        assert!(program.source.contains(&expected), "{}", program.source);
        assert!(program.source.contains("  using T = __nv_bfloat16;\n  constexpr int K = 4;\n  constexpr bool F = false;\n\nconst int N = w_shape[0];\n}\n"));
        assert!(program
            .source
            .starts_with("// sm_90\n#include <cuda_bf16.h>"));
        assert!(program.source.contains("__device__ int helper();"));
    }

    #[test]
    fn the_function_name_changes_with_the_program_and_only_with_it() {
        let (inputs, outputs) = (names(&["x"]), names(&["y"]));
        let text = |header, source| KernelText {
            name: "k",
            inputs: &inputs,
            shaped: &[false],
            outputs: &outputs,
            source,
            header,
        };
        let f32_in = [InputType {
            dtype: Dtype::Float32,
            ndim: 1,
        }];
        let build = |header, source, target, dtype, threads| {
            text(header, source)
                .program(target, &f32_in, &[dtype], &[], threads)
                .unwrap()
                .function
        };
        let base = ("#define X 1", "y[0] = x[0];", "sm_90", Dtype::Float32, 128);
        let name = |(header, source, target, dtype, threads)| {
            build(header, source, target, dtype, threads)
        };
        assert_eq!(name(base), name(base));
        for changed in [
            ("#define X 2", base.1, base.2, base.3, base.4),
            (base.0, "y[0] = 2 * x[0];", base.2, base.3, base.4),
            (base.0, base.1, "sm_100", base.3, base.4),
            (base.0, base.1, base.2, Dtype::Bfloat16, base.4),
            (base.0, base.1, base.2, base.3, 512),
        ] {
            assert_ne!(name(base), name(changed), "{changed:?}");
        }
    }

    #[test]
    fn mismatched_inputs_and_complex_arrays_are_refused() {
        let (inputs, outputs) = (names(&["x"]), names(&["y"]));
        let text = KernelText {
            name: "k",
            inputs: &inputs,
            shaped: &[false],
            outputs: &outputs,
            source: "",
            header: "",
        };
        let err = text
            .program("sm_90", &[], &[Dtype::Float32], &[], 128)
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("takes 1 inputs and 1 outputs, given 0 and 1"),
            "{err}"
        );
        let complex = [InputType {
            dtype: Dtype::Complex64,
            ndim: 1,
        }];
        let err = text
            .program("sm_90", &complex, &[Dtype::Float32], &[], 128)
            .unwrap_err();
        assert!(err.to_string().contains("complex64"), "{err}");
    }
}
