//! End-to-end tests of the `gemma-mlx` command on the default model (the
//! Gemma 3 270M GGUF; see `common::default_model_path`).
//!
//! Every run of `generate`, `tokenize` or `info` loads the model (a few
//! seconds), so the tests keep the number of runs small. Greedy token ids are
//! compared with mlx-lm's, committed in `fixtures/mlx_lm_greedy.json` (made by
//! `fixtures/make_mlx_lm_greedy.py`, which says how to run it).

mod common;

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use gemma::gguf::GgufFile;
use gemma::tokenizer::Tokenizer;
use mlx_core::block_dot::CpuKernels;
use serde_json::Value;

use common::{json_of, stderr};

/// Runs `gemma-mlx` with `args`, feeding `stdin` (empty when `None`).
fn run(args: &[&str], stdin: Option<&str>) -> Output {
    run_with(args, stdin, &[])
}

/// [`run`] with the environment variables `env` set.
fn run_with(args: &[&str], stdin: Option<&str>, env: &[(&str, &str)]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gemma-mlx"))
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("gemma-mlx starts");
    let mut pipe = child.stdin.take().expect("stdin is piped");
    pipe.write_all(stdin.unwrap_or("").as_bytes())
        .expect("stdin takes the prompt");
    drop(pipe);
    child.wait_with_output().expect("gemma-mlx runs")
}

fn ids(value: &Value) -> Vec<u32> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("not an array: {value}"))
        .iter()
        .map(|v| {
            v.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or_else(|| panic!("not a token id: {v}"))
        })
        .collect()
}

/// Runs `generate --json` and checks every field of its JSON result against
/// the others (counts, ids, finish reason, positive speeds and memory).
fn generate_json(args: &[&str], stdin: Option<&str>) -> Value {
    generate_json_with(args, stdin, &[])
}

/// [`generate_json`] with the environment variables `env` set.
fn generate_json_with(args: &[&str], stdin: Option<&str>, env: &[(&str, &str)]) -> Value {
    let mut all = vec!["generate", "--json"];
    all.extend_from_slice(args);
    let out = run_with(&all, stdin, env);
    let v = json_of(&out);
    let fields = [
        "text",
        "token_ids",
        "finish_reason",
        "decode",
        "prompt_tokens",
        "prompt_tps",
        "generation_tokens",
        "generation_tps",
        "ttft_s",
        "peak_memory_bytes",
        "decode_host",
        "weights",
        "activations",
        "cpu_kernels",
    ];
    for field in fields {
        assert!(v.get(field).is_some(), "field '{field}' missing from {v}");
    }
    // The host's decoding times: non-negative, and within the whole run's.
    let host: f64 = ["first_token_s", "build_s", "queue_s", "wait_s"]
        .iter()
        .map(|k| {
            let t = v["decode_host"][k].as_f64();
            assert!(t.is_some_and(|t| t >= 0.0), "decode_host.{k}: {v}");
            t.unwrap_or(0.0)
        })
        .sum();
    let decode_s = v["generation_tokens"].as_f64().unwrap_or(0.0)
        / v["generation_tps"]
            .as_f64()
            .filter(|t| *t > 0.0)
            .unwrap_or(f64::INFINITY);
    let whole = v["ttft_s"].as_f64().unwrap_or(0.0) + decode_s;
    assert!(
        host > 0.0 && host <= whole * 1.05 + 0.01,
        "{host} s of {whole} s: {v}"
    );
    let token_ids = ids(&v["token_ids"]);
    assert_eq!(
        v["generation_tokens"].as_u64(),
        Some(token_ids.len() as u64),
        "{v}"
    );
    assert!(v["prompt_tokens"].as_u64().is_some_and(|n| n >= 2), "{v}");
    assert!(
        ["stop", "stop_string", "length", "cancelled"]
            .contains(&v["finish_reason"].as_str().unwrap_or("")),
        "{v}"
    );
    assert!(v["text"].is_string(), "{v}");
    for field in ["prompt_tps", "ttft_s"] {
        assert!(
            v[field].as_f64().is_some_and(|x| x.is_finite() && x > 0.0),
            "{field}: {v}"
        );
    }
    if token_ids.len() > 1 {
        assert!(
            v["generation_tps"]
                .as_f64()
                .is_some_and(|x| x.is_finite() && x > 0.0),
            "{v}"
        );
    }
    // At least the weights are held: the 270M model's blocks as stored
    // (253 MB; its float32 weights are 1 GB).
    assert!(
        v["peak_memory_bytes"]
            .as_u64()
            .is_some_and(|b| b > 200_000_000),
        "{v}"
    );
    // The streamed text went to stderr.
    let text = v["text"].as_str().unwrap_or("");
    assert!(
        stderr(&out).contains(text),
        "stderr lacks the text {text:?}: {}",
        stderr(&out)
    );
    v
}

