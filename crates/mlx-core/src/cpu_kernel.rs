//! Operations whose CPU evaluation is a Rust kernel: MLX evaluates them
//! lazily like its own, handing the kernel the inputs' bytes and the
//! output's buffer on its CPU stream's thread. A kernel may also write into
//! inputs handed over to it ([`cpu_kernel_in_place`]).

use std::ops::Range;
use std::os::raw::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;
use std::sync::Arc;

use mlx_sys as sys;

use crate::array::new_array;
use crate::error::callback_status;
use crate::{Array, Dtype, Result};

/// A CPU kernel: fills the output's bytes from the inputs' bytes (each
/// row-contiguous, in the order given), or says why it could not.
pub type CpuKernelFn = dyn Fn(&[&[u8]], &mut [u8]) -> std::result::Result<(), String> + Send + Sync;

/// A CPU kernel that also writes into inputs in place: it reads the first
/// inputs' bytes, may write the others' (in the order given), and fills the
/// output's bytes.
pub type CpuKernelInPlaceFn =
    dyn Fn(&[&[u8]], &mut [&mut [u8]], &mut [u8]) -> std::result::Result<(), String> + Send + Sync;

/// An input's bytes as the float32 values they hold (in place), or why
/// they are not: a length that is not whole values, or a misaligned buffer.
pub fn floats(bytes: &[u8]) -> std::result::Result<&[f32], String> {
    bytemuck::try_cast_slice(bytes).map_err(|e| format!("float32 values: {e}"))
}

/// An output's bytes as float32 values (in place), or why they are not.
pub fn floats_mut(bytes: &mut [u8]) -> std::result::Result<&mut [f32], String> {
    bytemuck::try_cast_slice_mut(bytes).map_err(|e| format!("float32 values: {e}"))
}

/// What MLX holds for one operation: the kernel and how many of its inputs
/// it only reads (those come first).
struct Shared {
    kernel: Arc<CpuKernelInPlaceFn>,
    read: usize,
}

unsafe extern "C" fn trampoline(
    ctx: *mut c_void,
    inputs: *const *mut c_void,
    in_bytes: *const usize,
    n: usize,
    out: *mut c_void,
    out_bytes: usize,
    error: *mut c_char,
    error_len: usize,
) -> i32 {
    let result = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `ctx` is the Shared given to mlx_cpu_kernel, alive until
        // `free_ctx` runs; MLX passes `n` input pointers and lengths of live
        // buffers and an output buffer of `out_bytes` bytes for this call.
        let shared = unsafe { &*(ctx as *const Shared) };
        let (pointers, lengths) = if n == 0 {
            (&[][..], &[][..])
        } else {
            unsafe {
                (
                    std::slice::from_raw_parts(inputs, n),
                    std::slice::from_raw_parts(in_bytes, n),
                )
            }
        };
        let spans: Vec<Range<usize>> = pointers
            .iter()
            .zip(lengths)
            .map(|(&p, &len)| p as usize..p as usize + len)
            .collect();
        let read = shared.read.min(n);
        let overlap = |a: &Range<usize>, b: &Range<usize>| {
            !a.is_empty() && !b.is_empty() && a.start < b.end && b.start < a.end
        };
        for (i, written) in spans.iter().enumerate().skip(read) {
            let shared_with = spans
                .iter()
                .enumerate()
                .find(|&(j, other)| j != i && overlap(written, other));
            if let Some((j, _)) = shared_with {
                return Err(format!(
                    "input {i}, written in place, shares memory with input {j}"
                ));
            }
        }
        let views: Vec<&[u8]> = pointers[..read]
            .iter()
            .zip(lengths)
            .map(|(&p, &len)| {
                if len == 0 {
                    &[][..]
                } else {
                    // SAFETY: see above.
                    unsafe { std::slice::from_raw_parts(p.cast::<u8>().cast_const(), len) }
                }
            })
            .collect();
        let mut written: Vec<&mut [u8]> = pointers[read..]
            .iter()
            .zip(&lengths[read..])
            .map(|(&p, &len)| {
                if len == 0 {
                    &mut [][..]
                } else {
                    // SAFETY: see above; each written buffer overlaps no
                    // other input (checked above), and MLX hands it to this
                    // kernel alone while it runs (the caller handed it over).
                    unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), len) }
                }
            })
            .collect();
        let output = if out_bytes == 0 {
            &mut [][..]
        } else {
            // SAFETY: see above.
            unsafe { std::slice::from_raw_parts_mut(out.cast::<u8>(), out_bytes) }
        };
        (shared.kernel)(&views, &mut written, output)
    }));
    callback_status(result, "a Rust CPU kernel panicked", error, error_len)
}

