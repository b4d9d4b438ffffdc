//! Element types and the host types that map onto them.

use mlx_sys as sys;

/// An MLX element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// Boolean.
    Bool,
    /// Unsigned 8-bit integer.
    Uint8,
    /// Unsigned 16-bit integer.
    Uint16,
    /// Unsigned 32-bit integer.
    Uint32,
    /// Unsigned 64-bit integer.
    Uint64,
    /// Signed 8-bit integer.
    Int8,
    /// Signed 16-bit integer.
    Int16,
    /// Signed 32-bit integer.
    Int32,
    /// Signed 64-bit integer.
    Int64,
    /// IEEE half precision.
    Float16,
    /// IEEE single precision.
    Float32,
    /// IEEE double precision (CPU only).
    Float64,
    /// bfloat16.
    Bfloat16,
    /// Complex of two float32.
    Complex64,
}

impl Dtype {
    /// Every dtype, in MLX's order.
    pub const ALL: [Dtype; 14] = [
        Dtype::Bool,
        Dtype::Uint8,
        Dtype::Uint16,
        Dtype::Uint32,
        Dtype::Uint64,
        Dtype::Int8,
        Dtype::Int16,
        Dtype::Int32,
        Dtype::Int64,
        Dtype::Float16,
        Dtype::Float32,
        Dtype::Float64,
        Dtype::Bfloat16,
        Dtype::Complex64,
    ];

    /// Bytes per element.
    pub fn size_bytes(self) -> usize {
        match self {
            Dtype::Bool | Dtype::Uint8 | Dtype::Int8 => 1,
            Dtype::Uint16 | Dtype::Int16 | Dtype::Float16 | Dtype::Bfloat16 => 2,
            Dtype::Uint32 | Dtype::Int32 | Dtype::Float32 => 4,
            Dtype::Uint64 | Dtype::Int64 | Dtype::Float64 | Dtype::Complex64 => 8,
        }
    }

    /// Whether this is a floating-point type.
    pub fn is_float(self) -> bool {
        matches!(
            self,
            Dtype::Float16 | Dtype::Float32 | Dtype::Float64 | Dtype::Bfloat16
        )
    }

    /// The lower-case name MLX and numpy use ("float32", "bfloat16", ...).
    pub fn name(self) -> &'static str {
        match self {
            Dtype::Bool => "bool",
            Dtype::Uint8 => "uint8",
            Dtype::Uint16 => "uint16",
            Dtype::Uint32 => "uint32",
            Dtype::Uint64 => "uint64",
            Dtype::Int8 => "int8",
            Dtype::Int16 => "int16",
            Dtype::Int32 => "int32",
            Dtype::Int64 => "int64",
            Dtype::Float16 => "float16",
            Dtype::Float32 => "float32",
            Dtype::Float64 => "float64",
            Dtype::Bfloat16 => "bfloat16",
            Dtype::Complex64 => "complex64",
        }
    }

    pub(crate) fn to_sys(self) -> sys::mlx_dtype {
        match self {
            Dtype::Bool => sys::MLX_BOOL,
            Dtype::Uint8 => sys::MLX_UINT8,
            Dtype::Uint16 => sys::MLX_UINT16,
            Dtype::Uint32 => sys::MLX_UINT32,
            Dtype::Uint64 => sys::MLX_UINT64,
            Dtype::Int8 => sys::MLX_INT8,
            Dtype::Int16 => sys::MLX_INT16,
            Dtype::Int32 => sys::MLX_INT32,
            Dtype::Int64 => sys::MLX_INT64,
            Dtype::Float16 => sys::MLX_FLOAT16,
            Dtype::Float32 => sys::MLX_FLOAT32,
            Dtype::Float64 => sys::MLX_FLOAT64,
            Dtype::Bfloat16 => sys::MLX_BFLOAT16,
            Dtype::Complex64 => sys::MLX_COMPLEX64,
        }
    }

    pub(crate) fn from_sys(value: sys::mlx_dtype) -> Option<Dtype> {
        Dtype::ALL.into_iter().find(|d| d.to_sys() == value)
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A host type with the same bytes as one MLX dtype.
pub trait Element: Copy + Default + Send + Sync + 'static {
    /// The matching MLX dtype.
    const DTYPE: Dtype;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => {
        $(impl Element for $t { const DTYPE: Dtype = Dtype::$d; })*
    };
}

element!(
    bool => Bool,
    u8 => Uint8,
    u16 => Uint16,
    u32 => Uint32,
    u64 => Uint64,
    i8 => Int8,
    i16 => Int16,
    i32 => Int32,
    i64 => Int64,
    half::f16 => Float16,
    f32 => Float32,
    f64 => Float64,
    half::bf16 => Bfloat16,
);