/// The default model's tokenizer, read in-process (without the weights).
fn tokenizer() -> Tokenizer {
    let file = GgufFile::open(&common::default_model_path()).unwrap_or_else(|e| panic!("{e}"));
    Tokenizer::from_gguf(&file).unwrap_or_else(|e| panic!("{e}"))
}

/// mlx-lm's reference: `(prompt, prompt ids, greedy ids)` per case.
fn mlx_lm_reference() -> Vec<(String, Vec<u32>, Vec<u32>)> {
    let text = include_str!("fixtures/mlx_lm_greedy.json");
    let v: Value = serde_json::from_str(text).expect("fixture parses");
    assert_eq!(v["max_tokens"].as_u64(), Some(32));
    v["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| {
            (
                c["prompt"].as_str().expect("prompt").to_string(),
                ids(&c["prompt_ids"]),
                ids(&c["token_ids"]),
            )
        })
        .collect()
}

#[test]
fn greedy_ids_match_mlx_lm() {
    let reference = mlx_lm_reference();
    assert_eq!(reference.len(), 4);
    let tokenizer = tokenizer();
    for (prompt, prompt_ids, expected) in reference {
        // The dequantized weights: mlx-lm's float32 model, term for term.
        let v = generate_json(
            &[&prompt, "--max-tokens", "32", "--weights", "dequantized"],
            None,
        );
        assert_eq!(
            v["prompt_tokens"].as_u64(),
            Some(prompt_ids.len() as u64),
            "{prompt}"
        );
        assert_eq!(ids(&v["token_ids"]), expected, "greedy ids of {prompt:?}");
        let stopped = expected.last().is_some_and(|id| [1, 106].contains(id));
        assert_eq!(
            v["finish_reason"],
            if stopped { "stop" } else { "length" },
            "{prompt}"
        );
        // The text is the detokenized ids (a final stop token has no text).
        let text_ids: Vec<u32> = expected
            .iter()
            .copied()
            .filter(|id| ![1, 106].contains(id))
            .collect();
        assert_eq!(
            v["text"].as_str(),
            Some(tokenizer.decode(&text_ids).expect("decodes").as_str()),
            "{prompt}"
        );
    }
}

#[test]
fn compiled_decoding_gives_the_greedy_ids_of_mlx_lm() {
    for (prompt, _, expected) in mlx_lm_reference().into_iter().take(2) {
        let v = generate_json(
            &[
                &prompt,
                "--max-tokens",
                "32",
                "--decode",
                "compiled",
                "--weights",
                "dequantized",
            ],
            None,
        );
        assert_eq!(ids(&v["token_ids"]), expected, "greedy ids of {prompt:?}");
        assert_eq!(v["decode"], "compiled");
    }
}

