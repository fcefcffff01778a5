"""tests/megamoe imports its helpers (fake_deep_gemm) as plain modules; pytest runs with --import-mode=importlib,
which puts no test directory on sys.path, so this conftest adds its own folder (as tests/regression does)."""

from __future__ import annotations

import os
import sys

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


@pytest.fixture(autouse=True)
def _sglang_state(sglang_state):
    """Every test here builds SGLang's MoE layers, which publish server args, stamp topologies and initialise flags on
    SGLang's process-wide runtime context (a scheduler does it once per process): each test's is put back."""
