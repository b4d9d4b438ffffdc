//! Loading safetensors checkpoints (one file or shards listed in
//! `model.safetensors.index.json`), memory-mapped: float32, float16 and
//! bfloat16 tensors, and MLX-quantized ones (`.scales`/`.biases` beside a
//! packed `uint32` weight).

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use mlx_core::{Array, Dtype, QuantizedArray};
use safetensors::SafeTensors;

use super::tensors::{Tensor, TensorMap, WeightsError};
use crate::config::QuantizationConfig;

/// The bytes of one tensor inside a shared memory map.
struct MappedBytes {
    map: Arc<Mmap>,
    start: usize,
    end: usize,
}

impl AsRef<[u8]> for MappedBytes {
    fn as_ref(&self) -> &[u8] {
        self.map.get(self.start..self.end).unwrap_or_default()
    }
}

/// The shard files of a checkpoint folder.
pub fn shard_files(folder: &Path) -> Result<Vec<PathBuf>, WeightsError> {
    let index = folder.join("model.safetensors.index.json");
    if index.is_file() {
        let invalid = |message: String| WeightsError::Invalid {
            file: index.clone(),
            message,
        };
        let text =
            std::fs::read_to_string(&index).map_err(|e| invalid(format!("cannot read: {e}")))?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| invalid(format!("not JSON: {e}")))?;
        let map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| invalid("no \"weight_map\" object".into()))?;
        let mut files: Vec<PathBuf> = Vec::new();
        for value in map.values() {
            let name = value
                .as_str()
                .ok_or_else(|| invalid("a \"weight_map\" entry is not a file name".into()))?;
            if name.contains('/') || name.contains("..") {
                return Err(invalid(format!("shard name '{name}' leaves the folder")));
            }
            // One plain file name: not empty, not "." (the folder itself).
            let mut parts = Path::new(name).components();
            if !matches!(
                (parts.next(), parts.next()),
                (Some(std::path::Component::Normal(_)), None)
            ) {
                return Err(invalid(format!("shard name '{name}' is not a file name")));
            }
            let path = folder.join(name);
            if !files.contains(&path) {
                files.push(path);
            }
        }
        files.sort();
        return Ok(files);
    }
    let single = folder.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![single]);
    }
    Err(WeightsError::Invalid {
        file: folder.to_path_buf(),
        message: "no model.safetensors and no model.safetensors.index.json".into(),
    })
}

/// Reads every tensor of the checkpoint in `folder`, keeping names as they
/// are (a `language_model.` prefix of multimodal checkpoints removed, vision
/// tensors skipped). Floats are converted to `dtype`; MLX-quantized weights
/// stay packed.
pub fn load_safetensors_tensors(
    folder: &Path,
    dtype: Dtype,
    quantization: Option<&QuantizationConfig>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<TensorMap, WeightsError> {
    let files = shard_files(folder)?;
    let mut raw: BTreeMap<String, (Array, PathBuf)> = BTreeMap::new();
    let mut total = 0usize;
    let mut done = 0usize;
    let mut maps = Vec::new();
    for path in &files {
        let invalid = |message: String| WeightsError::Invalid {
            file: path.clone(),
            message,
        };
        let file = File::open(path).map_err(|e| invalid(format!("cannot open: {e}")))?;
        // SAFETY: a private copy-on-write mapping: writes (none are made) would
        // not reach the file; the file being changed by another process while
        // mapped is outside what this loader can guard against.
        let map = unsafe { memmap2::MmapOptions::new().map_copy_read_only(&file) }
            .map_err(|e| invalid(format!("cannot map: {e}")))?;
        let map = Arc::new(map);
        let count = SafeTensors::deserialize(&map)
            .map_err(|e| invalid(format!("not a safetensors file: {e}")))?
            .len();
        total += count;
        maps.push((path.clone(), map));
    }
    for (path, map) in maps {
        let invalid = |message: String| WeightsError::Invalid {
            file: path.clone(),
            message,
        };
        let st = SafeTensors::deserialize(&map)
            .map_err(|e| invalid(format!("not a safetensors file: {e}")))?;
        let base = map.as_ptr() as usize;
        for (name, view) in st.tensors() {
            done += 1;
            progress(done, total);
            let name = name
                .strip_prefix("language_model.")
                .unwrap_or(&name)
                .to_string();
            if name.starts_with("vision_tower.") || name.starts_with("multi_modal_projector.") {
                continue;
            }
            let tensor_dtype = match view.dtype() {
                safetensors::Dtype::F32 => Dtype::Float32,
                safetensors::Dtype::F16 => Dtype::Float16,
                safetensors::Dtype::BF16 => Dtype::Bfloat16,
                safetensors::Dtype::U32 => Dtype::Uint32,
                other => {
                    return Err(invalid(format!(
                        "tensor '{name}' has unsupported dtype {other:?}"
                    )))
                }
            };
            let shape = view
                .shape()
                .iter()
                .map(|&d| i32::try_from(d))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|_| invalid(format!("tensor '{name}' has a dimension too large")))?;
            let start = view.data().as_ptr() as usize - base;
            let bytes = MappedBytes {
                map: Arc::clone(&map),
                start,
                end: start + view.data().len(),
            };
            let array = Array::from_owned_bytes(bytes, &shape, tensor_dtype)?;
            raw.insert(name, (array, path.clone()));
        }
    }
    let file = files
        .first()
        .cloned()
        .unwrap_or_else(|| folder.to_path_buf());
    let mut out = TensorMap::new(&file, false);
    let names: Vec<String> = raw.keys().cloned().collect();
    for name in names {
        if name.ends_with(".scales") || name.ends_with(".biases") {
            continue;
        }
        let Some((array, path)) = raw.remove(&name) else {
            continue;
        };
        let stem = name.strip_suffix(".weight").unwrap_or(&name).to_string();
        let tensor = if array.dtype() == Dtype::Uint32 {
            let q = quantization.ok_or_else(|| WeightsError::Invalid {
                file: path.clone(),
                message: format!("tensor '{name}' is packed uint32 but config.json has no \"quantization\" block"),
            })?;
            let (bits, group_size) = q
                .overrides
                .get(&stem)
                .and_then(|o| o.as_ref())
                .map_or((q.bits, q.group_size), |o| (o.bits, o.group_size));
            let mut part = |suffix: &str| {
                raw.remove(&format!("{stem}.{suffix}"))
                    .map(|(a, _)| a)
                    .ok_or_else(|| WeightsError::Missing {
                        file: path.clone(),
                        name: format!("{stem}.{suffix}"),
                    })
            };
            let scales = part("scales")?;
            let biases = part("biases")?;
            Tensor::Quantized(QuantizedArray {
                packed: array,
                scales,
                biases,
                group_size: group_size as i32,
                bits: bits as i32,
            })
        } else {
            Tensor::Dense(if array.dtype() == dtype {
                array
            } else {
                array.astype(dtype)?
            })
        };
        out.tensors.insert(name, tensor);
    }
    if let Some(extra) = raw.keys().next() {
        return Err(WeightsError::Invalid {
            file,
            message: format!("tensor '{extra}' has no matching packed weight"),
        });
    }
    Ok(out)
}
