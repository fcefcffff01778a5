"""Every declared patch target exists in the installed SGLang with the signature and source the hook expects."""

import sys
import types

import pytest

from sglang_glm_ext.plugin.registry import PATCHES
from sglang_glm_ext.patching import contract
from sglang_glm_ext.declare import Patch, Tier


@pytest.mark.parametrize("patch", PATCHES, ids=[p.id for p in PATCHES])
def test_target_contract_holds_in_installed_sglang(patch):
    assert contract.check(patch) == []


def test_engine_builds_server_args_the_way_the_engine_hook_expects():
    # plugin/hooks.py:hook_engine_init shadows Engine.server_args_class; that only works while Engine builds its
    # record with `self.server_args_class(**kwargs)`.
    import inspect

    from sglang.srt.entrypoints.engine import Engine
    from sglang_glm_ext.patching.ledger import resolve_original

    assert "self.server_args_class(**kwargs)" in inspect.getsource(resolve_original(
        "sglang.srt.entrypoints.engine.Engine.__init__"))
    assert "server_args_class" in Engine.__dict__


def _fake_module(monkeypatch, body):
    mod = types.ModuleType("glm_ext_fake_target")
    exec(body, mod.__dict__)
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    return mod


def _patch_for(signature, sha=""):
    return Patch(id="fake", target="glm_ext_fake_target.Runner.capture", hook_type="around",
                 hook="x:y", feature="fake", tier=Tier.FEATURE, reason="r", seed_lines="-",
                 sglang_versions=("0",), remove_when="-", signature=signature, source_sha=sha)


def test_contract_fails_and_names_the_target_when_signature_changes(monkeypatch):
    _fake_module(monkeypatch, "class Runner:\n    def capture(self, stream):\n        return 1\n")
    assert contract.check(_patch_for(("self", "stream"))) == []
    _fake_module(monkeypatch, "class Runner:\n    def capture(self, stream, graph_pool):\n        return 1\n")
    problems = contract.check(_patch_for(("self", "stream")))
    assert len(problems) == 1 and "glm_ext_fake_target.Runner.capture" in problems[0]
    assert "graph_pool" in problems[0]


def test_contract_fails_when_target_disappears(monkeypatch):
    _fake_module(monkeypatch, "class Runner:\n    pass\n")
    (problem,) = contract.check(_patch_for(("self",)))
    assert "not found" in problem


def test_contract_fails_when_source_drifts(monkeypatch, tmp_path):
    import importlib.util

    from sglang_glm_ext.patching.ledger import source_sha

    def load(body):
        f = tmp_path / f"glm_ext_fake_src_{abs(hash(body))}.py"
        f.write_text(f"class Runner:\n    def capture(self):\n        {body}\n")
        spec = importlib.util.spec_from_file_location("glm_ext_fake_target", f)
        m = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(m)
        monkeypatch.setitem(sys.modules, "glm_ext_fake_target", m)
        return m

    sha = source_sha(load("return 1").Runner.capture)
    assert sha and contract.check(_patch_for(("self",), sha)) == []
    load("return 2")  # same signature, different code
    (problem,) = contract.check(_patch_for(("self",), sha))
    assert "source of glm_ext_fake_target.Runner.capture changed" in problem


def test_hook_registry_private_api_the_ledger_relies_on():
    # The ledger applies our hooks with HookRegistry._apply_target (keeps classmethod/staticmethod, propagates
    # stale `from X import Y` bindings). It is private: pin its shape so an SGLang upgrade names it if it moves.
    import inspect

    from sglang.srt.plugins.hook_registry import HookRegistry, HookSource, HookType

    assert list(inspect.signature(HookRegistry._apply_target).parameters) == ["target", "hooks"]
    assert {t.value for t in HookType} >= {"before", "after", "around", "replace"}
    assert HookSource._fields == ("plugin_name", "dist_name")
