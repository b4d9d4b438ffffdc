//! KV-cache specs in llama.cpp's style: `ctk=q8_0,ctv=q4_0`, plus `group=`,
//! `start=` and `attn=`.
//!
//! A type name means what it means in llama.cpp wherever llama.cpp has it:
//! `q8_0`, `q4_0`, `q4_1`, `q5_0`, `q5_1` are ggml's 32-value blocks, byte
//! for byte as llama.cpp stores its cache (CPU only so far); `turbo2`,
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

use gemma::cache::{CacheFormat, KvFormat, QueryRounding};
use gemma::quant::GgufDtype;
use mlx_core::Dtype;

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

/// A parsed KV-cache spec.
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

impl KvSpec {
    /// Parses `ctk=…,ctv=…,group=…,start=…` (any subset, any order; an empty
    /// spec means the compute dtype for both).
    pub fn parse(text: &str) -> Result<KvSpec, KvSpecError> {
        let err = |problem: String| KvSpecError {
            spec: text.to_string(),
            problem,
        };
        let mut spec = KvSpec {
            text: text.to_string(),
            keys: KvType::Compute,
            values: KvType::Compute,
            group_size: 64,
            start: 0,
            queries: QueryRounding::Exact,
        };
        let mut seen = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = part.split_once('=').ok_or_else(|| {
                err(format!(
                    "'{part}' is not KEY=VALUE (keys: ctk, ctv, group, start, attn)"
                ))
            })?;
            let (key, value) = (key.trim(), value.trim());
            if seen.contains(&key) {
                return Err(err(format!("'{key}' is given twice")));
            }
            seen.push(key);
            match key {
                "ctk" | "ctv" => {
                    let t = KvType::parse(value).map_err(|e| err(format!("{key}: {e}")))?;
                    if key == "ctk" {
                        spec.keys = t;
                    } else {
                        spec.values = t;
                    }
                }
                "group" => {
                    spec.group_size = match value {
                        "32" => 32,
                        "64" => 64,
                        "128" => 128,
                        _ => {
                            return Err(err(format!(
                                "group '{value}' is not accepted (accepted: 32, 64, 128)"
                            )))
                        }
                    }
                }
                "attn" => {
                    spec.queries = match value {
                        "exact" => QueryRounding::Exact,
                        "llama-cpu" => QueryRounding::LlamaCpu,
                        _ => {
                            return Err(err(format!(
                                "attn '{value}' is not accepted (accepted: exact, llama-cpu)"
                            )))
                        }
                    }
                }
                "start" => {
                    spec.start = value.parse().map_err(|_| {
                        err(format!(
                            "start '{value}' is not a token count (a whole number ≥ 0)"
                        ))
                    })?;
                }
                _ => {
                    return Err(err(format!(
                        "unknown key '{key}' (accepted: ctk, ctv, group, start, attn)"
                    )))
                }
            }
        }
        if seen.contains(&"group") && !spec.has_affine() {
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

    /// What changed about the meaning of the spec's type names (one line
    /// each; empty when nothing did): `q8_0`, `q4_0` and `q5_0` named MLX's
    /// affine formats before this release.
    pub fn notes(&self) -> Vec<String> {
        let mut notes: Vec<String> = [self.keys, self.values]
            .iter()
            .filter_map(|t| t.note())
            .collect();
        notes.dedup();
        notes
    }

    /// The canonical form, e.g. `ctk=q8_0,ctv=mlx4,group=64,start=0`
    /// (`group=` only when a side is MLX affine, the one kind it applies to;
    /// `attn=llama-cpu` last when given).
    pub fn canonical(&self, compute: Dtype) -> String {
        let group = if self.has_affine() {
            format!(",group={}", self.group_size)
        } else {
            String::new()
        };
        format!(
            "ctk={},ctv={}{group},start={}{}",
            self.keys.canonical(compute),
            self.values.canonical(compute),
            self.start,
            match self.queries {
                QueryRounding::Exact => "",
                QueryRounding::LlamaCpu => ",attn=llama-cpu",
            }
        )
    }

    /// The cache storage this spec asks for (from token `start` on; before
    /// it, the compute dtype).
    pub fn cache_format(&self) -> Result<CacheFormat, KvSpecError> {
        Ok(CacheFormat {
            keys: self.keys.format(self.group_size),
            values: self.values.format(self.group_size),
        })
    }
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
            .cache_format()
            .unwrap();
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
            .cache_format()
            .unwrap();
        assert_eq!(
            f.keys,
            KvFormat::Quantized {
                bits: 5,
                group_size: 128
            }
        );
        assert_eq!(f.values, KvFormat::Float(Some(Dtype::Bfloat16)));
        let f = KvSpec::parse("ctv=q5_0").unwrap().cache_format().unwrap();
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
            .contains("ctk, ctv, group, start, attn"));
        assert!(KvSpec::parse("attn=fast")
            .unwrap_err()
            .to_string()
            .contains("exact, llama-cpu"));
        assert!(KvSpec::parse("ctk=mlx8,ctk=mlx4")
            .unwrap_err()
            .to_string()
            .contains("twice"));
    }
}