#[test]
fn native_weights_decode_compiled_by_default_with_the_greedy_ids_of_mlx_lm() {
    // Float32 activations: our block kernels sum the same products as the
    // dequantized matrices, in another order.
    for (prompt, _, expected) in mlx_lm_reference() {
        let args = [
            "generate",
            "--json",
            prompt.as_str(),
            "--max-tokens",
            "32",
            "--weights",
            "native",
            "--activations",
            "f32",
        ];
        let v = json_of(&run(&args, None));
        assert_eq!(v["decode"], "compiled", "{prompt}");
        // The blocks as stored (253 MB), not the 1 GB of float32 weights.
        let peak = v["peak_memory_bytes"].as_u64().unwrap_or(0);
        assert!(peak > 200_000_000 && peak < 500_000_000, "{v}");
        assert_eq!(ids(&v["token_ids"]), expected, "greedy ids of {prompt:?}");
    }
}

#[test]
fn on_the_cpu_native_weights_decode_compiled_by_default_and_dequantized_ones_eager() {
    let (prompt, _, expected) = mlx_lm_reference().swap_remove(0);
    for kernels in [&[][..], &["--gpu-kernels"], &["--gpu-kernels=false"]] {
        // The flag before the prompt: a bare --gpu-kernels takes no value.
        let mut args = kernels.to_vec();
        args.extend([prompt.as_str(), "--max-tokens", "8"]);
        let v = generate_json(&args, None);
        assert_eq!(v["decode"], "compiled", "{kernels:?}");
        let peak = v["peak_memory_bytes"].as_u64().unwrap_or(0);
        assert!(peak < 500_000_000, "the blocks as stored: {v}");
        args.extend(["--weights", "dequantized"]);
        let v = generate_json(&args, None);
        assert_eq!(v["decode"], "eager", "{kernels:?}");
        assert_eq!(ids(&v["token_ids"]), expected[..8], "{kernels:?}");
    }
}

#[test]
fn compiled_and_eager_decoding_give_the_same_tokens_on_every_cpu_kernel_family() {
    // The default path (GGUF blocks as stored, 8-bit activations), where
    // both modes run each block as our operations with the same arithmetic:
    // the same tokens, compressed caches included (on an AVX-512 VNNI Xeon
    // they once parted at token 13 of this prompt under q8_0/q4_0).
    let prompt = "The history of the printing press begins";
    for family in CpuKernels::supported().unwrap() {
        let env = [("GEMMA_MLX_CPU_KERNELS", family.name())];
        for kv in [
            "ctk=q8_0,ctv=q4_0",
            "ctk=mlx8,ctv=mlx4",
            "ctk=turbo4,ctv=turbo3",
        ] {
            let run = |decode: &str| {
                let args = [prompt, "--max-tokens", "24", "--decode", decode, "--kv", kv];
                generate_json_with(&args, None, &env)
            };
            let (compiled, eager) = (run("compiled"), run("eager"));
            for (v, decode) in [(&compiled, "compiled"), (&eager, "eager")] {
                assert_eq!(v["decode"], decode, "{family}, {kv}");
                assert_eq!(v["weights"], "native", "{family}, {kv}");
                assert_eq!(v["activations"], "int8", "{family}, {kv}");
                assert_eq!(v["cpu_kernels"], family.name(), "{family}, {kv}");
            }
            assert_eq!(compiled["generation_tokens"], 24, "{family}, {kv}");
            assert_eq!(compiled["token_ids"], eager["token_ids"], "{family}, {kv}");
        }
    }
}

#[test]
fn the_cpu_kernel_family_is_chosen_by_the_environment_or_named_in_an_error() {
    // Unset or empty: the widest family this CPU runs.
    let best = CpuKernels::best().unwrap();
    let v = json_of(&run_with(
        &["info", "--json"],
        None,
        &[("GEMMA_MLX_CPU_KERNELS", "")],
    ));
    assert_eq!(
        v["cpu_kernels"],
        best.name(),
        "the widest family by default"
    );
    for family in CpuKernels::ALL {
        let env = [("GEMMA_MLX_CPU_KERNELS", family.name())];
        if family.is_supported().unwrap() {
            let v = json_of(&run_with(&["info", "--json"], None, &env));
            assert_eq!(v["cpu_kernels"], family.name());
        } else {
            assert_fails_with(
                &["info", "--json"],
                &env,
                &[
                    "GEMMA_MLX_CPU_KERNELS",
                    family.name(),
                    "do not run on this CPU",
                ],
            );
        }
    }
    for bad in ["avx1024", "AVX2", "fastest"] {
        assert_fails_with(
            &["info", "--json"],
            &[("GEMMA_MLX_CPU_KERNELS", bad)],
            &["GEMMA_MLX_CPU_KERNELS", bad, "portable, avx2, avx512"],
        );
    }
}

