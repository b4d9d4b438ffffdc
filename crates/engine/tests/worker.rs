//! `gemma-mlx worker`: the default model loaded once, requests as JSON lines.
//! Its answers equal the one-shot commands' `--json` output (greedy tokens,
//! tokenization, a KLD report, a trajectory report); malformed lines, unknown
//! ops and fields, bad flags and specs, failed requests and a model that
//! fails to load are JSON errors, and the worker goes on serving.

mod kld_cli;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use kld_cli::{model, report, temp_file, CORPUS, EXACT};
use serde_json::{json, Value};

/// A running worker and its pipes.
struct Worker {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

impl Worker {
    /// The worker with the model settings of the one-shot commands it is
    /// compared with ([`EXACT`], as `report` runs them).
    fn start(model: &str) -> Worker {
        let mut child = Command::new(env!("CARGO_BIN_EXE_gemma-mlx"))
            .args(["worker", "--model", model])
            .args(EXACT)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the worker starts");
        let input = child.stdin.take().expect("stdin");
        let output = BufReader::new(child.stdout.take().expect("stdout"));
        Worker {
            child,
            input,
            output,
        }
    }

    /// Sends one line and reads the answer line.
    fn send(&mut self, line: &str) -> Value {
        writeln!(self.input, "{line}").expect("write a request");
        self.input.flush().expect("flush");
        let mut answer = String::new();
        self.output.read_line(&mut answer).expect("read an answer");
        serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{e}: {answer:?}"))
    }

    /// The result of a request that must succeed.
    fn ok(&mut self, request: Value) -> Value {
        let answer = self.send(&request.to_string());
        assert_eq!(answer["ok"], true, "{request} -> {answer}");
        assert_eq!(answer["id"], request["id"]);
        answer["result"].clone()
    }

    /// The error of a request that must fail.
    fn error(&mut self, line: &str) -> String {
        let answer = self.send(line);
        assert_eq!(answer["ok"], false, "{line} -> {answer}");
        answer["error"]
            .as_str()
            .expect("an error message")
            .to_string()
    }

    /// Closes stdin; the worker must exit cleanly.
    fn finish(mut self) {
        drop(self.input);
        let status = self.child.wait().expect("the worker exits");
        assert!(status.success(), "{status}");
    }
}

#[test]
fn answers_equal_the_one_shot_commands() {
    let model = model();
    let mut w = Worker::start(&model);
    let prompt = "The capital of France is";
    let mut args = vec!["generate", prompt, "--model", &model];
    args.extend(EXACT);
    args.extend([
        "--max-tokens",
        "12",
        "--kv",
        "ctk=q8_0,ctv=turbo4",
        "--json",
    ]);
    let cli = kld_cli::json_of(&kld_cli::gemma_mlx(&args));
    let ours = w.ok(json!({
        "id": 1,
        "op": "complete",
        "prompt": prompt,
        "flags": {"max-tokens": 12, "kv": "ctk=q8_0,ctv=turbo4", "temp": 0},
    }));
    assert_eq!(ours["token_ids"], cli["token_ids"]);
    assert_eq!(ours["text"], cli["text"]);

    let tokens = w.ok(json!({"id": "t", "op": "tokenize", "text": "Hello world"}));
    let cli = kld_cli::json_of(&kld_cli::gemma_mlx(&[
        "tokenize",
        "Hello world",
        "--model",
        &model,
        "--json",
    ]));
    assert_eq!(tokens, cli);

    let kld = w.ok(json!({
        "id": 2, "op": "kld", "corpus": CORPUS, "cand": ["ctk=q8_0,ctv=turbo4"],
        "ctx": 128, "chunks": 2,
    }));
    let cli = report(
        "kld",
        &[
            "--corpus",
            CORPUS,
            "--cand",
            "ctk=q8_0,ctv=turbo4",
            "--ctx",
            "128",
            "--chunks",
            "2",
        ],
    );
    assert_eq!(kld["candidates"], cli["candidates"]);

    let (_dir, prompts) = temp_file(
        "prompts.jsonl",
        "{\"prompt\": \"The capital of France is\"}\n{\"prompt\": \"Water boils at\"}\n",
    );
    let prompts = prompts.display().to_string();
    let trajectory = w.ok(json!({
        "id": 3, "op": "trajectory", "prompts": prompts, "cand": ["ctk=turbo3,ctv=turbo3"],
        "max_tokens": 16,
    }));
    let cli = report(
        "trajectory",
        &[
            "--prompts",
            &prompts,
            "--cand",
            "ctk=turbo3,ctv=turbo3",
            "--max-tokens",
            "16",
        ],
    );
    assert_eq!(trajectory["candidates"], cli["candidates"]);
    w.finish();
}

#[test]
fn bad_requests_are_json_errors_and_the_worker_serves_on() {
    let mut w = Worker::start(&model());
    assert!(w.error("not json").contains("not JSON"));
    assert!(w
        .error(r#"{"op": "nope"}"#)
        .contains("unknown variant `nope`"));
    assert!(w
        .error(r#"{"op": "tokenize", "text": "a", "extra": 1}"#)
        .contains("unknown field `extra`"));
    assert!(w
        .error(r#"{"op": "tokenize"}"#)
        .contains("missing field `text`"));
    let e = w.error(r#"{"op": "complete", "prompt": "x", "flags": {"kv": "ctk=turbo5"}}"#);
    assert!(e.contains("turbo5") && e.contains("turbo4"), "{e}");
    let e = w.error(r#"{"op": "complete", "prompt": "x", "flags": {"bogus": 1}}"#);
    assert!(e.contains("--bogus"), "{e}");
    let e = w.error(r#"{"op": "kld", "corpus": "/no/such/corpus.txt", "cand": ["ctk=q8_0"]}"#);
    assert!(e.contains("/no/such/corpus.txt"), "{e}");
    // After every failure the next request is served.
    let tokens = w.ok(json!({"id": 7, "op": "tokenize", "text": "Hi", "plain": true}));
    assert_eq!(tokens["count"], 1);
    w.finish();
}

#[test]
fn a_model_that_fails_to_load_is_an_error_until_one_loads() {
    let mut w = Worker::start("/no/such/model.gguf");
    let e = w.error(r#"{"op": "tokenize", "text": "Hi"}"#);
    assert!(
        e.contains("no model is loaded") && e.contains("/no/such/model.gguf"),
        "{e}"
    );
    let e = w.error(r#"{"op": "load", "model": "/still/missing.gguf"}"#);
    assert!(e.contains("/still/missing.gguf"), "{e}");
    let info = w.ok(json!({"id": 1, "op": "load", "model": model()}));
    assert_eq!(info["layers"], 18);
    let tokens = w.ok(json!({"id": 2, "op": "tokenize", "text": "Hi", "plain": true}));
    assert_eq!(tokens["count"], 1);
    w.finish();
}
