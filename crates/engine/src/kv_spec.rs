//! KV-cache specs in llama.cpp's style: `ctk=q8_0,ctv=q4_0`, plus `group=`
//! and `start=`.
//!
//! The `q` types set the bit width of MLX affine quantization (this is not
//! llama.cpp's block format; the names are kept for familiarity):
//! `q8_0`/`q8` → 8, `q6_K`/`q6` → 6, `q5_0`/`q5_K`/`q5` → 5,
//! `q4_0`/`q4_K`/`q4` → 4, `q3_K`/`q3` → 3, `q2_K`/`q2` → 2; `turbo2`,
//! `turbo3`, `turbo4` are TurboQuant as the llama.cpp TurboQuant fork stores
//! it (groups of 128 values, so `group=` does not apply to them); `f32`,
//! `f16`, `bf16` store unquantized in that dtype. A missing `ctk` or `ctv`
//! means the compute dtype.

use gemma::cache::{CacheFormat, KvFormat};
use mlx_core::Dtype;

/// Accepted type names, for error messages.
pub const ACCEPTED_TYPES: &str = "q8_0, q8, q6_K, q6, q5_0, q5_K, q5, q4_0, q4_K, q4, q3_K, q3, \
                                  q2_K, q2, turbo2, turbo3, turbo4, f32, f16, bf16";

/// One side (keys or values) of a spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvType {
    /// The model's compute dtype.
    Compute,
    /// Unquantized in this dtype.
    Float(Dtype),
    /// MLX affine quantization with this many bits.
    Bits(i32),
    /// TurboQuant with this many bits (2, 3 or 4).
    Turbo(i32),
}

impl KvType {
    fn parse(text: &str) -> Option<KvType> {
        Some(match text {
            "q8_0" | "q8" => KvType::Bits(8),
            "q6_K" | "q6_k" | "q6" => KvType::Bits(6),
            "q5_0" | "q5_K" | "q5_k" | "q5" => KvType::Bits(5),
            "q4_0" | "q4_K" | "q4_k" | "q4" => KvType::Bits(4),
            "q3_K" | "q3_k" | "q3" => KvType::Bits(3),
            "q2_K" | "q2_k" | "q2" => KvType::Bits(2),
            "turbo2" => KvType::Turbo(2),
            "turbo3" => KvType::Turbo(3),
            "turbo4" => KvType::Turbo(4),
            "f32" => KvType::Float(Dtype::Float32),
            "f16" => KvType::Float(Dtype::Float16),
            "bf16" => KvType::Float(Dtype::Bfloat16),
            _ => return None,
        })
    }

    fn canonical(self, compute: Dtype) -> String {
        match self {
            KvType::Compute => short_dtype(compute).into(),
            KvType::Float(d) => short_dtype(d).into(),
            KvType::Bits(8) => "q8_0".into(),
            KvType::Bits(6) => "q6_K".into(),
            KvType::Bits(5) => "q5_0".into(),
            KvType::Bits(4) => "q4_0".into(),
            KvType::Bits(b) => format!("q{b}_K"),
            KvType::Turbo(b) => format!("turbo{b}"),
        }
    }

    fn format(self, group_size: i32) -> KvFormat {
        match self {
            KvType::Compute => KvFormat::Float(None),
            KvType::Float(d) => KvFormat::Float(Some(d)),
            KvType::Bits(bits) => KvFormat::Quantized { bits, group_size },
            KvType::Turbo(bits) => KvFormat::Turbo { bits },
        }
    }

