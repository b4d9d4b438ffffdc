//! The published configuration of each Gemma 3 size, for random weights of
//! the real shapes.

use std::path::Path;

use super::{ConfigError, ConfigProblem, Gemma3Config};

/// The sizes with a published configuration.
pub const PUBLISHED_SIZES: [&str; 5] = ["270m", "1b", "4b", "12b", "27b"];

impl Gemma3Config {
    /// The published configuration of a size ("270m", "1b", "4b", "12b" or
    /// "27b"), optionally cut to its first `layers` layers.
    pub fn published(size: &str, layers: Option<usize>) -> Result<Gemma3Config, ConfigError> {
        let text = match size.to_ascii_lowercase().as_str() {
            "270m" => include_str!("../../configs/gemma3-270m.json"),
            "1b" => include_str!("../../configs/gemma3-1b.json"),
            "4b" => include_str!("../../configs/gemma3-4b.json"),
            "12b" => include_str!("../../configs/gemma3-12b.json"),
            "27b" => include_str!("../../configs/gemma3-27b.json"),
            _ => {
                return Err(ConfigError {
                    path: Path::new("<published sizes>").to_path_buf(),
                    problem: ConfigProblem::BadValue {
                        field: "size".into(),
                        value: size.to_string(),
                        reason: format!(
                            "not a published size (known: {})",
                            PUBLISHED_SIZES.join(", ")
                        ),
                    },
                })
            }
        };
        let mut config =
            Gemma3Config::from_json_str(text, Path::new(&format!("gemma3-{size}.json")))?;
        if let Some(layers) = layers {
            config.num_hidden_layers = layers.clamp(1, config.num_hidden_layers);
        }
        Ok(config)
    }
}
