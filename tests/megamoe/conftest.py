"""tests/megamoe imports its helpers (fake_deep_gemm) as plain modules; pytest runs with --import-mode=importlib,
which puts no test directory on sys.path, so this conftest adds its own folder (as tests/regression does)."""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
