//! Tensor element types of GGUF files (ggml's `ggml_type`) and their block layouts.

/// The type of a tensor's elements, as ggml numbers them.
///
/// Every type stores its elements in blocks: `block_size()` elements take
/// `type_size()` bytes. Plain types (F32, F16, ...) have blocks of one element.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgufDtype {
    /// 32-bit IEEE float.
    F32,
    /// 16-bit IEEE float.
    F16,
    /// 4-bit, 32-element blocks with one f16 scale.
    Q4_0,
    /// 4-bit, 32-element blocks with an f16 scale and minimum.
    Q4_1,
    /// 5-bit, 32-element blocks with one f16 scale.
    Q5_0,
    /// 5-bit, 32-element blocks with an f16 scale and minimum.
    Q5_1,
    /// 8-bit, 32-element blocks with one f16 scale.
    Q8_0,
    /// 8-bit, 32-element blocks with an f32 scale and sum (an intermediate format).
    Q8_1,
    /// 2-bit k-quant, 256-element super-blocks.
    Q2_K,
    /// 3-bit k-quant, 256-element super-blocks.
    Q3_K,
    /// 4-bit k-quant, 256-element super-blocks.
    Q4_K,
    /// 5-bit k-quant, 256-element super-blocks.
    Q5_K,
    /// 6-bit k-quant, 256-element super-blocks.
    Q6_K,
    /// 8-bit k-quant (an intermediate format).
    Q8_K,
    /// 2.06-bit i-quant.
    IQ2_XXS,
    /// 2.31-bit i-quant.
    IQ2_XS,
    /// 3.06-bit i-quant.
    IQ3_XXS,
    /// 1.56-bit i-quant.
    IQ1_S,
    /// 4-bit non-linear i-quant, 32-element blocks.
    IQ4_NL,
    /// 3.44-bit i-quant.
    IQ3_S,
    /// 2.5-bit i-quant.
    IQ2_S,
    /// 4.25-bit non-linear i-quant.
    IQ4_XS,
    /// 8-bit signed integer.
    I8,
    /// 16-bit signed integer.
    I16,
    /// 32-bit signed integer.
    I32,
    /// 64-bit signed integer.
    I64,
    /// 64-bit IEEE float.
    F64,
    /// 1.75-bit i-quant.
    IQ1_M,
    /// bfloat16.
    BF16,
    /// 1.69-bit ternary quant.
    TQ1_0,
    /// 2.06-bit ternary quant.
    TQ2_0,
    /// 4-bit OCP microscaling float, 32-element blocks.
    MXFP4,
}

/// Elements per super-block of the k-quants.
const QK_K: u64 = 256;

impl GgufDtype {
    /// The type with ggml's numeric id, or `None` for an id this reader does not know.
    pub fn from_id(id: u32) -> Option<GgufDtype> {
        use GgufDtype::*;
        Some(match id {
            0 => F32,
            1 => F16,
            2 => Q4_0,
            3 => Q4_1,
            6 => Q5_0,
            7 => Q5_1,
            8 => Q8_0,
            9 => Q8_1,
            10 => Q2_K,
            11 => Q3_K,
            12 => Q4_K,
            13 => Q5_K,
            14 => Q6_K,
            15 => Q8_K,
            16 => IQ2_XXS,
            17 => IQ2_XS,
            18 => IQ3_XXS,
            19 => IQ1_S,
            20 => IQ4_NL,
            21 => IQ3_S,
            22 => IQ2_S,
            23 => IQ4_XS,
            24 => I8,
            25 => I16,
            26 => I32,
            27 => I64,
            28 => F64,
            29 => IQ1_M,
            30 => BF16,
            34 => TQ1_0,
            35 => TQ2_0,
            39 => MXFP4,
            _ => return None,
        })
    }

    /// ggml's numeric id of this type.
    pub fn id(self) -> u32 {
        use GgufDtype::*;
        match self {
            F32 => 0,
            F16 => 1,
            Q4_0 => 2,
            Q4_1 => 3,
            Q5_0 => 6,
            Q5_1 => 7,
            Q8_0 => 8,
            Q8_1 => 9,
            Q2_K => 10,
            Q3_K => 11,
            Q4_K => 12,
            Q5_K => 13,
            Q6_K => 14,
            Q8_K => 15,
            IQ2_XXS => 16,
            IQ2_XS => 17,
            IQ3_XXS => 18,
            IQ1_S => 19,
            IQ4_NL => 20,
            IQ3_S => 21,
            IQ2_S => 22,
            IQ4_XS => 23,
            I8 => 24,
            I16 => 25,
            I32 => 26,
            I64 => 27,
            F64 => 28,
            IQ1_M => 29,
            BF16 => 30,
            TQ1_0 => 34,
            TQ2_0 => 35,
            MXFP4 => 39,
        }
    }

    /// Number of elements in one block.
    pub fn block_size(self) -> u64 {
        use GgufDtype::*;
        match self {
            F32 | F16 | BF16 | F64 | I8 | I16 | I32 | I64 => 1,
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 | IQ4_NL | MXFP4 => 32,
            Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | Q8_K | IQ2_XXS | IQ2_XS | IQ3_XXS | IQ1_S
            | IQ3_S | IQ2_S | IQ4_XS | IQ1_M | TQ1_0 | TQ2_0 => QK_K,
        }
    }

    /// Number of bytes one block takes.
    pub fn type_size(self) -> u64 {
        use GgufDtype::*;
        match self {
            I8 => 1,
            F16 | BF16 | I16 => 2,
            F32 | I32 => 4,
            F64 | I64 => 8,
            Q4_0 => 2 + 16,
            Q4_1 => 2 + 2 + 16,
            Q5_0 => 2 + 4 + 16,
            Q5_1 => 2 + 2 + 4 + 16,
            Q8_0 => 2 + 32,
            Q8_1 => 4 + 4 + 32,
            IQ4_NL => 2 + 16,
            MXFP4 => 1 + 16,
            Q2_K => 2 + 2 + QK_K / 16 + QK_K / 4,
            Q3_K => 2 + QK_K / 4 + QK_K / 8 + 12,
            Q4_K => 2 + 2 + QK_K / 2 + 12,
            Q5_K => 2 + 2 + QK_K / 2 + QK_K / 8 + 12,
            Q6_K => 2 + QK_K / 2 + QK_K / 4 + QK_K / 16,
            Q8_K => 4 + QK_K + QK_K / 8,
            IQ2_XXS => 2 + QK_K / 4,
            IQ2_XS => 2 + QK_K / 4 + QK_K / 32,
            IQ3_XXS => 2 + QK_K / 4 + QK_K / 8,
            IQ1_S => 2 + QK_K / 8 + QK_K / 16,
            IQ3_S => 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4,
            IQ2_S => 2 + QK_K / 4 + QK_K / 16,
            IQ4_XS => 2 + 2 + QK_K / 2 + QK_K / 64,
            IQ1_M => QK_K / 8 + QK_K / 16 + QK_K / 32,
            TQ1_0 => 2 + 4 * 13,
            TQ2_0 => 2 + 64,
        }
    }

    /// Whether [`crate::gguf::GgufFile::dequantize_f32`] can convert this type.
    pub fn can_dequantize(self) -> bool {
        use GgufDtype::*;
        matches!(
            self,
            F32 | F16
                | BF16
                | Q4_0
                | Q4_1
                | Q5_0
                | Q5_1
                | Q8_0
                | IQ4_NL
                | Q2_K
                | Q3_K
                | Q4_K
                | Q5_K
                | Q6_K
        )
    }
}

impl std::fmt::Display for GgufDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}
