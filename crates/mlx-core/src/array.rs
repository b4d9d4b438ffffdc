//! `Array`: one owned MLX array handle, freed in `Drop`.

use std::os::raw::c_void;
use std::ptr;

use mlx_sys as sys;

use crate::error::{check, Error, Result};
use crate::{Dtype, Element};

/// An MLX array. Owns one handle: `Drop` frees it, `Clone` shares the data.
pub struct Array {
    raw: sys::mlx_array,
}

// SAFETY: an MLX array handle is a reference-counted C++ object; moving it to
// another thread is safe. It is not `Sync`: MLX graph building is not meant
// to run on one array from two threads at once.
unsafe impl Send for Array {}

impl Drop for Array {
    fn drop(&mut self) {
        // SAFETY: `raw` is a live handle owned by this value and freed once.
        unsafe { sys::mlx_array_free(self.raw) }
    }
}

impl Clone for Array {
    fn clone(&self) -> Self {
        let mut out = ptr::null_mut();
        // SAFETY: `raw` is live; cloning a valid handle only fails if the
        // process is out of memory, which Rust treats as fatal everywhere.
        let status = unsafe { sys::mlx_array_clone(&mut out, self.raw) };
        assert!(
            status == 0 && !out.is_null(),
            "out of memory cloning an array handle"
        );
        Array { raw: out }
    }
}

impl std::fmt::Debug for Array {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Array")
            .field("shape", &self.shape())
            .field("dtype", &self.dtype())
            .finish()
    }
}

/// Runs a C call that writes one new array handle, and wraps the handle.
pub(crate) fn new_array(f: impl FnOnce(*mut sys::mlx_array) -> i32) -> Result<Array> {
    let mut out: sys::mlx_array = ptr::null_mut();
    check(f(&mut out))?;
    if out.is_null() {
        return Err(Error::Mlx("MLX returned no array".into()));
    }
    Ok(Array { raw: out })
}

/// The arrays of a vector handle returned by a C call; the vector is freed.
pub(crate) fn take_vector(vector: sys::mlx_vector_array) -> Result<Vec<Array>> {
    let guard = VectorGuard(vector);
    let mut size = 0usize;
    // SAFETY: live vector.
    check(unsafe { sys::mlx_vector_array_size(&mut size, guard.0) })?;
    // SAFETY: live vector, index in range, new handle out.
    (0..size)
        .map(|i| new_array(|out| unsafe { sys::mlx_vector_array_get(out, guard.0, i) }))
        .collect()
}

/// Frees a vector of arrays on drop.
struct VectorGuard(sys::mlx_vector_array);

impl Drop for VectorGuard {
    fn drop(&mut self) {
        // SAFETY: a live handle owned by this guard.
        unsafe { sys::mlx_vector_array_free(self.0) }
    }
}

/// Runs a C call that writes two new array handles.
pub(crate) fn new_arrays2(
    f: impl FnOnce(*mut sys::mlx_array, *mut sys::mlx_array) -> i32,
) -> Result<(Array, Array)> {
    let (mut a, mut b): (sys::mlx_array, sys::mlx_array) = (ptr::null_mut(), ptr::null_mut());
    check(f(&mut a, &mut b))?;
    Ok((Array { raw: a }, Array { raw: b }))
}

/// Runs a C call that writes three new array handles.
pub(crate) fn new_arrays3(
    f: impl FnOnce(*mut sys::mlx_array, *mut sys::mlx_array, *mut sys::mlx_array) -> i32,
) -> Result<(Array, Array, Array)> {
    let (mut a, mut b, mut c): (sys::mlx_array, sys::mlx_array, sys::mlx_array) =
        (ptr::null_mut(), ptr::null_mut(), ptr::null_mut());
    check(f(&mut a, &mut b, &mut c))?;
    Ok((Array { raw: a }, Array { raw: b }, Array { raw: c }))
}

/// Checks that `shape` has no negative dimension and returns its element count.
fn element_count(shape: &[i32]) -> Result<usize> {
    shape.iter().try_fold(1usize, |n, &d| {
        usize::try_from(d)
            .ok()
            .and_then(|d| n.checked_mul(d))
            .ok_or_else(|| Error::Host(format!("invalid shape {shape:?}")))
    })
}

/// The bytes `shape` of `dtype` needs, or an error if the count overflows.
fn byte_count(shape: &[i32], dtype: Dtype) -> Result<usize> {
    element_count(shape)?
        .checked_mul(dtype.size_bytes())
        .ok_or_else(|| Error::Host(format!("shape {shape:?} of {dtype} is too large")))
}

