"""REFRACT backend ``gemma-mlx``: REFRACT's axes scored through ``gemma-mlx
worker``, one long-lived worker process per model.

Importing this package registers the backend with REFRACT, so that
``REFRACT_BACKEND=gemma-mlx`` selects it; the ``refract-gemma-mlx`` console
script does that and then runs REFRACT's own command line.
"""

from .backend import GemmaMlxBackend
from .registry import register
from .worker import WorkerClient, WorkerError

register()

__all__ = ["GemmaMlxBackend", "WorkerClient", "WorkerError", "register"]
