//! Where and in what precision the benchmarks run, from `BENCH_DEVICE`, and
//! at what size: `cargo bench` measures the real shapes, while `cargo test
//! --benches` (or `--all-targets`), which runs every benchmark once to check
//! that it works, gets a cut-down model so that it stays quick.

use gemma::config::Gemma3Config;
use mlx_core::device::{self, Device};
use mlx_core::Dtype;

use crate::BenchError;

/// The environment variable choosing the device: `cpu` (default) or `gpu`.
pub const DEVICE_VAR: &str = "BENCH_DEVICE";

/// Layers of the cut-down model: one sliding-window layer, one global layer.
const SMOKE_LAYERS: usize = 2;
/// Vocabulary of the cut-down model.
const SMOKE_VOCAB: usize = 4096;

/// Device, dtype and model shape of one benchmark run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// The device every operation runs on.
    pub device: Device,
    /// The dtype of weights and activations.
    pub dtype: Dtype,
    /// The published Gemma 3 size whose shapes are measured.
    pub size: &'static str,
    /// Whether the benchmarks only run once to check they work (no
    /// `--bench` argument: `cargo test`), with a cut-down model.
    pub smoke: bool,
}

impl Settings {
    /// CPU, float32, the 270M shape.
    pub const CPU: Settings = Settings {
        device: Device::Cpu,
        dtype: Dtype::Float32,
        size: "270m",
        smoke: false,
    };

    /// GPU, bfloat16, the 1B shape.
    pub const GPU: Settings = Settings {
        device: Device::Gpu,
        dtype: Dtype::Bfloat16,
        size: "1b",
        smoke: false,
    };

    /// The settings a value of `BENCH_DEVICE` asks for (unset: CPU), cut
    /// down unless `measuring`.
    pub fn parse(value: Option<&str>, measuring: bool) -> Result<Settings, BenchError> {
        let settings = match value.map(str::trim) {
            None | Some("") | Some("cpu") => Settings::CPU,
            Some("gpu") => Settings::GPU,
            Some(other) => {
                return Err(BenchError::Settings(format!(
                    "{DEVICE_VAR}={other}: expected 'cpu' or 'gpu'"
                )))
            }
        };
        Ok(Settings {
            smoke: !measuring,
            ..settings
        })
    }

    /// Reads `BENCH_DEVICE` and the command line (criterion measures only
    /// with `--bench`, which `cargo bench` passes) and makes the device the
    /// default one; an error when this MLX build has no such device.
    pub fn from_env() -> Result<Settings, BenchError> {
        let value = std::env::var(DEVICE_VAR).ok();
        let measuring = std::env::args().any(|a| a == "--bench");
        let settings = Settings::parse(value.as_deref(), measuring)?;
        settings.apply()?;
        Ok(settings)
    }

    /// Makes this device the default one.
    pub fn apply(&self) -> Result<(), BenchError> {
        device::set_default_device(self.device).map_err(|e| {
            BenchError::Settings(format!(
                "{DEVICE_VAR}={}: {e} (MLX {})",
                self.device,
                device::mlx_version()
            ))
        })
    }

    /// The published configuration of [`Settings::size`]; for a smoke run,
    /// its first two layers (one sliding, one global) and a vocabulary of 4096.
    pub fn config(&self) -> Result<Gemma3Config, BenchError> {
        let mut config = Gemma3Config::published(self.size, None)?;
        if self.smoke {
            config.num_hidden_layers = SMOKE_LAYERS;
            config.sliding_window_pattern = SMOKE_LAYERS;
            config.vocab_size = SMOKE_VOCAB;
        }
        Ok(config)
    }

    /// A label such as `cpu-float32-270m` (`…-smoke` for a smoke run) for
    /// benchmark group names.
    pub fn label(&self) -> String {
        let smoke = if self.smoke { "-smoke" } else { "" };
        format!("{}-{}-{}{smoke}", self.device, self.dtype, self.size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_or_cpu_means_cpu_float32_270m() {
        for value in [None, Some(""), Some("cpu"), Some(" cpu ")] {
            assert_eq!(Settings::parse(value, true).unwrap(), Settings::CPU);
        }
        assert_eq!(Settings::CPU.label(), "cpu-float32-270m");
        let c = Settings::CPU.config().unwrap();
        assert_eq!((c.hidden_size, c.num_hidden_layers), (640, 18));
        assert_eq!((c.intermediate_size, c.vocab_size), (2048, 262_144));
    }

    #[test]
    fn gpu_means_bfloat16_1b() {
        let s = Settings::parse(Some("gpu"), true).unwrap();
        assert_eq!(s, Settings::GPU);
        assert_eq!(s.label(), "gpu-bfloat16-1b");
        let c = s.config().unwrap();
        assert_eq!((c.hidden_size, c.intermediate_size), (1152, 6912));
        assert_eq!(c.num_hidden_layers, 26);
    }

    #[test]
    fn without_measuring_the_model_is_cut_down() {
        let s = Settings::parse(None, false).unwrap();
        assert!(s.smoke);
        assert_eq!(s.label(), "cpu-float32-270m-smoke");
        let c = s.config().unwrap();
        assert_eq!((c.num_hidden_layers, c.vocab_size), (2, 4096));
        assert!(c.is_sliding(0));
        assert!(!c.is_sliding(1));
        assert_eq!((c.hidden_size, c.head_dim), (640, 256));
    }

    #[test]
    fn other_values_are_refused_by_name() {
        let e = Settings::parse(Some("tpu"), true).unwrap_err().to_string();
        assert_eq!(e, "BENCH_DEVICE=tpu: expected 'cpu' or 'gpu'");
    }

    #[test]
    fn gpu_on_a_cpu_build_says_it_is_not_available() {
        if device::is_available(Device::Gpu).unwrap() {
            return;
        }
        let e = Settings::GPU.apply().unwrap_err().to_string();
        assert!(
            e.starts_with("BENCH_DEVICE=gpu: device gpu is not available in this MLX build"),
            "{e}"
        );
    }
}
