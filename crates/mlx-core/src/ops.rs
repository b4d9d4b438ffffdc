//! Array operations as methods and functions. Every operation runs on the
//! default stream of the default device (see [`crate::device`]).

use std::ptr;

use mlx_sys as sys;

use crate::array::new_array;
use crate::error::Result;
use crate::{Array, Dtype};

/// The default stream (a null handle).
const DEFAULT: sys::mlx_stream = ptr::null_mut();

/// An optional list of axes as the C API takes it (NULL: all axes).
fn axes_ptr(axes: Option<&[i32]>) -> (*const i32, usize) {
    match axes {
        Some(a) => (a.as_ptr(), a.len()),
        None => (ptr::null(), 0),
    }
}

/// Raw handles of a list of arrays.
fn raws(arrays: &[&Array]) -> Vec<sys::mlx_array> {
    arrays.iter().map(|a| a.raw()).collect()
}

macro_rules! unary_ops {
    ($($(#[$doc:meta])* $name:ident => $op:ident;)*) => {
        impl Array {
            $(
                $(#[$doc])*
                pub fn $name(&self) -> Result<Array> {
                    // SAFETY: live handle in, new handle out.
                    new_array(|out| unsafe { sys::mlx_unary(out, sys::$op, self.raw(), DEFAULT) })
                }
            )*
        }
    };
}

macro_rules! binary_ops {
    ($($(#[$doc:meta])* $name:ident => $op:ident;)*) => {
        impl Array {
            $(
                $(#[$doc])*
                pub fn $name(&self, other: &Array) -> Result<Array> {
                    // SAFETY: live handles in, new handle out.
                    new_array(|out| unsafe {
                        sys::mlx_binary(out, sys::$op, self.raw(), other.raw(), DEFAULT)
                    })
                }
            )*
        }
    };
}

macro_rules! reduce_ops {
    ($($(#[$doc:meta])* $name:ident, $all:ident => $op:ident;)*) => {
        impl Array {
            $(
                $(#[$doc])*
                pub fn $name(&self, axes: &[i32], keepdims: bool) -> Result<Array> {
                    self.reduce(sys::$op, Some(axes), keepdims)
                }

                $(#[$doc])*
                /// (over all axes, to a 0-d array)
                pub fn $all(&self) -> Result<Array> {
                    self.reduce(sys::$op, None, false)
                }
            )*
        }
    };
}

unary_ops! {
    /// |x|
    abs => MLX_UNARY_ABS;
    /// -x
    negative => MLX_UNARY_NEGATIVE;
    /// The sign of x (-1, 0 or 1).
    sign => MLX_UNARY_SIGN;
    /// x²
    square => MLX_UNARY_SQUARE;
    /// √x
    sqrt => MLX_UNARY_SQRT;
    /// 1/√x
    rsqrt => MLX_UNARY_RSQRT;
    /// 1/x
    reciprocal => MLX_UNARY_RECIPROCAL;
    /// eˣ
    exp => MLX_UNARY_EXP;
    /// ln x
    log => MLX_UNARY_LOG;
    /// ln(1 + x)
    log1p => MLX_UNARY_LOG1P;
    /// sin x
    sin => MLX_UNARY_SIN;
    /// cos x
    cos => MLX_UNARY_COS;
    /// tanh x
    tanh => MLX_UNARY_TANH;
    /// 1 / (1 + e⁻ˣ)
    sigmoid => MLX_UNARY_SIGMOID;
    /// The error function.
    erf => MLX_UNARY_ERF;
    /// ⌊x⌋
    floor => MLX_UNARY_FLOOR;
    /// ⌈x⌉
    ceil => MLX_UNARY_CEIL;
    /// x rounded to the nearest integer (halves to even).
    round => MLX_UNARY_ROUND;
    /// Whether x is finite (boolean).
    isfinite => MLX_UNARY_ISFINITE;
    /// Whether x is NaN (boolean).
    isnan => MLX_UNARY_ISNAN;
    /// Whether x is ±∞ (boolean).
    isinf => MLX_UNARY_ISINF;
    /// Logical not (boolean).
    logical_not => MLX_UNARY_LOGICAL_NOT;
    /// x, cut out of gradient computations.
    stop_gradient => MLX_UNARY_STOP_GRADIENT;
    /// A copy of x with its own buffer.
    copy => MLX_UNARY_COPY;
}

binary_ops! {
    /// a + b (broadcasting)
    add => MLX_BINARY_ADD;
    /// a - b
    subtract => MLX_BINARY_SUBTRACT;
    /// a · b
    multiply => MLX_BINARY_MULTIPLY;
    /// a / b
    divide => MLX_BINARY_DIVIDE;
    /// ⌊a / b⌋
    floor_divide => MLX_BINARY_FLOOR_DIVIDE;
    /// a mod b
    remainder => MLX_BINARY_REMAINDER;
    /// aᵇ
    power => MLX_BINARY_POWER;
    /// max(a, b)
    maximum => MLX_BINARY_MAXIMUM;
    /// min(a, b)
    minimum => MLX_BINARY_MINIMUM;
    /// a == b (boolean)
    equal => MLX_BINARY_EQUAL;
    /// a != b (boolean)
    not_equal => MLX_BINARY_NOT_EQUAL;
    /// a < b (boolean)
    less => MLX_BINARY_LESS;
    /// a <= b (boolean)
    less_equal => MLX_BINARY_LESS_EQUAL;
    /// a > b (boolean)
    greater => MLX_BINARY_GREATER;
    /// a >= b (boolean)
    greater_equal => MLX_BINARY_GREATER_EQUAL;
    /// a and b (boolean)
    logical_and => MLX_BINARY_LOGICAL_AND;
    /// a or b (boolean)
    logical_or => MLX_BINARY_LOGICAL_OR;
}

reduce_ops! {
    /// Sum over the axes.
    sum, sum_all => MLX_REDUCE_SUM;
    /// Mean over the axes.
    mean, mean_all => MLX_REDUCE_MEAN;
    /// Product over the axes.
    prod, prod_all => MLX_REDUCE_PROD;
    /// Maximum over the axes.
    max, max_all => MLX_REDUCE_MAX;
    /// Minimum over the axes.
    min, min_all => MLX_REDUCE_MIN;
    /// Whether every element over the axes is true.
    all, all_all => MLX_REDUCE_ALL;
    /// Whether any element over the axes is true.
    any, any_all => MLX_REDUCE_ANY;
    /// log Σ eˣ over the axes, computed stably.
    logsumexp, logsumexp_all => MLX_REDUCE_LOGSUMEXP;
}

impl Array {
    fn reduce(
        &self,
        op: sys::mlx_reduce_op,
        axes: Option<&[i32]>,
        keepdims: bool,
    ) -> Result<Array> {
        let (p, n) = axes_ptr(axes);
        // SAFETY: live handle and a valid (pointer, length) pair in.
        new_array(|out| unsafe { sys::mlx_reduce(out, op, self.raw(), p, n, keepdims, DEFAULT) })
    }

    fn scan(
        &self,
        op: sys::mlx_scan_op,
        axis: i32,
        reverse: bool,
        inclusive: bool,
    ) -> Result<Array> {
        // SAFETY: live handle in, new handle out.
        new_array(|out| unsafe {
            sys::mlx_scan(out, op, self.raw(), axis, reverse, inclusive, DEFAULT)
        })
    }

    /// Index of the maximum along `axis`.
    pub fn argmax(&self, axis: i32, keepdims: bool) -> Result<Array> {
        // SAFETY: live handle in, new handle out.
        new_array(|out| unsafe {
            sys::mlx_arg_reduce(
                out,
                sys::MLX_ARG_REDUCE_ARGMAX,
                self.raw(),
                axis,
                keepdims,
                DEFAULT,
            )
        })
    }

    /// Index of the minimum along `axis`.
    pub fn argmin(&self, axis: i32, keepdims: bool) -> Result<Array> {
        // SAFETY: live handle in, new handle out.
        new_array(|out| unsafe {
            sys::mlx_arg_reduce(
                out,
                sys::MLX_ARG_REDUCE_ARGMIN,
                self.raw(),
                axis,
                keepdims,
                DEFAULT,
            )
        })
    }

    /// Cumulative sum along `axis`.
    pub fn cumsum(&self, axis: i32, reverse: bool, inclusive: bool) -> Result<Array> {
        self.scan(sys::MLX_SCAN_CUMSUM, axis, reverse, inclusive)
    }

    /// Cumulative product along `axis`.
    pub fn cumprod(&self, axis: i32, reverse: bool, inclusive: bool) -> Result<Array> {
        self.scan(sys::MLX_SCAN_CUMPROD, axis, reverse, inclusive)
    }

    /// Cumulative maximum along `axis`.
    pub fn cummax(&self, axis: i32, reverse: bool, inclusive: bool) -> Result<Array> {
        self.scan(sys::MLX_SCAN_CUMMAX, axis, reverse, inclusive)
    }

    /// Cumulative minimum along `axis`.
    pub fn cummin(&self, axis: i32, reverse: bool, inclusive: bool) -> Result<Array> {
        self.scan(sys::MLX_SCAN_CUMMIN, axis, reverse, inclusive)
    }

    /// Cumulative log-sum-exp along `axis`.
    pub fn logcumsumexp(&self, axis: i32, reverse: bool, inclusive: bool) -> Result<Array> {
        self.scan(sys::MLX_SCAN_LOGCUMSUMEXP, axis, reverse, inclusive)
    }

    /// Softmax over `axes`; `precise` accumulates in float32.
    pub fn softmax(&self, axes: &[i32], precise: bool) -> Result<Array> {
        // SAFETY: live handle and a valid (pointer, length) pair in.
        new_array(|out| unsafe {
            sys::mlx_softmax(out, self.raw(), axes.as_ptr(), axes.len(), precise, DEFAULT)
        })
    }

    /// Clips to `[lo, hi]`; either bound may be absent.
    pub fn clip(&self, lo: Option<&Array>, hi: Option<&Array>) -> Result<Array> {
        let lo = lo.map_or(ptr::null_mut(), Array::raw);
        let hi = hi.map_or(ptr::null_mut(), Array::raw);
        // SAFETY: live or null handles in, new handle out.
        new_array(|out| unsafe { sys::mlx_clip(out, self.raw(), lo, hi, DEFAULT) })
    }

    /// The array converted to `dtype`.
    pub fn astype(&self, dtype: Dtype) -> Result<Array> {
        // SAFETY: live handle in, new handle out.
        new_array(|out| unsafe { sys::mlx_astype(out, self.raw(), dtype.to_sys(), DEFAULT) })
    }

    /// Matrix product (batched over leading axes).
    pub fn matmul(&self, other: &Array) -> Result<Array> {
        // SAFETY: live handles in, new handle out.
        new_array(|out| unsafe { sys::mlx_matmul(out, self.raw(), other.raw(), DEFAULT) })
    }

    /// The Walsh–Hadamard transform over the last axis (a butterfly over
    /// strides 1, 2, 4, …, its size a power of two), times `scale`.
    pub fn hadamard_transform(&self, scale: f32) -> Result<Array> {
        // SAFETY: live handle in, new handle out.
        new_array(|out| unsafe { sys::mlx_hadamard_transform(out, self.raw(), scale, DEFAULT) })
    }

    /// `self @ wᵀ` for `w` `[N, K]`. On the CPU a single float32 row takes a
    /// matrix-vector path (BLAS `sgemv`) instead of a matrix product, which
    /// would repack `w` on every call.
    pub fn linear(&self, w: &Array) -> Result<Array> {
        // SAFETY: live handles in, new handle out.
        new_array(|out| unsafe { sys::mlx_linear(out, self.raw(), w.raw(), DEFAULT) })
    }

    /// `alpha · (a @ b) + beta · self`.
    pub fn addmm(&self, a: &Array, b: &Array, alpha: f32, beta: f32) -> Result<Array> {
        // SAFETY: live handles in, new handle out.
        new_array(|out| unsafe {
            sys::mlx_addmm(out, self.raw(), a.raw(), b.raw(), alpha, beta, DEFAULT)
        })
    }

    /// The same elements in a new shape (one dimension may be -1).
    pub fn reshape(&self, shape: &[i32]) -> Result<Array> {
        // SAFETY: live handle and a valid (pointer, length) pair in.
        new_array(|out| unsafe {
            sys::mlx_reshape(out, self.raw(), shape.as_ptr(), shape.len(), DEFAULT)
        })
    }

    /// Axes permuted as `axes` says.
    pub fn transpose(&self, axes: &[i32]) -> Result<Array> {
        // SAFETY: live handle and a valid (pointer, length) pair in.
        new_array(|out| unsafe {
            sys::mlx_transpose(out, self.raw(), axes.as_ptr(), axes.len(), DEFAULT)
        })
    }

    /// Axes in reverse order.
    pub fn t(&self) -> Result<Array> {
        // SAFETY: live handle in (NULL axes: reverse), new handle out.
        new_array(|out| unsafe { sys::mlx_transpose(out, self.raw(), ptr::null(), 0, DEFAULT) })
    }

    /// Two axes swapped.
    pub fn swapaxes(&self, axis1: i32, axis2: i32) -> Result<Array> {
        // SAFETY: live handle in, new handle out.
        new_array(|out| unsafe { sys::mlx_swapaxes(out, self.raw(), axis1, axis2, DEFAULT) })
    }

    /// New size-1 axes inserted at `axes`.
    pub fn expand_dims(&self, axes: &[i32]) -> Result<Array> {
        // SAFETY: live handle and a valid (pointer, length) pair in.
        new_array(|out| unsafe {
            sys::mlx_expand_dims(out, self.raw(), axes.as_ptr(), axes.len(), DEFAULT)
        })
    }

    /// The size-1 axes `axes` removed.
    pub fn squeeze(&self, axes: &[i32]) -> Result<Array> {
        // SAFETY: live handle and a valid (pointer, length) pair in.
        new_array(|out| unsafe {
            sys::mlx_squeeze(out, self.raw(), axes.as_ptr(), axes.len(), DEFAULT)
        })
    }

    /// Broadcast to `shape`.
    pub fn broadcast_to(&self, shape: &[i32]) -> Result<Array> {
        // SAFETY: live handle and a valid (pointer, length) pair in.
        new_array(|out| unsafe {
            sys::mlx_broadcast_to(out, self.raw(), shape.as_ptr(), shape.len(), DEFAULT)
        })
    }

    /// Axes `start..=end` merged into one.
    pub fn flatten(&self, start_axis: i32, end_axis: i32) -> Result<Array> {
        // SAFETY: live handle in, new handle out.
        new_array(|out| unsafe { sys::mlx_flatten(out, self.raw(), start_axis, end_axis, DEFAULT) })
    }

    /// A row-contiguous version (a copy only if needed).
    pub fn contiguous(&self) -> Result<Array> {
        // SAFETY: live handle in, new handle out.
        new_array(|out| unsafe { sys::mlx_contiguous(out, self.raw(), DEFAULT) })
    }

    /// `self[start:stop:strides]`, one entry per axis.
    pub fn slice(&self, start: &[i32], stop: &[i32], strides: &[i32]) -> Result<Array> {
        let n = start.len();
        if stop.len() != n || strides.len() != n {
            return Err(crate::Error::Host(format!(
                "slice bounds of different lengths: start {start:?}, stop {stop:?}, strides {strides:?}"
            )));
        }
        // SAFETY: live handle and three arrays of `n` ints in.
        new_array(|out| unsafe {
            sys::mlx_slice(
                out,
                self.raw(),
                start.as_ptr(),
                stop.as_ptr(),
                strides.as_ptr(),
                n,
                DEFAULT,
            )
        })
    }

    /// `slice_size` elements along `axes` from the positions in `start` (an
    /// integer array): the start is data, so a compiled graph does not retrace.
    pub fn slice_dynamic(&self, start: &Array, axes: &[i32], slice_size: &[i32]) -> Result<Array> {
        // SAFETY: live handles and valid (pointer, length) pairs in.
        new_array(|out| unsafe {
            sys::mlx_slice_dynamic(
                out,
                self.raw(),
                start.raw(),
                axes.as_ptr(),
                axes.len(),
                slice_size.as_ptr(),
                slice_size.len(),
                DEFAULT,
            )
        })
    }

    /// A copy with `self[start:stop:strides]` replaced by `update`.
    pub fn slice_update(
        &self,
        update: &Array,
        start: &[i32],
        stop: &[i32],
        strides: &[i32],
    ) -> Result<Array> {
        let n = start.len();
        if stop.len() != n || strides.len() != n {
            return Err(crate::Error::Host(format!(
                "slice bounds of different lengths: start {start:?}, stop {stop:?}, strides {strides:?}"
            )));
        }
        // SAFETY: live handles and three arrays of `n` ints in.
        new_array(|out| unsafe {
            sys::mlx_slice_update(
                out,
                self.raw(),
                update.raw(),
                start.as_ptr(),
                stop.as_ptr(),
                strides.as_ptr(),
                n,
                DEFAULT,
            )
        })
    }

    /// A copy with the block at `start` (an integer array, one per axis in
    /// `axes`) replaced by `update`.
    pub fn slice_update_dynamic(
        &self,
        update: &Array,
        start: &Array,
        axes: &[i32],
    ) -> Result<Array> {
        // SAFETY: live handles and a valid (pointer, length) pair in.
        new_array(|out| unsafe {
            sys::mlx_slice_update_dynamic(
                out,
                self.raw(),
                update.raw(),
                start.raw(),
                axes.as_ptr(),
                axes.len(),
                DEFAULT,
            )
        })
    }

    /// Elements at `indices` along `axis`.
    pub fn take(&self, indices: &Array, axis: i32) -> Result<Array> {
        // SAFETY: live handles in, new handle out.
        new_array(|out| unsafe { sys::mlx_take(out, self.raw(), indices.raw(), axis, DEFAULT) })
    }

    /// Elements picked along `axis` by an index array of matching shape.
    pub fn take_along_axis(&self, indices: &Array, axis: i32) -> Result<Array> {
        // SAFETY: live handles in, new handle out.
        new_array(|out| unsafe {
            sys::mlx_take_along_axis(out, self.raw(), indices.raw(), axis, DEFAULT)
        })
    }

    /// A copy with `values` written at `indices` along `axis`.
    pub fn put_along_axis(&self, indices: &Array, values: &Array, axis: i32) -> Result<Array> {
        // SAFETY: live handles in, new handle out.
        new_array(|out| unsafe {
            sys::mlx_put_along_axis(out, self.raw(), indices.raw(), values.raw(), axis, DEFAULT)
        })
    }

    /// Sorted along `axis`.
    pub fn sort(&self, axis: i32) -> Result<Array> {
        // SAFETY: live handle in, new handle out.
        new_array(|out| unsafe { sys::mlx_sort(out, self.raw(), axis, DEFAULT) })
    }

    /// Indices that sort along `axis`.
    pub fn argsort(&self, axis: i32) -> Result<Array> {
        // SAFETY: live handle in, new handle out.
        new_array(|out| unsafe { sys::mlx_argsort(out, self.raw(), axis, DEFAULT) })
    }

    /// Indices that partition along `axis` around the `kth` smallest element.
    pub fn argpartition(&self, kth: i32, axis: i32) -> Result<Array> {
        // SAFETY: live handle in, new handle out.
        new_array(|out| unsafe { sys::mlx_argpartition(out, self.raw(), kth, axis, DEFAULT) })
    }

    /// The `k` largest values along `axis`, unordered.
    pub fn topk(&self, k: i32, axis: i32) -> Result<Array> {
        // SAFETY: live handle in, new handle out.
        new_array(|out| unsafe { sys::mlx_topk(out, self.raw(), k, axis, DEFAULT) })
    }
}

/// `x` where `condition` holds, else `y` (broadcasting).
pub fn where_(condition: &Array, x: &Array, y: &Array) -> Result<Array> {
    // SAFETY: live handles in, new handle out.
    new_array(|out| unsafe { sys::mlx_where(out, condition.raw(), x.raw(), y.raw(), DEFAULT) })
}

/// The arrays joined along `axis`.
pub fn concatenate(arrays: &[&Array], axis: i32) -> Result<Array> {
    let handles = raws(arrays);
    // SAFETY: live handles in, new handle out.
    new_array(|out| unsafe {
        sys::mlx_concatenate(out, handles.as_ptr(), handles.len(), axis, DEFAULT)
    })
}

/// The arrays stacked along a new axis `axis`.
pub fn stack(arrays: &[&Array], axis: i32) -> Result<Array> {
    let handles = raws(arrays);
    // SAFETY: live handles in, new handle out.
    new_array(|out| unsafe { sys::mlx_stack(out, handles.as_ptr(), handles.len(), axis, DEFAULT) })
}

/// `start, start + step, …` below `stop`.
pub fn arange(start: f64, stop: f64, step: f64, dtype: Dtype) -> Result<Array> {
    // SAFETY: plain values in, new handle out.
    new_array(|out| unsafe { sys::mlx_arange(out, start, stop, step, dtype.to_sys(), DEFAULT) })
}

/// An array of `shape` filled with `value`.
pub fn full(shape: &[i32], value: &Array, dtype: Dtype) -> Result<Array> {
    // SAFETY: live handle and a valid (pointer, length) pair in.
    new_array(|out| unsafe {
        sys::mlx_full(
            out,
            shape.as_ptr(),
            shape.len(),
            value.raw(),
            dtype.to_sys(),
            DEFAULT,
        )
    })
}

/// An array of zeros.
pub fn zeros(shape: &[i32], dtype: Dtype) -> Result<Array> {
    // SAFETY: valid (pointer, length) pair in.
    new_array(|out| unsafe {
        sys::mlx_zeros(out, shape.as_ptr(), shape.len(), dtype.to_sys(), DEFAULT)
    })
}

/// An array of ones.
pub fn ones(shape: &[i32], dtype: Dtype) -> Result<Array> {
    // SAFETY: valid (pointer, length) pair in.
    new_array(|out| unsafe {
        sys::mlx_ones(out, shape.as_ptr(), shape.len(), dtype.to_sys(), DEFAULT)
    })
}

/// An `n × m` matrix with ones at and below diagonal `k`.
pub fn tri(n: i32, m: i32, k: i32, dtype: Dtype) -> Result<Array> {
    // SAFETY: plain values in, new handle out.
    new_array(|out| unsafe { sys::mlx_tri(out, n, m, k, dtype.to_sys(), DEFAULT) })
}

impl Array {
    /// The lower triangle (at and below diagonal `k`) of the last two axes.
    pub fn tril(&self, k: i32) -> Result<Array> {
        // SAFETY: live handle in, new handle out.
        new_array(|out| unsafe { sys::mlx_tril(out, self.raw(), k, DEFAULT) })
    }

    /// The upper triangle (at and above diagonal `k`) of the last two axes.
    pub fn triu(&self, k: i32) -> Result<Array> {
        // SAFETY: live handle in, new handle out.
        new_array(|out| unsafe { sys::mlx_triu(out, self.raw(), k, DEFAULT) })
    }
}
