"""The ``gemma-mlx`` REFRACT backend: every primitive is one request to a
``gemma-mlx worker`` that keeps the model loaded (one worker per model).

KV specs are REFRACT's own strings (``ctk=f16,ctv=f16``,
``ctk=q8_0,ctv=turbo4``, ...) passed to gemma-mlx as they are, meaning what
they mean in llama.cpp: ``q8_0``/``q4_0``/``q4_1``/``q5_0``/``q5_1`` are
ggml's blocks, ``turbo2/3/4`` the TurboQuant fork's; MLX's affine formats,
which REFRACT's MLX backend called ``q8_0`` and ``q4_0``, are ``mlx8`` and
``mlx4`` (``group=`` applies to them). Keys and values are independent and
``start=`` applies; gemma-mlx rejects what it does not know, naming what it
accepts.

KLD chunks start with ``<bos>``, as llama-perplexity (REFRACT's llama.cpp
backend) scores them, so that the two backends' numbers compare.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Optional

from refract.backends.base import (
    Backend,
    BackendCapabilityError,
    CompletionResult,
    KLDResult,
    TrajectoryResult,
)

from .worker import WorkerClient, WorkerError, extra_arguments, gemma_mlx_binary

#: How KLD chunks start, as the worker's ``kld`` request takes it.
KLD_BOS = True

_INSTANCE: Optional["GemmaMlxBackend"] = None


def backend_instance() -> "GemmaMlxBackend":
    """The process's one backend, so that its workers are shared."""
    global _INSTANCE
    if _INSTANCE is None:
        _INSTANCE = GemmaMlxBackend()
    return _INSTANCE


class GemmaMlxBackend(Backend):
    """REFRACT's primitives through ``gemma-mlx worker``."""

    name = "gemma-mlx"

    def __init__(self) -> None:
        self._workers: dict[Path, WorkerClient] = {}

    def worker(self, model: Path) -> WorkerClient:
        """The worker holding ``model`` (started on first use)."""
        key = Path(model).resolve()
        if key not in self._workers:
            self._workers[key] = WorkerClient(key)
        return self._workers[key]

    def _request(self, model: Path, op: str, **fields) -> dict:
        try:
            return self.worker(model).request(op, **fields)
        except WorkerError as e:
            if "KV spec" in str(e):
                raise BackendCapabilityError(str(e)) from e
            raise

    def _generate(self, model: Path, prompt: str, kv_config_str: str, n_predict: int,
                  seed: int, temperature: float, apply_chat_template: bool,
                  system: Optional[str]) -> dict:
        flags = {"max-tokens": n_predict, "kv": kv_config_str, "temp": temperature,
                 "seed": seed}
        return self._request(model, "complete", prompt=prompt, chat=apply_chat_template,
                             system=system, flags=flags)

    def run_completion(self, *, model: Path, prompt: str, kv_config_str: str,
                       n_predict: int = 128, ctx: int = 512, n_gpu_layers: int = 99,
                       seed: int = 42, temperature: float = 0.0, timeout: float = 300.0,
                       apply_chat_template: bool = True, system: Optional[str] = None,
                       reasoning: str = "off") -> CompletionResult:
        result = self._generate(model, prompt, kv_config_str, n_predict, seed, temperature,
                                apply_chat_template, system)
        return CompletionResult(
            text=(result["text"] or "").strip(),
            n_tokens=result["generation_tokens"],
            metadata={"decode": result["decode"], "finish_reason": result["finish_reason"]},
        )

    def run_completion_trajectory(self, *, model: Path, prompt: str, kv_config_str: str,
                                  n_predict: int = 128, ctx: int = 512,
                                  n_gpu_layers: int = 99, seed: int = 42,
                                  temperature: float = 0.0, timeout: float = 300.0,
                                  apply_chat_template: bool = True,
                                  system: Optional[str] = None) -> TrajectoryResult:
        result = self._generate(model, prompt, kv_config_str, n_predict, seed, temperature,
                                apply_chat_template, system)
        ids = list(result["token_ids"])
        return TrajectoryResult(token_ids=ids, metadata={"n_tokens": len(ids),
                                                         "decode": result["decode"]})

    def run_kld(self, *, model: Path, corpus: Path, ref_kv_str: str, cand_kv_str: str,
                chunks: int = 32, ctx: int = 512, n_gpu_layers: int = 99) -> KLDResult:
        report = self._request(model, "kld", corpus=str(Path(corpus).resolve()),
                               ref=ref_kv_str, cand=[cand_kv_str], ctx=ctx, chunks=chunks,
                               bos=KLD_BOS)
        candidate = report["candidates"][0]
        settings = report["settings"]
        return KLDResult(
            mean_kld=candidate["mean_kld"],
            ppl=candidate["ppl_cand"],
            rms_dp_pct=100.0 * candidate["rms_delta_p"],
            same_topp_pct=candidate["same_top_percent"],
            chunks=settings["chunks"],
            ctx=settings["ctx"],
            metadata={"gemma_mlx": report},
        )

    def tokenize_to_ids(self, *, model: Path, text: str, timeout: float = 120.0) -> list[int]:
        if not text:
            return []
        return list(self._request(model, "tokenize", text=text, plain=True)["token_ids"])

    def model_metadata(self, *, model: Path) -> dict:
        info = self._request(model, "info")
        version = subprocess.run([gemma_mlx_binary(), "--version"], capture_output=True,
                                 text=True, check=False).stdout.strip()
        return {
            "backend": self.name,
            "model": str(model),
            "gemma_mlx_version": version,
            "gemma_mlx_commit": source_commit(),
            "gemma_mlx_arguments": extra_arguments(),
            "mlx_version": info.get("mlx_version"),
            "device": info.get("device"),
            "dtype": info.get("dtype"),
            "weights": info.get("weights"),
            "activations": info.get("activations"),
            "cpu_kernels": info.get("cpu_kernels"),
            "kld_chunk_start": "<bos>" if KLD_BOS else "mid-text",
            "kv_type_names": "llama.cpp's (q8_0 etc. are ggml blocks; MLX affine is mlx8/mlx4)",
        }


def source_commit() -> Optional[str]:
    """The git commit of the checkout this package is installed from (an
    editable install, as `cargo xtask setup` makes), when there is one."""
    result = subprocess.run(["git", "-C", str(Path(__file__).resolve().parent), "rev-parse",
                             "--short=12", "HEAD"], capture_output=True, text=True, check=False)
    return result.stdout.strip() or None
