"""megamoe's hooks against the installed SGLang, in this process (the two-rank block run is test_glm4_block.py).

- The launch check runs inside SGLang's real argument-resolution pipeline (`ServerArgs.resolve_once()`) on real
  GLM-4 / GLM-5 configs, with the platform said to be SM90 or SM100 and a fake deep_gemm: each refusal, SGLang's own
  token-budget check now reaching GLM models (it does not without the hook), the retired env switches.
- The GLM-5.x guard on should_use_mega_moe, and the load check's marking of DeepseekV2MoE layers.
- The plugin never sets DG_USE_FP4_ACTS. (The feature's activity and the refusal of a launch whose megamoe patch
  did not land: test_feature.py.)
"""

from __future__ import annotations

import copy
import inspect
import json
import pathlib
import re
import sys
from types import SimpleNamespace

import pytest
import torch

import sglang.srt.arg_groups.mega_moe_hook as mega_moe_hook
import sglang.srt.layers.moe.mega_moe as mega_moe
from sglang.srt.plugins.hook_registry import HookType, _wrap_fn
from sglang.srt.runtime_context import override_platform
from sglang.srt.server_args import ServerArgs

import fake_deep_gemm
import sglang_glm_ext
from sglang_glm_ext.megamoe import guard, hooks, select
from sglang_glm_ext.patching.ledger import resolve_original

from glm_configs import GLM4_CONFIG, write_model_dir

