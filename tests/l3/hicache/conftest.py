"""Fixtures for the L3 HiCache backend tests: SGLang's real host pools and HiCache stack on a CPU.

The CPU stand-ins (sglang_glm_ext/l3/demo/cpu_standins.py) are installed per module and removed after
it. SGLang's storage test kit imports ``datasets`` through ``sglang.benchmark`` (not part of the CPU set-up): when
it is missing, a stub module whose ``load_dataset`` raises is inserted, only in this test process.
"""

from __future__ import annotations

import os
import sys
import types

import pytest

os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "..",
                                                           ".torch_extensions"))


def ensure_datasets_importable() -> None:
    try:
        import datasets  # noqa: F401
    except ImportError:
        stub = types.ModuleType("datasets")

        def load_dataset(*args, **kwargs):
            raise RuntimeError("datasets is stubbed in the sglang-glm-ext CPU tests (not installed)")

        stub.load_dataset = load_dataset
        sys.modules["datasets"] = stub


@pytest.fixture(scope="module")
def plugin():
    import sglang_glm_ext

    ledger = sglang_glm_ext.register()
    assert ledger is not None
    bad = [s for s in ledger.status.values()
           if s.patch.feature.name == "l3" and s.patch.tier.value != "demo" and s.state.value != "applied"]
    assert not bad, bad
    return ledger


@pytest.fixture(scope="module")
def standins(plugin):
    from sglang_glm_ext.l3 import hooks
    from sglang_glm_ext.l3.demo import cpu_standins

    hooks._LAUNCHED = False  # an earlier test module may have resolved a launch-like record in this process
    cpu_standins.install()
    yield cpu_standins
    cpu_standins.uninstall()


# Slabs are preallocated (fallocate): keep test budgets small and drop each test's slabs when it ends, so the
# basetemp directories pytest keeps around never pin gigabytes of a shared disk.
TEST_BUDGET = "16MiB"


@pytest.fixture(autouse=True)
def _drop_slabs(tmp_path):
    yield
    import shutil

    shutil.rmtree(tmp_path, ignore_errors=True)


@pytest.fixture
def l3_config(tmp_path):
    """A small valid L3 config under tmp_path; returns its path."""
    return write_config(tmp_path)


def write_config(tmp_path, name="l3", **overrides) -> str:
    """An L3 config with TOML overrides (top-level scalars) under tmp_path/name."""
    from sglang_glm_ext.l3.config import example_config

    d = tmp_path / name
    d.mkdir(parents=True, exist_ok=True)
    text = example_config(str(d)).replace('budget = "1GiB"', f'budget = "{TEST_BUDGET}"')
    for key, value in overrides.items():
        rendered = f'"{value}"' if isinstance(value, str) else str(value).lower()
        lines = [ln for ln in text.splitlines() if not ln.startswith(f"{key} ")]
        text = "\n".join([f"{key} = {rendered}", *lines]) + "\n"
    p = d / "l3.toml"
    p.write_text(text)
    return str(p)
