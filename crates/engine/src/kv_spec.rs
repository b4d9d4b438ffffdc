//! KV-cache specs in llama.cpp's style: `ctk=q8_0,ctv=q4_0`, plus `group=`,
//! `start=` and `attn=`.
//!
//! A type name means what it means in llama.cpp wherever llama.cpp has it:
//! `q8_0`, `q4_0`, `q4_1`, `q5_0`, `q5_1`, `iq4_nl` are ggml's 32-value blocks, byte
//! for byte as llama.cpp stores its cache, on either device; `turbo2`,
//! `turbo3`, `turbo4` are TurboQuant as the llama.cpp TurboQuant fork
//! stores it (groups of 128 values); `f32`, `f16`, `bf16` store unquantized
//! in that dtype. MLX's affine formats (mlx-lm's `QuantizedKVCache`) have
//! names of their own: `mlx8`, `mlx6`, `mlx5`, `mlx4`, `mlx3`, `mlx2`, with
//! `group=` 32, 64 or 128 values per scale and bias. A missing `ctk` or
//! `ctv` means the compute dtype.
//!
//! Until this release `q8_0`, `q4_0` and `q5_0` named MLX's 8-, 4- and
//! 5-bit affine formats (as REFRACT's MLX backend does); [`KvSpec::notes`]
//! says so where a spec uses them. The other old names (`q8`, `q6_K`, `q4`,
//! …) are errors that name the affine format they meant.
//!
//! `attn=llama-cpu` treats the queries as llama.cpp's CPU flash attention
//! does (see [`QueryRounding::LlamaCpu`]), so that a format's cost can be
//! measured with llama.cpp's arithmetic as well as with ours
//! (`attn=exact`, the default).
//!
//! A spec is a policy when parts follow it: `BASE;LAYERS:SETTINGS;…`, each
//! part setting `ctk`, `ctv` and `group` (joined by `,` or `+`) for the
//! layers it names ([`crate::kv_layers`]), later parts winning. For example
//! `ctk=q8_0,ctv=turbo2;first2,last2:ctv=q8_0` is the TurboQuant fork's
//! "boundary V" (`TURBO_LAYER_ADAPTIVE=7`).
//!
//! `rot=k`, `rot=v` or `rot=kv` rotates that side by a Walsh–Hadamard
//! matrix before it is stored, as upstream llama.cpp does for quantized
//! caches (see [`Rotation`]); `rot=none` (the default) does not.

use gemma::cache::{CacheFormat, KvFormat, LayerFormats, QueryRounding, Rotation};
use gemma::config::Gemma3Config;
use gemma::quant::GgufDtype;
use mlx_core::Dtype;

use crate::kv_layers::{parse_layer_sets, runs, LayerSet};

/// Accepted type names, for error messages.
pub const ACCEPTED_TYPES: &str = "q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, turbo2, turbo3, \
                                  turbo4, mlx8, mlx6, mlx5, mlx4, mlx3, mlx2, f32, f16, bf16";

/// The ggml block formats by their llama.cpp names.
const BLOCK_TYPES: [(&str, GgufDtype); 6] = [
    ("q8_0", GgufDtype::Q8_0),
    ("q4_0", GgufDtype::Q4_0),
    ("q4_1", GgufDtype::Q4_1),
    ("q5_0", GgufDtype::Q5_0),
    ("q5_1", GgufDtype::Q5_1),
    ("iq4_nl", GgufDtype::IQ4_NL),
];

/// Names accepted before, that llama.cpp has no KV type for, with the
/// affine bits they meant.
const RETIRED_NAMES: [(&str, i32); 11] = [
    ("q8", 8),
    ("q6_K", 6),
    ("q6", 6),
    ("q5_K", 5),
    ("q5", 5),
    ("q4_K", 4),
    ("q4", 4),
    ("q3_K", 3),
    ("q3", 3),
    ("q2_K", 2),
    ("q2", 2),
];

/// One side (keys or values) of a spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvType {
    /// The model's compute dtype.
    Compute,
    /// Unquantized in this dtype.
    Float(Dtype),
    /// MLX affine quantization with this many bits (`mlxN`).
    Affine(i32),
    /// One of ggml's 32-value block formats.
    Block(GgufDtype),
    /// TurboQuant with this many bits (2, 3 or 4).
    Turbo(i32),
}

