//! Products of ggml block-quantized rows, and of MLX's affine-quantized
//! rows, with 8-bit activations by `mlx-c`'s x86 kernels
//! (`mlx-c/src/block_dot.cpp`), for the formats they cover, in the kernel
//! family the caller names ([`CpuKernels`]); the caller keeps another path
//! for the rest.

use std::fmt;
use std::str::FromStr;

use crate::error::check;
use crate::{Error, Result};

/// The environment variable that chooses the CPU kernel family
/// ([`CpuKernels::from_env`]).
pub const CPU_KERNELS_VAR: &str = "GEMMA_MLX_CPU_KERNELS";

/// A family of CPU kernels for products with 8-bit activations. The integer
/// products are exact in every family; the families differ in the order in
/// which they add the scaled float partial sums, so results may differ in
/// the last bits from one family to another, never within one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CpuKernels {
    /// None of `mlx-c`'s kernels: the caller's portable Rust kernels, the
    /// same sums on every CPU.
    Portable,
    /// `mlx-c`'s 256-bit kernels (x86-64 with AVX2, FMA and F16C).
    Avx2,
    /// `mlx-c`'s 512-bit AVX-512 VNNI kernels where a format has one (a
    /// single row of activations times Q4_0, Q5_0, Q8_0, Q4_K or Q6_K;
    /// several rows times any of those or Q5_K), the 256-bit ones
    /// elsewhere.
    Avx512,
}

impl CpuKernels {
    /// Every family, from the most portable to the widest.
    pub const ALL: [CpuKernels; 3] = [CpuKernels::Portable, CpuKernels::Avx2, CpuKernels::Avx512];

    /// The family's name, as [`CPU_KERNELS_VAR`] takes it.
    pub fn name(self) -> &'static str {
        match self {
            CpuKernels::Portable => "portable",
            CpuKernels::Avx2 => "avx2",
            CpuKernels::Avx512 => "avx512",
        }
    }

    fn sys(self) -> mlx_sys::mlx_cpu_kernels {
        match self {
            CpuKernels::Portable => mlx_sys::MLX_CPU_KERNELS_PORTABLE,
            CpuKernels::Avx2 => mlx_sys::MLX_CPU_KERNELS_AVX2,
            CpuKernels::Avx512 => mlx_sys::MLX_CPU_KERNELS_AVX512,
        }
    }

    /// Whether this CPU runs the family.
    pub fn is_supported(self) -> Result<bool> {
        let mut supported = false;
        // SAFETY: `supported` is a live bool the call writes.
        check(unsafe { mlx_sys::mlx_cpu_kernels_supported(&mut supported, self.sys()) })?;
        Ok(supported)
    }

    /// The families this CPU runs, from the most portable to the widest.
    pub fn supported() -> Result<Vec<CpuKernels>> {
        let mut out = Vec::new();
        for family in CpuKernels::ALL {
            if family.is_supported()? {
                out.push(family);
            }
        }
        Ok(out)
    }

    /// The widest family this CPU runs.
    pub fn best() -> Result<CpuKernels> {
        Ok(CpuKernels::supported()?
            .pop()
            .unwrap_or(CpuKernels::Portable))
    }

    /// The family [`CPU_KERNELS_VAR`] names, or the [best](Self::best) when
    /// it is unset or empty. Any other value, or a family this CPU does not
    /// run, is an error naming the variable and the values it takes.
    pub fn from_env() -> Result<CpuKernels> {
        match std::env::var(CPU_KERNELS_VAR) {
            Err(std::env::VarError::NotPresent) => CpuKernels::best(),
            Err(std::env::VarError::NotUnicode(v)) => Err(Error::Host(format!(
                "{CPU_KERNELS_VAR}={v:?} is not a CPU kernel family: {}",
                CpuKernels::accepted()
            ))),
            Ok(v) if v.is_empty() => CpuKernels::best(),
            Ok(v) => {
                let named = |e: Error| Error::Host(format!("{CPU_KERNELS_VAR}={v}: {e}"));
                let family: CpuKernels = v.parse().map_err(named)?;
                family.require().map_err(named)?;
                Ok(family)
            }
        }
    }

    /// Fails, naming the families this CPU runs, unless it runs this one.
    pub fn require(self) -> Result<()> {
        if self.is_supported()? {
            return Ok(());
        }
        let names: Vec<&str> = CpuKernels::supported()?
            .into_iter()
            .map(CpuKernels::name)
            .collect();
        Err(Error::Host(format!(
            "the {self} CPU kernels do not run on this CPU (it runs: {})",
            names.join(", ")
        )))
    }

    /// The values a family is named by, for messages.
    fn accepted() -> String {
        let names: Vec<&str> = CpuKernels::ALL.iter().map(|f| f.name()).collect();
        format!("expected one of {}", names.join(", "))
    }
}

impl fmt::Display for CpuKernels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for CpuKernels {
    type Err = Error;

    fn from_str(s: &str) -> Result<CpuKernels> {
        CpuKernels::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| {
                Error::Host(format!(
                    "'{s}' is not a CPU kernel family: {}",
                    CpuKernels::accepted()
                ))
            })
    }
}

/// Activations quantized to 8 bits per 16 values, one row or several one
/// after another: value `j` ≈ `scales[j / 16] · q[j]`, `sums[g]` the sum
/// of group `g`'s approximations.
#[derive(Debug, Clone, Copy)]
pub struct Int8Activations<'a> {
    /// The integers, each in [−127, 127].
    pub q: &'a [i8],
    /// One scale per 16 values.
    pub scales: &'a [f32],
    /// One sum per 16 values.
    pub sums: &'a [f32],
}

