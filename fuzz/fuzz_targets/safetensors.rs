//! Safetensors checkpoints: file headers, the sharded index
//! (`model.safetensors.index.json`) and the loader that maps tensors into
//! MLX arrays (float, and MLX-quantized with `.scales`/`.biases`).
//!
//! The first input byte picks the layout (bit 0: sharded) and the
//! quantization the config declares (bits 1-2: none, 4-bit groups of 64,
//! or that with an 8-bit override for `model.embed_tokens`). A single file
//! is the rest of the input. Sharded: a u16 length and the index, a u16
//! length and the first shard, and the second shard; they are written as
//! `model.safetensors.index.json`, `model-00001-of-00002.safetensors` and
//! `model-00002-of-00002.safetensors`. Invariants: nothing panics; the
//! shard list stays inside the folder, sorted and without duplicates; a
//! loaded checkpoint has no `language_model.` prefixes, no vision tensors,
//! and every quantized weight comes with scales and biases.

#![no_main]

use std::collections::BTreeMap;
use std::path::Path;

use gemma::config::{LayerQuantization, QuantizationConfig};
use gemma::weights::{load_safetensors_tensors, shard_files, Tensor};
use gemma_fuzz::input::Input;
use gemma_fuzz::scratch;
use libfuzzer_sys::fuzz_target;
use mlx_core::Dtype;

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let flags = input.byte();
    let dir = scratch::empty_subdir("checkpoint");
    if flags & 1 == 0 {
        scratch::write_in(&dir, "model.safetensors", input.rest());
    } else {
        let index_len = usize::from(input.u16());
        scratch::write_in(&dir, "model.safetensors.index.json", input.take(index_len));
        let first_len = usize::from(input.u16());
        scratch::write_in(
            &dir,
            "model-00001-of-00002.safetensors",
            input.take(first_len),
        );
        scratch::write_in(&dir, "model-00002-of-00002.safetensors", input.rest());
    }
    if let Ok(files) = shard_files(&dir) {
        check_shards(&dir, &files);
    }
    let quantization = quantization((flags >> 1) % 3);
    let Ok(map) = load_safetensors_tensors(
        &dir,
        Dtype::Float32,
        quantization.as_ref(),
        &mut |done, total| {
            assert!(done <= total, "progress {done} of {total}");
        },
    ) else {
        return;
    };
    for (name, tensor) in &map.tensors {
        assert!(!name.starts_with("language_model."), "{name}");
        assert!(!name.starts_with("vision_tower."), "{name}");
        assert!(!name.starts_with("multi_modal_projector."), "{name}");
        if let Tensor::Quantized(q) = tensor {
            assert!(quantization.is_some(), "{name} quantized without a config");
            assert!(q.bits >= 1 && q.group_size >= 1, "{name}");
        }
    }
});

/// The shard list: inside `dir`, sorted, no duplicates.
fn check_shards(dir: &Path, files: &[std::path::PathBuf]) {
    for file in files {
        assert_eq!(
            file.parent(),
            Some(dir),
            "{} leaves the folder",
            file.display()
        );
    }
    assert!(files.windows(2).all(|w| w[0] < w[1]), "{files:?}");
}

/// The quantization a config declares: none, 4-bit groups of 64, or that
/// with `model.embed_tokens` at 8 bits in groups of 32.
fn quantization(choice: u8) -> Option<QuantizationConfig> {
    let mut overrides = BTreeMap::new();
    if choice == 2 {
        let layer = LayerQuantization {
            group_size: 32,
            bits: 8,
        };
        overrides.insert("model.embed_tokens".to_string(), Some(layer));
    }
    (choice > 0).then(|| QuantizationConfig {
        group_size: 64,
        bits: 4,
        mode: "affine".to_string(),
        overrides,
    })
}
