//! `gemma-mlx kld` at 512-token chunks on the default model (float32),
//! against mlx-lm and across bit widths.
//!
//! One sweep (the whole shipped corpus: 8 chunks of 512 tokens, 4,088 scored
//! positions; MLX's affine formats mlx8, mlx6, mlx4, mlx2 and mlx8 keys with
//! mlx4 values, as mlx-lm's `QuantizedKVCache` stores them; chunks without
//! `<bos>`, as the mlx-lm script cuts them) serves every test here. The mlx-lm figures are committed in `fixtures/kld/mlx_lm_kld.json`,
//! made by `fixtures/kld/mlx_lm_kld.py` (which says how to run it).

mod kld_cli;

use std::sync::OnceLock;

use kld_cli::{by_canonical, num, report, CORPUS};
use serde_json::Value;
use sha2::{Digest, Sha256};

const Q8: &str = "ctk=mlx8,ctv=mlx8";
const Q6: &str = "ctk=mlx6,ctv=mlx6";
const Q4: &str = "ctk=mlx4,ctv=mlx4";
const Q2: &str = "ctk=mlx2,ctv=mlx2";
const Q8_Q4: &str = "ctk=mlx8,ctv=mlx4";

/// Relative tolerance against mlx-lm, as the issue sets it. KV quantization
/// is discontinuous: the float rounding of two correct implementations flips
/// some quantization decisions, and the flips grow through the residual
/// stream (a different rounding of the q/k/v projections moves single-chunk
/// q8 means by several percent). Our multi-token forward runs one product
/// per projection, rounding as mlx-lm's does, so the means agreed far closer
/// than this bound (0.0 %) on the machine that made the fixture.
const TOLERANCE: f64 = 0.02;

/// Standard errors of our mean that a difference may also span. OpenBLAS
/// picks its kernels by CPU, and they round differently: on an AMD EPYC
/// where it runs its Cooper Lake kernels (2026-12-01), mlx-lm's own q8 means
/// moved by up to 4.2 % per chunk from the fixture's, and ours differed
/// from mlx-lm's by 4.2 % at q8 (0.004586 against 0.004787, 1.2 standard
/// errors; q4 0.4 %). A real fault (floats attended within the chunk, wrong
/// bits or groups) moves a mean by far more than either bound.
const STANDARD_ERRORS: f64 = 2.0;

fn mlx_lm() -> Value {
    let text = include_str!("fixtures/kld/mlx_lm_kld.json");
    serde_json::from_str(text).expect("mlx_lm_kld.json is JSON")
}

/// The sweep, run once for all tests of this file.
fn sweep() -> &'static Value {
    static SWEEP: OnceLock<Value> = OnceLock::new();
    SWEEP.get_or_init(|| {
        let chunks = mlx_lm()["chunks"].to_string();
        report(
            "kld",
            &[
                "--corpus", CORPUS, "--ref", "", "--cand", Q8, "--cand", Q6, "--cand", Q4,
                "--cand", Q2, "--cand", Q8_Q4, "--ctx", "512", "--chunks", &chunks, "--no-bos",
            ],
        )
    })
}

fn mean_kld(spec: &str) -> f64 {
    let c = sweep()["candidates"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["spec"] == spec))
        .unwrap_or_else(|| panic!("no candidate '{spec}'"));
    num(c, "mean_kld")
}

#[test]
fn mean_kld_agrees_with_mlx_lm() {
    let reference = mlx_lm();
    let ours = sweep();
    let corpus_sha = format!(
        "{:x}",
        Sha256::digest(std::fs::read(CORPUS).expect("corpus read"))
    );
    assert_eq!(
        reference["corpus_sha256"],
        corpus_sha.as_str(),
        "stale fixture"
    );
    assert_eq!(ours["settings"]["chunks"], reference["chunks"]);
    assert_eq!(ours["settings"]["ctx"], reference["ctx"]);
    for r in reference["candidates"].as_array().expect("candidates") {
        let spec = r["spec"].as_str().expect("spec");
        let c = by_canonical(ours, &format!("{spec},group=64,start=0"));
        assert_eq!(c["positions"], r["positions"], "{spec}");
        let (ours, theirs) = (num(c, "mean_kld"), num(r, "mean_kld"));
        let error = num(c, "mean_kld_error");
        let relative = ours / theirs - 1.0;
        eprintln!(
            "{spec}: mean KLD {ours:.6} ± {error:.6} (mlx-lm {theirs:.6}, {:+.2} %)",
            100.0 * relative
        );
        assert!(
            relative.abs() < TOLERANCE || (ours - theirs).abs() < STANDARD_ERRORS * error,
            "{spec}: {ours} ± {error} against mlx-lm's {theirs}"
        );
    }
}

#[test]
fn fewer_bits_drift_further() {
    let [q8, q6, q4, q2, q8_q4] = [Q8, Q6, Q4, Q2, Q8_Q4].map(mean_kld);
    eprintln!(
        "mean KLD: q8 {q8:.6}, q6 {q6:.6}, q4 {q4:.6}, q2 {q2:.6}, q8 keys q4 values {q8_q4:.6}"
    );
    for spec in [Q8, Q6, Q4, Q2, Q8_Q4] {
        let c = sweep()["candidates"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["spec"] == spec))
            .expect("candidate");
        eprintln!(
            "{spec}: same top {:.2} %, PPL ratio {:.4}, KLD score {:.2}, band {}",
            num(c, "same_top_percent"),
            num(c, "ppl_ratio"),
            num(c, "kld_score"),
            c["band"]
        );
    }
    assert!(q8 < q6 && q6 < q4 && q4 < q2, "{q8} {q6} {q4} {q2}");
    assert!(q8 < q8_q4 && q8_q4 < q4, "{q8} {q8_q4} {q4}");
}
