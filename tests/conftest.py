"""Marker scheme: `pytest` on a CPU machine runs everything CPU-able; `pytest -m gpu` on a GPU node runs the rest.

A test marked `@pytest.mark.gpu(reason="...")` says in its reason what it proves. It runs only where a CUDA GPU is
visible to torch AND SGLang imports; elsewhere it is skipped with that reason plus why it could not run here, so the
skip list in `pytest -ra` doubles as the list of what this machine did not prove. `slow` needs no gate (deselect it
with `-m "not slow"`).

The leak guard (tests/leakguard.py): every test, and every module's module-scoped fixtures, must leave process-wide
state (environment, sys.path, SGLang's published topology and server args, loggers, fake modules, the plugin's
registries, ...) as they found it; the one that does not fails, naming what it changed, and the state is put back.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys

import pytest

# Helpers shared across test folders (rank_zygote.py) are plain modules here: with --import-mode=importlib no test
# folder is on sys.path otherwise.
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import leakguard  # noqa: E402

leakguard.trace_imports()  # before any test file is imported: what an import changes is not a test's leak


@pytest.fixture(autouse=True)
def _leak_guard(request):
    """Set up before, and torn down after, every other function-scoped fixture of the test (autouse in the root
    conftest comes first): what it sees changed is the test's own doing."""
    before = leakguard.snapshot()
    yield
    changes = leakguard.diff(before, leakguard.snapshot())
    if changes:
        leakguard.restore(before)
        pytest.fail(leakguard.message(request.node.nodeid, changes), pytrace=False)


@pytest.fixture
def sglang_state():
    """For a test that drives SGLang the way a launch or a scheduler does once per process: publishing server args,
    stamping a topology, reading a flag SGLang then initialises, parsing a launch (ServerArgs exports environment
    variables, SGLang's logger set-up replaces the root logger's handler, the plugin's L3 hook latches "launched").
    All of it is put back when the test ends."""
    with leakguard.kept("environment", "logging", "SGLang runtime context", "plugin"):
        yield


_module_before: dict = {}  # the state before the first test of the module that runs now


def _module_of(item) -> str:
    return item.nodeid.split("::")[0]


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item):
    if _module_before.get("module") != _module_of(item):  # before its module-scoped fixtures are set up
        _module_before.update(module=_module_of(item), state=leakguard.snapshot())
    return (yield)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_teardown(item, nextitem):
    result = yield
    # pytest tears a module's fixtures down after its last test when the next test is in another module. (After
    # the session's last test, the session's fixtures go too: what they set up is not a module's leak.)
    if nextitem is not None and _module_of(nextitem) != _module_of(item) and \
            _module_before.get("module") == _module_of(item):
        before = _module_before.pop("state")
        _module_before.clear()
        changes = leakguard.diff(before, leakguard.snapshot())
        if changes:
            leakguard.restore(before)
            raise pytest.fail.Exception(leakguard.message(
                f"{_module_of(item)} (its module-scoped fixtures, torn down after this test)", changes), pytrace=False)
    return result


@functools.lru_cache(maxsize=1)
def _why_no_gpu() -> str:
    """'' when GPU tests can run here, else the reason they cannot (checked once per session)."""
    if importlib.util.find_spec("sglang") is None:
        return "SGLang is not installed"
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - any import failure means "cannot run here"
        return f"torch does not import ({exc})"
    if not torch.cuda.is_available():
        return "no CUDA GPU visible to torch"
    try:
        import sglang.srt  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        return f"sglang.srt does not import ({type(exc).__name__}: {exc})"
    return ""


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    why = _why_no_gpu()
    if not why:
        return
    for item in gpu_items:
        marker = item.get_closest_marker("gpu")
        proves = marker.kwargs.get("reason") or (marker.args[0] if marker.args else "")
        # A marker without a reason still skips (never break collection), but says it should carry one.
        proves = proves or "(this @pytest.mark.gpu gives no reason= saying what it proves)"
        item.add_marker(pytest.mark.skip(reason=f"GPU test skipped ({why}): {proves}"))


# What a fresh interpreter that registers the plugin imports of torch, transformers and SGLang (~3,000 modules, about
# 8 s of CPU), none of the plugin's own.
SGLANG_PRELOAD = ["torch", "transformers", "sglang.srt.server_args", "sglang.srt.plugins",
                  "sglang.srt.configs.model_config", "sglang.srt.elastic_ep.expert_backup_manager",
                  "sglang.srt.layers.quantization"]


@pytest.fixture(scope="session")
def sglang_python():
    """``sglang_python.run(code=... | module=..., argv=..., env=..., timeout=...)``: ``python -c`` / ``-m`` in a
    process forked from a zygote that imported SGLang but never the plugin (tests/rank_zygote.py): a process where
    the plugin has not run, with its own argv, environment and exit status, in ~2 s instead of ~10 s of CPU. Not for
    tests whose subject is what importing does (import warnings, import order, what a module pulls in): those keep a
    fresh interpreter."""
    from rank_zygote import Zygote

    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    with Zygote(SGLANG_PRELOAD, env=env) as z:
        yield z
