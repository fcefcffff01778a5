"""megamoe as users see it: switched on by SGLang's own --moe-a2a-backend megamoe (no plugin flag), and a launch
asking for it refuses when any megamoe patch (GLM block or FP4 weights) did not land, by every route in."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglang.srt.server_args import ServerArgs

from sglang_glm_ext.declare import PluginFlagError
from sglang_glm_ext.megamoe import feature, guard
from sglang_glm_ext.megamoe.feature import FEATURE
from sglang_glm_ext.patching.ledger import Ledger, PatchStatus, State
from sglang_glm_ext.plugin import features, register
from sglang_glm_ext.plugin.hooks import hook_engine_init, hook_from_cli_args
from sglang_glm_ext.plugin.registry import FEATURE_BY_NAME, PATCHES

MEGA = SimpleNamespace(moe_a2a_backend="megamoe", moe_runner_backend="auto")
NONE = SimpleNamespace(moe_a2a_backend="none", moe_runner_backend="auto")


def test_feature_is_switched_on_by_sglangs_own_flag():
    assert feature.megamoe_requested(MEGA)
    assert feature.megamoe_requested(SimpleNamespace(moe_a2a_backend="none", moe_runner_backend="megamoe"))
    assert not feature.megamoe_requested(NONE)
    assert FEATURE.is_active(SimpleNamespace(moe_a2a_backend="megamoe"))
    assert not FEATURE.switched_on({"enable_cp_l3": True})  # plugin flags never switch it on
    assert not FEATURE.switched_on({}, NONE) and FEATURE.switched_on({}, MEGA)
    assert FEATURE_BY_NAME["megamoe"] is FEATURE


def test_is_active_reads_the_record_sglang_published(monkeypatch):
    import sglang.srt.runtime_context as rc

    monkeypatch.setattr(rc, "get_server_args", lambda: MEGA)
    assert FEATURE.is_active()
    monkeypatch.setattr(rc, "get_server_args", lambda: NONE)
    assert not FEATURE.is_active()


def test_one_feature_owns_both_issues_patches_and_env_vars():
    ids = [p.id for p in PATCHES if p.feature is FEATURE]
    assert ids == ["megamoe.glm4_shared_replicated", "megamoe.glm4_forward", "megamoe.dsv2_no_fallback",
                   "megamoe.dsv2_miss", "megamoe.launch_check", "megamoe.load_check", "megamoe.compat_message", "megamoe.launch_exit",
                   "megamoe.weights_sm90_loader", "megamoe.weights_sm90_loader_fused", "megamoe.weight_update_tensor",
                   "megamoe_fp4.nvfp4_keep_trtllm",
                   "megamoe_fp4.nvfp4_create_weights", "megamoe_fp4.nvfp4_weights", "megamoe_fp4.mxfp4_create_weights",
                   "megamoe_fp4.mxfp4_weights", "megamoe_fp4.memory_summary"]
    assert "megamoe_fp4" not in FEATURE_BY_NAME
    names = [e.name for e in FEATURE.env]
    assert names == ["SGLANG_GLM_EXT_MEGAMOE_FP4_KEEP_TRTLLM", *sorted(guard.RETIRED_ENV, reverse=True)]
    assert {e.name for e in feature.RETIRED_ENV_VARS} == set(guard.RETIRED_ENV)  # the launch check reads the same


@pytest.fixture
def ledger(monkeypatch):
    led = Ledger(PATCHES, {p.id: PatchStatus(p, State.APPLIED) for p in PATCHES})
    monkeypatch.setattr(register, "_LEDGER", led)

    def fail(patch_id, detail="target moved"):
        led.status[patch_id] = PatchStatus(led.status[patch_id].patch, State.FAILED, detail)

    return fail


@pytest.mark.parametrize("patch_id", ["megamoe.glm4_forward", "megamoe_fp4.nvfp4_weights"])
def test_megamoe_launch_refuses_when_a_megamoe_patch_did_not_land(ledger, patch_id):
    features.require_switched_on_available({}, MEGA)  # all landed: fine
    ledger(patch_id)
    with pytest.raises(PluginFlagError, match=f"megamoe.*{patch_id.split('.')[1]} failed: target moved"):
        features.require_switched_on_available({}, MEGA)
    features.require_switched_on_available({}, NONE)  # not asked for: nothing to refuse
    features.require_switched_on_available({})  # SGLang's arguments not given: only flags are asked
    with pytest.raises(SystemExit, match=patch_id.split(".")[1]):
        hook_from_cli_args(MEGA, ServerArgs, SimpleNamespace())
    assert hook_from_cli_args(NONE, ServerArgs, SimpleNamespace()) is NONE


def test_engine_routes_refuse_too(ledger):
    ledger("megamoe.load_check")

    def original(self, *args, **kwargs):
        return self.server_args_class(**kwargs)

    class Args(SimpleNamespace):
        pass

    engine = SimpleNamespace(server_args_class=Args)
    with pytest.raises(PluginFlagError, match="load_check failed"):  # Engine(moe_a2a_backend="megamoe", ...)
        hook_engine_init(original, engine, moe_a2a_backend="megamoe", moe_runner_backend="auto")
    assert engine.server_args_class is Args  # restored after the refusal
    built = hook_engine_init(original, engine, moe_a2a_backend="none", moe_runner_backend="auto")
    assert isinstance(built, Args) and built.moe_a2a_backend == "none"
    with pytest.raises(PluginFlagError, match="load_check failed"):  # Engine(server_args=ServerArgs(...))
        hook_engine_init(lambda self, **kw: None, engine, server_args=MEGA)