#[test]
fn prompt_from_stdin() {
    let (prompt, _, expected) = mlx_lm_reference().swap_remove(0);
    // The dequantized weights: mlx-lm's path, which the ids come from.
    let v = generate_json(
        &["--max-tokens", "6", "--weights", "dequantized"],
        Some(&prompt),
    );
    assert_eq!(ids(&v["token_ids"]), expected[..6]);
    assert_eq!(v["finish_reason"], "length");
}

#[test]
fn chat_flag_wraps_the_prompt_in_the_template() {
    let (prompt, _, raw) = mlx_lm_reference().swap_remove(0);
    let v = generate_json(&[&prompt, "--chat", "--max-tokens", "8"], None);
    // The Gemma 3 format, written out by hand; tokenizing with <bos> added
    // gives the template's own leading <bos>.
    let rendered = format!("<start_of_turn>user\n{prompt}<end_of_turn>\n<start_of_turn>model\n");
    let expected_prompt = tokenizer().encode(&rendered, true).expect("encodes");
    assert_eq!(expected_prompt[..2], [2, 105], "<bos><start_of_turn>");
    assert_eq!(
        v["prompt_tokens"].as_u64(),
        Some(expected_prompt.len() as u64)
    );
    assert_ne!(
        ids(&v["token_ids"]),
        raw[..ids(&v["token_ids"]).len()],
        "chat ids equal the raw completion's"
    );
}

#[test]
fn stop_string_is_never_streamed() {
    // Greedy: " the capital of the country of France. It is…"; the stop string
    // spans three tokens ("▁France", ".", "▁It"), so "France." must be held
    // back from the stream until it is known not to begin the stop string.
    let (prompt, _, expected) = mlx_lm_reference().swap_remove(0);
    // The dequantized weights: mlx-lm's path, which the ids come from.
    let out = run(
        &[
            "generate",
            "--json",
            &prompt,
            "--max-tokens",
            "12",
            "--stop",
            "France. It",
            "--weights",
            "dequantized",
        ],
        None,
    );
    let v = json_of(&out);
    assert_eq!(v["finish_reason"], "stop_string");
    assert_eq!(v["text"], " the capital of the country of ");
    // The ids run to the token completing the stop string.
    assert_eq!(ids(&v["token_ids"]), expected[..9]);
    let streamed = stderr(&out);
    assert!(
        streamed.starts_with(" the capital of the country of \n"),
        "streamed: {streamed:?}"
    );
}

