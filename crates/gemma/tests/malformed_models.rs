//! Malformed models through the whole loading path ([`gemma::load::load`]):
//! each damaged input gives an `Err` whose message names the file and the
//! problem, never a panic, an abort or a hang.
//!
//! Two sources of damage:
//! - the default GGUF model (`<workspace>/target/model/gemma-3-270m-q4_k_m.gguf`;
//!   these cases skip, saying so, when it is missing), copied into a
//!   temporary folder and patched in place, or with its header rewritten in
//!   front of the original tensor data;
//! - a Hugging Face folder written by [`gemma::convert::write_hf_folder`]
//!   from a tiny random model, plain or MLX-quantized, then damaged.
//!
//! Every case prints `case <name>: <error>`.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use gemma::config::{Gemma3Config, QuantizationConfig};
use gemma::convert::write_hf_folder;
use gemma::load::{load, LoadOptions, ModelSource, WeightStorage};
use gemma::weights::{random_tensors, Tensor, TensorMap};
use mlx_core::{quantize, Dtype};
use safetensors::tensor::TensorView;
use safetensors::SafeTensors;

// ---------------------------------------------------------------------------
// Running a case
// ---------------------------------------------------------------------------

/// Loads `source`, which must fail; checks that the message names `file` and
/// contains every one of `needles`, and returns it.
fn expect_failure(case: &str, source: &ModelSource, file: &Path, needles: &[&str]) -> String {
    let options = LoadOptions {
        dtype: Dtype::Float32,
        quantize: None,
        weights: WeightStorage::Dequantized,
    };
    let message = match load(source, options, &mut |_, _| {}) {
        Ok(loaded) => panic!("case {case}: loading succeeded ({})", loaded.name),
        Err(e) => e.to_string(),
    };
    println!("case {case}: {message}");
    let file = file.display().to_string();
    assert!(
        message.contains(&file),
        "case {case}: {message:?} does not name {file}"
    );
    for needle in needles {
        assert!(
            message.contains(needle),
            "case {case}: {message:?} lacks {needle:?}"
        );
    }
    message
}

// ---------------------------------------------------------------------------
// The real GGUF file: where its header fields are
// ---------------------------------------------------------------------------

fn model_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/model/gemma-3-270m-q4_k_m.gguf")
}

/// Byte positions of one metadata entry.
struct MetaAt {
    /// The key's length field.
    start: usize,
    /// The value type field.
    type_at: usize,
    /// The value.
    value_at: usize,
    /// One past the value.
    end: usize,
}

/// Byte positions of one tensor info.
struct TensorAt {
    /// The first byte of the name.
    name_at: usize,
    /// The first dimension (u64s follow, GGUF order).
    dims_at: usize,
    /// The type id field.
    type_at: usize,
    /// The offset field.
    offset_at: usize,
}

/// The real file's header bytes and where its fields are.
struct Layout {
    header: Vec<u8>,
    /// Where tensor infos end.
    infos_end: usize,
    data_offset: u64,
    file_len: u64,
    meta: BTreeMap<String, MetaAt>,
    tensors: BTreeMap<String, TensorAt>,
}

/// A read position in header bytes; `None` when they run out.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: u64) -> Option<&[u8]> {
        let end = self.pos.checked_add(usize::try_from(n).ok()?)?;
        let slice = self.bytes.get(self.pos..end)?;
        self.pos = end;
        Some(slice)
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn string(&mut self) -> Option<String> {
        let n = self.u64()?;
        Some(String::from_utf8_lossy(self.take(n)?).into_owned())
    }

    fn skip_value(&mut self, type_id: u32) -> Option<()> {
        match type_id {
            0 | 1 | 7 => self.take(1).map(drop),
            2 | 3 => self.take(2).map(drop),
            4..=6 => self.take(4).map(drop),
            10..=12 => self.take(8).map(drop),
            8 => self.string().map(drop),
            9 => {
                let elem = self.u32()?;
                let count = self.u64()?;
                (0..count).try_for_each(|_| self.skip_value(elem))
            }
            _ => None,
        }
    }
}

