//! Medians over rounds, and the figures the report compares.

use serde::Serialize;

use crate::bench::engines::{CaseResult, RunOutput};

/// The median of `values` (the mean of the middle two for an even count);
/// `None` when there are none.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => sorted.get(n / 2).copied(),
        _ => Some((sorted.get(n / 2 - 1)? + sorted.get(n / 2)?) / 2.0),
    }
}

/// A metric of one case, the median over rounds for both engines, and
/// their ratio (ours / theirs).
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// What is measured, e.g. `prompt tok/s, 512-token prompt`.
    pub metric: String,
    /// KV-cache setting.
    pub kv: String,
    /// Our median.
    pub ours: Option<f64>,
    /// mlx-lm's median.
    pub mlx_lm: Option<f64>,
    /// ours / mlx-lm.
    pub ratio: Option<f64>,
    /// Whether a higher value is better.
    pub higher_is_better: bool,
}

/// Which figure of a case a row reads.
#[derive(Clone, Copy, Debug)]
pub enum Figure {
    /// Prompt tokens per second.
    PromptTps,
    /// Generated tokens per second.
    GenerationTps,
    /// Time to first token.
    Ttft,
    /// Peak memory, in MiB.
    PeakMib,
}

impl Figure {
    fn read(self, result: &CaseResult) -> f64 {
        match self {
            Figure::PromptTps => result.prompt_tps,
            Figure::GenerationTps => result.generation_tps,
            Figure::Ttft => result.ttft_s,
            Figure::PeakMib => result.peak_memory_bytes as f64 / (1u64 << 20) as f64,
        }
    }

    fn higher_is_better(self) -> bool {
        matches!(self, Figure::PromptTps | Figure::GenerationTps)
    }
}

/// The median of `figure` of case `name` over `runs`.
pub fn median_of(runs: &[RunOutput], name: &str, figure: Figure) -> Option<f64> {
    let values: Vec<f64> = runs
        .iter()
        .filter_map(|run| run.case(name))
        .map(|result| figure.read(result))
        .collect();
    median(&values)
}

/// A row comparing `figure` of case `name` between the two engines' runs.
pub fn row(
    metric: &str,
    kv: &str,
    name: &str,
    figure: Figure,
    ours: &[RunOutput],
    theirs: &[RunOutput],
) -> Row {
    let ours = median_of(ours, name, figure);
    let mlx_lm = median_of(theirs, name, figure);
    Row {
        metric: metric.to_owned(),
        kv: kv.to_owned(),
        ours,
        mlx_lm,
        ratio: ours.zip(mlx_lm).map(|(a, b)| a / b),
        higher_is_better: figure.higher_is_better(),
    }
}

/// How many leading token ids `a` and `b` share.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[f64::NAN, 5.0]), Some(5.0));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn common_prefix_stops_at_the_first_difference() {
        assert_eq!(common_prefix(&[1, 2, 3, 4], &[1, 2, 9, 4]), 2);
        assert_eq!(common_prefix(&[1, 2], &[1, 2, 3]), 2);
    }
}