#[test]
fn tokenize_json() {
    let v = json_of(&run(
        &["tokenize", "--json", "The capital of France is"],
        None,
    ));
    // SentencePiece's ids and pieces (the model rebuilt from the GGUF's
    // vocabulary, as in gemma's tests/fixtures/tokenizer/make_reference.py).
    assert_eq!(ids(&v["token_ids"]), [2, 818, 5279, 529, 7001, 563]);
    assert_eq!(v["count"], 6);
    let tokens: Vec<&str> = v["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(|t| t.as_str().expect("token"))
        .collect();
    assert_eq!(
        tokens,
        ["<bos>", "The", "▁capital", "▁of", "▁France", "▁is"]
    );
}

#[test]
fn info_json() {
    let v = json_of(&run(&["info", "--json"], None));
    assert_eq!(v["layers"], 18);
    assert_eq!(v["hidden_size"], 640);
    assert_eq!(v["attention_heads"], 4);
    assert_eq!(v["kv_heads"], 1);
    assert_eq!(v["head_dim"], 256);
    assert_eq!(v["vocab_size"], 262144);
    assert_eq!(v["sliding_window"], 512);
    assert_eq!(v["context_length"], 32768);
    assert_eq!(v["mlx_version"], "0.32.4");
    assert_eq!(v["device"], "cpu");
    assert_eq!(v["dtype"], "float32");
    // The default on the CPU: the Q4_K_M file's blocks as stored, 8-bit
    // activations on the kernel family the environment names (the widest
    // this CPU runs when it names none).
    assert_eq!(
        v["quantization"],
        "GGUF blocks as stored: Q8_0, Q5_0, Q4_K, Q6_K"
    );
    assert_eq!(v["weights"], "native");
    assert_eq!(v["activations"], "int8");
    assert_eq!(v["cpu_kernels"], CpuKernels::from_env().unwrap().name());
    assert_eq!(
        v["name"],
        common::default_model_path()
            .file_name()
            .and_then(|n| n.to_str())
            .expect("file name")
    );
    // Gemma 3 270M, float32: 262144 × 640 embedding + 640 final norm + 18
    // layers × (q 640×1024 + k, v 640×256 + o 1024×640 + gate, up 640×2048 +
    // down 2048×640 + 4 norms of 640 + 2 of 256) = 268,098,176 parameters.
    assert_eq!(v["parameters"], 268_098_176);
    // The file's tensors as stored (the file less its metadata and vocabulary).
    let file = std::fs::metadata(common::default_model_path())
        .map(|m| m.len())
        .unwrap_or(0);
    let held = v["weight_bytes"].as_u64().unwrap_or(0);
    assert!(
        held > file - 10_000_000 && held < file,
        "{held} of {file}: {v}"
    );
    // Dequantized: the same parameters, float32 each.
    let v = json_of(&run(&["info", "--json", "--weights", "dequantized"], None));
    assert_eq!(v["quantization"], "none");
    assert_eq!(v["weights"], "dequantized");
    assert_eq!(v["activations"], Value::Null);
    assert_eq!(
        v["cpu_kernels"],
        Value::Null,
        "no kernel of ours multiplies"
    );
    assert_eq!(v["parameters"], 268_098_176);
    assert_eq!(v["weight_bytes"], 4 * 268_098_176u64);
    // Float32 activations take the portable kernels, whatever the family.
    let v = json_of(&run(&["info", "--json", "--activations", "f32"], None));
    assert_eq!(v["activations"], "f32");
    assert_eq!(v["cpu_kernels"], "portable");
}

/// Asserts a failed run: exit status in 1..100, `error: ` and `expect` on
/// stderr, no panic, nothing on stdout.
fn assert_fails(args: &[&str], stdin: Option<&str>, expect: &[&str]) -> Duration {
    assert_fails_in(args, stdin, &[], expect)
}

/// [`assert_fails`] with the environment variables `env` set, no stdin.
fn assert_fails_with(args: &[&str], env: &[(&str, &str)], expect: &[&str]) -> Duration {
    assert_fails_in(args, None, env, expect)
}

fn assert_fails_in(
    args: &[&str],
    stdin: Option<&str>,
    env: &[(&str, &str)],
    expect: &[&str],
) -> Duration {
    let start = Instant::now();
    let out = run_with(args, stdin, env);
    let took = start.elapsed();
    let code = out
        .status
        .code()
        .unwrap_or_else(|| panic!("{args:?} was killed: {}", stderr(&out)));
    assert!(
        (1..100).contains(&code),
        "{args:?} exited with {code}: {}",
        stderr(&out)
    );
    let err = stderr(&out);
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    assert!(err.contains("error: "), "{args:?}: {err}");
    for needle in expect {
        assert!(
            err.contains(needle),
            "{args:?}: stderr lacks {needle:?}: {err}"
        );
    }
    assert!(
        out.stdout.is_empty(),
        "{args:?} printed {:?}",
        String::from_utf8_lossy(&out.stdout)
    );
    took
}

#[test]
fn bad_flags_fail_with_a_message() {
    assert_fails(
        &["generate", "hi", "--temp", "-1"],
        None,
        &["temperature", "-1", ">= 0"],
    );
    assert_fails(
        &["generate", "hi", "--top-p", "2"],
        None,
        &["top_p", "(0, 1]"],
    );
    assert_fails(
        &[
            "generate",
            "hi",
            "--xtc-probability",
            "0.5",
            "--xtc-threshold",
            "0.7",
        ],
        None,
        &["xtc_threshold", "[0, 0.5]"],
    );
    assert_fails(
        &["generate", "hi", "--presence-context-size", "0"],
        None,
        &["presence_window", "[1, 2147483647]"],
    );
    assert_fails(
        &["generate", "hi", "--kv", "ctk=turbo5"],
        None,
        &["turbo5", "turbo4", "q8_0"],
    );
    assert_fails(
        &["generate", "hi", "--kv", "ctk=turbo3,group=32"],
        None,
        &["group=", "TurboQuant"],
    );
    assert_fails(&["generate", "hi", "--logit-bias", "5"], None, &["ID=BIAS"]);
    assert_fails(
        &["generate", "hi", "--logit-bias", "999999=1"],
        None,
        &["999999", "262144"],
    );
    assert_fails(
        &["generate", "hi", "--prefill-chunk", "0"],
        None,
        &["prefill chunk"],
    );
    assert_fails(
        &["generate", "hi", "--steps-per-sync", "0"],
        None,
        &["--steps-per-sync", "1..=64"],
    );
    assert_fails(
        &["generate", "--gpu-kernels=maybe", "hi"],
        None,
        &["--gpu-kernels", "maybe"],
    );
    assert_fails(
        &["generate", "hi", "--max-memory", "0"],
        None,
        &["--max-memory"],
    );
    assert_fails(
        &["generate", "hi", "--layers", "2"],
        None,
        &["--random-weights"],
    );
    assert_fails(&["info", "--random-weights", "5b"], None, &["5b", "270m"]);
    // clap's usage errors exit with 2.
    let out = run(&["generate", "hi", "--bogus"], None);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--bogus"));
    assert_fails(&["generate", "hi", "--max-tokens", "-3"], None, &["-3"]);
}

#[test]
fn negative_penalties_are_accepted() {
    // mlx-lm allows negative presence and frequency penalties (they favour
    // repetition); they must not be mistaken for flags.
    let v = generate_json(
        &[
            "The capital of France is",
            "--max-tokens",
            "2",
            "--presence-penalty",
            "-0.5",
            "--frequency-penalty",
            "-0.25",
        ],
        None,
    );
    assert_eq!(ids(&v["token_ids"]).len(), 2);
}

#[test]
fn missing_model_fails_with_its_path() {
    assert_fails(
        &["generate", "hi", "--model", "/nonexistent.gguf"],
        None,
        &["/nonexistent.gguf", "no such file"],
    );
    assert_fails(
        &["info", "--model", "/nonexistent.gguf"],
        None,
        &["/nonexistent.gguf"],
    );
}

#[test]
fn over_long_prompt_fails_before_any_forward() {
    // 40,000 words, one token each: longer than the 32,768-token context. A
    // forward pass over 32k tokens would take minutes here; the check comes
    // first, so the run takes about as long as loading the model. The prompt
    // goes through stdin: it is too long for one command-line argument.
    let prompt = " the".repeat(40_000);
    let took = assert_fails(
        &["generate", "--json"],
        Some(&prompt),
        &["40001 tokens", "context is 32768 tokens"],
    );
    assert!(took < Duration::from_secs(60), "took {took:?}");
}