impl KvType {
    /// The type a name stands for, or why the name is not accepted.
    fn parse(text: &str) -> Result<KvType, String> {
        if let Some((_, t)) = BLOCK_TYPES.iter().find(|(name, _)| *name == text) {
            return Ok(KvType::Block(*t));
        }
        if let Some(bits) = text.strip_prefix("mlx").and_then(|b| b.parse().ok()) {
            if [2, 3, 4, 5, 6, 8].contains(&bits) {
                return Ok(KvType::Affine(bits));
            }
        }
        let retired = RETIRED_NAMES
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(text));
        if let Some((name, bits)) = retired {
            return Err(format!(
                "'{name}' is not a llama.cpp KV type; MLX's {bits}-bit affine format, which it \
                 named before, is mlx{bits} (accepted: {ACCEPTED_TYPES})"
            ));
        }
        Ok(match text {
            "turbo2" => KvType::Turbo(2),
            "turbo3" => KvType::Turbo(3),
            "turbo4" => KvType::Turbo(4),
            "f32" => KvType::Float(Dtype::Float32),
            "f16" => KvType::Float(Dtype::Float16),
            "bf16" => KvType::Float(Dtype::Bfloat16),
            _ => {
                return Err(format!(
                    "unknown type '{text}' (accepted: {ACCEPTED_TYPES})"
                ))
            }
        })
    }

    fn canonical(self, compute: Dtype) -> String {
        match self {
            KvType::Compute => short_dtype(compute).into(),
            KvType::Float(d) => short_dtype(d).into(),
            KvType::Affine(b) => format!("mlx{b}"),
            KvType::Block(t) => block_name(t).into(),
            KvType::Turbo(b) => format!("turbo{b}"),
        }
    }

    fn format(self, group_size: i32) -> KvFormat {
        match self {
            KvType::Compute => KvFormat::Float(None),
            KvType::Float(d) => KvFormat::Float(Some(d)),
            KvType::Affine(bits) => KvFormat::Quantized { bits, group_size },
            KvType::Block(t) => KvFormat::Block(t),
            KvType::Turbo(bits) => KvFormat::Turbo { bits },
        }
    }

    fn is_turbo(self) -> bool {
        matches!(self, KvType::Turbo(_))
    }

    fn is_affine(self) -> bool {
        matches!(self, KvType::Affine(_))
    }

    /// What changed about this type's name, for a user who knew it before.
    fn note(self) -> Option<String> {
        let KvType::Block(t) = self else {
            return None;
        };
        let bits = match t {
            GgufDtype::Q8_0 => 8,
            GgufDtype::Q4_0 => 4,
            GgufDtype::Q5_0 => 5,
            _ => return None,
        };
        let name = block_name(t);
        Some(format!(
            "{name} is llama.cpp's {name} (blocks of 32 values with one f16 scale); MLX's \
             {bits}-bit affine format, which {name} named before, is mlx{bits}"
        ))
    }
}

/// llama.cpp's name of a block format.
fn block_name(t: GgufDtype) -> &'static str {
    BLOCK_TYPES
        .iter()
        .find(|(_, b)| *b == t)
        .map_or("?", |(name, _)| name)
}

fn short_dtype(d: Dtype) -> &'static str {
    match d {
        Dtype::Float16 => "f16",
        Dtype::Bfloat16 => "bf16",
        _ => "f32",
    }
}

/// A parsed KV-cache spec: a base for every layer and, after `;`, parts
/// that set other formats for some layers (later parts win).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvSpec {
    /// The text as the user typed it.
    pub text: String,
    /// Keys.
    pub keys: KvType,
    /// Values.
    pub values: KvType,
    /// Affine quantization group size of `mlxN` (32, 64 or 128; ggml
    /// blocks hold 32 values and TurboQuant groups 128).
    pub group_size: i32,
    /// Tokens kept unquantized before quantization starts.
    pub start: usize,
    /// How attention treats the queries.
    pub queries: QueryRounding,
    /// Which sides are Hadamard-rotated before they are stored (`rot=`).
    pub rotation: Rotation,
    /// The per-layer parts, in order.
    pub layers: Vec<LayerPart>,
}

/// One `LAYERS:SETTINGS` part of a spec: what it changes for its layers
/// (`None`: what the base and earlier parts say).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerPart {
    /// The layers it applies to.
    pub sets: Vec<LayerSet>,
    /// Keys.
    pub keys: Option<KvType>,
    /// Values.
    pub values: Option<KvType>,
    /// Affine group size.
    pub group_size: Option<i32>,
    /// Rotated sides.
    pub rotation: Option<Rotation>,
}

/// What one layer's cache holds under a spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerSpec {
    /// Keys.
    pub keys: KvType,
    /// Values.
    pub values: KvType,
    /// Affine group size (used when a side is `mlxN`).
    pub group_size: i32,
    /// Rotated sides.
    pub rotation: Rotation,
}

impl LayerSpec {
    fn has_affine(&self) -> bool {
        self.keys.is_affine() || self.values.is_affine()
    }

    /// The cache format.
    pub fn format(&self) -> CacheFormat {
        CacheFormat {
            keys: self.keys.format(self.group_size),
            values: self.values.format(self.group_size),
            rotation: self.rotation,
        }
    }

    /// `ctk=…,ctv=…`, with `,group=…` when a side is MLX affine and
    /// `,rot=…` when a side is rotated.
    pub fn canonical(&self, compute: Dtype) -> String {
        self.canonical_with_group(compute, self.has_affine())
    }

