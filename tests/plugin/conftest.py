"""tests/plugin/test_doctor.py runs `sglang-glm-ext doctor` in a fresh interpreter per case (each imports SGLang:
~10 s of CPU): it belongs to the slow lane. Marked here rather than in the module (this change keeps that file to
one assertion); a ``pytestmark = pytest.mark.slow`` there does the same."""

from __future__ import annotations

import os

import pytest

_DOCTOR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "test_doctor.py")


def pytest_collection_modifyitems(items):
    for item in items:
        if str(item.fspath) == _DOCTOR:
            item.add_marker(pytest.mark.slow)