fn parse_layout(header: Vec<u8>, file_len: u64) -> Option<Layout> {
    let mut r = Reader {
        bytes: &header,
        pos: 8,
    };
    let tensor_count = r.u64()?;
    let kv_count = r.u64()?;
    let mut meta = BTreeMap::new();
    for _ in 0..kv_count {
        let start = r.pos;
        let key = r.string()?;
        let type_at = r.pos;
        let type_id = r.u32()?;
        let value_at = r.pos;
        r.skip_value(type_id)?;
        meta.insert(
            key,
            MetaAt {
                start,
                type_at,
                value_at,
                end: r.pos,
            },
        );
    }
    let mut tensors = BTreeMap::new();
    for _ in 0..tensor_count {
        let name_at = r.pos + 8;
        let name = r.string()?;
        let n_dims = r.u32()?;
        let dims_at = r.pos;
        r.take(8 * u64::from(n_dims))?;
        let type_at = r.pos;
        r.u32()?;
        let offset_at = r.pos;
        r.u64()?;
        tensors.insert(
            name,
            TensorAt {
                name_at,
                dims_at,
                type_at,
                offset_at,
            },
        );
    }
    let infos_end = r.pos;
    assert!(
        !meta.contains_key("general.alignment"),
        "the rewriting below assumes the default alignment"
    );
    let data_offset = (infos_end as u64).div_ceil(32) * 32;
    Some(Layout {
        header,
        infos_end,
        data_offset,
        file_len,
        meta,
        tensors,
    })
}

/// The layout of the default model, read once; `None` when it is missing.
fn layout() -> Option<&'static Layout> {
    static LAYOUT: OnceLock<Option<Layout>> = OnceLock::new();
    LAYOUT
        .get_or_init(|| {
            let path = model_path();
            let mut file = File::open(&path).ok()?;
            let file_len = file.metadata().expect("stat").len();
            let mut header = vec![0u8; file_len.min(16 << 20) as usize];
            file.read_exact(&mut header).expect("read the header");
            Some(parse_layout(header, file_len).expect("the header fits in 16 MiB"))
        })
        .as_ref()
}

/// The layout, or `None` after saying that the GGUF cases are skipped.
fn real_model() -> Option<&'static Layout> {
    let found = layout();
    if found.is_none() {
        println!(
            "SKIPPED: the default model {} is missing (run the model download first)",
            model_path().display()
        );
    }
    found
}

impl Layout {
    fn meta(&self, key: &str) -> &MetaAt {
        self.meta
            .get(key)
            .unwrap_or_else(|| panic!("no metadata {key}"))
    }

    fn tensor(&self, name: &str) -> &TensorAt {
        self.tensors
            .get(name)
            .unwrap_or_else(|| panic!("no tensor {name}"))
    }

    fn u64_at(&self, at: usize) -> u64 {
        u64::from_le_bytes(self.header[at..at + 8].try_into().expect("8 bytes"))
    }
}

/// A copy of the default model in a fresh temporary folder.
fn copy_model() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temporary folder");
    let path = dir.path().join("damaged.gguf");
    std::fs::copy(model_path(), &path).expect("copy the model");
    (dir, path)
}

/// A copy of the default model with `bytes` written at `at`.
fn patched(patches: &[(usize, &[u8])]) -> (tempfile::TempDir, PathBuf) {
    let (dir, path) = copy_model();
    let file = OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open the copy");
    for (at, bytes) in patches {
        file.write_all_at(bytes, *at as u64).expect("patch");
    }
    (dir, path)
}

/// A file made of `header` (magic to the end of the tensor infos), padding
/// to the alignment, and the default model's tensor data.
fn rewritten(layout: &Layout, header: &[u8]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temporary folder");
    let path = dir.path().join("rewritten.gguf");
    let mut out = File::create(&path).expect("create");
    out.write_all(header).expect("write the header");
    let padding = (header.len() as u64).div_ceil(32) * 32 - header.len() as u64;
    out.write_all(&vec![0; padding as usize]).expect("pad");
    let mut source = File::open(model_path()).expect("open the model");
    source
        .seek(SeekFrom::Start(layout.data_offset))
        .expect("seek");
    std::io::copy(&mut source, &mut out).expect("copy the tensor data");
    (dir, path)
}

fn gguf(path: &Path) -> ModelSource {
    ModelSource::Gguf(path.to_path_buf())
}

// ---------------------------------------------------------------------------
// GGUF cases
// ---------------------------------------------------------------------------

