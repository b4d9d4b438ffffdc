//! The cache formats of a model's layers: one format for every layer, or
//! one per layer (a KV policy that treats some layers apart).

use super::buffers::CacheFormat;
use super::error::CacheError;

/// The formats of each layer's cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayerFormats {
    /// The same format in every layer.
    Uniform(CacheFormat),
    /// Layer i's format at index i.
    PerLayer(Vec<CacheFormat>),
}

impl LayerFormats {
    /// Layer `index`'s format, checking that a per-layer list names every
    /// one of the model's `layers`.
    pub fn of(&self, index: usize, layers: usize) -> Result<CacheFormat, CacheError> {
        match self {
            LayerFormats::Uniform(format) => Ok(*format),
            LayerFormats::PerLayer(formats) if formats.len() == layers => Ok(formats[index]),
            LayerFormats::PerLayer(formats) => Err(CacheError::Format(format!(
                "{} per-layer formats given for a model of {layers} layers",
                formats.len()
            ))),
        }
    }
}

impl From<CacheFormat> for LayerFormats {
    fn from(format: CacheFormat) -> LayerFormats {
        LayerFormats::Uniform(format)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::KvFormat;

    #[test]
    fn a_per_layer_list_must_name_every_layer() {
        let turbo = CacheFormat {
            keys: KvFormat::Turbo { bits: 4 },
            values: KvFormat::Turbo { bits: 2 },
            ..CacheFormat::COMPUTE
        };
        let formats = LayerFormats::PerLayer(vec![CacheFormat::COMPUTE, turbo]);
        assert_eq!(formats.of(1, 2).unwrap(), turbo);
        assert_eq!(formats.of(0, 2).unwrap(), CacheFormat::COMPUTE);
        let err = formats.of(0, 3).unwrap_err().to_string();
        assert!(
            err.contains("2 per-layer formats") && err.contains("3 layers"),
            "{err}"
        );
        assert_eq!(LayerFormats::from(turbo).of(17, 18).unwrap(), turbo);
    }
}
