//! Statistics of per-position comparisons, as llama.cpp's `--kl-divergence`
//! reports them, and the scores of the existing evaluation tool.

use serde::{Deserialize, Serialize};

/// Per-position measurements of one candidate against the reference.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PositionSamples {
    /// KL(reference ‖ candidate) in nats.
    pub kld: Vec<f64>,
    /// Whether both put the same token on top.
    pub same_top: Vec<bool>,
    /// ln p_ref(actual next token).
    pub logp_ref: Vec<f64>,
    /// ln p_cand(actual next token).
    pub logp_cand: Vec<f64>,
    /// Positions left out because a value was NaN or infinite.
    pub non_finite: usize,
}

impl PositionSamples {
    /// Adds one position, or counts it as non-finite.
    pub fn push(&mut self, kld: f64, same_top: bool, logp_ref: f64, logp_cand: f64) {
        if kld.is_finite() && logp_ref.is_finite() && logp_cand.is_finite() {
            self.kld.push(kld.max(0.0));
            self.same_top.push(same_top);
            self.logp_ref.push(logp_ref);
            self.logp_cand.push(logp_cand);
        } else {
            self.non_finite += 1;
        }
    }

    /// Appends `later`'s positions after this one's (the positions of the
    /// chunks that come after).
    pub fn extend(&mut self, later: PositionSamples) {
        self.kld.extend(later.kld);
        self.same_top.extend(later.same_top);
        self.logp_ref.extend(later.logp_ref);
        self.logp_cand.extend(later.logp_cand);
        self.non_finite += later.non_finite;
    }
}

/// Percentiles reported for a distribution.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Percentiles {
    /// 99.9th percentile.
    pub p99_9: f64,
    /// 99th.
    pub p99: f64,
    /// 95th.
    pub p95: f64,
    /// 90th.
    pub p90: f64,
    /// Median.
    pub median: f64,
    /// 10th.
    pub p10: f64,
    /// 5th.
    pub p5: f64,
    /// 1st.
    pub p1: f64,
    /// 0.1th.
    pub p0_1: f64,
}

/// The value at quantile `q` (0..=1) of sorted data, interpolating linearly
/// between neighbours (numpy's default).
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        1 => sorted[0],
        n => {
            let pos = q.clamp(0.0, 1.0) * (n - 1) as f64;
            let lo = pos.floor() as usize;
            let hi = (lo + 1).min(n - 1);
            sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
        }
    }
}

fn percentiles(values: &[f64]) -> Percentiles {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let q = |p: f64| quantile(&sorted, p);
    Percentiles {
        p99_9: q(0.999),
        p99: q(0.99),
        p95: q(0.95),
        p90: q(0.90),
        median: q(0.5),
        p10: q(0.10),
        p5: q(0.05),
        p1: q(0.01),
        p0_1: q(0.001),
    }
}

/// Mean and its standard error (sample standard deviation / √n).
pub fn mean_and_error(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    if values.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let mean = values.iter().sum::<f64>() / n;
    if values.len() < 2 {
        return (mean, f64::NAN);
    }
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, (var / n).sqrt())
}

/// Everything reported for one candidate.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct KldStats {
    /// Positions scored.
    pub positions: usize,
    /// Positions excluded because a value was not finite.
    pub non_finite_positions: usize,
    /// Mean KL divergence in nats.
    pub mean_kld: f64,
    /// Standard error of the mean KLD.
    pub mean_kld_error: f64,
    /// Largest KLD.
    pub max_kld: f64,
    /// Smallest KLD.
    pub min_kld: f64,
    /// KLD percentiles.
    pub kld_percentiles: Percentiles,
    /// Percent of positions where both pick the same top token.
    pub same_top_percent: f64,
    /// Mean of Δp = p_cand − p_ref of the actual next token.
    pub mean_delta_p: f64,
    /// Standard error of the mean Δp.
    pub mean_delta_p_error: f64,
    /// Root mean square of Δp.
    pub rms_delta_p: f64,
    /// Largest Δp.
    pub max_delta_p: f64,
    /// Smallest Δp.
    pub min_delta_p: f64,
    /// Δp percentiles.
    pub delta_p_percentiles: Percentiles,
    /// Perplexity of the reference on the actual next tokens.
    pub ppl_ref: f64,
    /// Perplexity of the candidate.
    pub ppl_cand: f64,
    /// ppl_cand / ppl_ref.
    pub ppl_ratio: f64,
    /// 100·exp(−mean KLD).
    pub kld_score: f64,
}