#[test]
fn gguf_rewriting_an_unchanged_header_keeps_a_valid_file() {
    // The machinery of the cases below: a header rewritten unchanged in
    // front of the original data gives back the same file.
    let Some(layout) = real_model() else { return };
    let (_dir, path) = rewritten(layout, &layout.header[..layout.infos_end]);
    assert_eq!(
        std::fs::metadata(&path).expect("stat").len(),
        layout.file_len
    );
    let file = gemma::gguf::GgufFile::open(&path).expect("open");
    let config = Gemma3Config::from_gguf(&file).expect("config");
    assert_eq!((config.num_hidden_layers, config.vocab_size), (18, 262_144));
    let original = gemma::gguf::GgufFile::open(&model_path()).expect("open");
    for name in ["output_norm.weight", "blk.17.ffn_down.weight"] {
        let info = file.tensor(name).expect("tensor");
        assert_eq!(
            file.tensor_bytes(info),
            original.tensor_bytes(original.tensor(name).expect("tensor"))
        );
    }
}

#[test]
fn gguf_truncated_tensor_data() {
    let Some(layout) = real_model() else { return };
    let (_dir, path) = copy_model();
    let file = OpenOptions::new().write(true).open(&path).expect("open");
    file.set_len(layout.file_len - 1_000_000).expect("truncate");
    expect_failure(
        "gguf truncated tensor data",
        &gguf(&path),
        &path,
        &["needs", "the file has"],
    );
}

#[test]
fn gguf_header_longer_than_the_file() {
    let Some(layout) = real_model() else { return };
    let (_dir, path) = copy_model();
    let file = OpenOptions::new().write(true).open(&path).expect("open");
    // Cut inside the vocabulary, long before the tensor infos.
    let tokens = layout.meta("tokenizer.ggml.tokens");
    file.set_len(((tokens.value_at + tokens.end) / 2) as u64)
        .expect("truncate");
    expect_failure(
        "gguf header longer than the file",
        &gguf(&path),
        &path,
        &["truncated", "tokenizer.ggml.tokens"],
    );
}

#[test]
fn gguf_lying_tensor_count() {
    if real_model().is_none() {
        return;
    }
    let (_dir, path) = patched(&[(8, &(1u64 << 40).to_le_bytes())]);
    expect_failure(
        "gguf lying tensor count",
        &gguf(&path),
        &path,
        &["the tensor count is 1099511627776"],
    );
}

#[test]
fn gguf_lying_metadata_count() {
    if real_model().is_none() {
        return;
    }
    let (_dir, path) = patched(&[(16, &u64::MAX.to_le_bytes())]);
    expect_failure(
        "gguf lying metadata count",
        &gguf(&path),
        &path,
        &["the metadata count is"],
    );
}

#[test]
fn gguf_lying_string_length() {
    let Some(layout) = real_model() else { return };
    let at = layout.meta("general.name").value_at;
    let (_dir, path) = patched(&[(at, &(1u64 << 50).to_le_bytes())]);
    expect_failure(
        "gguf lying string length",
        &gguf(&path),
        &path,
        &["truncated", "metadata 'general.name'"],
    );
}

#[test]
fn gguf_lying_array_length() {
    let Some(layout) = real_model() else { return };
    // Element type (u32), then the count.
    let at = layout.meta("tokenizer.ggml.scores").value_at + 4;
    let (_dir, path) = patched(&[(at, &(1u64 << 40).to_le_bytes())]);
    expect_failure(
        "gguf lying array length",
        &gguf(&path),
        &path,
        &["the length of metadata 'tokenizer.ggml.scores' is 1099511627776"],
    );
}

#[test]
fn gguf_tensor_data_past_the_end() {
    let Some(layout) = real_model() else { return };
    let at = layout.tensor("blk.0.attn_q.weight").offset_at;
    let past = (layout.file_len - layout.data_offset).div_ceil(32) * 32;
    let (_dir, path) = patched(&[(at, &past.to_le_bytes())]);
    expect_failure(
        "gguf tensor data past the end",
        &gguf(&path),
        &path,
        &[
            "tensor 'blk.0.attn_q.weight' needs 450560 bytes",
            "the file has 0 left",
        ],
    );
}

#[test]
fn gguf_misaligned_tensor_offset() {
    let Some(layout) = real_model() else { return };
    let at = layout.tensor("blk.0.attn_q.weight").offset_at;
    let offset = layout.u64_at(at) + 1;
    let (_dir, path) = patched(&[(at, &offset.to_le_bytes())]);
    expect_failure(
        "gguf misaligned tensor offset",
        &gguf(&path),
        &path,
        &["blk.0.attn_q.weight", "not a multiple of the alignment 32"],
    );
}

