"""The leak guard (tests/leakguard.py, wired in the root conftest) catches what a test leaves changed, names it, and
puts it back: probe by probe here, and end to end in a pytest run of its own."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

import leakguard

TESTS = Path(__file__).resolve().parent


def _caught(change, undo=None):
    """The guard's findings for ``change()``, and proof that its restore puts the state back."""
    before = leakguard.snapshot()
    try:
        change()
        found = leakguard.diff(before, leakguard.snapshot())
        leakguard.restore(before)
        assert leakguard.diff(before, leakguard.snapshot()) == [], "restore left a change behind"
        return found
    finally:
        if undo is not None:
            undo()


def test_an_environment_variable_set_or_removed_is_named_and_put_back():
    os.environ["GLM_EXT_LEAKGUARD_KEEP"] = "1"
    try:
        found = _caught(lambda: (os.environ.__setitem__("GLM_EXT_LEAKGUARD_NEW", "x"),
                                 os.environ.pop("GLM_EXT_LEAKGUARD_KEEP")))
        assert os.environ.get("GLM_EXT_LEAKGUARD_KEEP") == "1" and "GLM_EXT_LEAKGUARD_NEW" not in os.environ
    finally:
        os.environ.pop("GLM_EXT_LEAKGUARD_KEEP", None)
    assert "env: GLM_EXT_LEAKGUARD_NEW added ('x')" in found
    assert any(f.startswith("env: GLM_EXT_LEAKGUARD_KEEP removed") for f in found), found


def test_sys_path_cwd_and_switch_interval(tmp_path):
    here, interval = os.getcwd(), sys.getswitchinterval()
    found = _caught(lambda: (sys.path.insert(0, "/nowhere/glm"), os.chdir(tmp_path), sys.setswitchinterval(5.0)))
    assert "sys.path: /nowhere/glm added" in found
    assert any(f.startswith("cwd: ") for f in found) and any("getswitchinterval" in f for f in found), found
    assert "/nowhere/glm" not in sys.path and os.getcwd() == here and sys.getswitchinterval() == interval


def test_a_logger_silenced_or_given_a_handler_is_named_and_put_back():
    lg = logging.getLogger("sglang_glm_ext.leakguard_probe")
    h = logging.NullHandler()
    found = _caught(lambda: (lg.setLevel(logging.CRITICAL), lg.addHandler(h), setattr(lg, "propagate", False)))
    assert any("'sglang_glm_ext.leakguard_probe': level 0 -> 50" in f for f in found), found
    assert any("handlers" in f for f in found) and any("propagate True -> False" in f for f in found), found
    assert (lg.level, lg.handlers, lg.propagate) == (logging.NOTSET, [], True)


def test_a_fake_module_left_in_sys_modules_is_named_and_removed_an_import_is_not_a_leak():
    fake = types.ModuleType("glm_ext_leakguard_fake")
    found = _caught(lambda: sys.modules.__setitem__("glm_ext_leakguard_fake", fake))
    assert found == [f"sys.modules: glm_ext_leakguard_fake added by hand ({fake!r})"]
    assert "glm_ext_leakguard_fake" not in sys.modules
    real = sys.modules.pop("json.tool", None)
    try:
        assert _caught(lambda: __import__("json.tool")) == []  # an import is not a leak
    finally:
        if real is not None:
            sys.modules["json.tool"] = real
    old = sys.modules["textwrap"]
    found = _caught(lambda: sys.modules.__setitem__("textwrap", types.ModuleType("textwrap")))
    assert len(found) == 1 and found[0].startswith("sys.modules: textwrap replaced")
    assert sys.modules["textwrap"] is old