impl KldStats {
    /// Summarizes samples; `None` when no position was finite.
    pub fn from_samples(s: &PositionSamples) -> Option<KldStats> {
        let n = s.kld.len();
        if n == 0 {
            return None;
        }
        let (mean_kld, mean_kld_error) = mean_and_error(&s.kld);
        let delta: Vec<f64> = s
            .logp_cand
            .iter()
            .zip(&s.logp_ref)
            .map(|(c, r)| c.exp() - r.exp())
            .collect();
        let (mean_delta_p, mean_delta_p_error) = mean_and_error(&delta);
        let fold = |v: &[f64], f: fn(f64, f64) -> f64, init: f64| v.iter().copied().fold(init, f);
        let ppl_ref = (-s.logp_ref.iter().sum::<f64>() / n as f64).exp();
        let ppl_cand = (-s.logp_cand.iter().sum::<f64>() / n as f64).exp();
        Some(KldStats {
            positions: n,
            non_finite_positions: s.non_finite,
            mean_kld,
            mean_kld_error,
            max_kld: fold(&s.kld, f64::max, f64::NEG_INFINITY),
            min_kld: fold(&s.kld, f64::min, f64::INFINITY),
            kld_percentiles: percentiles(&s.kld),
            same_top_percent: 100.0 * s.same_top.iter().filter(|&&b| b).count() as f64 / n as f64,
            mean_delta_p,
            mean_delta_p_error,
            rms_delta_p: (delta.iter().map(|d| d * d).sum::<f64>() / n as f64).sqrt(),
            max_delta_p: fold(&delta, f64::max, f64::NEG_INFINITY),
            min_delta_p: fold(&delta, f64::min, f64::INFINITY),
            delta_p_percentiles: percentiles(&delta),
            ppl_ref,
            ppl_cand,
            ppl_ratio: ppl_cand / ppl_ref,
            kld_score: 100.0 * (-mean_kld).exp(),
        })
    }
}

/// The existing tool's bands for a composite score.
pub fn band(score: f64) -> &'static str {
    if score >= 90.0 {
        "EXCELLENT"
    } else if score >= 80.0 {
        "PASS"
    } else if score >= 60.0 {
        "DEGRADED"
    } else {
        "FAIL"
    }
}

/// Harmonic mean of the scores present (0 if any is 0).
pub fn composite(scores: &[f64]) -> f64 {
    if scores.is_empty() {
        return f64::NAN;
    }
    if scores.iter().any(|&s| s <= 0.0) {
        return 0.0;
    }
    scores.len() as f64 / scores.iter().map(|s| 1.0 / s).sum::<f64>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_like_numpy() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(quantile(&v, 0.5), 2.5);
        assert_eq!(quantile(&v, 0.0), 1.0);
        assert_eq!(quantile(&v, 1.0), 4.0);
        assert!((quantile(&v, 0.9) - 3.7).abs() < 1e-12);
    }

    #[test]
    fn mean_error_is_sample_std_over_root_n() {
        let (m, e) = mean_and_error(&[1.0, 2.0, 3.0, 4.0]);
        assert_eq!(m, 2.5);
        // sample variance 5/3, /4 → sqrt(5/12)
        assert!((e - (5.0f64 / 12.0).sqrt()).abs() < 1e-12);
    }

    #[test]
    fn scores_bands_and_harmonic_mean() {
        assert!((composite(&[90.0, 60.0]) - 72.0).abs() < 1e-12);
        assert_eq!(composite(&[0.0, 90.0]), 0.0);
        assert_eq!(band(90.0), "EXCELLENT");
        assert_eq!(band(85.0), "PASS");
        assert_eq!(band(60.0), "DEGRADED");
        assert_eq!(band(59.9), "FAIL");
    }

    #[test]
    fn stats_from_hand_made_samples() {
        let mut s = PositionSamples::default();
        s.push(0.1, true, (0.5f64).ln(), (0.4f64).ln());
        s.push(0.3, false, (0.25f64).ln(), (0.5f64).ln());
        s.push(f64::NAN, true, 0.0, 0.0);
        let st = KldStats::from_samples(&s).unwrap();
        assert_eq!(st.positions, 2);
        assert_eq!(st.non_finite_positions, 1);
        assert!((st.mean_kld - 0.2).abs() < 1e-12);
        assert_eq!(st.same_top_percent, 50.0);
        assert!((st.mean_delta_p - 0.075).abs() < 1e-12); // (-0.1 + 0.25) / 2
        assert!((st.ppl_ref - (1.0 / (0.5f64 * 0.25).sqrt())).abs() < 1e-9);
        assert!((st.kld_score - 100.0 * (-0.2f64).exp()).abs() < 1e-9);
        assert!(KldStats::from_samples(&PositionSamples::default()).is_none());
    }
}