    /// [`LayerSpec::canonical`], with `,group=…` also when `group` says so.
    fn canonical_with_group(&self, compute: Dtype, group: bool) -> String {
        let group = if group {
            format!(",group={}", self.group_size)
        } else {
            String::new()
        };
        let rot = match rotation_name(self.rotation) {
            "none" => String::new(),
            name => format!(",rot={name}"),
        };
        format!(
            "ctk={},ctv={}{group}{rot}",
            self.keys.canonical(compute),
            self.values.canonical(compute)
        )
    }
}

/// A spec that cannot be parsed.
#[derive(Debug, thiserror::Error)]
#[error("KV spec '{spec}': {problem}")]
pub struct KvSpecError {
    /// The spec.
    pub spec: String,
    /// What is wrong.
    pub problem: String,
}

/// The settings one part of a spec gives (`None`: not given).
#[derive(Debug, Default)]
struct Settings {
    keys: Option<KvType>,
    values: Option<KvType>,
    group_size: Option<i32>,
    start: Option<usize>,
    queries: Option<QueryRounding>,
    rotation: Option<Rotation>,
}

/// The keys a part may give, for error messages.
const KEYS: &str = "ctk, ctv, group, rot, start, attn";

/// `rot=`'s values and what they rotate.
const ROTATIONS: [(&str, Rotation); 4] = [
    ("none", Rotation::NONE),
    (
        "k",
        Rotation {
            keys: true,
            values: false,
        },
    ),
    (
        "v",
        Rotation {
            keys: false,
            values: true,
        },
    ),
    (
        "kv",
        Rotation {
            keys: true,
            values: true,
        },
    ),
];

/// The name of a rotation in `rot=`.
fn rotation_name(rotation: Rotation) -> &'static str {
    ROTATIONS
        .iter()
        .find(|(_, r)| *r == rotation)
        .map_or("none", |(name, _)| name)
}

/// Parses `KEY=VALUE,…` (any subset, any order, each key once).
fn parse_settings(text: &str) -> Result<Settings, String> {
    let mut settings = Settings::default();
    let mut seen = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, value) = part
            .split_once('=')
            .ok_or_else(|| format!("'{part}' is not KEY=VALUE (keys: {KEYS})"))?;
        let (key, value) = (key.trim(), value.trim());
        if seen.contains(&key) {
            return Err(format!("'{key}' is given twice"));
        }
        seen.push(key);
        match key {
            "ctk" => settings.keys = Some(KvType::parse(value).map_err(|e| format!("ctk: {e}"))?),
            "ctv" => settings.values = Some(KvType::parse(value).map_err(|e| format!("ctv: {e}"))?),
            "group" => {
                settings.group_size = Some(match value {
                    "32" => 32,
                    "64" => 64,
                    "128" => 128,
                    _ => {
                        return Err(format!(
                            "group '{value}' is not accepted (accepted: 32, 64, 128)"
                        ))
                    }
                })
            }
            "attn" => {
                settings.queries = Some(match value {
                    "exact" => QueryRounding::Exact,
                    "llama-cpu" => QueryRounding::LlamaCpu,
                    _ => {
                        return Err(format!(
                            "attn '{value}' is not accepted (accepted: exact, llama-cpu)"
                        ))
                    }
                })
            }
            "rot" => {
                settings.rotation = Some(
                    ROTATIONS
                        .iter()
                        .find(|(name, _)| *name == value)
                        .map(|(_, r)| *r)
                        .ok_or_else(|| {
                            format!("rot '{value}' is not accepted (accepted: k, v, kv, none)")
                        })?,
                )
            }
            "start" => {
                settings.start = Some(value.parse().map_err(|_| {
                    format!("start '{value}' is not a token count (a whole number ≥ 0)")
                })?);
            }
            _ => return Err(format!("unknown key '{key}' (accepted: {KEYS})")),
        }
    }
    Ok(settings)
}

impl KvSpec {
    /// Parses `ctk=…,ctv=…,group=…,start=…,attn=…` (any subset, any order;
    /// an empty spec means the compute dtype for both), followed by any
    /// number of `;LAYERS:SETTINGS` parts ([`crate::kv_layers`]) whose
    /// `ctk`, `ctv` and `group` apply to those layers.
    pub fn parse(text: &str) -> Result<KvSpec, KvSpecError> {
        let err = |problem: String| KvSpecError {
            spec: text.to_string(),
            problem,
        };
        let mut parts = text.split(';');
        let base = parse_settings(parts.next().unwrap_or("")).map_err(err)?;
        let mut spec = KvSpec {
            text: text.to_string(),
            keys: base.keys.unwrap_or(KvType::Compute),
            values: base.values.unwrap_or(KvType::Compute),
            group_size: base.group_size.unwrap_or(64),
            start: base.start.unwrap_or(0),
            queries: base.queries.unwrap_or(QueryRounding::Exact),
            rotation: base.rotation.unwrap_or(Rotation::NONE),
            layers: Vec::new(),
        };
        for part in parts.map(str::trim) {
            spec.layers.push(parse_part(part).map_err(err)?);
        }
        if base.group_size.is_some() && !spec.affine_anywhere() {
            let other = if spec.has_turbo() {
                "TurboQuant encodes groups of 128 values"
            } else {
                "ggml blocks hold 32 values"
            };
            return Err(err(format!(
                "group= sets the group of MLX's affine formats (mlx2 … mlx8) only ({other}); \
                 leave it out"
            )));
        }
        Ok(spec)
    }