unsafe extern "C" fn free_ctx(ctx: *mut c_void) {
    // SAFETY: `ctx` came from Box::into_raw in `make`; freed once.
    drop(unsafe { Box::from_raw(ctx as *mut Shared) });
}

/// An array of `shape` and `dtype` that `kernel` computes on the CPU from
/// `inputs` when evaluated (the default stream must be the CPU's). A kernel
/// that fails cannot raise an error from MLX's stream thread: its message
/// goes to stderr and a float32 output is filled with NaN, so validate what
/// can fail before making the operation.
pub fn cpu_kernel(
    inputs: &[&Array],
    shape: &[i32],
    dtype: Dtype,
    kernel: Arc<CpuKernelFn>,
) -> Result<Array> {
    let kernel: Arc<CpuKernelInPlaceFn> = Arc::new(move |read, _, out| kernel(read, out));
    make(inputs, inputs.len(), shape, dtype, kernel)
}

/// [`cpu_kernel`] that also writes into the arrays `written` in place. They
/// must be row-contiguous once evaluated (MLX would hand the kernel a copy of
/// any other, and the writes would be lost), and the caller must hand them
/// over: nothing else may read them until this operation has run (other
/// arrays sharing their buffers see the writes). A written input that
/// shares memory with another input fails the kernel.
pub fn cpu_kernel_in_place(
    read: &[&Array],
    written: &[&Array],
    shape: &[i32],
    dtype: Dtype,
    kernel: Arc<CpuKernelInPlaceFn>,
) -> Result<Array> {
    let inputs: Vec<&Array> = read.iter().chain(written).copied().collect();
    make(&inputs, read.len(), shape, dtype, kernel)
}

