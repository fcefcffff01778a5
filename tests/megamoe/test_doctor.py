"""MegaMoE's doctor part: FP4 MegaMoE needs SM100 GPUs only, and DeepGEMM installed."""

from sglang_glm_ext.declare import DoctorInput
from sglang_glm_ext.megamoe.doctor import fp4_megamoe, report

B200 = {"index": 0, "name": "B200", "sm": 100}
H200 = {"index": 1, "name": "H200", "sm": 90}


def test_reasons_in_order_of_what_is_missing():
    assert fp4_megamoe([], "2.1") == {"possible": False, "why": "no CUDA GPU visible"}
    assert "SM100-only; this node has SM [90, 100]" in fp4_megamoe([B200, H200], "2.1")["why"]
    assert fp4_megamoe([B200], None) == {"possible": False, "why": "deep_gemm is not installed"}
    assert fp4_megamoe([B200, dict(B200, index=1, sm=103)], "2.1") == {"possible": True, "why": ""}


def test_report_reads_gpus_and_the_deep_gemm_version_from_doctor_input():
    part = report(DoctorInput(values={}, gpus=(B200,), versions={"deep_gemm": "2.1"}))
    assert part.hardware == {"fp4_megamoe": {"possible": True, "why": ""}} and part.problems == ()