    /// Whether keys or values are TurboQuant.
    fn has_turbo(&self) -> bool {
        self.keys.is_turbo() || self.values.is_turbo()
    }

    /// Whether keys or values are MLX affine.
    fn has_affine(&self) -> bool {
        self.keys.is_affine() || self.values.is_affine()
    }

    /// Whether a side of the base or of any part is MLX affine.
    fn affine_anywhere(&self) -> bool {
        self.has_affine()
            || self.layers.iter().any(|p| {
                p.keys.is_some_and(KvType::is_affine) || p.values.is_some_and(KvType::is_affine)
            })
    }

    /// What changed about the meaning of the spec's type names (one line
    /// each; empty when nothing did): `q8_0`, `q4_0` and `q5_0` named MLX's
    /// affine formats before this release.
    pub fn notes(&self) -> Vec<String> {
        let parts = self.layers.iter().flat_map(|p| [p.keys, p.values]);
        let mut notes: Vec<String> = [Some(self.keys), Some(self.values)]
            .into_iter()
            .chain(parts)
            .flatten()
            .filter_map(KvType::note)
            .collect();
        notes.sort();
        notes.dedup();
        notes
    }

    /// The base's canonical form, e.g. `ctk=q8_0,ctv=mlx4,group=64,start=0`
    /// (`group=` only when a side is MLX affine, the one kind it applies to;
    /// `attn=llama-cpu` last when given), then each layer part as written
    /// (its sets, then the `ctk`, `ctv`, `group` it gives). Reports use
    /// [`KvSpec::canonical_on`], which names each layer's format.
    pub fn canonical(&self, compute: Dtype) -> String {
        let parts_take_group = self.affine_anywhere() && self.group_size != 64;
        let mut text = self.base_canonical(compute, parts_take_group);
        for part in &self.layers {
            let sets: Vec<String> = part.sets.iter().map(ToString::to_string).collect();
            let mut settings = Vec::new();
            if let Some(k) = part.keys {
                settings.push(format!("ctk={}", k.canonical(compute)));
            }
            if let Some(v) = part.values {
                settings.push(format!("ctv={}", v.canonical(compute)));
            }
            if let Some(g) = part.group_size {
                settings.push(format!("group={g}"));
            }
            if let Some(r) = part.rotation {
                settings.push(format!("rot={}", rotation_name(r)));
            }
            text.push_str(&format!(";{}:{}", sets.join(","), settings.join(",")));
        }
        text
    }

    /// The canonical form on a model: [`KvSpec::canonical`]'s base, then,
    /// where layers differ from it, one part per run of such layers by
    /// index with its full format (`;0-1:ctk=q8_0,ctv=q8_0`), so that the
    /// policy that ran reads layer by layer.
    pub fn canonical_on(
        &self,
        compute: Dtype,
        config: &Gemma3Config,
    ) -> Result<String, KvSpecError> {
        let mut text = self.base_canonical(compute, false);
        let base = self.base_layer();
        for (first, last, layer) in runs(&self.layer_specs(config)?) {
            if layer == base {
                continue;
            }
            let set = LayerSet::Range { first, last };
            text.push_str(&format!(";{set}:{}", layer.canonical(compute)));
        }
        Ok(text)
    }

    /// The base's canonical form; its `group=` is written when the base is
    /// MLX affine or `parts_take_group` (parts as written, where an affine
    /// side without a group of its own takes the base's; the parts of
    /// [`KvSpec::canonical_on`] name theirs).
    fn base_canonical(&self, compute: Dtype, parts_take_group: bool) -> String {
        let base = self.base_layer();
        let group = base.has_affine() || parts_take_group;
        format!(
            "{},start={}{}",
            base.canonical_with_group(compute, group),
            self.start,
            match self.queries {
                QueryRounding::Exact => "",
                QueryRounding::LlamaCpu => ",attn=llama-cpu",
            }
        )
    }

    fn base_layer(&self) -> LayerSpec {
        LayerSpec {
            keys: self.keys,
            values: self.values,
            group_size: self.group_size,
            rotation: self.rotation,
        }
    }

