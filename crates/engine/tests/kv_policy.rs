//! KV policies (`BASE;LAYERS:SETTINGS`) through `gemma-mlx`: a policy runs
//! the formats it names per layer, reports them layer by layer, scores
//! between its uniform ends, and decodes the same tokens eagerly and
//! compiled.

mod kld_cli;

use kld_cli::{candidate, gemma_mlx, json_of, model, num, report, CORPUS};

/// Values at turbo2 everywhere, at q8_0 everywhere, and the TurboQuant
/// fork's boundary V (`TURBO_LAYER_ADAPTIVE=7`): q8_0 in the first two and
/// last two of the 18 layers.
const LOW: &str = "ctk=q8_0,ctv=turbo2";
const HIGH: &str = "ctk=q8_0,ctv=q8_0";
const BOUNDARY: &str = "ctk=q8_0,ctv=turbo2;first2,last2:ctv=q8_0";

#[test]
fn a_boundary_policy_scores_between_its_uniform_ends() {
    let r = report(
        "kld",
        &[
            "--corpus", CORPUS, "--cand", LOW, "--cand", BOUNDARY, "--cand", HIGH, "--ctx", "256",
            "--chunks", "2",
        ],
    );
    let kld = |i| num(candidate(&r, i), "mean_kld");
    let bytes = |i| num(candidate(&r, i), "kv_cache_bytes");
    println!(
        "mean KLD: uniform turbo2 V {:.5}, boundary V {:.5}, uniform q8_0 V {:.5}",
        kld(0),
        kld(1),
        kld(2)
    );
    assert!(kld(2) < kld(1) && kld(1) < kld(0), "{r}");
    assert!(bytes(0) < bytes(1) && bytes(1) < bytes(2), "{r}");
    assert_eq!(
        candidate(&r, 1)["canonical"],
        "ctk=q8_0,ctv=turbo2,start=0;0-1:ctk=q8_0,ctv=q8_0;16-17:ctk=q8_0,ctv=q8_0"
    );
    assert_eq!(candidate(&r, 1)["spec"], BOUNDARY);
}

#[test]
fn a_policy_decodes_the_same_tokens_eagerly_and_compiled() {
    let policy = "ctk=turbo3,ctv=turbo3;global:ctk=q8_0+ctv=q8_0;0:ctv=iq4_nl";
    let model = model();
    let run = |decode: &str| {
        json_of(&gemma_mlx(&[
            "generate",
            "--model",
            &model,
            "--json",
            "The capital of France is",
            "--max-tokens",
            "24",
            "--kv",
            policy,
            "--decode",
            decode,
        ]))
    };
    let (eager, compiled) = (run("eager"), run("compiled"));
    assert_eq!(compiled["decode"], "compiled");
    assert_eq!(eager["token_ids"], compiled["token_ids"]);
    assert!(eager["token_ids"]
        .as_array()
        .is_some_and(|ids| !ids.is_empty()));
}

#[test]
fn a_policy_naming_layers_the_model_lacks_is_an_error() {
    let out = gemma_mlx(&[
        "kld",
        "--model",
        &model(),
        "--corpus",
        CORPUS,
        "--cand",
        "ctk=q8_0;18:ctv=q8_0",
        "--chunks",
        "1",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("'18'") && err.contains("0-17"), "{err}");
}

#[test]
fn rotation_keeps_float_caches_exact_and_lowers_what_4_bits_lose() {
    let r = report(
        "kld",
        &[
            "--corpus",
            CORPUS,
            "--cand",
            "ctk=f32,ctv=f32,rot=kv",
            "--cand",
            "ctk=q4_0,ctv=q4_0",
            "--cand",
            "ctk=q4_0,ctv=q4_0,rot=kv",
            "--ctx",
            "256",
            "--chunks",
            "2",
        ],
    );
    let kld = |i| num(candidate(&r, i), "mean_kld");
    println!(
        "mean KLD: rotated f32 {:e}, q4_0 {:.5}, rotated q4_0 {:.5}",
        kld(0),
        kld(1),
        kld(2)
    );
    // Float32 rounding of the two products with the Hadamard matrix only.
    assert!(kld(0) < 1e-5, "{r}");
    assert_eq!(num(candidate(&r, 0), "same_top_percent"), 100.0);
    assert_eq!(
        candidate(&r, 2)["canonical"],
        "ctk=q4_0,ctv=q4_0,rot=kv,start=0"
    );
    // Gemma 3's keys and values have outlying channels; the rotation
    // spreads them over 256 (keys) and 64 (values) values before the blocks
    // take their scale.
    assert!(kld(2) < kld(1), "{r}");
}
