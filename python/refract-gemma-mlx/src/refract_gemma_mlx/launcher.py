"""``refract-gemma-mlx``: REFRACT's command line with our backend selected
(``REFRACT_BACKEND=gemma-mlx``), so that a ``.gguf`` model goes to gemma-mlx
rather than REFRACT's llama.cpp backend. Arguments pass unchanged
(``score``, ``selftest``, ``compare``, ``repeatability``, ...)."""

from __future__ import annotations

import os
import sys

from .registry import NAME, register


def main() -> int:
    os.environ["REFRACT_BACKEND"] = NAME
    register()
    from refract.cli import main as refract_main
    result = refract_main()
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
