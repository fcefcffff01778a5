"""Hardware truth and doctor's MegaMoE part: FP4 kernels SM100-only, FP8 on SM90, and why not."""

import sys

import pytest

from sglang_glm_ext.megamoe.guard import SM90_KERNEL_API, SM100_KERNEL_API
from sglang_glm_ext.megamoe.hardware import DeepGemmProbe, doctor_part, doctor_problems, kernel_support, probe_deep_gemm

BOTH = SM90_KERNEL_API | SM100_KERNEL_API


@pytest.mark.parametrize("sms,fp8,fp4", [
    ([90], True, False), ([90, 90], True, False), ([100], False, True), ([103], False, True),
    ([90, 100], False, False), ([120], False, False), ([80], False, False),
])
def test_kernel_support_by_sm(sms, fp8, fp4):
    k = kernel_support(sms, BOTH)
    assert k["fp8_sm90"]["possible"] is fp8 and k["fp4_sm100"]["possible"] is fp4
    if not fp4:
        assert "SM100-only" in k["fp4_sm100"]["why"]


def test_kernel_support_says_why_without_gpu_or_kernel():
    assert kernel_support([], BOTH)["fp8_sm90"]["why"] == "no CUDA GPU visible"
    assert "does not import (boom)" in kernel_support([90], frozenset(), "boom")["fp8_sm90"]["why"]
    assert "lacks ['fp8_mega_moe', 'mega_moe_pre_dispatch_sm90']" in kernel_support([90], SM100_KERNEL_API)["fp8_sm90"]["why"]


def test_probe_reports_an_unimportable_deep_gemm(monkeypatch):
    monkeypatch.setitem(sys.modules, "deep_gemm", None)
    probe = probe_deep_gemm()
    assert probe.api == frozenset() and "import of deep_gemm halted" in probe.error


def test_doctor_part_and_problems(monkeypatch):
    monkeypatch.setenv("SGLANG_OPT_USE_DEEPGEMM_MEGA_MOE", "1")
    monkeypatch.setenv("DG_USE_FP4_ACTS", "1")
    part = doctor_part([{"sm": 90}], DeepGemmProbe("0.2.3.post2", BOTH))
    assert part["fp8_sm90"] == {"possible": True, "why": ""} and part["fp4_sm100"]["possible"] is False
    assert part["retired_env"] == ["SGLANG_OPT_USE_DEEPGEMM_MEGA_MOE"] and part["dg_use_fp4_acts_set"]
    problems = doctor_problems(part)
    assert any("--moe-a2a-backend megamoe" in p for p in problems) and any("DG_USE_FP4_ACTS" in p for p in problems)
    monkeypatch.delenv("SGLANG_OPT_USE_DEEPGEMM_MEGA_MOE")
    monkeypatch.delenv("DG_USE_FP4_ACTS")
    assert doctor_problems(doctor_part([], DeepGemmProbe(None, frozenset(), "absent"))) == []