#[test]
fn gguf_unknown_tensor_type() {
    let Some(layout) = real_model() else { return };
    let at = layout.tensor("blk.0.attn_k.weight").type_at;
    let (_dir, path) = patched(&[(at, &99u32.to_le_bytes())]);
    expect_failure(
        "gguf unknown tensor type",
        &gguf(&path),
        &path,
        &["tensor 'blk.0.attn_k.weight' has unknown type id 99"],
    );
}

#[test]
fn gguf_unknown_metadata_type() {
    let Some(layout) = real_model() else { return };
    let at = layout.meta("general.type").type_at;
    let (_dir, path) = patched(&[(at, &13u32.to_le_bytes())]);
    expect_failure(
        "gguf unknown metadata type",
        &gguf(&path),
        &path,
        &["metadata 'general.type' has unknown value type 13"],
    );
}

#[test]
fn gguf_rows_of_partial_blocks() {
    let Some(layout) = real_model() else { return };
    // attn_output is Q4_K (blocks of 256) with ne0 1024.
    let at = layout.tensor("blk.0.attn_output.weight").dims_at;
    let (_dir, path) = patched(&[(at, &1000u64.to_le_bytes())]);
    expect_failure(
        "gguf rows of partial blocks",
        &gguf(&path),
        &path,
        &[
            "blk.0.attn_output.weight",
            "1000 is not a multiple of the Q4_K block size 256",
        ],
    );
}

#[test]
fn gguf_duplicate_tensor_name() {
    let Some(layout) = real_model() else { return };
    let at = layout.tensor("blk.0.attn_k.weight").name_at;
    let (_dir, path) = patched(&[(at, b"blk.0.attn_v.weight")]);
    expect_failure(
        "gguf duplicate tensor name",
        &gguf(&path),
        &path,
        &["tensor 'blk.0.attn_v.weight' appears more than once"],
    );
}

#[test]
fn gguf_wrong_tensor_shape() {
    let Some(layout) = real_model() else { return };
    // attn_q is GGUF [640, 1024]: 1024 rows of 640; claim 512 rows (the
    // data then fits with room to spare, so only the model can object).
    let at = layout.tensor("blk.0.attn_q.weight").dims_at + 8;
    assert_eq!(layout.u64_at(at), 1024);
    let (_dir, path) = patched(&[(at, &512u64.to_le_bytes())]);
    expect_failure(
        "gguf wrong tensor shape",
        &gguf(&path),
        &path,
        &[
            "tensor 'model.layers.0.self_attn.q_proj.weight' has shape [512, 640]",
            "needs [1024, 640]",
        ],
    );
}

#[test]
fn gguf_tensor_gemma_does_not_have() {
    let Some(layout) = real_model() else { return };
    // The first tensor of the file, so that the case fails before the
    // 178 MB embedding is converted.
    let at = layout.tensor("output_norm.weight").name_at;
    let (_dir, path) = patched(&[(at, b"output_mask.weight")]);
    expect_failure(
        "gguf tensor Gemma does not have",
        &gguf(&path),
        &path,
        &["tensor 'output_mask.weight' is not a Gemma 3 tensor"],
    );
}

#[test]
fn gguf_missing_tensor() {
    let Some(layout) = real_model() else { return };
    // Layer 17's up projection renamed to a layer the model does not have.
    let at = layout.tensor("blk.17.ffn_up.weight").name_at;
    let (_dir, path) = patched(&[(at, b"blk.18.ffn_up.weight")]);
    expect_failure(
        "gguf missing tensor",
        &gguf(&path),
        &path,
        &["missing tensor 'model.layers.17.mlp.up_proj.weight'"],
    );
}

#[test]
fn gguf_vocabulary_larger_than_the_embedding() {
    let Some(layout) = real_model() else { return };
    // token_embd is GGUF [640, 262144]: claim fewer rows than tokens.
    let at = layout.tensor("token_embd.weight").dims_at + 8;
    assert_eq!(layout.u64_at(at), 262_144);
    let (_dir, path) = patched(&[(at, &262_000u64.to_le_bytes())]);
    expect_failure(
        "gguf vocabulary larger than the embedding",
        &gguf(&path),
        &path,
        &[
            "the tokenizer has 262144 tokens",
            "embedding has only 262000 rows",
        ],
    );
}

