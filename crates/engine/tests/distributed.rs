//! `kld` and `trajectory` spread over two ranks on this machine by MLX's
//! launcher (`mlx.launch -n 2 --backend ring`, from the reference
//! environment that `cargo xtask setup` makes): rank 0's report equals the
//! single-process report on the same settings, every statistic within
//! 1e-9 relative, with the ranks' shares recorded; a rank that fails makes
//! the run fail with its error and no report is written.
//! `GEMMA_MLX_SKIP_PARITY=1` skips these tests with the reference tests.

mod kld_cli;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;

use kld_cli::{model, stderr, temp_file, CORPUS, NATIVE};
use serde_json::Value;

/// `mlx.launch` of the reference environment, or `None` when told to skip.
fn launcher() -> Option<PathBuf> {
    if std::env::var("GEMMA_MLX_SKIP_PARITY").is_ok_and(|v| v == "1") {
        println!("SKIPPED: GEMMA_MLX_SKIP_PARITY=1, mlx.launch not run");
        return None;
    }
    let launch = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/py/venv/bin/mlx.launch");
    assert!(
        launch.is_file(),
        "{} is missing: run `cargo xtask setup`",
        launch.display()
    );
    Some(launch)
}

/// One thread per process, in the single process and in each rank alike.
const ONE_THREAD: [(&str, &str); 2] = [("RAYON_NUM_THREADS", "1"), ("OPENBLAS_NUM_THREADS", "1")];

/// One launch at a time: the ranks of two would meet on each other's ports.
static LAUNCH: Mutex<()> = Mutex::new(());

/// The first of `n` consecutive ports nobody listens on now.
fn free_ports(n: u16) -> u16 {
    loop {
        let first = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if first < u16::MAX - n
            && (1..n).all(|i| TcpListener::bind(("127.0.0.1", first + i)).is_ok())
        {
            return first;
        }
    }
}

/// `gemma-mlx ARGS` alone (`ranks` = None) or on `ranks` ranks through
/// `launch`.
fn run(ranks: Option<(&Path, usize)>, args: &[String]) -> Output {
    let _one_at_a_time = LAUNCH.lock().unwrap_or_else(|e| e.into_inner());
    let bin = env!("CARGO_BIN_EXE_gemma-mlx");
    let mut command = match ranks {
        None => {
            let mut c = Command::new(bin);
            c.args(args);
            c
        }
        Some((launch, n)) => {
            let mut c = Command::new(launch);
            let port = free_ports(n as u16).to_string();
            c.args([
                "-n",
                &n.to_string(),
                "--backend",
                "ring",
                "--starting-port",
                &port,
            ]);
            for (name, value) in ONE_THREAD {
                c.args(["--env", &format!("{name}={value}")]);
            }
            c.args(["--", bin]).args(args);
            c
        }
    };
    command.envs(ONE_THREAD);
    command.output().expect("the command runs")
}

/// The report a run wrote to `out`, with its stderr on failure.
fn report(output: &Output, out: &Path) -> Value {
    let text = std::fs::read_to_string(out).unwrap_or_else(|e| {
        panic!(
            "no report at {} ({e}); status {}, stderr:\n{}",
            out.display(),
            output.status,
            stderr(output)
        )
    });
    serde_json::from_str(&text).expect("the report is JSON")
}

/// Asserts `a` equals `b`: numbers within 1e-9 relative, everything else
/// exactly; `path` names the place for the message.
fn assert_same(a: &Value, b: &Value, path: &str) {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            assert!(
                x == y || (x - y).abs() <= 1e-9 * x.abs().max(y.abs()),
                "{path}: {x} against {y}"
            );
        }
        (Value::Object(x), Value::Object(y)) => {
            let keys = |o: &serde_json::Map<String, Value>| o.keys().cloned().collect::<Vec<_>>();
            assert_eq!(keys(x), keys(y), "{path}");
            for (k, v) in x {
                assert_same(v, &y[k], &format!("{path}.{k}"));
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            assert_eq!(x.len(), y.len(), "{path}");
            for (i, (v, w)) in x.iter().zip(y).enumerate() {
                assert_same(v, w, &format!("{path}[{i}]"));
            }
        }
        _ => assert_eq!(a, b, "{path}"),
    }
}

/// The settings two runs of one job share: all but the timing, the ranks
/// and the memory readings (each rank's own process).
fn shared_settings(report: &Value) -> Value {
    let mut settings = report["settings"].clone();
    let object = settings.as_object_mut().unwrap();
    for field in ["seconds", "world_size", "ranks", "active_memory_bytes"] {
        object.remove(field);
    }
    settings
}