    fn is_turbo(self) -> bool {
        matches!(self, KvType::Turbo(_))
    }
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
    /// Affine quantization group size (32, 64 or 128; TurboQuant always
    /// encodes groups of 128).
    pub group_size: i32,
    /// Tokens kept unquantized before quantization starts.
    pub start: usize,
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
        };
        let mut seen = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = part.split_once('=').ok_or_else(|| {
                err(format!(
                    "'{part}' is not KEY=VALUE (keys: ctk, ctv, group, start)"
                ))
            })?;
            let (key, value) = (key.trim(), value.trim());
            if seen.contains(&key) {
                return Err(err(format!("'{key}' is given twice")));
            }
            seen.push(key);
            match key {
                "ctk" | "ctv" => {
                    let t = KvType::parse(value).ok_or_else(|| {
                        err(format!(
                            "unknown type '{value}' for {key} (accepted: {ACCEPTED_TYPES})"
                        ))
                    })?;
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
                "start" => {
                    spec.start = value.parse().map_err(|_| {
                        err(format!(
                            "start '{value}' is not a token count (a whole number ≥ 0)"
                        ))
                    })?;
                }
                _ => {
                    return Err(err(format!(
                        "unknown key '{key}' (accepted: ctk, ctv, group, start)"
                    )))
                }
            }
        }
        if seen.contains(&"group") && spec.has_turbo() {
            return Err(err(
                "group= does not apply to turbo2/3/4 (TurboQuant encodes groups of 128 \
                 values); leave it out"
                    .into(),
            ));
        }
        Ok(spec)
    }

    /// Whether keys or values are TurboQuant.
    fn has_turbo(&self) -> bool {
        self.keys.is_turbo() || self.values.is_turbo()
    }

    /// The canonical form, e.g. `ctk=q8_0,ctv=q4_0,group=64,start=0`
    /// (without `group=` when a side is TurboQuant, which takes none).
    pub fn canonical(&self, compute: Dtype) -> String {
        let group = if self.has_turbo() {
            String::new()
        } else {
            format!(",group={}", self.group_size)
        };
        format!(
            "ctk={},ctv={}{group},start={}",
            self.keys.canonical(compute),
            self.values.canonical(compute),
            self.start
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
            (KvType::Bits(8), KvType::Bits(4), 64, 0)
        );
        assert_eq!(
            spec.canonical(Dtype::Float32),
            "ctk=q8_0,ctv=q4_0,group=64,start=0"
        );
        let spec = KvSpec::parse(" ctv=q6_K , group=32,ctk=f16").unwrap();
        assert_eq!(
            spec.canonical(Dtype::Float32),
            "ctk=f16,ctv=q6_K,group=32,start=0"
        );
        assert_eq!(
            KvSpec::parse("").unwrap().canonical(Dtype::Bfloat16),
            "ctk=bf16,ctv=bf16,group=64,start=0"
        );
        assert_eq!(
            KvSpec::parse("ctk=q2,ctv=q3_K")
                .unwrap()
                .canonical(Dtype::Float32),
            "ctk=q2_K,ctv=q3_K,group=64,start=0"
        );
    }

    #[test]
    fn parses_turbo_types_on_either_side() {
        let spec = KvSpec::parse("ctk=q8_0,ctv=turbo4").unwrap();
        assert_eq!(
            (spec.keys, spec.values),
            (KvType::Bits(8), KvType::Turbo(4))
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
        for text in ["ctk=turbo2,ctv=turbo2", "ctk=turbo4,ctv=q8_0,start=7"] {
            let canonical = KvSpec::parse(text).unwrap().canonical(Dtype::Float32);
            assert_eq!(
                KvSpec::parse(&canonical).unwrap().canonical(Dtype::Float32),
                canonical
            );
        }
    }

    #[test]
    fn maps_types_to_cache_formats() {
        let f = KvSpec::parse("ctk=q5_K,ctv=bf16,group=128")
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
        assert_eq!(
            KvSpec::parse("ctv=q8")
                .unwrap()
                .cache_format()
                .unwrap()
                .keys,
            KvFormat::Float(None)
        );
    }

    #[test]
    fn rejects_bad_specs_listing_what_is_accepted() {
        let e = KvSpec::parse("ctk=turbo5").unwrap_err().to_string();
        assert!(
            e.contains("turbo5") && e.contains("turbo4") && e.contains("q8_0"),
            "{e}"
        );
        let e = KvSpec::parse("ctk=q8_0,ctv=turbo3,group=64")
            .unwrap_err()
            .to_string();
        assert!(e.contains("group=") && e.contains("turbo"), "{e}");
        assert!(KvSpec::parse("group=48")
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
            .contains("ctk, ctv, group, start"));
        assert!(KvSpec::parse("ctk=q8,ctk=q4")
            .unwrap_err()
            .to_string()
            .contains("twice"));
    }
}