#[test]
fn gguf_block_count_is_a_string() {
    let Some(layout) = real_model() else { return };
    let m = layout.meta("gemma3.block_count");
    let mut header = layout.header[..m.type_at].to_vec();
    header.extend_from_slice(&8u32.to_le_bytes());
    header.extend_from_slice(&8u64.to_le_bytes());
    header.extend_from_slice(b"eighteen");
    header.extend_from_slice(&layout.header[m.end..layout.infos_end]);
    let (_dir, path) = rewritten(layout, &header);
    expect_failure(
        "gguf block_count is a string",
        &gguf(&path),
        &path,
        &[
            "field 'gemma3.block_count' is string",
            "expected a non-negative integer",
        ],
    );
}

#[test]
fn gguf_required_key_missing() {
    let Some(layout) = real_model() else { return };
    // Rename the key (same length): the value is kept under another name.
    let at = layout.meta("gemma3.embedding_length").start + 8;
    let (_dir, path) = patched(&[(at, b"gemma3.embedding_lengtx")]);
    expect_failure(
        "gguf required key missing",
        &gguf(&path),
        &path,
        &["missing field 'gemma3.embedding_length'"],
    );
}

#[test]
fn gguf_another_architecture() {
    let Some(layout) = real_model() else { return };
    let at = layout.meta("general.architecture").value_at + 8;
    let (_dir, path) = patched(&[(at, b"gemma2")]);
    expect_failure(
        "gguf another architecture",
        &gguf(&path),
        &path,
        &["general.architecture", "\"gemma2\""],
    );
}

#[test]
fn gguf_unsupported_tokenizer_model() {
    let Some(layout) = real_model() else { return };
    let at = layout.meta("tokenizer.ggml.model").value_at + 8;
    let (_dir, path) = patched(&[(at, b"gpt-2")]);
    expect_failure(
        "gguf unsupported tokenizer model",
        &gguf(&path),
        &path,
        &["tokenizer.ggml.model", "\"gpt-2\"", "only \"llama\""],
    );
}

#[test]
fn gguf_bos_id_is_not_bos() {
    let Some(layout) = real_model() else { return };
    let at = layout.meta("tokenizer.ggml.bos_token_id").value_at;
    let (_dir, path) = patched(&[(at, &5u32.to_le_bytes())]);
    expect_failure(
        "gguf BOS id is not <bos>",
        &gguf(&path),
        &path,
        &["tokenizer.ggml.bos_token_id", "at id 2"],
    );
}

#[test]
fn gguf_path_that_is_not_gguf() {
    let dir = tempfile::tempdir().expect("temporary folder");
    let path = dir.path().join("model.gguf");
    std::fs::write(&path, "{\"model_type\": \"gemma3_text\"}").expect("write");
    expect_failure(
        "file that is not GGUF",
        &gguf(&path),
        &path,
        &["not a GGUF file"],
    );
}

#[test]
fn gguf_path_that_does_not_exist() {
    let dir = tempfile::tempdir().expect("temporary folder");
    let path = dir.path().join("absent.gguf");
    expect_failure(
        "GGUF path that does not exist",
        &ModelSource::from_path(&path),
        &path,
        &["no such file or folder"],
    );
}

// ---------------------------------------------------------------------------
// Hugging Face folders
// ---------------------------------------------------------------------------

fn tiny_config() -> Gemma3Config {
    let mut c = Gemma3Config::published("270m", Some(2)).expect("published config");
    c.hidden_size = 64;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 64;
    c.query_pre_attn_scalar = 64.0;
    c.intermediate_size = 128;
    c.vocab_size = 256;
    c.sliding_window = 8;
    c.sliding_window_pattern = 2;
    c
}

/// The folder of a tiny random model; MLX-quantized (4 bits, groups of 64)
/// when `quantized`.
fn hf_folder(quantized: bool) -> (tempfile::TempDir, PathBuf) {
    let mut config = tiny_config();
    let mut tensors = random_tensors(&config, Dtype::Float32, 3).expect("random tensors");
    if quantized {
        quantize_projections(&mut tensors);
        config.quantization = Some(QuantizationConfig {
            group_size: 64,
            bits: 4,
            mode: "affine".into(),
            overrides: BTreeMap::new(),
        });
    }
    let dir = tempfile::tempdir().expect("temporary folder");
    let folder = dir.path().join("tiny-gemma");
    write_hf_folder(&tensors, &config, None, &folder).expect("write the folder");
    (dir, folder)
}

