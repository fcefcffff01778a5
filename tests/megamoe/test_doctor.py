"""MegaMoE's doctor part: FP4 MegaMoE needs SM100 GPUs only and DeepGEMM installed; which MegaMoE kernels this node
and its deep_gemm can run; and a checked megamoe launch (`doctor --moe-a2a-backend megamoe`) on a node that runs
none of them is a problem."""

import json
import os

import pytest

from sglang_glm_ext.declare import DoctorInput
from sglang_glm_ext.megamoe import hardware
from sglang_glm_ext.megamoe.doctor import fp4_megamoe, launch_problems, report

B200 = {"index": 0, "name": "B200", "sm": 100}
H200 = {"index": 1, "name": "H200", "sm": 90}
MEGA = {"moe_a2a_backend": "megamoe"}


@pytest.fixture(autouse=True)
def _no_switches(monkeypatch):
    for name in ("SGLANG_OPT_USE_DEEPGEMM_MEGA_MOE", "SGLANG_OPT_DEEPGEMM_MEGA_MOE_USE_FP4_ACTS", "DG_USE_FP4_ACTS"):
        monkeypatch.delenv(name, raising=False)


def test_reasons_in_order_of_what_is_missing():
    assert fp4_megamoe([], "2.1") == {"possible": False, "why": "no CUDA GPU visible"}
    assert "SM100-only; this node has SM [90, 100]" in fp4_megamoe([B200, H200], "2.1")["why"]
    assert fp4_megamoe([B200], None) == {"possible": False, "why": "deep_gemm is not installed"}
    assert fp4_megamoe([B200, dict(B200, index=1, sm=103)], "2.1") == {"possible": True, "why": ""}


def test_report_reads_gpus_and_the_deep_gemm_version_from_doctor_input():
    part = report(DoctorInput(values={}, gpus=(B200,), versions={"deep_gemm": "2.1"}))
    fp4 = part.hardware["fp4_megamoe"]
    # schema 1: the original keys with their values, then the additions
    assert {k: fp4[k] for k in ("possible", "why")} == {"possible": True, "why": ""}
    assert fp4["deep_gemm"] == "2.1" and fp4["trtllm_layout"] == hardware.trtllm_layout()
    assert set(part.hardware["megamoe"]) == {"fp8_sm90", "fp4_sm100", "deep_gemm", "retired_env",
                                             "dg_use_fp4_acts_set", "shared_expert"}
    assert part.problems == ()


def test_a_checked_megamoe_launch_needs_a_node_that_runs_some_megamoe_kernel(monkeypatch):
    monkeypatch.setattr(hardware, "probe_deep_gemm",
                        lambda: hardware.DeepGemmProbe("0.2.3.post2", hardware.SM90_KERNEL_API))
    cpu = DoctorInput(values={}, gpus=(), versions={}, launch=MEGA)
    (problem,) = report(cpu).problems
    assert problem.startswith("--moe-a2a-backend megamoe: no MegaMoE kernel can run on this node")
    assert "fp8_sm90: no CUDA GPU visible" in problem
    assert report(DoctorInput(values={}, gpus=(H200,), versions={}, launch=MEGA)).problems == ()
    assert report(DoctorInput(values={}, gpus=(), versions={}, launch={"moe_runner_backend": "megamoe"})).problems
    # megamoe not asked (no SGLang arguments given, or another backend): the node is not judged
    assert report(DoctorInput(values={}, gpus=(), versions={})).problems == ()
    other = {"moe_a2a_backend": "deepep"}
    assert report(DoctorInput(values={}, gpus=(), versions={}, launch=other)).problems == ()
    assert launch_problems({"fp8_sm90": {"possible": False, "why": "a"},
                            "fp4_sm100": {"possible": True, "why": ""}}) == []


@pytest.fixture
def _doctor(sglang_python):
    """`sglang-glm-ext doctor --json ARGS` in a process of its own (forked from a parent that imported SGLang only)."""
    def run(*args):
        env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
        return sglang_python.run(module="sglang_glm_ext.cli", argv=["doctor", "--json", *args], env=env, timeout=300)

    return run