def test_what_an_import_sets_is_the_imports_what_a_test_sets_after_it_is_a_leak(tmp_path, monkeypatch):
    """import sglang points third-party caches at its own folder, C extensions register runtime modules: whichever
    test imports a module first must not be blamed for what the import did (the import tracer records it)."""
    (tmp_path / "glm_ext_leakguard_side_effects.py").write_text(
        "import os, sys, types, logging\n"
        "os.environ['GLM_EXT_SET_BY_IMPORT'] = '1'\n"
        "sys.modules['glm_ext_runtime_registry'] = types.ModuleType('glm_ext_runtime_registry')\n"
        "sys.modules['glm_ext_lazy_alias'] = types.ModuleType('glm_ext_lazy_alias')\n"
        "logging.getLogger('glm_ext_leakguard_probe2').setLevel(logging.ERROR)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    logging.getLogger("glm_ext_leakguard_probe2")  # exists before the import: its level change is the import's
    # a placeholder an import replaces (transformers' lazy aliases become the real module when first imported)
    sys.modules["glm_ext_lazy_alias"] = placeholder = types.ModuleType("glm_ext_lazy_alias")
    try:
        assert _caught(lambda: __import__("glm_ext_leakguard_side_effects")) == []
        assert sys.modules["glm_ext_lazy_alias"] is not placeholder  # the import's replacement stays
        found = _caught(lambda: sys.modules.__setitem__("glm_ext_lazy_alias", placeholder))
        assert len(found) == 1 and found[0].startswith("sys.modules: glm_ext_lazy_alias replaced"), found
        found = _caught(lambda: os.environ.__setitem__("GLM_EXT_SET_BY_IMPORT", "2"))
        assert found == ["env: GLM_EXT_SET_BY_IMPORT '1' -> '2'"], found
    finally:
        os.environ.pop("GLM_EXT_SET_BY_IMPORT", None)
        sys.modules.pop("glm_ext_runtime_registry", None)
        sys.modules.pop("glm_ext_lazy_alias", None)
        sys.modules.pop("glm_ext_leakguard_side_effects", None)
        logging.getLogger("glm_ext_leakguard_probe2").setLevel(logging.NOTSET)


def test_sglang_topology_stamped_or_server_args_published_is_named_and_put_back():
    """The leak that broke the CP tests: a publish and a permanent topology stamp that nothing undid. SGLang's own
    snapshot_context() would not see it come back: it keeps the stamp dict by reference, and override_permanently
    updates that dict in place."""
    from sglang.srt.runtime_context import get_parallel, get_context
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    par = get_parallel()
    args_before = get_context()._server_args

    def leak():
        set_global_server_args_for_scheduler(ServerArgs(model_path="dummy"))
        par.override_permanently(tp_size=1, tp_rank=0, pp_rank=0, pp_size=1)

    found = _caught(leak)
    assert "SGLang server_args: published" in found or "SGLang server_args: replaced" in found, found
    assert any(f.startswith("SGLang parallel (override_permanently): tp_size") for f in found), found
    assert get_context()._server_args is args_before and "tp_size" not in par._stamp
    with par.override(tp_size=1, tp_rank=0):  # a scoped override is not a leak once its block ends
        pass
    assert leakguard.diff(leakguard.snapshot(), leakguard.snapshot()) == []


def test_the_plugins_registration_is_one_way_and_not_a_leak_its_launch_latch_is():
    from sglang_glm_ext.l3 import hooks
    from sglang_glm_ext.plugin import register

    ledger, launched = register._LEDGER, hooks._LAUNCHED
    try:
        register._LEDGER = None
        before = leakguard.snapshot()
        register._LEDGER = object()
        hooks._LAUNCHED = not launched
        found = leakguard.diff(before, leakguard.snapshot())
        assert [f for f in found if f.startswith("plugin ledger")] == []
        assert any(f.startswith("L3 launched in this process") for f in found), found
    finally:
        register._LEDGER, hooks._LAUNCHED = ledger, launched


GUARDED_RUN = {
    "conftest.py": f"""
        import importlib.util
        _spec = importlib.util.spec_from_file_location("root_conftest", {str(TESTS / 'conftest.py')!r})
        _root = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(_root)
        _leak_guard = _root._leak_guard
        pytest_runtest_setup, pytest_runtest_teardown = _root.pytest_runtest_setup, _root.pytest_runtest_teardown
        """,
    "test_a.py": """
        import os, sys
        def test_1_leaks_an_env_var():
            os.environ["GLM_EXT_GUARDED_RUN"] = "leaked"
        def test_2_sees_it_put_back():
            assert "GLM_EXT_GUARDED_RUN" not in os.environ
        def test_3_monkeypatch_undoes_before_the_guard_looks(monkeypatch):
            monkeypatch.setenv("GLM_EXT_GUARDED_RUN", "scoped")
            monkeypatch.syspath_prepend("/glm/scoped")
        """,
    "test_b.py": """
        import sys, pytest
        @pytest.fixture(scope="module", autouse=True)
        def module_state():
            sys.path.append("/glm/module-leak")
            yield
        def test_1():
            pass
        def test_2():
            pass
        """,
    "test_c.py": """
        import sys
        def test_after_the_module_sees_it_put_back():
            assert "/glm/module-leak" not in sys.path
        """,
}


@pytest.mark.slow
def test_a_guarded_pytest_run_fails_the_leaking_test_and_module_and_only_them(tmp_path):
    for name, text in GUARDED_RUN.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GLM_EXT_"))}
    res = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:random_order", "-rA",
                          "test_a.py", "test_b.py", "test_c.py"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=300)
    out = res.stdout
    assert res.returncode == 1, out[-3000:] + res.stderr[-2000:]
    assert "ERROR test_a.py::test_1_leaks_an_env_var" in out and "env: GLM_EXT_GUARDED_RUN added ('leaked')" in out
    for ok in ("test_a.py::test_2_sees_it_put_back", "test_a.py::test_3_monkeypatch_undoes_before_the_guard_looks",
               "test_b.py::test_1", "test_c.py::test_after_the_module_sees_it_put_back"):
        assert f"PASSED {ok}" in out, out[-3000:]
    assert "ERROR test_b.py::test_2" in out and "its module-scoped fixtures" in out, out[-3000:]
    assert "sys.path: /glm/module-leak added" in out
    assert "2 errors" in out.splitlines()[-1], out.splitlines()[-1]
