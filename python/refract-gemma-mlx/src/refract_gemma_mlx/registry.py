"""Registration of the backend with REFRACT, which picks backends from a
fixed list in ``refract.backends``: its ``get_backend`` and
``auto_backend`` are wrapped so that the name ``gemma-mlx`` (by
``REFRACT_BACKEND`` or by name) gives ours."""

from __future__ import annotations

import os
from pathlib import Path

NAME = "gemma-mlx"
_registered = False


def register() -> None:
    """Wraps REFRACT's backend selection once (idempotent)."""
    global _registered
    if _registered:
        return
    import refract.backends as backends

    original_get = backends.get_backend

    def get_backend(name: str):
        if name.lower() == NAME:
            from .backend import backend_instance
            return backend_instance()
        return original_get(name)

    def auto_backend(model: Path):
        env = os.environ.get("REFRACT_BACKEND")
        if env:
            return get_backend(env)
        return original_auto(model)

    original_auto = backends.auto_backend
    backends.get_backend = get_backend
    backends.auto_backend = auto_backend
    _registered = True
