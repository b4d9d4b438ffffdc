"""Draws target/bench/chart.png from report.json: generation tokens/s against
the context length the tokens are generated after, both engines.

Usage: python chart.py REPORT_JSON OUT_PNG   (needs matplotlib; `cargo xtask
bench` installs it into the reference environment when it is missing)
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    report = json.load(open(sys.argv[1]))
    rows = report["generation_tps_by_context"]
    contexts = [r[0] for r in rows]
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    ax.plot(contexts, [r[1] for r in rows], marker="o", label="gemma-mlx")
    ax.plot(contexts, [r[2] for r in rows], marker="s", label="mlx-lm 0.32.2")
    ax.set_xscale("log", base=2)
    ax.set_xticks(contexts, [str(c) for c in contexts])
    ax.set_xlabel("context length (tokens before the 64 generated)")
    ax.set_ylabel("generation tokens/s")
    ax.set_ylim(bottom=0)
    ax.set_title("Gemma 3 270M, float32, CPU, same libmlx and OpenBLAS")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(sys.argv[2])


if __name__ == "__main__":
    main()