/// Checks that bytes meant as `dtype` are valid: a bool byte must be 0 or 1,
/// since any other value read back as a Rust `bool` is undefined behaviour.
fn check_bytes(bytes: &[u8], dtype: Dtype) -> Result<()> {
    match bytes.iter().position(|&b| b > 1) {
        Some(i) if dtype == Dtype::Bool => Err(Error::Host(format!(
            "bool element {i} is the byte {}, not 0 or 1",
            bytes[i]
        ))),
        _ => Ok(()),
    }
}

impl Array {
    /// The raw handle, for this crate's wrappers.
    pub(crate) fn raw(&self) -> sys::mlx_array {
        self.raw
    }

    /// Builds an array by copying `data` (row-major) with the given shape.
    pub fn from_slice<T: Element>(data: &[T], shape: &[i32]) -> Result<Array> {
        let count = element_count(shape)?;
        if count != data.len() {
            return Err(Error::Host(format!(
                "shape {shape:?} holds {count} elements, the data has {}",
                data.len()
            )));
        }
        // SAFETY: `data` holds `count` elements of T::DTYPE, read before return.
        new_array(|out| unsafe {
            sys::mlx_array_from_data(
                out,
                data.as_ptr().cast(),
                shape.as_ptr(),
                shape.len(),
                T::DTYPE.to_sys(),
            )
        })
    }

    /// A new array of `shape` and `dtype` whose bytes `fill` writes (for
    /// data read straight into MLX's memory, without a copy on the host),
    /// or `fill`'s error. Bool bytes other than 0 and 1 are refused.
    pub fn from_fill<E>(
        shape: &[i32],
        dtype: Dtype,
        fill: impl FnOnce(&mut [u8]) -> std::result::Result<(), E>,
    ) -> Result<std::result::Result<Array, E>> {
        let len = byte_count(shape, dtype)?;
        let mut data: *mut c_void = ptr::null_mut();
        // SAFETY: plain values in; one handle and its data pointer out.
        let array = new_array(|out| unsafe {
            sys::mlx_array_alloc(out, &mut data, shape.as_ptr(), shape.len(), dtype.to_sys())
        })?;
        let bytes: &mut [u8] = if data.is_null() || len == 0 {
            &mut []
        } else {
            // SAFETY: MLX allocated `len` bytes for the new array, whose only
            // handle is `array`, held here: nothing else reads or writes them
            // until this function returns.
            unsafe { std::slice::from_raw_parts_mut(data.cast::<u8>(), len) }
        };
        if let Err(e) = fill(&mut *bytes) {
            return Ok(Err(e));
        }
        check_bytes(bytes, dtype)?;
        Ok(Ok(array))
    }

    /// Builds an array from raw bytes of the given dtype, copying them.
    pub fn from_bytes(bytes: &[u8], shape: &[i32], dtype: Dtype) -> Result<Array> {
        let needed = byte_count(shape, dtype)?;
        if needed != bytes.len() {
            return Err(Error::Host(format!(
                "shape {shape:?} of {dtype} needs {needed} bytes, got {}",
                bytes.len()
            )));
        }
        check_bytes(bytes, dtype)?;
        // SAFETY: `bytes` holds exactly the array's bytes, read before return.
        new_array(|out| unsafe {
            sys::mlx_array_from_data(
                out,
                bytes.as_ptr().cast(),
                shape.as_ptr(),
                shape.len(),
                dtype.to_sys(),
            )
        })
    }

    /// Wraps bytes owned by `owner` (for example a memory map) without copying
    /// where the device allows it. `owner` is dropped when MLX is done with it.
    pub fn from_owned_bytes<O>(owner: O, shape: &[i32], dtype: Dtype) -> Result<Array>
    where
        O: AsRef<[u8]> + Send + 'static,
    {
        let needed = byte_count(shape, dtype)?;
        let len = owner.as_ref().len();
        if needed != len {
            return Err(Error::Host(format!(
                "shape {shape:?} of {dtype} needs {needed} bytes, the buffer has {len}"
            )));
        }
        check_bytes(owner.as_ref(), dtype)?;
        let boxed: Box<O> = Box::new(owner);
        let data = boxed.as_ref().as_ref().as_ptr() as *mut c_void;
        let ctx = Box::into_raw(boxed);

        unsafe extern "C" fn release<O>(ctx: *mut c_void) {
            // SAFETY: `ctx` came from Box::into_raw above; MLX calls this once.
            drop(unsafe { Box::from_raw(ctx.cast::<O>()) });
        }

        // SAFETY: the buffer stays valid until `release` runs, which MLX
        // guarantees to call exactly once (also when the call fails). MLX
        // never writes into an input's buffer while another handle (ours)
        // holds it.
        new_array(|out| unsafe {
            sys::mlx_array_from_buffer(
                out,
                data,
                shape.as_ptr(),
                shape.len(),
                dtype.to_sys(),
                Some(release::<O>),
                ctx.cast(),
            )
        })
    }