TARGET = "sglang.srt.arg_groups.mega_moe_hook.validate_mega_moe_token_budget_for_model"
GLM5_CONFIG = {
    "architectures": ["GlmMoeDsaForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 256,
    "intermediate_size": 512, "moe_intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 4, "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
    "n_group": 4, "topk_group": 2, "first_k_dense_replace": 1, "routed_scaling_factor": 2.5,
    "norm_topk_prob": True, "vocab_size": 1024, "kv_lora_rank": 64, "q_lora_rank": 64, "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 32, "v_head_dim": 32, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
    "hidden_act": "silu", "quantization_config": GLM4_CONFIG["quantization_config"],
}
SM90 = dict(is_cuda=True, is_sm90=True, is_sm100=False, device_sm=90)
SM100 = dict(is_cuda=True, is_sm90=False, is_sm100=True, device_sm=100)


@pytest.fixture
def launch(monkeypatch, tmp_path):
    """resolve(config, platform, **server_args) runs SGLang's resolution pipeline with the plugin's launch hook
    (and only it) in place; returns None or the MegaMoELaunchError / ValueError raised."""
    monkeypatch.setitem(sys.modules, "deep_gemm", fake_deep_gemm.FakeDeepGemm())
    for name in guard.RETIRED_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK", "64")
    wrapped = _wrap_fn(resolve_original(TARGET), hooks.hook_token_budget, HookType.AROUND)
    counter = iter(range(100))

    def resolve(config=GLM4_CONFIG, platform=SM90, hook=True, **kw):
        model = write_model_dir(tmp_path / f"m{next(counter)}", config)
        args = dict(model_path=model, tp_size=2, moe_a2a_backend="megamoe", device="cpu", skip_tokenizer_init=True,
                    max_running_requests=32, chunked_prefill_size=64)
        args.update(kw)
        with monkeypatch.context() as m:
            m.setattr(mega_moe_hook, "validate_mega_moe_token_budget_for_model",
                      wrapped if hook else resolve_original(TARGET))
            with override_platform(**platform):
                try:
                    ServerArgs(**args).resolve_once()
                except (ValueError, SystemExit) as exc:
                    return exc
        return None

    return resolve


def with_quant(config, qc):
    out = copy.deepcopy(config)
    if qc is None:
        out.pop("quantization_config", None)
    else:
        out["quantization_config"] = qc
    return out


def test_valid_glm4_and_glm5_fp8_launches_on_sm90_pass(launch):
    assert launch() is None
    assert launch(GLM5_CONFIG) is None


@pytest.mark.parametrize("config,platform,kw,needle", [
    (with_quant(GLM4_CONFIG, {"quant_method": "modelopt", "quant_algo": "NVFP4"}), SM90,
     {"quantization": "modelopt_fp4"}, "SM100-only"),
    (dict(GLM5_CONFIG, architectures=["Glm4MoeLiteForCausalLM"]), SM90, {}, "no MegaMoE path"),  # MLA, like GLM-5
    (GLM4_CONFIG, SM90, {"enable_w4a4_mxfp4_megamoe": True}, "--enable-w4a4-mxfp4-megamoe selects"),
    (GLM4_CONFIG, SM90, {"ep_num_redundant_experts": 2}, "--ep-num-redundant-experts 0"),
    # A captured CUDA graph always runs the kernel: its size must fit the cap even with the miss path.
    (GLM4_CONFIG, SM90, {"device": "cuda", "max_running_requests": 256, "cuda_graph_max_bs_decode": 128},
     "a decode CUDA graph is captured at 128 requests"),
])
def test_each_launch_refusal_through_sglang_resolution(launch, config, platform, kw, needle):
    exc = launch(config, platform, **kw)
    assert isinstance(exc, guard.MegaMoELaunchError), exc
    assert needle in str(exc), str(exc)


@pytest.mark.parametrize("config,platform,kw,note", [
    (with_quant(GLM4_CONFIG, None), SM90, {}, "on every batch: bf16/fp16 experts"),
    (with_quant(GLM5_CONFIG, None), SM90, {}, "on every batch: bf16/fp16 experts"),
    (GLM4_CONFIG, SM100, {}, "on every batch: block-FP8 experts on SM100"),
    (with_quant(GLM4_CONFIG, dict(GLM4_CONFIG["quantization_config"],
                                  ignored_layers=["model.layers.1.mlp.experts.0.up_proj"])), SM90, {},
     "layer 1's experts are excluded from quantisation"),
    (GLM4_CONFIG, SM90, {"max_running_requests": 65}, "a decode batch can carry 65 requests"),
    (GLM4_CONFIG, SM90, {"max_running_requests": None}, "--max-running-requests is not set"),
    (GLM4_CONFIG, SM90, {"chunked_prefill_size": 4096}, "a prefill batch can reach 4096 tokens per rank"),
    (GLM5_CONFIG, SM90, {"chunked_prefill_size": 4096}, "a prefill batch can reach 4096 tokens per rank"),
])
def test_launches_the_miss_path_serves_pass_and_say_so_at_startup(launch, caplog, config, platform, kw, note):
    """Issue 26: what issue 15 refused because a batch could miss the kernel is served, through the gathered miss
    path; the startup log says which layers take it and when. (SGLang alone does not check GLM-4 FP8 at all.)"""
    import logging

    with caplog.at_level(logging.INFO, logger="sglang_glm_ext"):
        assert launch(config, platform, **kw) is None
    lines = [r.getMessage() for r in caplog.records if "miss path" in r.getMessage()]
    assert any(note in line for line in lines), lines


def test_nvfp4_glm_launch_above_the_cap_is_served_on_the_kept_trtllm_layout(launch, monkeypatch):
    """SGLang runs its own budget check for NVFP4 checkpoints (mega_moe_needs_token_budget) and raises first; with
    the TRTLLM layout kept the miss path serves those batches, so the plugin supersedes it. Without the kept layout
    (the opt-out) the launch is refused with the plugin's lines (the DP-correct bound and why no miss path)."""
    import sglang.srt.layers.quantization as quantization
    from sglang.srt.layers.quantization.modelopt_quant import ModelOptFp4Config

    monkeypatch.setitem(quantization.QUANTIZATION_METHODS, "modelopt_fp4", ModelOptFp4Config)
    fake = sys.modules["deep_gemm"]
    for name in sorted(guard.SM100_KERNEL_API - set(dir(fake))):
        monkeypatch.setattr(fake, name, lambda *a, **k: None, raising=False)
    nvfp4 = with_quant(GLM5_CONFIG, {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16})
    assert mega_moe_hook.mega_moe_needs_token_budget("GlmMoeDsaForCausalLM", nvfp4["quantization_config"], None)
    exc = launch(nvfp4, SM100, hook=False, chunked_prefill_size=4096)
    assert isinstance(exc, ValueError) and "required_per_rank=4096" in str(exc)  # SGLang's own, unhooked
    assert launch(nvfp4, SM100, chunked_prefill_size=4096) is None
    monkeypatch.setenv("SGLANG_GLM_EXT_MEGAMOE_FP4_KEEP_TRTLLM", "0")
    exc = launch(nvfp4, SM100, chunked_prefill_size=4096)
    assert isinstance(exc, guard.MegaMoELaunchError) and "required_per_rank" not in str(exc)
    lines = str(exc).splitlines()
    assert "reach 4096 tokens per rank" in lines[0] and "cannot serve those batches instead" in lines[1]


def test_deep_gemm_without_the_sm90_kernel_is_refused(launch, monkeypatch):
    monkeypatch.setitem(sys.modules, "deep_gemm", None)  # import deep_gemm -> ImportError
    exc = launch()
    assert isinstance(exc, guard.MegaMoELaunchError) and "deep_gemm does not import" in str(exc)


def test_non_glm_models_are_left_to_sglang(launch):
    cfg = dict(with_quant(GLM5_CONFIG, None), architectures=["DeepseekV3ForCausalLM"])
    assert launch(cfg) is None  # bf16 DeepSeek: not the plugin's to refuse


@pytest.mark.parametrize("name", sorted(guard.RETIRED_ENV))
def test_retired_env_switch_refuses_any_launch_naming_the_replacement(launch, monkeypatch, name):
    monkeypatch.setenv(name, "1")
    exc = launch(moe_a2a_backend="none")
    assert isinstance(exc, guard.MegaMoELaunchError) and name in str(exc) and "retired" in str(exc)
    assert guard.RETIRED_ENV[name].split()[0] in str(exc)
    monkeypatch.setenv(name, "0")
    assert launch(moe_a2a_backend="none") is None


# ---------------------------------------------------------------- GLM-5.x: DeepseekV2MoE miss guard

@pytest.fixture
def megamoe_gate(monkeypatch):
    state = SimpleNamespace(megamoe=True, ready=True, cap=64, global_tokens=None)
    monkeypatch.setattr(mega_moe, "get_moe_a2a_backend",
                        lambda: SimpleNamespace(is_megamoe=lambda: state.megamoe))
    monkeypatch.setattr(mega_moe, "is_mega_moe_experts_ready", lambda experts: state.ready)
    monkeypatch.setattr(mega_moe, "get_is_capture_mode", lambda: False)
    monkeypatch.setattr(mega_moe, "get_dp_global_num_tokens", lambda: state.global_tokens)
    monkeypatch.setattr(mega_moe, "is_dsa_enable_prefill_cp", lambda: False)
    monkeypatch.setenv("SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK", "64")
    return state


def _moe(marked=True):
    moe = SimpleNamespace(experts=SimpleNamespace(), layer_id=5)
    if marked:
        moe.__dict__[hooks.GUARD_ATTR] = True
    return moe


def test_glm5_layer_that_misses_raises_instead_of_forward_normal(megamoe_gate):
    wrapped = _wrap_fn(resolve_original("sglang.srt.layers.moe.mega_moe.should_use_mega_moe"),
                       hooks.hook_should_use_mega_moe, HookType.AROUND)
    x = torch.zeros(65, 8)
    with pytest.raises(select.MegaMoEMissError, match="layer 5: 65 tokens per rank exceed"):
        wrapped(_moe(), x)
    assert wrapped(_moe(marked=False), x) is False  # not a GLM model's layer: SGLang's answer stands
    assert wrapped(_moe(), torch.zeros(64, 8)) is True
    megamoe_gate.ready = False
    with pytest.raises(select.MegaMoEMissError, match="no MegaMoE weights"):
        wrapped(_moe(), torch.zeros(3, 8))
    megamoe_gate.megamoe = False
    assert wrapped(_moe(), x) is False  # not under megamoe: the stock path is SGLang's correct one


def test_deepseek_v2_moe_reaches_the_patched_gate():
    # DeepseekV2MoE.forward imports should_use_mega_moe from the module at call time, so the ledger's
    # module-attribute patch is what it calls.
    from sglang.srt.models.deepseek_v2 import DeepseekV2MoE

    src = inspect.getsource(DeepseekV2MoE.forward)
    assert "from sglang.srt.layers.moe.mega_moe import forward_mega_moe, should_use_mega_moe" in src
    assert src.index("if should_use_mega_moe(self, hidden_states):") < src.index("self.forward_normal(")


def test_load_check_marks_glm5_layers_serves_unready_stock_ones_and_names_the_rest(megamoe_gate, caplog):
    import logging

    from sglang.srt.models.deepseek_v2 import DeepseekV2MoE

    moe = DeepseekV2MoE.__new__(DeepseekV2MoE)
    torch.nn.Module.__init__(moe)
    moe.experts = torch.nn.Module()
    moe.experts._mega_moe_weights_built = False
    moe.experts.quant_method = SimpleNamespace(runner=object())
    holder = torch.nn.Module()
    holder.layers = torch.nn.ModuleList([torch.nn.Module()])
    holder.layers[0].mlp = moe
    runner = SimpleNamespace(model=holder, model_config=SimpleNamespace(
        hf_config=SimpleNamespace(architectures=["DeepseekV3ForCausalLM"])))
    assert hooks.hook_load_check(None, runner) is None and hooks.GUARD_ATTR not in moe.__dict__  # not GLM
    runner.model_config.hf_config.architectures = ["GlmMoeDsaForCausalLM"]
    megamoe_gate.ready = False
    with caplog.at_level(logging.INFO, logger="sglang_glm_ext"):
        assert hooks.hook_load_check(None, runner) is None  # no MegaMoE weights: its checkpoint layout, served
    assert moe.__dict__[hooks.GUARD_ATTR] is True and moe.experts.__dict__[hooks.FALLBACK_ATTR] == "stock"
    assert any("take the gathered miss path on every batch" in r.getMessage() for r in caplog.records)
    moe.experts._mega_moe_weights_built = True  # a MegaMoE-only layout this GPU cannot run: nothing serves it
    with pytest.raises(guard.MegaMoELaunchError, match=r"layers\.0\.mlp: .*keeps no layout the miss path runs"):
        hooks.hook_load_check(None, runner)
    megamoe_gate.ready = True
    assert hooks.hook_load_check(None, runner) is None
    megamoe_gate.megamoe = False
    moe.__dict__.pop(hooks.GUARD_ATTR)
    assert hooks.hook_load_check(None, runner) is None and hooks.GUARD_ATTR not in moe.__dict__


# ---------------------------------------------------------------- MXFP4 GLM layers: no silent Triton miss
# Issue 16's hand-off: under megamoe Mxfp4MoEMethod still builds a Triton runner with --moe-runner-backend auto
# (layers/quantization/mxfp4.py:1443-1466), and SGLang's own token-budget check skips MXFP4 checkpoints
# (arg_groups/mega_moe_hook.py:67-75 covers NVFP4 and its architecture list only), so a stock miss would run
# Triton on MegaMoE-packed weights. The launch check holds MXFP4 GLM launches to the budget, and the runtime
# guard raises before the stock path.

MXFP4 = {"quant_method": "mxfp4"}


@pytest.fixture
def mxfp4_sm100(launch, monkeypatch):
    """A GPU node as SGLang sees it: the mxfp4 method registered (SGLang registers it on CUDA builds only, so not
    on this CPU), and deep_gemm with the SM100 kernels' names (the launch check probes names, calls nothing)."""
    import sglang.srt.layers.quantization as quantization
    from sglang.srt.layers.quantization.mxfp4 import Mxfp4Config

    monkeypatch.setitem(quantization.QUANTIZATION_METHODS, "mxfp4", Mxfp4Config)
    fake = sys.modules["deep_gemm"]
    for name in sorted(guard.SM100_KERNEL_API - set(dir(fake))):
        monkeypatch.setattr(fake, name, lambda *a, **k: pytest.fail("the launch check must not call deep_gemm"),
                            raising=False)
    return launch


@pytest.mark.parametrize("config", [GLM5_CONFIG, GLM4_CONFIG], ids=["glm5", "glm4"])
def test_mxfp4_glm_launch_is_held_to_the_token_budget_sglang_skips(mxfp4_sm100, config):
    launch = mxfp4_sm100
    cfg = with_quant(config, MXFP4)
    assert not mega_moe_hook.mega_moe_needs_token_budget(cfg["architectures"][0], MXFP4, None)  # SGLang skips it
    assert launch(cfg, SM100) is None
    assert launch(cfg, SM100, chunked_prefill_size=4096, hook=False) is None  # SGLang alone lets it through
    exc = launch(cfg, SM100, chunked_prefill_size=4096)
    assert isinstance(exc, guard.MegaMoELaunchError) and "reach 4096 tokens per rank" in str(exc), exc
    exc = launch(cfg, SM100, max_running_requests=65)
    assert isinstance(exc, guard.MegaMoELaunchError) and "a decode batch can carry 65 requests" in str(exc)
    exc = launch(cfg, SM90)
    assert isinstance(exc, guard.MegaMoELaunchError) and "MXFP4 experts need the FP4 MegaMoE kernels" in str(exc)


def test_mxfp4_glm5_layer_that_misses_raises_before_its_triton_runner(megamoe_gate, monkeypatch):
    """Real: an MXFP4 FusedMoE built and loaded under megamoe (Mxfp4MoEMethod, deep_gemm's weight transforms),
    DeepseekV2MoE.forward, the load check and the patched gate. Fake: deep_gemm's UE8M0 scale transform (a CUDA
    op, replaced by deep_gemm's own torch fallback) and the platform's SM (100)."""
    import deep_gemm
    from deep_gemm.utils.layout import _pack_fp32_into_ue8m0_fallback
    from sglang.srt.models.deepseek_v2 import DeepseekV2MoE

    import fp4_harness as H

    monkeypatch.setattr(deep_gemm, "transform_sf_into_required_layout",
                        lambda sf, *a, **k: _pack_fp32_into_ue8m0_fallback(sf))
    monkeypatch.setattr(mega_moe, "is_mega_moe_experts_ready", resolve_original(
        "sglang.srt.layers.moe.mega_moe.is_mega_moe_experts_ready"))  # the real readiness, not the fixture's
    monkeypatch.setattr(mega_moe, "_device_sm", 100)
    ck = H.Checkpoint.random(2, 512, 512, recipe="mxfp4")
    with H.sglang_runtime(quantization="mxfp4", a2a="megamoe", runner="auto"):
        experts = H.build_mxfp4_layer(ck)
        H.load_mxfp4_fused(experts, ck, [0, 1])
        experts.quant_method.process_weights_after_loading(experts)
    assert experts._mega_moe_weights_built and experts.quant_method.runner is not None  # the Triton hazard

    def stock(*args, **kwargs):
        pytest.fail("the stock (Triton) MoE path ran under megamoe")

    monkeypatch.setattr(experts.quant_method, "apply", stock)
    monkeypatch.setattr(DeepseekV2MoE, "forward_normal", stock)
    moe = DeepseekV2MoE.__new__(DeepseekV2MoE)
    torch.nn.Module.__init__(moe)
    moe.experts, moe.layer_id = experts, 3
    # What DeepseekV2MoE.forward reads on its way from a "no" of the gate to forward_normal (no DP a2a, no alt stream)
    moe.gate, moe._enable_a2a_moe, moe.alt_stream = SimpleNamespace(e_score_correction_bias_vl=None), False, None
    holder = torch.nn.Module()
    holder.layers = torch.nn.ModuleList([torch.nn.Module()])
    holder.layers[0].mlp = moe
    runner = SimpleNamespace(model=holder, model_config=SimpleNamespace(
        hf_config=SimpleNamespace(architectures=["GlmMoeDsaForCausalLM"])))
    assert hooks.hook_load_check(None, runner) is None and moe.__dict__[hooks.GUARD_ATTR] is True  # ready on SM100
    wrapped = _wrap_fn(resolve_original("sglang.srt.layers.moe.mega_moe.should_use_mega_moe"),
                       hooks.hook_should_use_mega_moe, HookType.AROUND)
    monkeypatch.setattr(mega_moe, "should_use_mega_moe", wrapped)  # DeepseekV2MoE.forward imports it per call
    with pytest.raises(select.MegaMoEMissError, match="layer 3: 65 tokens per rank exceed"):
        moe.forward(torch.zeros(65, 512, dtype=torch.bfloat16))
    assert wrapped(moe, torch.zeros(64, 512)) is True  # within the cap: the kernel path


def test_the_plugin_never_sets_dg_use_fp4_acts():
    pkg = pathlib.Path(sglang_glm_ext.__file__).resolve().parent
    setter = re.compile(r"""(environ\[\s*["']DG_USE_FP4_ACTS["']\s*\]\s*=|setdefault\(\s*["']DG_USE_FP4_ACTS|"""
                        r"""putenv\(\s*["']DG_USE_FP4_ACTS|environ\.update\([^)]*DG_USE_FP4_ACTS)""")
    hits = [str(p) for p in pkg.rglob("*.py") if setter.search(p.read_text())]
    assert hits == []


def test_the_glm4_block_builds_no_redundant_expert_slots():
    """Why --ep-num-redundant-experts is refused for GLM-4.x (issue 22, defect 5): with it set, SGLang's expert
    location map counts logical + redundant physical experts (eplb/expert_location.py:236), DeepseekV2MoE builds that
    many (deepseek_v2.py:750-755), but Glm4MoeSparseMoeBlock builds the routed experts only (glm4_moe.py:436-446).
    When SGLang sizes the GLM-4 block for them, this test fails: lift the refusal (guard.check_launch)."""
    from sglang.srt.layers.moe.utils import MoeA2ABackend, MoeRunnerBackend
    from sglang.srt.models.glm4_moe import Glm4MoeSparseMoeBlock
    from sglang.srt.runtime_context import get_context, get_exec, get_flags, get_parallel, reset_context

    reset_context()
    try:
        get_context().set_server_args(ServerArgs(model_path="dummy", moe_a2a_backend="megamoe", tp_size=1,
                                                 device="cpu", ep_num_redundant_experts=2))
        get_parallel().override_permanently(tp_size=1, tp_rank=0, moe_ep_size=1, moe_ep_rank=0, moe_tp_size=1,
                                            moe_tp_rank=0)
        get_flags().moe.a2a_backend = MoeA2ABackend("megamoe")
        get_flags().moe.runner_backend = MoeRunnerBackend("auto")
        assert get_exec().moe.ep_num_redundant_experts == 2
        cfg = SimpleNamespace(num_experts_per_tok=2, routed_scaling_factor=2.5, n_shared_experts=1, n_routed_experts=8,
                              hidden_act="silu", hidden_size=256, moe_intermediate_size=128, norm_topk_prob=True,
                              n_group=4, topk_group=2)
        block = Glm4MoeSparseMoeBlock(cfg, layer_id=3, quant_config=None, prefix="model.layers.3.mlp")
        assert block.experts.num_experts == 8  # not 8 + 2
    finally:
        reset_context()