fn args(subcommand: &str, out: &Path, rest: &[&str]) -> Vec<String> {
    let mut all = vec![subcommand.to_string(), "--model".into(), model()];
    all.extend(NATIVE.iter().map(|s| s.to_string()));
    all.extend(["--json".into(), "--out".into(), out.display().to_string()]);
    all.extend(rest.iter().map(|s| s.to_string()));
    all
}

const PROMPTS: &str = "{\"prompt\": \"The capital of France is\"}\n\
    {\"prompt\": \"Write one sentence about rivers.\", \"chat\": true}\n\
    {\"prompt\": \"1, 2, 3, 4,\"}\n";

#[test]
fn two_ranks_write_the_single_process_report_of_kld_and_trajectories() {
    let Some(launch) = launcher() else { return };
    let (_dir, prompts) = temp_file("prompts.jsonl", PROMPTS);
    let prompts = prompts.display().to_string();
    let job = [
        "--corpus",
        CORPUS,
        "--ctx",
        "128",
        "--chunks",
        "5",
        "--cand",
        "ctk=q8_0,ctv=q8_0",
        "--cand",
        "ctk=turbo3,ctv=q4_0",
        "--prompts",
        &prompts,
        "--max-tokens",
        "12",
    ];
    let dir = tempfile::tempdir().unwrap();
    let (one_out, two_out) = (dir.path().join("one.json"), dir.path().join("two.json"));
    let one = report(&run(None, &args("kld", &one_out, &job)), &one_out);
    let two = report(
        &run(Some((&launch, 2)), &args("kld", &two_out, &job)),
        &two_out,
    );
    assert_same(&one["candidates"], &two["candidates"], "candidates");
    assert_same(&shared_settings(&one), &shared_settings(&two), "settings");
    assert_eq!(one["settings"]["world_size"], 1);
    assert_eq!(two["settings"]["world_size"], 2);
    let ranks = two["settings"]["ranks"].as_array().unwrap();
    let shares: Vec<(u64, u64, u64)> = ranks
        .iter()
        .map(|r| {
            assert_eq!(r["device"], "cpu");
            (
                r["rank"].as_u64().unwrap(),
                r["chunks"].as_u64().unwrap(),
                r["prompts"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(shares, [(0, 2, 1), (1, 3, 2)]);
    assert_eq!(two["settings"]["chunks"], 5);
    assert_eq!(two["settings"]["forwards"], 15);

    let trajectory = [
        "--prompts",
        &prompts,
        "--cand",
        "ctk=turbo2,ctv=turbo2",
        "--max-tokens",
        "12",
    ];
    let one = report(
        &run(None, &args("trajectory", &one_out, &trajectory)),
        &one_out,
    );
    let two = report(
        &run(
            Some((&launch, 2)),
            &args("trajectory", &two_out, &trajectory),
        ),
        &two_out,
    );
    assert_same(
        &one["candidates"],
        &two["candidates"],
        "trajectory candidates",
    );
    assert_same(
        &shared_settings(&one),
        &shared_settings(&two),
        "trajectory settings",
    );
    assert_eq!(
        two["candidates"][0]["trajectories"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
}

#[test]
fn a_failing_rank_fails_the_run_with_its_error_and_no_report_is_written() {
    let Some(launch) = launcher() else { return };
    // The second prompt, rank 1's share, is longer than the model's
    // 32,768-token context; the first, rank 0's, is fine.
    let long = "a ".repeat(40_000);
    let text = format!("{{\"prompt\": \"Hello\"}}\n{{\"prompt\": \"{long}\"}}\n");
    let (_dir, prompts) = temp_file("prompts.jsonl", &text);
    let prompts = prompts.display().to_string();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("report.json");
    let trajectory = [
        "--prompts",
        &prompts,
        "--cand",
        "ctk=q8_0,ctv=q8_0",
        "--max-tokens",
        "4",
    ];
    let output = run(Some((&launch, 2)), &args("trajectory", &out, &trajectory));
    let err = stderr(&output);
    assert!(
        !out.exists(),
        "a report was written though rank 1 failed:\n{err}"
    );
    assert!(
        err.contains("rank 1 of 2 failed") && err.contains("context is 32768 tokens"),
        "{err}"
    );
    assert!(!output.stdout.contains(&b'{'), "a report on stdout");
}
