"""A client of ``gemma-mlx worker``: JSON lines over a child process's pipes."""

from __future__ import annotations

import itertools
import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any, Optional


class WorkerError(RuntimeError):
    """A request the worker answered with an error, or a worker that died."""


def gemma_mlx_binary() -> str:
    """``GEMMA_MLX_BIN``, else ``gemma-mlx`` on ``PATH``."""
    explicit = os.environ.get("GEMMA_MLX_BIN")
    if explicit:
        return explicit
    found = shutil.which("gemma-mlx")
    if found is None:
        raise WorkerError(
            "gemma-mlx not found: put it on PATH (cargo install --path crates/engine) "
            "or set GEMMA_MLX_BIN to the binary"
        )
    return found


def extra_arguments() -> list[str]:
    """Model options for every worker, from ``GEMMA_MLX_ARGS`` (e.g.
    ``--device cpu --dtype float32``)."""
    return shlex.split(os.environ.get("GEMMA_MLX_ARGS", ""))


class WorkerClient:
    """One ``gemma-mlx worker`` with ``model`` loaded; started on first use
    and again if it has died."""

    def __init__(self, model: Path, binary: Optional[str] = None,
                 arguments: Optional[list[str]] = None) -> None:
        self.model = Path(model)
        self.binary = binary
        self.arguments = arguments
        self._process: Optional[subprocess.Popen] = None
        self._ids = itertools.count(1)

    def _start(self) -> subprocess.Popen:
        if self._process is None or self._process.poll() is not None:
            command = [self.binary or gemma_mlx_binary(), "worker", "--model", str(self.model)]
            command += extra_arguments() if self.arguments is None else self.arguments
            self._process = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL, text=True, bufsize=1,
            )
        return self._process

    def request(self, op: str, **fields: Any) -> dict:
        """Sends one request and returns its result; raises WorkerError with
        the worker's message when it answers with an error. With
        ``REFRACT_GEMMA_MLX_PER_CALL=1`` every request gets a fresh worker
        that loads the model for it alone (the per-call method, to measure
        what keeping the model loaded saves)."""
        if os.environ.get("REFRACT_GEMMA_MLX_PER_CALL") == "1":
            try:
                return self._send(op, fields)
            finally:
                self.close()
        return self._send(op, fields)

    def _send(self, op: str, fields: dict) -> dict:
        process = self._start()
        request_id = next(self._ids)
        line = json.dumps({"id": request_id, "op": op, **fields})
        try:
            process.stdin.write(line + "\n")
            process.stdin.flush()
            answer = process.stdout.readline()
        except OSError as e:
            raise WorkerError(f"gemma-mlx worker for {self.model} died: {e}") from e
        if not answer:
            raise WorkerError(
                f"gemma-mlx worker for {self.model} exited (status {process.poll()})"
            )
        reply = json.loads(answer)
        if reply.get("id") != request_id:
            raise WorkerError(f"answer {reply.get('id')!r} to request {request_id}")
        if not reply.get("ok"):
            raise WorkerError(reply.get("error", "unknown error"))
        return reply["result"]

    def close(self) -> None:
        """Ends the worker (closing its stdin)."""
        if self._process is not None and self._process.poll() is None:
            self._process.stdin.close()
            self._process.wait(timeout=60)
        self._process = None
