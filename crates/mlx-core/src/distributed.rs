//! Groups of processes that compute together, and the collectives over
//! them: MLX's distributed backends (ring over TCP for CPU hosts, NCCL for
//! NVIDIA GPUs, MPI, JACCL), set up from the environment that MLX's
//! launcher, `mlx.launch`, gives each process.

use std::ffi::CString;
use std::ptr;

use mlx_sys as sys;

use crate::array::new_array;
use crate::device::{Device, Stream};
use crate::error::{check, Error, Result};
use crate::Array;

/// A group of processes (ranks); freed on drop.
pub struct Group {
    raw: sys::mlx_distributed_group,
}

impl Group {
    /// The group of every process the launcher started, through `backend`
    /// (`"any"`: the first MLX finds configured; or `"ring"`, `"mpi"`,
    /// `"nccl"`, `"jaccl"`). Without a launcher's environment: a group of
    /// this process alone, or, when `strict`, an error.
    pub fn init(strict: bool, backend: &str) -> Result<Group> {
        let name = CString::new(backend)
            .map_err(|_| Error::Mlx(format!("backend name '{backend}' holds a NUL byte")))?;
        let mut raw = ptr::null_mut();
        // SAFETY: a C string that outlives the call; one handle out (owned
        // by the result).
        check(unsafe { sys::mlx_distributed_init(&mut raw, strict, name.as_ptr()) })?;
        Ok(Group { raw })
    }

    /// This process's rank, 0 … size − 1.
    pub fn rank(&self) -> Result<usize> {
        let mut out = 0;
        // SAFETY: live handle in, one int out.
        check(unsafe { sys::mlx_distributed_group_rank(&mut out, self.raw) })?;
        Ok(out as usize)
    }

    /// The number of ranks.
    pub fn size(&self) -> Result<usize> {
        let mut out = 0;
        // SAFETY: live handle in, one int out.
        check(unsafe { sys::mlx_distributed_group_size(&mut out, self.raw) })?;
        Ok(out as usize)
    }

    /// The sum of every rank's `x` (the same shape and dtype on every
    /// rank), computed on `device`'s default stream.
    pub fn all_sum(&self, x: &Array, device: Device) -> Result<Array> {
        let stream = Stream::default_for(device)?;
        // SAFETY: live handles in, one new array out.
        new_array(|out| unsafe {
            sys::mlx_distributed_all_sum(out, x.raw(), self.raw, stream.raw())
        })
    }

    /// Every rank's `x` (the same shape and dtype on every rank), in rank
    /// order, joined along the first axis; computed on `device`'s default
    /// stream.
    pub fn all_gather(&self, x: &Array, device: Device) -> Result<Array> {
        let stream = Stream::default_for(device)?;
        // SAFETY: live handles in, one new array out.
        new_array(|out| unsafe {
            sys::mlx_distributed_all_gather(out, x.raw(), self.raw, stream.raw())
        })
    }

    /// Every rank's bytes, in rank order: the lengths are gathered first,
    /// so ranks may give different amounts. Runs on the CPU, which every
    /// backend serves.
    pub fn all_gather_bytes(&self, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
        let len = i64::try_from(bytes.len())
            .map_err(|_| Error::Mlx(format!("{} bytes are too many to gather", bytes.len())))?;
        let lengths = self
            .all_gather(&Array::from_slice(&[len], &[1])?, Device::Cpu)?
            .to_vec::<i64>()?;
        let widest = lengths.iter().copied().max().unwrap_or(0).max(1);
        let mut padded = bytes.to_vec();
        padded.resize(widest as usize, 0);
        let all = self
            .all_gather(
                &Array::from_slice(&padded, &[1, widest as i32])?,
                Device::Cpu,
            )?
            .to_vec::<u8>()?;
        Ok(lengths
            .iter()
            .zip(all.chunks(widest as usize))
            .map(|(&n, row)| row[..n as usize].to_vec())
            .collect())
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // SAFETY: a live handle owned by this value.
        unsafe { sys::mlx_distributed_group_free(self.raw) }
    }
}