/// Replaces every 2-D weight by its 4-bit MLX quantization.
fn quantize_projections(tensors: &mut TensorMap) {
    for tensor in tensors.tensors.values_mut() {
        if let Tensor::Dense(w) = tensor {
            if w.ndim() == 2 {
                *tensor = Tensor::Quantized(quantize(w, 64, 4).expect("quantize"));
            }
        }
    }
}

fn folder(path: &Path) -> ModelSource {
    ModelSource::Folder(path.to_path_buf())
}

/// One tensor of a safetensors file, owned.
struct Entry {
    dtype: safetensors::Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

/// Reads `path`, lets `edit` change its tensors, and writes them back.
fn rewrite_safetensors(path: &Path, edit: impl FnOnce(&mut BTreeMap<String, Entry>)) {
    let bytes = std::fs::read(path).expect("read");
    let st = SafeTensors::deserialize(&bytes).expect("valid safetensors");
    let mut entries: BTreeMap<String, Entry> = st
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            let entry = Entry {
                dtype: view.dtype(),
                shape: view.shape().to_vec(),
                data: view.data().to_vec(),
            };
            (name, entry)
        })
        .collect();
    edit(&mut entries);
    let views: Vec<(String, TensorView)> = entries
        .iter()
        .map(|(name, e)| {
            let view = TensorView::new(e.dtype, e.shape.clone(), &e.data).expect("view");
            (name.clone(), view)
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).expect("write");
}

fn weights(folder: &Path) -> PathBuf {
    folder.join("model.safetensors")
}

