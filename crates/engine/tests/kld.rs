//! `gemma-mlx kld` on the default model (float32 on the CPU): the sweep's
//! forward count and its reuse of reference logits, the self-test, identical
//! specs, the JSON report and `--out`, errors, and two-model mode.
//!
//! Chunks are short (256 tokens, 1–2 of them) to keep the runtime modest;
//! the agreement with mlx-lm at 512 tokens is in `kld_mlx_lm.rs`.

mod kld_cli;

use kld_cli::{
    by_canonical, candidate, gemma_mlx, model, num, report, stderr, temp_file, CORPUS, STAT_FIELDS,
};
use serde_json::Value;
use sha2::{Digest, Sha256};

const Q8: &str = "ctk=q8_0,ctv=q8_0";
const Q4: &str = "ctk=q4_0,ctv=q4_0";

/// Every statistic is present, and `positions` is what `chunks` chunks of
/// `ctx` tokens give with every position scored.
fn assert_stats(c: &Value, chunks: usize, ctx: usize) {
    for field in STAT_FIELDS {
        assert!(!c[field].is_null(), "'{field}' missing in {c}");
    }
    assert_eq!(c["positions"], chunks * (ctx - 1), "{c}");
    assert_eq!(c["non_finite_positions"], 0, "{c}");
    for field in [
        "p99_9", "p99", "p95", "p90", "median", "p10", "p5", "p1", "p0_1",
    ] {
        assert!(c["kld_percentiles"][field].is_number(), "{field} in {c}");
        assert!(
            c["delta_p_percentiles"][field].is_number(),
            "{field} in {c}"
        );
    }
    let (mean, score) = (num(c, "mean_kld"), num(c, "kld_score"));
    assert!((score - 100.0 * (-mean).exp()).abs() < 1e-9, "{c}");
    let ppl_ratio = num(c, "ppl_cand") / num(c, "ppl_ref");
    assert!((num(c, "ppl_ratio") - ppl_ratio).abs() < 1e-9, "{c}");
}

#[test]
fn sweep_computes_the_reference_once_per_chunk() {
    let (dir, out_file) = temp_file("report.json", "");
    let out_path = out_file.display().to_string();
    let common = [
        "--corpus", CORPUS, "--ref", "", "--cand", Q8, "--cand", Q4, "--ctx", "256", "--chunks",
        "2",
    ];
    let mut shared_args = common.to_vec();
    shared_args.extend(["--out", &out_path]);
    let shared = report("kld", &shared_args);
    let mut two_args = common.to_vec();
    two_args.push("--two-forwards");
    let two = report("kld", &two_args);

    // 2 chunks · (2 candidates + 1 reference), against 2 chunks · 2 · 2.
    assert_eq!(shared["settings"]["forwards"], 6, "{}", shared["settings"]);
    assert_eq!(two["settings"]["forwards"], 8, "{}", two["settings"]);
    assert_eq!(shared["settings"]["two_forwards"], false);
    assert_eq!(two["settings"]["two_forwards"], true);
    // The reference is deterministic, so reusing it changes nothing.
    assert_eq!(shared["candidates"], two["candidates"]);

    // --out writes the object printed on stdout.
    let written: Value =
        serde_json::from_str(&std::fs::read_to_string(&out_file).expect("--out file written"))
            .expect("--out file is JSON");
    assert_eq!(written, shared);
    drop(dir);

    let settings = &shared["settings"];
    let corpus_sha = format!(
        "{:x}",
        Sha256::digest(std::fs::read(CORPUS).expect("corpus read"))
    );
    assert_eq!(settings["corpus_sha256"], corpus_sha.as_str());
    assert_eq!(settings["model"], "gemma-3-270m-q4_k_m.gguf");
    assert_eq!(
        (settings["ctx"].clone(), settings["chunks"].clone()),
        (256.into(), 2.into())
    );
    assert_eq!(
        settings["bos"], true,
        "<bos> at each chunk's start by default"
    );
    assert_eq!(
        settings["convention"],
        "<bos> at each chunk's start (llama-perplexity's)"
    );
    assert_eq!(settings["second_half"], false);
    assert_eq!(settings["dtype"], "float32");
    for field in ["mlx_version", "device"] {
        assert!(
            settings[field].as_str().is_some_and(|s| !s.is_empty()),
            "settings.{field}: {settings}"
        );
    }
    assert_eq!(settings["reference_canonical"], "ctk=f32,ctv=f32,start=0");
    assert_eq!(candidate(&shared, 0)["spec"], Q8);
    assert_eq!(candidate(&shared, 1)["spec"], Q4);
    let q8 = by_canonical(&shared, "ctk=q8_0,ctv=q8_0,start=0");
    let q4 = by_canonical(&shared, "ctk=q4_0,ctv=q4_0,start=0");
    assert_stats(q8, 2, 256);
    assert_stats(q4, 2, 256);
    assert!(num(q8, "mean_kld") > 0.0 && num(q8, "mean_kld") < num(q4, "mean_kld"));
    // Keys and values of 18 layers, 256 positions, 1 head of 256 dims: 8
    // ggml blocks of 32 values, 34 bytes each in q8_0 (an f16 scale and 32
    // bytes), 18 in q4_0 (an f16 scale and 16 bytes of nibbles).
    let bytes = |block: usize| 18 * 2 * 256 * 8 * block;
    assert_eq!(q8["kv_cache_bytes"], bytes(34));
    assert_eq!(q4["kv_cache_bytes"], bytes(18));
    assert_eq!(settings["reference_kv_cache_bytes"], 18 * 2 * 256 * 256 * 4);
}

