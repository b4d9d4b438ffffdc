//! Functions of arrays, and MLX's `compile` of them into fused graphs.

use std::os::raw::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;

use mlx_sys as sys;

use crate::array::{new_array, take_vector};
use crate::error::{callback_status, check, Result};
use crate::Array;

/// A function from arrays to arrays that MLX can call (and trace).
pub struct Function {
    raw: sys::mlx_closure,
}

// SAFETY: the closure handle owns a `Send` Rust function; moving it is safe.
unsafe impl Send for Function {}

type BoxedFn = Box<dyn Fn(&[Array]) -> Result<Vec<Array>> + Send>;

unsafe extern "C" fn trampoline(
    ctx: *mut c_void,
    inputs: *const sys::mlx_array,
    n: usize,
    outputs: sys::mlx_vector_array,
    error: *mut c_char,
    error_len: usize,
) -> i32 {
    let result = catch_unwind(AssertUnwindSafe(|| -> Result<()> {
        // SAFETY: `ctx` is the BoxedFn given to mlx_closure_new, alive until
        // `free_ctx` runs; `inputs` holds `n` live handles for this call.
        let f = unsafe { &*(ctx as *const BoxedFn) };
        let handles = if n == 0 {
            &[][..]
        } else {
            unsafe { std::slice::from_raw_parts(inputs, n) }
        };
        let args = handles
            .iter()
            // SAFETY: each handle is live; the clone is a new owned handle.
            .map(|&h| new_array(|out| unsafe { sys::mlx_array_clone(out, h) }))
            .collect::<Result<Vec<_>>>()?;
        for output in f(&args)? {
            // SAFETY: live vector and array handles.
            check(unsafe { sys::mlx_vector_array_push(outputs, output.raw()) })?;
        }
        Ok(())
    }));
    callback_status(
        result,
        "a Rust function called by MLX panicked",
        error,
        error_len,
    )
}

unsafe extern "C" fn free_ctx(ctx: *mut c_void) {
    // SAFETY: `ctx` came from Box::into_raw in `Function::new`; freed once.
    drop(unsafe { Box::from_raw(ctx as *mut BoxedFn) });
}

impl Function {
    /// Wraps a Rust function of arrays.
    pub fn new<F>(f: F) -> Result<Function>
    where
        F: Fn(&[Array]) -> Result<Vec<Array>> + Send + 'static,
    {
        let boxed: Box<BoxedFn> = Box::new(Box::new(f));
        let ctx = Box::into_raw(boxed).cast::<c_void>();
        let mut raw = ptr::null_mut();
        // SAFETY: `ctx` is handed to MLX, which frees it with `free_ctx` once
        // (also when this call fails).
        check(unsafe { sys::mlx_closure_new(&mut raw, Some(trampoline), ctx, Some(free_ctx)) })?;
        Ok(Function { raw })
    }

    /// A compiled version: traced once per input shapes (or once for all
    /// shapes when `shapeless`), then run as one fused graph.
    pub fn compile(&self, shapeless: bool) -> Result<Function> {
        let mut raw = ptr::null_mut();
        // SAFETY: live closure in, one closure out (owned by the result).
        check(unsafe { sys::mlx_compile(&mut raw, self.raw, shapeless) })?;
        Ok(Function { raw })
    }

    /// Calls the function.
    pub fn call(&self, inputs: &[&Array]) -> Result<Vec<Array>> {
        let handles: Vec<sys::mlx_array> = inputs.iter().map(|a| a.raw()).collect();
        let mut vector = ptr::null_mut();
        // SAFETY: live closure and input handles; one vector out, freed below.
        check(unsafe {
            sys::mlx_closure_apply(&mut vector, self.raw, handles.as_ptr(), handles.len())
        })?;
        take_vector(vector)
    }
}

impl Drop for Function {
    fn drop(&mut self) {
        // SAFETY: a live handle owned by this value.
        unsafe { sys::mlx_closure_free(self.raw) }
    }
}