    /// Each layer's keys, values and group on a model, or which part names
    /// layers the model lacks or sets a group no affine side of its layers
    /// uses.
    pub fn layer_specs(&self, config: &Gemma3Config) -> Result<Vec<LayerSpec>, KvSpecError> {
        let err = |problem: String| KvSpecError {
            spec: self.text.clone(),
            problem,
        };
        let mut layers = vec![self.base_layer(); config.num_hidden_layers];
        for part in &self.layers {
            for set in &part.sets {
                set.check(config).map_err(err)?;
            }
            let mut affine = false;
            for (i, layer) in layers.iter_mut().enumerate() {
                if !part.sets.iter().any(|s| s.contains(i, config)) {
                    continue;
                }
                layer.keys = part.keys.unwrap_or(layer.keys);
                layer.values = part.values.unwrap_or(layer.values);
                layer.group_size = part.group_size.unwrap_or(layer.group_size);
                layer.rotation = part.rotation.unwrap_or(layer.rotation);
                affine |= layer.has_affine();
            }
            if part.group_size.is_some() && !affine {
                return Err(err(format!(
                    "a part for '{}' sets group=, but none of its layers has an MLX affine \
                     side (mlx2 … mlx8)",
                    part.sets
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(",")
                )));
            }
        }
        Ok(layers)
    }

    /// The cache formats of a model's layers: one for all without layer
    /// parts, one per layer with them.
    pub fn layer_formats(&self, config: &Gemma3Config) -> Result<LayerFormats, KvSpecError> {
        if self.layers.is_empty() {
            return Ok(LayerFormats::Uniform(self.base_layer().format()));
        }
        Ok(LayerFormats::PerLayer(
            self.layer_specs(config)?
                .iter()
                .map(LayerSpec::format)
                .collect(),
        ))
    }
}