#[test]
fn self_test_and_identical_specs_give_zero() {
    let model = model();
    let out = gemma_mlx(&[
        "kld",
        "--model",
        &model,
        "--dtype",
        "float32",
        "--json",
        "--corpus",
        CORPUS,
        "--self-test",
        "--cand",
        "ctk=f32,ctv=f32",
        "--ctx",
        "256",
        "--chunks",
        "1",
    ]);
    let report = kld_cli::json_of(&out);
    assert!(
        stderr(&out).contains("self-test passed"),
        "{}",
        stderr(&out)
    );
    assert_eq!(report["settings"]["dtype"], "float32");
    let own = candidate(&report, 0);
    assert_eq!(own["spec"], "");
    assert_eq!(num(own, "mean_kld"), 0.0);
    assert_eq!(num(own, "max_kld"), 0.0);
    assert_eq!(num(own, "same_top_percent"), 100.0);
    assert!(num(own, "composite") >= 99.5, "{own}");
    // f32 keys and values on a float32 model: the reference's own format.
    let f32 = candidate(&report, 1);
    assert_eq!(f32["canonical"], "ctk=f32,ctv=f32,start=0");
    assert_eq!(num(f32, "mean_kld"), 0.0);
    assert_eq!(num(f32, "same_top_percent"), 100.0);
    assert_eq!(num(f32, "ppl_ratio"), 1.0);
}

#[test]
fn unknown_type_lists_the_accepted_ones() {
    let out = gemma_mlx(&["kld", "--corpus", CORPUS, "--cand", "ctk=turbo5"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("turbo5"), "{err}");
    for t in [
        "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "turbo2", "turbo3", "turbo4", "mlx8", "mlx6",
        "mlx5", "mlx4", "mlx3", "mlx2", "f32", "f16", "bf16",
    ] {
        assert!(err.contains(t), "'{t}' not listed: {err}");
    }
}

#[test]
fn turbo_candidates_score_beside_affine_ones() {
    let r = report(
        "kld",
        &[
            "--corpus",
            CORPUS,
            "--cand",
            "ctk=q8_0,ctv=turbo4",
            "--cand",
            "ctk=turbo3,ctv=turbo3",
            "--ctx",
            "256",
            "--chunks",
            "1",
        ],
    );
    let mixed = by_canonical(&r, "ctk=q8_0,ctv=turbo4,start=0");
    let turbo3 = by_canonical(&r, "ctk=turbo3,ctv=turbo3,start=0");
    assert_stats(mixed, 1, 256);
    assert_stats(turbo3, 1, 256);
    // Gemma 3's keys cost more fidelity than its values: 3-bit TurboQuant
    // keys lose more than 8-bit keys with 4-bit TurboQuant values.
    assert!(num(mixed, "mean_kld") > 0.0 && num(mixed, "mean_kld") < num(turbo3, "mean_kld"));
    // 18 layers of 256 positions, 1 head of 256 values (two groups of 128):
    // q8_0 keys 8 blocks of 34 bytes, turbo4 values 2·(64 + 2), turbo3 2·(48 + 2).
    let per_position = |k: usize, v: usize| 18 * 256 * (k + v);
    assert_eq!(mixed["kv_cache_bytes"], per_position(8 * 34, 2 * 66));
    assert_eq!(turbo3["kv_cache_bytes"], per_position(2 * 50, 2 * 50));
}

#[test]
fn group_with_a_turbo_side_is_an_error() {
    let out = gemma_mlx(&[
        "kld",
        "--corpus",
        CORPUS,
        "--cand",
        "ctk=turbo4,ctv=turbo3,group=32",
    ]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("group=") && err.contains("TurboQuant"),
        "{err}"
    );
}

#[test]
fn corpus_shorter_than_a_chunk_is_an_error() {
    let model = model();
    // The corpus's token count, as the mlx-lm fixture recorded it.
    let fixture: serde_json::Value =
        serde_json::from_str(include_str!("fixtures/kld/mlx_lm_kld.json"))
            .expect("fixture is JSON");
    let tokens = fixture["corpus_tokens"].as_u64().expect("corpus_tokens");
    let out = gemma_mlx(&[
        "kld", "--model", &model, "--corpus", CORPUS, "--cand", "ctk=q8_0", "--ctx", "8192",
    ]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains(&format!("{tokens} tokens")) && err.contains("8192"),
        "{err}"
    );
}

#[test]
fn two_models_compare_a_gguf_with_its_float_conversion() {
    let model = model();
    let dir = tempfile::tempdir().expect("temp dir");
    let folder = dir.path().join("hf");
    let folder = folder.display().to_string();
    let converted = gemma_mlx(&[
        "convert", "--model", &model, "--dtype", "float32", "--out", &folder,
    ]);
    assert!(converted.status.success(), "{}", stderr(&converted));
    let r = report(
        "kld",
        &[
            "--corpus",
            CORPUS,
            "--ref-model",
            &model,
            "--cand-model",
            &folder,
            "--ctx",
            "256",
            "--chunks",
            "2",
        ],
    );
    assert!(r["settings"]["cand_model"].is_string(), "{}", r["settings"]);
    assert_eq!(r["candidates"].as_array().map(Vec::len), Some(1));
    let c = candidate(&r, 0);
    assert_stats(c, 2, 256);
    let mean = num(c, "mean_kld");
    eprintln!(
        "GGUF against its float32 conversion: mean KLD {mean:e}, same top {}%",
        c["same_top_percent"]
    );
    assert!(mean < 1e-6, "{c}");
}