/// Whether [`block_rows_dot`] multiplies rows of ggml type `ggml_type` in
/// `family` (an error for a family this CPU does not run).
pub fn block_rows_dot_available(family: CpuKernels, ggml_type: u32) -> Result<bool> {
    let mut available = false;
    // SAFETY: `available` is a live bool the call writes.
    check(unsafe {
        mlx_sys::mlx_block_rows_dot_available(&mut available, family.sys(), ggml_type)
    })?;
    Ok(available)
}

/// `out[m · rows + r] = Σ_j w[r, j] · x[m, j]`: each of the `rows` rows of
/// `w` (ggml type `ggml_type`, `row_bytes` bytes of whole blocks each)
/// against each of the `out.len() / rows` rows of `x` (`x` holding that many
/// rows one after another), by the kernels of `family`. Several rows of `x`
/// decode each tile of weights once for all of them. Fails where
/// [`block_rows_dot_available`] says no, or when the sizes do not match the
/// type.
pub fn block_rows_dot(
    family: CpuKernels,
    ggml_type: u32,
    w: &[u8],
    row_bytes: usize,
    x: Int8Activations<'_>,
    out: &mut [f32],
) -> Result<()> {
    let rows = w.len().checked_div(row_bytes).unwrap_or(0);
    let n = out.len().checked_div(rows).unwrap_or(0);
    let cols = x.q.len().checked_div(n).unwrap_or(0);
    if rows == 0 || out.is_empty() {
        return Ok(());
    }
    if w.len() != rows * row_bytes
        || out.len() != n * rows
        || x.q.len() != n * cols
        || !cols.is_multiple_of(16)
        || x.scales.len() != n * cols / 16
        || x.sums.len() != n * cols / 16
    {
        return Err(Error::Host(format!(
            "block rows product: {} bytes of rows of {row_bytes} bytes for {} outputs, \
             {} activations with {} scales and {} sums",
            w.len(),
            out.len(),
            x.q.len(),
            x.scales.len(),
            x.sums.len()
        )));
    }
    // SAFETY: every pointer comes from a live slice of the length checked
    // above (`rows` rows of `row_bytes` bytes, `n` rows of `cols`
    // activations with `cols / 16` scales and sums each, `n · rows`
    // outputs); the kernel checks that `row_bytes` is `cols` values of its
    // type and reads no further.
    check(unsafe {
        mlx_sys::mlx_block_rows_dot(
            out.as_mut_ptr(),
            family.sys(),
            ggml_type,
            w.as_ptr(),
            rows,
            row_bytes,
            cols,
            n,
            x.q.as_ptr(),
            x.scales.as_ptr(),
            x.sums.as_ptr(),
        )
    })
}

/// MLX's affine-quantized rows: `bits` (4 or 8) in groups of `group_size`,
/// the packed bytes of each row followed by the next, and float32 scales and
/// biases, one per group.
#[derive(Debug, Clone, Copy)]
pub struct AffineRows<'a> {
    /// The packed values, `cols · bits / 8` bytes a row.
    pub packed: &'a [u8],
    /// One scale per group.
    pub scales: &'a [f32],
    /// One bias per group.
    pub biases: &'a [f32],
    /// Bits per value.
    pub bits: i32,
    /// Values per group.
    pub group_size: i32,
}

/// Whether [`affine_rows_dot`] multiplies `bits`-bit rows in groups of
/// `group_size` in `family` (an error for a family this CPU does not run).
pub fn affine_rows_dot_available(family: CpuKernels, bits: i32, group_size: i32) -> Result<bool> {
    let mut available = false;
    // SAFETY: `available` is a live bool the call writes.
    check(unsafe {
        mlx_sys::mlx_affine_rows_dot_available(&mut available, family.sys(), bits, group_size)
    })?;
    Ok(available)
}

/// `out[r] = Σ_j w[r, j] · x_j` for each of the `out.len()` rows of `w`
/// against `x`, by the kernel of `family`. Fails where
/// [`affine_rows_dot_available`] says no, or when the sizes do not match.
pub fn affine_rows_dot(
    family: CpuKernels,
    w: AffineRows<'_>,
    x: Int8Activations<'_>,
    out: &mut [f32],
) -> Result<()> {
    let (rows, cols) = (out.len(), x.q.len());
    let bits = usize::try_from(w.bits).unwrap_or(0);
    let group = usize::try_from(w.group_size).unwrap_or(0);
    let fits = bits > 0
        && group > 0
        && cols.is_multiple_of(group)
        && cols.is_multiple_of(16)
        && w.packed.len() == rows * cols * bits / 8
        && w.scales.len() == rows * cols / group
        && w.biases.len() == w.scales.len()
        && x.scales.len() == cols / 16
        && x.sums.len() == cols / 16;
    if !fits {
        return Err(Error::Host(format!(
            "affine rows product: {} packed bytes, {} scales and {} biases of {bits}-bit \
             groups of {group} for {rows} rows of {cols} activations",
            w.packed.len(),
            w.scales.len(),
            w.biases.len()
        )));
    }
    // SAFETY: every pointer comes from a live slice of the length checked
    // above for `rows` rows of `cols` values; the kernel reads no further.
    check(unsafe {
        mlx_sys::mlx_affine_rows_dot(
            out.as_mut_ptr(),
            family.sys(),
            w.bits,
            w.group_size,
            w.packed.as_ptr(),
            w.scales.as_ptr(),
            w.biases.as_ptr(),
            rows,
            cols,
            x.q.as_ptr(),
            x.scales.as_ptr(),
            x.sums.as_ptr(),
        )
    })
}
