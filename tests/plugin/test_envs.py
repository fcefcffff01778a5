"""Every environment variable the package reads is declared, so plugin/registry.py ENV_VARS lists it (one table)."""

import pathlib
import re

from sglang_glm_ext.plugin.registry import ENV_VARS

PKG = pathlib.Path(__file__).resolve().parents[2] / "sglang_glm_ext"


def test_every_env_read_is_declared():
    declared = {e.name for e in ENV_VARS}
    pattern = re.compile(r"""(?:environ(?:\.get)?\(?\[?|getenv\()\s*["']((?:SGLANG|GLM)_[A-Z0-9_]+)["']""")
    used = set()
    for path in PKG.rglob("*.py"):
        used |= set(pattern.findall(path.read_text()))
    assert used <= declared, f"undeclared env vars: {sorted(used - declared)}"


def test_bool_parsing_is_strict(monkeypatch):
    import pytest

    from sglang_glm_ext.plugin.envs import DISABLE

    monkeypatch.setenv(DISABLE.name, "on")
    assert DISABLE.get_bool() is True
    monkeypatch.setenv(DISABLE.name, "0")
    assert DISABLE.get_bool() is False
    monkeypatch.setenv(DISABLE.name, "enable")
    with pytest.raises(ValueError, match=DISABLE.name):
        DISABLE.get_bool()
