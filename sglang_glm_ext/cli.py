"""`sglang-glm-ext` and `python -m sglang_glm_ext.cli`: the stable command name; the CLI is plugin/cli.py."""

from __future__ import annotations

import sys

from .plugin.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
