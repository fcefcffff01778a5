"""Weight updates under megamoe (issue 22, defect 1): after any update the MegaMoE kernel reads the new weights in
its layout, or the update is refused; never the mixed layout.

Real: SGLang 0.5.23's FusedMoE with Fp8MoEMethod (block-FP8 create_weights, the parameter loaders,
process_weights_after_loading, which runs SGLang's own build_sm90_mega_moe_experts_weights), DefaultModelLoader's
restore / postprocess, WeightUpdater's update_weights_from_tensor / load_weights_from_distributed, SGLang's
run_mega_routed_experts, EPLB's update_expert_weights_single_layer; the plugin's hooks as register() installs them.
Fake: deep_gemm (fake_deep_gemm: its SM90 kernel computes the dequantised MoE from the interleaved weights it is
handed), the platform's SM (90), and `fp8._is_cpu` (False, so Fp8MoEMethod takes its GPU branch, the one that
builds MegaMoE weights, instead of the CPU AMX repack).
"""

from __future__ import annotations

import contextlib
import sys
from types import SimpleNamespace

import pytest
import torch

import fake_deep_gemm
from sglang_glm_ext.megamoe import sm90_fp8, weight_update
from sglang_glm_ext.patching.ledger import resolve_original

E, H, I = 8, 256, 128
PREFIX = "model.layers.3.mlp.experts"
LOADER = "sglang.srt.layers.moe.fused_moe_triton.layer.FusedMoE._weight_loader_impl"


@pytest.fixture(scope="module", autouse=True)
def plugin():
    import sglang_glm_ext

    sglang_glm_ext.register()
    st = sglang_glm_ext.ledger_state().status
    assert st["megamoe.weights_sm90_loader"].state.value == "applied"