    /// A 0-d array holding `value` converted to `dtype`.
    pub fn scalar(value: f64, dtype: Dtype) -> Result<Array> {
        // SAFETY: plain values in, one handle out.
        new_array(|out| unsafe { sys::mlx_array_scalar(out, value, dtype.to_sys()) })
    }

    /// The shape.
    pub fn shape(&self) -> Vec<i32> {
        let mut ndim = 0usize;
        let mut dims: *const i32 = ptr::null();
        // SAFETY: `raw` is live; the shape pointer is valid while it lives
        // and is copied before return.
        unsafe {
            if sys::mlx_array_ndim(&mut ndim, self.raw) != 0
                || sys::mlx_array_shape(&mut dims, self.raw) != 0
            {
                return Vec::new();
            }
            if ndim == 0 || dims.is_null() {
                return Vec::new();
            }
            std::slice::from_raw_parts(dims, ndim).to_vec()
        }
    }

    /// The number of dimensions.
    pub fn ndim(&self) -> usize {
        let mut ndim = 0usize;
        // SAFETY: `raw` is live.
        unsafe { sys::mlx_array_ndim(&mut ndim, self.raw) };
        ndim
    }

    /// The size of one axis (negative counts from the end).
    pub fn dim(&self, axis: i32) -> Result<i32> {
        let shape = self.shape();
        let index = if axis < 0 {
            shape.len() as i32 + axis
        } else {
            axis
        };
        usize::try_from(index)
            .ok()
            .and_then(|i| shape.get(i).copied())
            .ok_or_else(|| Error::Host(format!("axis {axis} out of range for shape {shape:?}")))
    }

    /// The element type.
    pub fn dtype(&self) -> Dtype {
        let mut d: sys::mlx_dtype = sys::MLX_FLOAT32;
        // SAFETY: `raw` is live.
        unsafe { sys::mlx_array_dtype(&mut d, self.raw) };
        Dtype::from_sys(d).unwrap_or(Dtype::Float32)
    }

    /// The number of elements.
    pub fn size(&self) -> usize {
        let mut n = 0usize;
        // SAFETY: `raw` is live.
        unsafe { sys::mlx_array_size(&mut n, self.raw) };
        n
    }

    /// The number of bytes of the elements.
    pub fn nbytes(&self) -> usize {
        let mut n = 0usize;
        // SAFETY: `raw` is live.
        unsafe { sys::mlx_array_nbytes(&mut n, self.raw) };
        n
    }

    /// Whether the array holds its data (it was evaluated, or made from
    /// data) rather than only the graph that computes it.
    pub fn is_evaluated(&self) -> bool {
        let mut out = false;
        // SAFETY: `raw` is live.
        unsafe { sys::mlx_array_is_available(&mut out, self.raw) };
        out
    }

    /// Evaluates the array.
    pub fn eval(&self) -> Result<()> {
        eval(&[self])
    }

    /// Evaluates the array and copies its elements out, row-major.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if self.dtype() != T::DTYPE {
            return Err(Error::Host(format!(
                "cannot read an array of {} as {}",
                self.dtype(),
                T::DTYPE
            )));
        }
        let mut out = vec![T::default(); self.size()];
        let bytes = std::mem::size_of_val(out.as_slice());
        // SAFETY: `out` has room for exactly nbytes(self) bytes of T.
        check(unsafe { sys::mlx_array_read(self.raw, out.as_mut_ptr().cast(), bytes) })?;
        Ok(out)
    }

    /// Evaluates a one-element array and returns its value.
    pub fn item<T: Element>(&self) -> Result<T> {
        let values = self.to_vec::<T>()?;
        match values.as_slice() {
            [v] => Ok(*v),
            _ => Err(Error::Host(format!(
                "item() needs one element, the array has shape {:?}",
                self.shape()
            ))),
        }
    }
}

/// Evaluates the arrays (and the graphs they depend on).
pub fn eval(arrays: &[&Array]) -> Result<()> {
    let raws: Vec<sys::mlx_array> = arrays.iter().map(|a| a.raw).collect();
    // SAFETY: every handle is live for the duration of the call.
    check(unsafe { sys::mlx_eval(raws.as_ptr(), raws.len()) })
}

/// Queues the arrays' evaluation and returns at once.
pub fn async_eval(arrays: &[&Array]) -> Result<()> {
    let raws: Vec<sys::mlx_array> = arrays.iter().map(|a| a.raw).collect();
    // SAFETY: every handle is live for the duration of the call.
    check(unsafe { sys::mlx_async_eval(raws.as_ptr(), raws.len()) })
}
