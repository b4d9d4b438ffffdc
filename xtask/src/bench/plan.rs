//! The benchmark plan both engines run: cases of prompt token ids, token
//! counts and KV-cache settings, written as JSON for `gemma-mlx bench --plan`
//! and `xtask/bench/mlx_lm_bench.py`.

use serde::{Deserialize, Serialize};

/// Token ids the engines must never stop on (`<eos>`, `<end_of_turn>`):
/// biased away on both sides so every generation runs to its length.
pub const STOP_IDS: [u32; 2] = [1, 106];

/// A KV-cache setting of the comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kv {
    /// Unquantized, in the compute dtype.
    Plain,
    /// 8-bit keys and values (global layers: all mlx-lm can quantize).
    Q8,
    /// 4-bit keys and values (global layers).
    Q4,
}

impl Kv {
    /// Every setting, in report order.
    pub const ALL: [Kv; 3] = [Kv::Plain, Kv::Q8, Kv::Q4];

    /// The name in case names and the report.
    pub fn name(self) -> &'static str {
        match self {
            Kv::Plain => "plain",
            Kv::Q8 => "q8",
            Kv::Q4 => "q4",
        }
    }

    fn bits(self) -> Option<i32> {
        match self {
            Kv::Plain => None,
            Kv::Q8 => Some(8),
            Kv::Q4 => Some(4),
        }
    }
}

/// One timed generation.
#[derive(Clone, Debug, Serialize)]
pub struct Case {
    /// Unique within the plan.
    pub name: String,
    /// Prompt token ids (`<bos>` first).
    pub prompt: Vec<u32>,
    /// Tokens to generate.
    pub max_tokens: usize,
    /// Cache quantization bits, if any.
    pub kv_bits: Option<i32>,
    /// Values per quantization group.
    pub kv_group_size: i32,
}

impl Case {
    /// A case named `name` on the first `prompt_len` tokens of `tokens`.
    pub fn new(name: String, tokens: &[u32], prompt_len: usize, max_tokens: usize, kv: Kv) -> Self {
        Case {
            name,
            prompt: tokens[..prompt_len.min(tokens.len())].to_vec(),
            max_tokens,
            kv_bits: kv.bits(),
            kv_group_size: 64,
        }
    }
}

/// What both engines are given.
#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    /// Run the first case briefly before timing.
    pub warmup: bool,
    /// Token id (as text) → bias.
    pub logit_bias: std::collections::BTreeMap<String, f32>,
    /// The cases, in order.
    pub cases: Vec<Case>,
}

impl Plan {
    /// A plan of `cases` with a warm-up and the stop tokens biased away.
    pub fn new(cases: Vec<Case>) -> Self {
        Plan {
            warmup: true,
            logit_bias: STOP_IDS.iter().map(|id| (id.to_string(), -1e9)).collect(),
            cases,
        }
    }
}

/// The name of the speed case: a `prompt`-token prompt, then `tokens` generated.
pub fn case_name(prompt: usize, tokens: usize, kv: Kv) -> String {
    format!("p{prompt}-g{tokens}-{}", kv.name())
}