class Checkpoint:
    def __init__(self, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.t = {}
        for e in range(E):
            for shard, (rows, cols) in {"w1": (I, H), "w3": (I, H), "w2": (H, I)}.items():
                self.t[(e, shard, "weight")] = (torch.randn(rows, cols, generator=g) * 0.05).to(torch.float8_e4m3fn)
                self.t[(e, shard, "weight_scale_inv")] = torch.rand(rows // 128, cols // 128, generator=g) + 0.5

    def replace(self, other, experts, shards=("w1", "w3", "w2")):
        out = Checkpoint.__new__(Checkpoint)
        out.t = dict(self.t)
        for (e, shard, kind), v in other.t.items():
            if e in experts and shard in shards:
                out.t[(e, shard, kind)] = v
        return out

    def stacked(self):
        w13 = torch.stack([torch.cat([self.t[(e, "w1", "weight")], self.t[(e, "w3", "weight")]]) for e in range(E)])
        s13 = torch.stack([torch.cat([self.t[(e, "w1", "weight_scale_inv")], self.t[(e, "w3", "weight_scale_inv")]])
                           for e in range(E)])
        w2 = torch.stack([self.t[(e, "w2", "weight")] for e in range(E)])
        s2 = torch.stack([self.t[(e, "w2", "weight_scale_inv")] for e in range(E)])
        return w13, s13, w2, s2

    def named(self, experts=None, shards=("w1", "w3", "w2")):
        """Checkpoint names as GLM's load_weights sees them (gate_proj / up_proj / down_proj)."""
        proj = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
        return [(f"{PREFIX}.{e}.{proj[s]}.{k}", v) for (e, s, k), v in self.t.items()
                if (experts is None or e in experts) and s in shards]


class Holder(torch.nn.Module):
    """The smallest model SGLang's loader and updater drive: one MoE layer, GLM's expert-name mapping."""

    def __init__(self, experts):
        super().__init__()
        self.model = torch.nn.Module()
        self.model.layers = torch.nn.ModuleList([torch.nn.Module() for _ in range(4)])
        self.model.layers[3].mlp = torch.nn.Module()
        self.model.layers[3].mlp.experts = experts

    def load_weights(self, weights):
        from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE

        mapping = FusedMoE.make_expert_params_mapping(ckpt_gate_proj_name="gate_proj", ckpt_down_proj_name="down_proj",
                                                      ckpt_up_proj_name="up_proj", num_experts=E)
        params = dict(self.named_parameters())
        for name, w in weights:
            for param_name, weight_name, expert_id, shard_id in mapping:
                if weight_name not in name:
                    continue
                pname = name.replace(weight_name, param_name)
                param = params[pname]
                param.weight_loader(param, w, pname, shard_id=shard_id, expert_id=expert_id)
                break


@contextlib.contextmanager
def sm90_megamoe(monkeypatch):
    from sglang.srt.layers.moe.utils import MoeA2ABackend, MoeRunnerBackend
    from sglang.srt.runtime_context import get_context, get_flags, get_parallel, override_platform, reset_context
    from sglang.srt.server_args import ServerArgs
    import sglang.srt.layers.moe.mega_moe as mm
    import sglang.srt.layers.moe.mega_moe_sm90 as mm90
    import sglang.srt.layers.quantization.fp8 as fp8

    fake = fake_deep_gemm.install(monkeypatch)
    monkeypatch.setattr(fp8, "_is_cpu", False)
    monkeypatch.setattr(mm, "_device_sm", 90)
    monkeypatch.setattr(mm90, "_device_sm", 90)
    monkeypatch.setattr(mm, "_MEGA_MOE_SYMM_BUFFER", {})
    monkeypatch.setenv("SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK", "64")
    reset_context()
    try:
        get_context().set_server_args(ServerArgs(model_path="dummy", moe_a2a_backend="megamoe", tp_size=1,
                                                 device="cpu"))
        get_parallel().override_permanently(moe_ep_size=1, moe_ep_rank=0, moe_tp_size=1, moe_tp_rank=0, tp_size=1,
                                            tp_rank=0, moe_ep_group=SimpleNamespace(device_group=None))
        get_flags().moe.a2a_backend = MoeA2ABackend("megamoe")
        get_flags().moe.runner_backend = MoeRunnerBackend("auto")
        with override_platform(is_cuda=True, is_sm90=True, is_sm100=False, device_sm=90):
            yield fake
    finally:
        reset_context()


def build(ck: Checkpoint):
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE
    from sglang.srt.layers.quantization.fp8 import Fp8Config
    from sglang.srt.model_loader.loader import DefaultModelLoader

    cfg = Fp8Config(is_checkpoint_fp8_serialized=True, weight_block_size=[128, 128])
    experts = FusedMoE(num_experts=E, hidden_size=H, intermediate_size=I, layer_id=3, top_k=2,
                       params_dtype=torch.bfloat16, quant_config=cfg, prefix=PREFIX)
    model = Holder(experts)
    model.load_weights(ck.named())
    DefaultModelLoader.postprocess_weights(model, torch.device("cpu"))  # SGLang's builder interleaves w13
    assert experts._mega_moe_sm90_fp8_weights and experts.mega_l1_weights[0].data_ptr() == experts.w13_weight.data_ptr()
    return model, experts


X = torch.randn(24, H, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
IDS = torch.randint(0, E, (24, 2), generator=torch.Generator().manual_seed(10))
WTS = torch.rand(24, 2, generator=torch.Generator().manual_seed(11))


def forward(experts):
    """What the kernel computes from the layer as it is now (SGLang's run_mega_routed_experts, SM90 path)."""
    from sglang.srt.layers.moe.mega_moe import run_mega_routed_experts

    return run_mega_routed_experts(experts, X, IDS, WTS, hidden_size=H, intermediate_size=I, top_k=2,
                                   num_tokens=24).float()


def reference(ck: Checkpoint):
    w13, s13, w2, s2 = ck.stacked()
    return sm90_fp8.reference_moe(X.float(), IDS, WTS, w13, s13, w2, s2, w13_interleaved=False)


def rel(a, b):
    return float((a - b).norm() / b.norm())


def update(model, new: Checkpoint, experts, shards=("w1", "w3", "w2")):
    """update_weights_from_disk's sequence (weight_updater.py:216-219): restore, load, post-process."""
    from sglang.srt.model_loader.loader import DefaultModelLoader

    DefaultModelLoader.restore_weights_before_loading(model, torch.device("cpu"))
    model.load_weights(new.named(experts, shards))
    DefaultModelLoader.postprocess_weights(model, torch.device("cpu"))


def test_update_of_some_experts_is_served_in_the_kernels_layout(monkeypatch):
    a, b = Checkpoint(0), Checkpoint(1)
    with sm90_megamoe(monkeypatch):
        model, experts = build(a)
        assert rel(forward(experts), reference(a)) < 1e-2
        storage = experts.w13_weight.data.data_ptr()
        update(model, b, {1, 5})
        want = a.replace(b, {1, 5})
        got = forward(experts)
        assert rel(got, reference(want)) < 1e-2
        assert rel(got, reference(a)) > 0.05  # the update did change what is served
        # Byte-exact: w13 is the interleave of the new checkpoint, in the storage the kernel's tuple views.
        assert torch.equal(experts.w13_weight.data.view(torch.uint8),
                           sm90_fp8.interleave_gate_up(want.stacked()[0]).view(torch.uint8))
        assert experts.w13_weight.data.data_ptr() == storage and experts.mega_l1_weights[0].data_ptr() == experts.w13_weight.data_ptr()
        # A gate-only write (w1 of expert 2) keeps that expert's up rows.
        c = Checkpoint(2)
        update(model, c, {2}, shards=("w1",))
        want = want.replace(c, {2}, shards=("w1",))
        assert torch.equal(experts.w13_weight.data.view(torch.uint8),
                           sm90_fp8.interleave_gate_up(want.stacked()[0]).view(torch.uint8))
        assert rel(forward(experts), reference(want)) < 1e-2


def test_without_the_hook_the_same_update_serves_the_mixed_layout(monkeypatch):
    """The defect, on 0.5.23 alone: SGLang's loader writes plain rows, its builder returns early."""
    a, b = Checkpoint(0), Checkpoint(1)
    from sglang.srt.layers.moe.fused_moe_triton.layer import FusedMoE

    with sm90_megamoe(monkeypatch):
        model, experts = build(a)
        monkeypatch.setattr(FusedMoE, "_weight_loader_impl", resolve_original(LOADER))
        update(model, b, {1, 5})
        want = a.replace(b, {1, 5})
        assert rel(forward(experts), reference(want)) > 0.2


def test_fused_checkpoint_update(monkeypatch):
    a, b = Checkpoint(0), Checkpoint(3)
    with sm90_megamoe(monkeypatch):
        model, experts = build(a)
        w13 = b.stacked()[0]
        experts.weight_loader_fused(experts.w13_weight, w13, f"{PREFIX}.w13_weight", shard_id="w13")
        want = a.replace(b, set(range(E)), shards=("w1", "w3"))
        assert torch.equal(experts.w13_weight.data.view(torch.uint8),
                           sm90_fp8.interleave_gate_up(w13).view(torch.uint8))
        experts.w13_weight_scale_inv.data.copy_(want.stacked()[1])
        assert rel(forward(experts), reference(want)) < 1e-2


def updater(model):
    from sglang.srt.model_executor.model_runner_components.weight_updater import WeightUpdater

    return WeightUpdater(tp_rank=0, device="cpu", gpu_id=0, model_config=None, custom_weight_loaders={},
                         get_model=lambda: model, update_model_fields=lambda *a, **k: None,
                         recapture_cuda_graph=lambda: None, get_model_runner=lambda: None)


def test_sglang_updater_paths_tensor_and_distributed(monkeypatch):
    """SGLang's own WeightUpdater entry points: update_weights_from_tensor (no restore or post-process of its
    own: the session brackets it) and load_weights_from_distributed (neither)."""
    a, b, c = Checkpoint(0), Checkpoint(4), Checkpoint(5)
    with sm90_megamoe(monkeypatch):
        model, experts = build(a)
        wu = updater(model)
        ok, msg = wu.update_weights_from_tensor(b.named({0, 7}))
        assert ok, msg
        want = a.replace(b, {0, 7})
        assert rel(forward(experts), reference(want)) < 1e-2
        ok, msg = wu.load_weights_from_distributed(c.named({3}))
        assert ok, msg
        want = want.replace(c, {3})
        assert rel(forward(experts), reference(want)) < 1e-2
        # 'direct' copies tensors verbatim into parameters: refused for the interleaved w13, nothing written.
        before = experts.w13_weight.data.clone()
        ok, msg = wu.update_weights_from_tensor([(f"{PREFIX}.w13_weight", b.stacked()[0])], load_format="direct")
        assert not ok and "load_format='direct'" in msg and "checkpoint-named tensors" in msg
        assert torch.equal(experts.w13_weight.data.view(torch.uint8), before.view(torch.uint8))
        ok, msg = wu.update_weights_from_tensor([(f"{PREFIX}.w2_weight", b.stacked()[2])], load_format="direct")
        assert ok, msg  # w2 is in checkpoint layout: a verbatim copy is right


def test_eplb_moves_keep_each_experts_layout(monkeypatch):
    """EPLB (eplb/expert_location_updater.py) copies whole physical experts of every per-expert parameter; the
    interleave is per expert, so a rebalanced layer reads right through the physical ids TopK then gives."""
    from sglang.srt.eplb.expert_location_updater import create_temp_buffers, update_expert_weights_single_layer
    from sglang.srt.layers.moe.mega_moe import run_mega_routed_experts

    a = Checkpoint(0)
    with sm90_megamoe(monkeypatch):
        model, experts = build(a)
        weights = [p.data for n, p in experts.named_parameters() if p.data.dim() > 0 and p.data.shape[0] == E]
        assert any(w.data_ptr() == experts.w13_weight.data_ptr() for w in weights)
        old = list(range(E))
        new = [3, 1, 2, 0, 6, 5, 4, 7]  # physical slot -> logical expert
        update_expert_weights_single_layer(routed_experts_weights=weights, temp_buffers=create_temp_buffers(weights),
                                           old_physical_to_logical_map=old, new_physical_to_logical_map=new,
                                           num_local_physical_experts=E, num_gpu_per_node=1, rank=0, world_size=1)
        physical = torch.tensor([new.index(e) for e in range(E)])[IDS]
        got = run_mega_routed_experts(experts, X, physical, WTS, hidden_size=H, intermediate_size=I, top_k=2,
                                      num_tokens=24).float()
        assert rel(got, reference(a)) < 1e-2
        assert experts.mega_l1_weights[0].data_ptr() == experts.w13_weight.data_ptr()


def test_fp4_megamoe_layers_refuse_every_update_path_before_writing(monkeypatch):
    """FP4 layouts cannot be rewritten in place: the load check gives them SGLang's own refusal marker, which every
    WeightUpdater entry point checks first; a write that reaches one anyway raises."""
    import fp4_harness as Hfp4

    fi = Hfp4.FakeFlashInfer()
    ck = Hfp4.Checkpoint.random(4, 256, 256)
    with fi.installed(), Hfp4.sglang_runtime(quantization="modelopt_fp4", a2a="megamoe", runner="auto"):
        layer = Hfp4.build_nvfp4_layer(ck)
        Hfp4.load_nvfp4(layer, ck)
        layer.quant_method.process_weights_after_loading(layer)
        assert layer._mega_moe_trtllm_layout
        model = Holder(layer)
        assert weight_update.mark_refused_layers(model) == [PREFIX]
        before = layer.w13_weight.data.clone()
        wu = updater(model)
        for call in (lambda: wu.update_weights_from_tensor([(f"{PREFIX}.0.gate_proj.weight", torch.zeros(1))]),
                     lambda: wu.load_weights_from_distributed([(f"{PREFIX}.0.gate_proj.weight", torch.zeros(1))]),
                     lambda: wu.update_weights_from_ipc(SimpleNamespace(zmq_handles={}))):
            ok, msg = call()
            assert not ok and "online weight updates are refused, nothing written" in msg
            assert PREFIX in msg and "TRTLLM layout" in msg and "--moe-a2a-backend none" in msg
        assert torch.equal(layer.w13_weight.data, before)
        with pytest.raises(weight_update.MegaMoEWeightUpdateError, match="nothing written"):
            Hfp4.load_nvfp4(layer, ck)