fn edit_config(folder: &Path, edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let path = folder.join("config.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("JSON");
    edit(&mut json);
    std::fs::write(&path, json.to_string()).expect("write");
    path
}

fn write_index(folder: &Path, shards: &[(&str, &str)]) -> PathBuf {
    let map: HashMap<&str, &str> = shards.iter().copied().collect();
    let path = folder.join("model.safetensors.index.json");
    let json = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(&path, json.to_string()).expect("write");
    path
}

#[test]
fn hf_unmodified_folders_load() {
    // The sources of the cases below are valid.
    for quantized in [false, true] {
        let (_dir, path) = hf_folder(quantized);
        let options = LoadOptions {
            dtype: Dtype::Float32,
            quantize: None,
            weights: WeightStorage::Dequantized,
        };
        let loaded = load(&folder(&path), options, &mut |_, _| {})
            .unwrap_or_else(|e| panic!("quantized {quantized}: {e}"));
        assert_eq!(loaded.model.layers.len(), 2);
        assert_eq!(loaded.weight_quantization, quantized.then_some((4, 64)));
    }
}

#[test]
fn hf_config_is_not_json() {
    let (_dir, path) = hf_folder(false);
    let config = path.join("config.json");
    std::fs::write(
        &config,
        "{\"model_type\": \"gemma3_text\", \"hidden_size\": 64,",
    )
    .expect("write");
    expect_failure(
        "hf config is not JSON",
        &folder(&path),
        &config,
        &["not valid JSON"],
    );
}

#[test]
fn hf_config_is_missing() {
    let (_dir, path) = hf_folder(false);
    let config = path.join("config.json");
    std::fs::remove_file(&config).expect("remove");
    expect_failure(
        "hf config is missing",
        &folder(&path),
        &config,
        &["cannot read the file"],
    );
}

#[test]
fn hf_config_has_another_model_type() {
    let (_dir, path) = hf_folder(false);
    let config = edit_config(&path, |j| j["model_type"] = "llama".into());
    expect_failure(
        "hf config has another model type",
        &folder(&path),
        &config,
        &["model_type", "\"llama\""],
    );
}

#[test]
fn hf_config_field_of_the_wrong_type() {
    let (_dir, path) = hf_folder(false);
    let config = edit_config(&path, |j| j["hidden_size"] = "64".into());
    expect_failure(
        "hf config field of the wrong type",
        &folder(&path),
        &config,
        &["hidden_size", "expected"],
    );
}

#[test]
fn hf_config_shape_disagrees_with_the_weights() {
    let (_dir, path) = hf_folder(false);
    edit_config(&path, |j| j["intermediate_size"] = 96.into());
    expect_failure(
        "hf config shape disagrees with the weights",
        &folder(&path),
        &weights(&path),
        &[
            "mlp.gate_proj.weight' has shape [128, 64]",
            "needs [96, 64]",
        ],
    );
}

#[test]
fn hf_truncated_safetensors() {
    let (_dir, path) = hf_folder(false);
    let file = OpenOptions::new()
        .write(true)
        .open(weights(&path))
        .expect("open");
    let len = file.metadata().expect("stat").len();
    file.set_len(len - 1000).expect("truncate");
    expect_failure(
        "hf truncated safetensors",
        &folder(&path),
        &weights(&path),
        &["not a safetensors file"],
    );
}

#[test]
fn hf_safetensors_header_longer_than_the_file() {
    let (_dir, path) = hf_folder(false);
    let file = OpenOptions::new()
        .write(true)
        .open(weights(&path))
        .expect("open");
    let len = file.metadata().expect("stat").len();
    file.write_all_at(&(len * 2).to_le_bytes(), 0)
        .expect("patch");
    expect_failure(
        "hf safetensors header longer than the file",
        &folder(&path),
        &weights(&path),
        &["not a safetensors file"],
    );
}

#[test]
fn hf_tensor_of_the_wrong_shape() {
    let (_dir, path) = hf_folder(false);
    rewrite_safetensors(&weights(&path), |t| {
        let e = t
            .get_mut("model.layers.1.self_attn.k_proj.weight")
            .expect("k_proj");
        // [128, 64] f32 → [64, 64].
        e.shape = vec![64, 64];
        e.data.truncate(64 * 64 * 4);
    });
    expect_failure(
        "hf tensor of the wrong shape",
        &folder(&path),
        &weights(&path),
        &[
            "model.layers.1.self_attn.k_proj.weight' has shape [64, 64]",
            "needs [128, 64]",
        ],
    );
}

#[test]
fn hf_missing_tensor() {
    let (_dir, path) = hf_folder(false);
    rewrite_safetensors(&weights(&path), |t| {
        t.remove("model.layers.1.self_attn.o_proj.weight")
            .expect("o_proj");
    });
    expect_failure(
        "hf missing tensor",
        &folder(&path),
        &weights(&path),
        &["missing tensor 'model.layers.1.self_attn.o_proj.weight'"],
    );
}

#[test]
fn hf_extra_unknown_tensor() {
    let (_dir, path) = hf_folder(false);
    rewrite_safetensors(&weights(&path), |t| {
        let entry = Entry {
            dtype: safetensors::Dtype::F32,
            shape: vec![4],
            data: vec![0; 16],
        };
        t.insert("model.layers.0.self_attn.rotary_emb.inv_freq".into(), entry);
    });
    expect_failure(
        "hf extra unknown tensor",
        &folder(&path),
        &weights(&path),
        &[
            "model.layers.0.self_attn.rotary_emb.inv_freq",
            "is not part of a 2-layer Gemma 3",
        ],
    );
}

#[test]
fn hf_separate_output_projection() {
    let (_dir, path) = hf_folder(false);
    rewrite_safetensors(&weights(&path), |t| {
        let embed = t.get("model.embed_tokens.weight").expect("embedding");
        let copy = Entry {
            dtype: embed.dtype,
            shape: embed.shape.clone(),
            data: embed.data.clone(),
        };
        t.insert("lm_head.weight".into(), copy);
    });
    expect_failure(
        "hf separate output projection",
        &folder(&path),
        &weights(&path),
        &["lm_head.weight", "ties it to the embedding"],
    );
}

#[test]
fn hf_unsupported_dtype() {
    let (_dir, path) = hf_folder(false);
    rewrite_safetensors(&weights(&path), |t| {
        let e = t.get_mut("model.norm.weight").expect("norm");
        e.dtype = safetensors::Dtype::I32;
    });
    expect_failure(
        "hf unsupported dtype",
        &folder(&path),
        &weights(&path),
        &["tensor 'model.norm.weight' has unsupported dtype I32"],
    );
}

#[test]
fn hf_packed_weight_without_a_quantization_block() {
    let (_dir, path) = hf_folder(true);
    edit_config(&path, |j| {
        j.as_object_mut().expect("object").remove("quantization");
    });
    expect_failure(
        "hf packed weight without a quantization block",
        &folder(&path),
        &weights(&path),
        &["is packed uint32 but config.json has no \"quantization\" block"],
    );
}

#[test]
fn hf_quantized_weight_without_scales() {
    let (_dir, path) = hf_folder(true);
    rewrite_safetensors(&weights(&path), |t| {
        t.remove("model.layers.0.mlp.down_proj.scales")
            .expect("scales");
    });
    expect_failure(
        "hf quantized weight without scales",
        &folder(&path),
        &weights(&path),
        &["missing tensor 'model.layers.0.mlp.down_proj.scales'"],
    );
}

#[test]
fn hf_scales_without_a_packed_weight() {
    let (_dir, path) = hf_folder(true);
    rewrite_safetensors(&weights(&path), |t| {
        t.remove("model.layers.0.mlp.down_proj.weight")
            .expect("weight");
    });
    expect_failure(
        "hf scales without a packed weight",
        &folder(&path),
        &weights(&path),
        &["model.layers.0.mlp.down_proj.biases' has no matching packed weight"],
    );
}

#[test]
fn hf_quantization_bits_disagree_with_the_weights() {
    let (_dir, path) = hf_folder(true);
    edit_config(&path, |j| j["quantization"]["bits"] = 8.into());
    // 4-bit packing of 64 inputs is 8 uint32 per row; 8 bits would need 16.
    expect_failure(
        "hf quantization bits disagree with the weights",
        &folder(&path),
        &weights(&path),
        &[
            "model.embed_tokens.weight' has shape [256, 8]",
            "needs [256, 16]",
        ],
    );
}

#[test]
fn hf_index_names_a_missing_shard() {
    let (_dir, path) = hf_folder(false);
    std::fs::rename(
        weights(&path),
        path.join("model-00001-of-00002.safetensors"),
    )
    .expect("rename");
    write_index(
        &path,
        &[
            (
                "model.embed_tokens.weight",
                "model-00001-of-00002.safetensors",
            ),
            ("model.norm.weight", "model-00002-of-00002.safetensors"),
        ],
    );
    let missing = path.join("model-00002-of-00002.safetensors");
    expect_failure(
        "hf index names a missing shard",
        &folder(&path),
        &missing,
        &["cannot open"],
    );
}

#[test]
fn hf_index_shard_outside_the_folder() {
    let (_dir, path) = hf_folder(false);
    let index = write_index(&path, &[("model.norm.weight", "../model.safetensors")]);
    expect_failure(
        "hf index shard outside the folder",
        &folder(&path),
        &index,
        &["shard name '../model.safetensors' leaves the folder"],
    );
}

#[test]
fn hf_index_shard_names_that_are_not_file_names() {
    // Found by the safetensors fuzz target: "" joined to the folder is the
    // folder itself.
    for name in ["", "."] {
        let (_dir, path) = hf_folder(false);
        let index = write_index(&path, &[("model.norm.weight", name)]);
        expect_failure(
            "hf index shard that is not a file name",
            &folder(&path),
            &index,
            &[&format!("shard name '{name}' is not a file name")],
        );
    }
}

#[test]
fn hf_index_is_not_json() {
    let (_dir, path) = hf_folder(false);
    let index = path.join("model.safetensors.index.json");
    std::fs::write(&index, "{\"weight_map\": {").expect("write");
    expect_failure(
        "hf index is not JSON",
        &folder(&path),
        &index,
        &["not JSON"],
    );
}

#[test]
fn hf_folder_without_weights() {
    let (_dir, path) = hf_folder(false);
    std::fs::remove_file(weights(&path)).expect("remove");
    expect_failure(
        "hf folder without weights",
        &folder(&path),
        &path,
        &["no model.safetensors and no model.safetensors.index.json"],
    );
}

#[test]
fn hf_broken_tokenizer_json() {
    let (_dir, path) = hf_folder(false);
    let tokenizer = path.join("tokenizer.json");
    std::fs::write(&tokenizer, "{\"model\": {\"type\": \"Unigram\"").expect("write");
    expect_failure(
        "hf broken tokenizer.json",
        &folder(&path),
        &tokenizer,
        &["EOF while parsing"],
    );
}