/// Parses one `LAYERS:SETTINGS` part.
fn parse_part(part: &str) -> Result<LayerPart, String> {
    let (sets, settings) = part.split_once(':').ok_or_else(|| {
        format!(
            "'{part}' is not LAYERS:SETTINGS (after ';', e.g. global:ctk=q8_0,ctv=q8_0 or \
             0-1,last2:ctv=q8_0)"
        )
    })?;
    let sets = parse_layer_sets(sets.trim()).map_err(|e| format!("'{part}': {e}"))?;
    // `+` joins a part's settings as `,` does: REFRACT splits a spec at its
    // commas and keeps the last `ctk=`/`ctv=` fragment, so a part spelled
    // `global:ctk=q8_0+ctv=q8_0` reaches the backend whole.
    let settings =
        parse_settings(&settings.replace('+', ",")).map_err(|e| format!("'{part}': {e}"))?;
    if settings.start.is_some() || settings.queries.is_some() {
        return Err(format!(
            "'{part}': start= and attn= apply to every layer; give them in the first part"
        ));
    }
    if settings.keys.is_none()
        && settings.values.is_none()
        && settings.group_size.is_none()
        && settings.rotation.is_none()
    {
        return Err(format!(
            "'{part}' sets nothing for its layers (give ctk=, ctv=, group= or rot=)"
        ));
    }
    Ok(LayerPart {
        sets,
        keys: settings.keys,
        values: settings.values,
        group_size: settings.group_size,
        rotation: settings.rotation,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_llama_cpp_style_specs() {
        let spec = KvSpec::parse("ctk=q8_0,ctv=q4_0").unwrap();
        assert_eq!(
            (spec.keys, spec.values, spec.group_size, spec.start),
            (
                KvType::Block(GgufDtype::Q8_0),
                KvType::Block(GgufDtype::Q4_0),
                64,
                0
            )
        );
        assert_eq!(spec.canonical(Dtype::Float32), "ctk=q8_0,ctv=q4_0,start=0");
        let spec = KvSpec::parse(" ctv=mlx6 , group=32,ctk=f16").unwrap();
        assert_eq!(
            spec.canonical(Dtype::Float32),
            "ctk=f16,ctv=mlx6,group=32,start=0"
        );
        assert_eq!(
            KvSpec::parse("").unwrap().canonical(Dtype::Bfloat16),
            "ctk=bf16,ctv=bf16,start=0"
        );
        assert_eq!(
            KvSpec::parse("ctk=mlx2,ctv=q5_1")
                .unwrap()
                .canonical(Dtype::Float32),
            "ctk=mlx2,ctv=q5_1,group=64,start=0"
        );
    }

    #[test]
    fn parses_turbo_types_on_either_side() {
        let spec = KvSpec::parse("ctk=q8_0,ctv=turbo4").unwrap();
        assert_eq!(
            (spec.keys, spec.values),
            (KvType::Block(GgufDtype::Q8_0), KvType::Turbo(4))
        );
        assert_eq!(
            spec.canonical(Dtype::Float32),
            "ctk=q8_0,ctv=turbo4,start=0"
        );
        let f = KvSpec::parse("ctk=turbo3,ctv=f16,start=16")
            .unwrap()
            .base_layer()
            .format();
        assert_eq!(f.keys, KvFormat::Turbo { bits: 3 });
        assert_eq!(f.values, KvFormat::Float(Some(Dtype::Float16)));
        for text in [
            "ctk=turbo2,ctv=turbo2",
            "ctk=turbo4,ctv=mlx8,start=7",
            "ctk=q4_1,ctv=mlx4,group=128",
        ] {
            let canonical = KvSpec::parse(text).unwrap().canonical(Dtype::Float32);
            assert_eq!(
                KvSpec::parse(&canonical).unwrap().canonical(Dtype::Float32),
                canonical
            );
        }
    }

    #[test]
    fn maps_types_to_cache_formats() {
        let f = KvSpec::parse("ctk=mlx5,ctv=bf16,group=128")
            .unwrap()
            .base_layer()
            .format();
        assert_eq!(
            f.keys,
            KvFormat::Quantized {
                bits: 5,
                group_size: 128
            }
        );
        assert_eq!(f.values, KvFormat::Float(Some(Dtype::Bfloat16)));
        let f = KvSpec::parse("ctv=q5_0").unwrap().base_layer().format();
        assert_eq!(f.keys, KvFormat::Float(None));
        assert_eq!(f.values, KvFormat::Block(GgufDtype::Q5_0));
    }

    #[test]
    fn attn_selects_llama_cpps_query_rounding() {
        let spec = KvSpec::parse("ctk=q8_0,ctv=q8_0,attn=llama-cpu").unwrap();
        assert_eq!(spec.queries, QueryRounding::LlamaCpu);
        let canonical = spec.canonical(Dtype::Float32);
        assert_eq!(canonical, "ctk=q8_0,ctv=q8_0,start=0,attn=llama-cpu");
        assert_eq!(
            KvSpec::parse(&canonical).unwrap().queries,
            QueryRounding::LlamaCpu
        );
        let exact = KvSpec::parse("ctk=q8_0,attn=exact").unwrap();
        assert_eq!(exact.queries, QueryRounding::Exact);
        assert_eq!(exact.canonical(Dtype::Float32), "ctk=q8_0,ctv=f32,start=0");
    }

    #[test]
    fn names_whose_meaning_changed_carry_a_note() {
        let notes = KvSpec::parse("ctk=q8_0,ctv=q8_0").unwrap().notes();
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].contains("q8_0") && notes[0].contains("mlx8"));
        let notes = KvSpec::parse("ctk=q4_0,ctv=q5_0").unwrap().notes();
        assert!(
            notes[0].contains("mlx4") && notes[1].contains("mlx5"),
            "{notes:?}"
        );
        for text in ["ctk=q4_1,ctv=q5_1", "ctk=mlx8,ctv=turbo3", ""] {
            assert!(KvSpec::parse(text).unwrap().notes().is_empty(), "{text}");
        }
    }

    #[test]
    fn retired_names_say_what_they_meant() {
        for (name, new) in [
            ("q6_K", "mlx6"),
            ("q8", "mlx8"),
            ("q4_k", "mlx4"),
            ("q2", "mlx2"),
        ] {
            let e = KvSpec::parse(&format!("ctk={name}"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(new) && e.contains("q4_1"), "{e}");
        }
        assert_eq!(
            KvSpec::parse("ctk=iq4_nl,ctv=q8_0").unwrap().keys,
            KvType::Block(GgufDtype::IQ4_NL)
        );
        assert!(KvSpec::parse("ctk=mlx7").is_err());
    }

    #[test]
    fn rejects_bad_specs_listing_what_is_accepted() {
        let e = KvSpec::parse("ctk=turbo5").unwrap_err().to_string();
        assert!(
            e.contains("turbo5") && e.contains("turbo4") && e.contains("q8_0"),
            "{e}"
        );
        for text in ["ctk=turbo3,ctv=q4_0,group=64", "ctk=q8_0,group=32"] {
            let e = KvSpec::parse(text).unwrap_err().to_string();
            assert!(e.contains("group=") && e.contains("mlx2"), "{e}");
        }
        let mixed = KvSpec::parse("ctk=mlx8,ctv=turbo3,group=32").unwrap();
        assert_eq!(
            mixed.canonical(Dtype::Float32),
            "ctk=mlx8,ctv=turbo3,group=32,start=0",
            "group= sets the affine side's group"
        );
        assert!(KvSpec::parse("ctk=mlx4,group=48")
            .unwrap_err()
            .to_string()
            .contains("32, 64, 128"));
        assert!(KvSpec::parse("start=-1")
            .unwrap_err()
            .to_string()
            .contains("start"));
        assert!(KvSpec::parse("ctk")
            .unwrap_err()
            .to_string()
            .contains("KEY=VALUE"));
        assert!(KvSpec::parse("bits=4")
            .unwrap_err()
            .to_string()
            .contains("ctk, ctv, group, rot, start, attn"));
        assert!(KvSpec::parse("attn=fast")
            .unwrap_err()
            .to_string()
            .contains("exact, llama-cpu"));
        assert!(KvSpec::parse("ctk=mlx8,ctk=mlx4")
            .unwrap_err()
            .to_string()
            .contains("twice"));
    }

    /// Gemma 3 270M: 18 layers, 5, 11 and 17 global.
    fn gemma_270m() -> Gemma3Config {
        Gemma3Config::published("270m", None).unwrap()
    }

    #[test]
    fn layer_parts_override_their_layers_later_parts_winning() {
        let c = gemma_270m();
        let spec =
            KvSpec::parse("ctk=turbo3,ctv=turbo3;global:ctk=q8_0,ctv=q8_0;17:ctv=mlx4").unwrap();
        let layers = spec.layer_specs(&c).unwrap();
        let q8 = KvType::Block(GgufDtype::Q8_0);
        for (i, layer) in layers.iter().enumerate() {
            let expected = match i {
                5 | 11 => (q8, q8),
                17 => (q8, KvType::Affine(4)),
                _ => (KvType::Turbo(3), KvType::Turbo(3)),
            };
            assert_eq!((layer.keys, layer.values), expected, "layer {i}");
        }
        assert_eq!(
            spec.canonical(Dtype::Float32),
            "ctk=turbo3,ctv=turbo3,start=0;global:ctk=q8_0,ctv=q8_0;17:ctv=mlx4"
        );
        assert_eq!(
            spec.canonical_on(Dtype::Float32, &c).unwrap(),
            "ctk=turbo3,ctv=turbo3,start=0;5:ctk=q8_0,ctv=q8_0;11:ctk=q8_0,ctv=q8_0;\
             17:ctk=q8_0,ctv=mlx4,group=64"
        );
        let LayerFormats::PerLayer(formats) = spec.layer_formats(&c).unwrap() else {
            panic!("a policy with parts gives one format per layer");
        };
        assert_eq!(formats.len(), 18);
        assert_eq!(formats[5].keys, KvFormat::Block(GgufDtype::Q8_0));
        assert_eq!(formats[0].values, KvFormat::Turbo { bits: 3 });
    }

    #[test]
    fn the_forks_boundary_mode_reads_layer_by_layer_and_round_trips() {
        let c = gemma_270m();
        let spec = KvSpec::parse("ctk=q8_0,ctv=turbo2;first2,last2:ctv=q8_0").unwrap();
        let expanded = spec.canonical_on(Dtype::Float32, &c).unwrap();
        assert_eq!(
            expanded,
            "ctk=q8_0,ctv=turbo2,start=0;0-1:ctk=q8_0,ctv=q8_0;16-17:ctk=q8_0,ctv=q8_0"
        );
        let again = KvSpec::parse(&expanded).unwrap();
        assert_eq!(
            again.layer_specs(&c).unwrap(),
            spec.layer_specs(&c).unwrap()
        );
        assert_eq!(again.canonical_on(Dtype::Float32, &c).unwrap(), expanded);
        let written = spec.canonical(Dtype::Float32);
        assert_eq!(
            KvSpec::parse(&written).unwrap().canonical(Dtype::Float32),
            written
        );
        // A part that changes nothing leaves the uniform cache.
        let same = KvSpec::parse("ctk=q8_0,ctv=q8_0;global:ctk=q8_0").unwrap();
        assert_eq!(
            same.canonical_on(Dtype::Float32, &c).unwrap(),
            "ctk=q8_0,ctv=q8_0,start=0"
        );
        assert!(
            KvSpec::parse("ctk=q8_0")
                .unwrap()
                .layer_formats(&c)
                .unwrap()
                == LayerFormats::Uniform(KvSpec::parse("ctk=q8_0").unwrap().base_layer().format())
        );
    }

    #[test]
    fn bad_policies_say_what_is_wrong() {
        for (text, says) in [
            ("ctk=q8_0;global", "LAYERS:SETTINGS"),
            ("ctk=q8_0;global:", "sets nothing"),
            ("ctk=q8_0;;", "LAYERS:SETTINGS"),
            ("ctk=q8_0;0-3,2-5:ctv=q8_0", "twice"),
            ("ctk=q8_0;3-1:ctv=q8_0", "backwards"),
            ("ctk=q8_0;global:bits=4", "unknown key"),
            ("ctk=q8_0;global:start=4", "every layer"),
            ("ctk=q8_0;global:attn=llama-cpu", "every layer"),
            ("ctk=q8_0;global:ctv=turbo9", "turbo9"),
            ("ctk=q8_0;middle:ctv=q8_0", "firstN"),
            ("ctk=q8_0;global:ctk=f16,ctk=f32", "twice"),
        ] {
            let e = KvSpec::parse(text).unwrap_err().to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
        let c = gemma_270m();
        for (text, says) in [
            ("ctk=q8_0;18:ctv=q8_0", "0-17"),
            ("ctk=q8_0;last20:ctv=q8_0", "0-17"),
            ("ctk=q8_0;global:group=32", "group="),
        ] {
            let e = KvSpec::parse(text)
                .unwrap()
                .layer_specs(&c)
                .unwrap_err()
                .to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
        // `+` joins a part's settings as `,` does.
        let joined = KvSpec::parse("ctk=turbo3,ctv=turbo3;global:ctk=q8_0+ctv=q8_0").unwrap();
        let commas = KvSpec::parse("ctk=turbo3,ctv=turbo3;global:ctk=q8_0,ctv=q8_0").unwrap();
        assert_eq!(joined.layers, commas.layers);
        // A group for the affine sides a part makes is fine.
        let affine = KvSpec::parse("ctk=turbo3,ctv=turbo3;global:ctk=mlx4,group=32").unwrap();
        assert_eq!(affine.layer_specs(&c).unwrap()[5].group_size, 32);
    }

    #[test]
    fn the_bases_group_survives_canonical_forms_when_only_parts_are_affine() {
        // Found by the kv_spec fuzz target: the base's group=32 was left
        // out, so the parts' mlx sides came back with groups of 64.
        let c = gemma_270m();
        let spec = KvSpec::parse("group=32,;0-4:ctk=mlx5,ctv=q5_0;0-2:ctk=mlx5,ctv=mlx4").unwrap();
        let layers = spec.layer_specs(&c).unwrap();
        assert_eq!(layers[0].group_size, 32);
        let each = |layers: &[LayerSpec]| -> Vec<String> {
            layers.iter().map(|l| l.canonical(Dtype::Float32)).collect()
        };
        let written = spec.canonical(Dtype::Float32);
        assert_eq!(
            written,
            "ctk=f32,ctv=f32,group=32,start=0;0-4:ctk=mlx5,ctv=q5_0;0-2:ctk=mlx5,ctv=mlx4"
        );
        let on_model = spec.canonical_on(Dtype::Float32, &c).unwrap();
        assert_eq!(
            on_model,
            "ctk=f32,ctv=f32,start=0;0-2:ctk=mlx5,ctv=mlx4,group=32;\
             3-4:ctk=mlx5,ctv=q5_0,group=32"
        );
        for text in [written, on_model] {
            let again = KvSpec::parse(&text).unwrap();
            assert_eq!(
                each(&again.layer_specs(&c).unwrap()),
                each(&layers),
                "{text}"
            );
            assert_eq!(again.canonical(Dtype::Float32), text);
        }
        // A part that a later part undoes leaves no affine layer: the form
        // on the model has no group to give.
        let undone = KvSpec::parse("group=128;2:ctk=mlx2;2:ctk=bf16").unwrap();
        let on_model = undone.canonical_on(Dtype::Float32, &c).unwrap();
        assert_eq!(on_model, "ctk=f32,ctv=f32,start=0;2:ctk=bf16,ctv=f32");
        assert_eq!(
            KvSpec::parse(&on_model)
                .unwrap()
                .canonical_on(Dtype::Float32, &c)
                .unwrap(),
            on_model
        );
        // With the default group nothing is added.
        let default = KvSpec::parse("ctk=q8_0;global:ctv=mlx4").unwrap();
        assert_eq!(
            default.canonical(Dtype::Float32),
            "ctk=q8_0,ctv=f32,start=0;global:ctv=mlx4"
        );
    }

    #[test]
    fn rot_rotates_the_sides_it_names_in_the_layers_it_names() {
        let both = Rotation {
            keys: true,
            values: true,
        };
        let spec = KvSpec::parse("ctk=q4_0,ctv=q4_0,rot=kv").unwrap();
        assert_eq!(spec.rotation, both);
        let canonical = spec.canonical(Dtype::Float32);
        assert_eq!(canonical, "ctk=q4_0,ctv=q4_0,rot=kv,start=0");
        assert_eq!(KvSpec::parse(&canonical).unwrap().rotation, both);
        assert_eq!(spec.base_layer().format().rotation, both);
        let c = gemma_270m();
        let part = KvSpec::parse("ctk=q4_0,ctv=q4_0;global:rot=k").unwrap();
        let layers = part.layer_specs(&c).unwrap();
        assert_eq!(layers[0].rotation, Rotation::NONE);
        assert!(layers[5].rotation.keys && !layers[5].rotation.values);
        assert_eq!(
            part.canonical_on(Dtype::Float32, &c).unwrap(),
            "ctk=q4_0,ctv=q4_0,start=0;5:ctk=q4_0,ctv=q4_0,rot=k;11:ctk=q4_0,ctv=q4_0,rot=k;\
             17:ctk=q4_0,ctv=q4_0,rot=k"
        );
        let e = KvSpec::parse("ctk=q4_0,rot=q").unwrap_err().to_string();
        assert!(e.contains("k, v, kv, none"), "{e}");
    }
}