@pytest.mark.slow
def test_doctor_json_carries_the_megamoe_part(_doctor):
    proc = _doctor()
    rep = json.loads(proc.stdout)
    mm = rep["hardware"]["megamoe"]
    assert set(mm) == {"fp8_sm90", "fp4_sm100", "deep_gemm", "retired_env", "dg_use_fp4_acts_set", "shared_expert"}
    assert mm["fp8_sm90"] == {"possible": False, "why": "no CUDA GPU visible"}  # this CPU machine
    assert set(rep["hardware"]["fp4_megamoe"]) == {"possible", "why", "deep_gemm", "trtllm_layout"}
    feature = next(f for f in rep["features"] if f["name"] == "megamoe")
    assert feature["active"] is False  # applied; on only via --moe-a2a-backend
    # no MegaMoE kernel runs on this CPU machine: not "available" (its patches are in; the node cannot serve it)
    assert feature["available"] is False and "no MegaMoE kernel can run on this node" in feature["why_unavailable"]


@pytest.mark.slow
def test_doctor_checks_a_megamoe_launch_given_sglangs_own_flag(_doctor):
    proc = _doctor("--moe-a2a-backend", "megamoe")
    assert proc.returncode == 1, proc.stdout + proc.stderr[-2000:]
    rep = json.loads(proc.stdout)
    feature = next(f for f in rep["features"] if f["name"] == "megamoe")
    assert feature["active"] is True and feature["available"] is False
    assert any(p.startswith("--moe-a2a-backend megamoe: no MegaMoE kernel can run") for p in rep["problems"])


def test_shared_expert_memory_for_the_released_glm4_models_and_a_given_one(tmp_path):
    """Under megamoe the plugin replicates GLM-4.x's shared expert (full weights on every GPU); doctor states what
    that costs per GPU against TP sharding: about 2.1 GB for GLM-4.5/4.6 FP8 (89 MoE layers), 0.8 GB for Air."""
    from sglang_glm_ext.megamoe.doctor import render_shared_expert, shared_expert_part

    part = shared_expert_part()
    rows = {r["model"]: r for r in part["known"]}
    big, air = rows["GLM-4.5 / GLM-4.6 FP8"], rows["GLM-4.5-Air FP8"]
    assert big["moe_layers"] == 89 and round(big["replicated_per_gpu_bytes"] / 1e9, 2) == 2.10
    assert air["moe_layers"] == 45 and round(air["replicated_per_gpu_bytes"] / 1e9, 2) == 0.78
    assert part["tp_size"] == 8 and round(big["tp_sharded_per_gpu_bytes"] / 1e9, 2) == 0.26
    assert big["extra_per_gpu_bytes"] == big["replicated_per_gpu_bytes"] - big["tp_sharded_per_gpu_bytes"]
    # 3 x H x I FP8 bytes + fp32 128x128 block scales, per MoE layer
    assert big["replicated_per_gpu_bytes"] == 89 * (3 * 5120 * 1536 + (24 * 40 + 40 * 12) * 4)
    text = "\n".join(render_shared_expert(part))
    assert "2.10 GB per GPU replicated under megamoe; TP-sharded over 8: 0.26 GB" in text
    from glm_configs import GLM4_CONFIG, write_model_dir

    model = write_model_dir(tmp_path / "m", GLM4_CONFIG)
    mine = shared_expert_part(model, "2")["model"]
    assert mine["moe_layers"] == 1 and mine["tp_sharded_per_gpu_bytes"] * 2 == mine["replicated_per_gpu_bytes"]
    assert "cannot read" in shared_expert_part(str(tmp_path / "none"))["why"]
    glm5 = write_model_dir(tmp_path / "g5", dict(GLM4_CONFIG, architectures=["GlmMoeDsaForCausalLM"]))
    assert "not a GLM-4.x" in shared_expert_part(glm5)["why"]


@pytest.mark.slow
def test_doctor_cli_takes_the_model_and_tp_size(_doctor, tmp_path):
    from glm_configs import write_model_dir

    model = write_model_dir(tmp_path / "m")
    rep = json.loads(_doctor("--model-path", model, "--tp-size", "4").stdout)
    part = rep["hardware"]["megamoe"]["shared_expert"]
    assert part["tp_size"] == 4 and part["model"]["model"] == model
