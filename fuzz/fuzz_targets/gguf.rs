//! GGUF files: header, metadata, tensor infos, the block decoders on the
//! tensors' bytes, and what is built from the metadata (configuration,
//! tokenizer, chat template).
//!
//! The input is the whole file. Invariants: opening never panics; an opened
//! file's tensors lie inside it, aligned, with `n_bytes` matching shape and
//! type; every tensor of a decodable type dequantizes to exactly its element
//! count (F32 bit for bit); the others are refused as unsupported; the
//! configuration, tokenizer and chat template built from the metadata are
//! either errors or usable.

#![no_main]

use gemma::chat_template::{ChatMessage, ChatTemplate, Role};
use gemma::config::Gemma3Config;
use gemma::gguf::{GgufFile, GgufTensorInfo};
use gemma::quant::{dequantize, DequantError, GgufDtype};
use gemma::tokenizer::Tokenizer;
use gemma_fuzz::scratch;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = scratch::write("input.gguf", data);
    let Ok(file) = GgufFile::open(&path) else {
        return;
    };
    check_layout(&file, data.len() as u64);
    for info in file.tensors() {
        check_dequantize(&file, info);
    }
    if let Ok(config) = Gemma3Config::from_gguf(&file) {
        gemma_fuzz::config::check(&config);
    }
    if let Ok(tokenizer) = Tokenizer::from_gguf(&file) {
        check_tokenizer(&tokenizer);
    }
    if let Ok(template) = ChatTemplate::from_gguf(&file) {
        let messages = [
            ChatMessage::new(Role::System, "Be brief."),
            ChatMessage::new(Role::User, "Hello"),
        ];
        // A model's template may reject a conversation, never panic.
        let _ = template.render(&messages, true);
    }
});

/// Alignment, offsets, sizes and names of an opened file.
fn check_layout(file: &GgufFile, file_len: u64) {
    let alignment = file.alignment();
    assert!(alignment.is_power_of_two(), "alignment {alignment}");
    assert_eq!(file.data_offset() % alignment, 0, "data offset");
    for info in file.tensors() {
        assert!(info.shape.len() <= 4, "{info:?}");
        assert!(info.offset >= file.data_offset(), "{info:?}");
        assert_eq!(
            (info.offset - file.data_offset()) % alignment,
            0,
            "{info:?}"
        );
        let end = info
            .offset
            .checked_add(info.n_bytes)
            .expect("end overflows");
        assert!(end <= file_len, "{info:?} ends past {file_len}");
        let elements = info.n_elements();
        assert_eq!(elements % info.dtype.block_size(), 0, "{info:?}");
        assert_eq!(
            info.n_bytes,
            elements / info.dtype.block_size() * info.dtype.type_size(),
            "{info:?}"
        );
        assert_eq!(
            file.tensor_bytes(info).len() as u64,
            info.n_bytes,
            "{info:?}"
        );
        assert_eq!(file.tensor(&info.name), Some(info), "lookup by name");
    }
}

/// Dequantizing one tensor: its element count, F32 bit for bit, or a refusal.
fn check_dequantize(file: &GgufFile, info: &GgufTensorInfo) {
    let bytes = file.tensor_bytes(info);
    match dequantize(info.dtype, bytes) {
        Ok(values) => {
            assert!(info.dtype.can_dequantize(), "{info:?} decoded");
            assert_eq!(values.len() as u64, info.n_elements(), "{info:?}");
            if info.dtype == GgufDtype::F32 {
                for (value, raw) in values.iter().zip(bytes.chunks_exact(4)) {
                    let raw = u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]);
                    assert_eq!(value.to_bits(), raw, "{info:?}");
                }
            }
            let named = file.dequantize_f32(&info.name).expect("by name");
            assert_eq!(named.len(), values.len(), "{info:?}");
        }
        Err(DequantError::Unsupported(dtype)) => {
            assert!(!dtype.can_dequantize(), "{dtype} refused");
        }
        Err(e) => panic!("{info:?}: a validated tensor failed to decode: {e}"),
    }
}

/// A tokenizer from GGUF metadata encodes and decodes without panicking.
fn check_tokenizer(tokenizer: &Tokenizer) {
    let special = tokenizer.special_tokens();
    let vocab = tokenizer.vocab_size();
    for id in [
        special.bos,
        special.eos,
        special.start_of_turn,
        special.end_of_turn,
    ] {
        assert!((id as usize) < vocab, "special id {id} outside {vocab}");
    }
    for text in [
        "Hello world",
        "<start_of_turn>user\n héllo 😀\t\t<end_of_turn>",
    ] {
        if let Ok(ids) = tokenizer.encode(text, true) {
            assert_eq!(ids.first(), Some(&special.bos));
            let _ = tokenizer.decode(&ids);
        }
        let _ = tokenizer.encode_plain(text);
    }
}