/// The operation of `kernel` over `inputs`, the first `read` of them only
/// read.
fn make(
    inputs: &[&Array],
    read: usize,
    shape: &[i32],
    dtype: Dtype,
    kernel: Arc<CpuKernelInPlaceFn>,
) -> Result<Array> {
    let ctx = Box::into_raw(Box::new(Shared { kernel, read })).cast::<c_void>();
    let handles: Vec<sys::mlx_array> = inputs.iter().map(|a| a.raw()).collect();
    // SAFETY: `ctx` is handed to MLX, which frees it with `free_ctx` once
    // (also when this call fails); live input handles and a valid shape.
    new_array(|out| unsafe {
        sys::mlx_cpu_kernel(
            out,
            Some(trampoline),
            ctx,
            Some(free_ctx),
            handles.as_ptr(),
            handles.len(),
            shape.as_ptr(),
            shape.len(),
            dtype.to_sys(),
            ptr::null_mut(),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rust_kernel_computes_an_array_lazily() {
        let x = Array::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
        let y = Array::from_slice(&[10.0f32, 20.0, 30.0], &[3]).unwrap();
        let add: Arc<CpuKernelFn> = Arc::new(|inputs, out| {
            let floats = |b: &[u8]| -> Vec<f32> {
                b.chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect()
            };
            let (a, b) = (floats(inputs[0]), floats(inputs[1]));
            for (i, o) in out.chunks_exact_mut(4).enumerate() {
                o.copy_from_slice(&(a[i] + b[i] * 2.0).to_le_bytes());
            }
            Ok(())
        });
        let z = cpu_kernel(&[&x, &y.multiply(&y).unwrap()], &[3], Dtype::Float32, add).unwrap();
        assert_eq!(z.to_vec::<f32>().unwrap(), vec![201.0, 802.0, 1803.0]);
    }

    #[test]
    fn a_failing_kernel_poisons_its_output_with_nan() {
        let x = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
        let fail: Arc<CpuKernelFn> = Arc::new(|_, _| Err("no".into()));
        let z = cpu_kernel(&[&x], &[2], Dtype::Float32, fail).unwrap();
        assert!(z.to_vec::<f32>().unwrap().iter().all(|v| v.is_nan()));
    }

    #[test]
    fn an_in_place_kernel_writes_into_the_buffer_handed_over() {
        let x = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
        let store = Array::from_slice(&[0.0f32; 4], &[4]).unwrap();
        store.eval().unwrap();
        let kernel: Arc<CpuKernelInPlaceFn> = Arc::new(|read, written, out| {
            written[0][4..12].copy_from_slice(&read[0][..8]);
            out.copy_from_slice(&7.0f32.to_le_bytes());
            Ok(())
        });
        let y = cpu_kernel_in_place(&[&x], &[&store], &[1], Dtype::Float32, kernel).unwrap();
        assert_eq!(y.to_vec::<f32>().unwrap(), vec![7.0]);
        assert_eq!(store.to_vec::<f32>().unwrap(), vec![0.0, 1.0, 2.0, 0.0]);
    }

    /// A kernel copying its one input's bytes to its output.
    fn copied(x: &Array) -> Array {
        let copy: Arc<CpuKernelFn> = Arc::new(|inputs, out| {
            out.copy_from_slice(inputs[0]);
            Ok(())
        });
        cpu_kernel(&[x], &x.shape(), x.dtype(), copy).unwrap()
    }

    #[test]
    fn inputs_arrive_in_row_major_order_whatever_their_layout() {
        let values: Vec<f32> = (0..24).map(|v| v as f32).collect();
        let x = Array::from_slice(&values, &[2, 3, 4]).unwrap();
        x.eval().unwrap();
        let row = Array::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
        let layouts = [
            (
                "rows 1..2",
                x.slice(&[1, 0, 0], &[2, 3, 4], &[1, 1, 1]).unwrap(),
            ),
            ("transposed", x.transpose(&[2, 0, 1]).unwrap()),
            (
                "every other column",
                x.slice(&[0, 0, 1], &[2, 3, 4], &[1, 1, 2]).unwrap(),
            ),
            (
                "middle of each axis",
                x.slice(&[1, 1, 1], &[2, 3, 3], &[1, 1, 1]).unwrap(),
            ),
            ("broadcast", row.broadcast_to(&[2, 2, 3]).unwrap()),
        ];
        for (name, view) in layouts {
            let expected = view.to_vec::<f32>().unwrap();
            assert_eq!(copied(&view).to_vec::<f32>().unwrap(), expected, "{name}");
        }
        // Hand-computed: the transpose's first values walk the last axis.
        let t = copied(&x.transpose(&[2, 0, 1]).unwrap());
        assert_eq!(
            &t.to_vec::<f32>().unwrap()[..7],
            &[0.0, 4.0, 8.0, 12.0, 16.0, 20.0, 1.0]
        );
    }

    #[test]
    fn a_slice_of_rows_arrives_as_its_parent_s_buffer() {
        // Larger than the 16 KiB by which MLX lets a view's buffer exceed it.
        let store = Array::from_slice(&[0.0f32; 8192], &[4096, 2]).unwrap();
        store.eval().unwrap();
        let rows = store.slice(&[1, 0], &[3, 2], &[1, 1]).unwrap();
        let kernel: Arc<CpuKernelInPlaceFn> = Arc::new(|_, written, out| {
            for (i, v) in written[0].chunks_exact_mut(4).enumerate() {
                v.copy_from_slice(&(i as f32 + 1.0).to_le_bytes());
            }
            out.copy_from_slice(&0.0f32.to_le_bytes());
            Ok(())
        });
        let y = cpu_kernel_in_place(&[], &[&rows], &[1], Dtype::Float32, kernel).unwrap();
        y.eval().unwrap();
        assert_eq!(
            &store.to_vec::<f32>().unwrap()[..8],
            &[0.0, 0.0, 1.0, 2.0, 3.0, 4.0, 0.0, 0.0]
        );
    }

    #[test]
    fn an_input_written_in_place_may_not_share_memory_with_another() {
        let store = Array::from_slice(&[0.0f32; 4], &[4]).unwrap();
        store.eval().unwrap();
        let kernel: Arc<CpuKernelInPlaceFn> = Arc::new(|_, _, _| Ok(()));
        let y = cpu_kernel_in_place(&[&store], &[&store], &[1], Dtype::Float32, kernel).unwrap();
        assert!(y.to_vec::<f32>().unwrap()[0].is_nan());
    }
}
