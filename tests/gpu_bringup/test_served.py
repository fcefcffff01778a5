"""The GPU served run's pieces that need no GPU: SGLang's own parser takes its arguments as meant (eager phases
with no CUDA graph, the graph phase with decode graphs for batches of 1-4), its environment is the tier's, and the
[cg_mem] check reads the tables the attribution prints (the H200 core run's output, verbatim) and sees a per-shape
delta missing."""

import pathlib

import pytest

from sglang_glm_ext.cpu_serve import run as serve_run
from sglang_glm_ext.gpu_bringup import feature, served

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _parse(argv):
    import argparse

    from sglang.srt.server_args import ServerArgs

    p = argparse.ArgumentParser()
    ServerArgs.add_cli_args(p)
    return p.parse_args(["--model-path", "/tmp/m", *argv])


@pytest.mark.parametrize("layout", ["layer_first", "page_first"])
def test_sglang_parses_the_gpu_run_as_meant(layout):
    prof = serve_run.Profile(**served.profile(layout))
    eager = _parse([*prof.base_args, *prof.hicache_args])
    assert (eager.device, eager.attention_backend, eager.hicache_mem_layout, eager.hicache_io_backend,
            eager.dtype) == ("cuda", "triton", layout, "kernel", "float32")
    assert (eager.cuda_graph_backend_decode, eager.cuda_graph_backend_prefill) == ("disabled", "disabled")
    graphs = _parse([*prof.base_args, *prof.hicache_args, *served.GRAPH_ARGS])
    assert (graphs.cuda_graph_backend_decode, graphs.cuda_graph_backend_prefill,
            graphs.cuda_graph_max_bs_decode) == ("full", "disabled", 4)
    env = dict(prof.base_env)
    assert env[feature.GPU_BRINGUP.name] == "1" and env["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"] == "python"
    assert env["SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK"] == "1" and env["SGLANG_FP8_PAGED_MQA_LOGITS_TORCH"] == "1"
    assert prof.perturb_env == "SGLANG_GLM_EXT_GPU_BRINGUP_PERTURB_LOADS"


def _h200_output() -> str:
    text = (ROOT / "docs_internal" / "cg_mem_h200_run.md").read_text()
    return text.split("## Output (verbatim)", 1)[1]


def test_the_cg_mem_check_reads_the_attributions_tables_and_sees_a_missing_shape():
    report = served.cg_mem_report(_h200_output())
    tv = report["target_verify"]
    assert tv["buffers"] == 5 and tv["shape_pool_mib"] == [172.0, 0.0, 0.0, 4.0, 0.0, 0.0]
    assert tv["shape_sum_mib"] == tv["whole_pool_mib"] == tv["pool_mib"] == 176.0 and tv["sums_to_pool"]
    assert {"target_verify", "draft", "draft_extend"} <= set(report)
    cut = _h200_output().replace("  bs=32                          +4.00", "  bs=32                          +0.00", 1)
    assert served.cg_mem_report(cut)["target_verify"]["sums_to_pool"] is False
    assert served.cg_mem_report("no table here") == {}


def test_the_check_reads_sglangs_real_decode_capture_on_the_counter_its_line_names():
    """Verbatim from SGLang 0.5.23's decode capture on the H100 (docs_internal/gpu_runs_2026-12-05.md): the graph
    pool is created inside the capture call, so the whole-capture line gives `reserved`; the per-shape `reserved`
    deltas must sum to it (they do: 36 = 36), and a row cut from them fails the check."""
    text = (ROOT / "docs_internal" / "gpu_runs_2026-12-05.md").read_text()
    text = text.split("## CUDA graphs:", 1)[1].split("```", 2)[1]
    dec = served.cg_mem_report(text)["decode"]
    assert dec["buffers"] == 12 and dec["whole_counter"] == "reserved" and dec["whole_mib"] == 36.0
    assert dec["shape_mib"]["reserved"] == [36.0, 0.0, 0.0] and dec["shape_pool_mib"] == [2.0, 0.0, 0.0]
    assert dec["pool_mib"] == 2.0 and dec["sums_to_pool"] is True
    cut = text.replace("+36.00      +32.00", "+34.00      +32.00", 1)
    assert served.cg_mem_report(cut)["decode"]["sums_to_pool"] is False


def test_the_check_reads_the_whole_capture_pool_line_the_plugin_now_logs_on_a_gpu():
    """Verbatim from SGLang 0.5.23's decode capture on the H100, 2026-12-06 (docs_internal/gpu_runs_2026-12-06.md):
    with the pool SGLang creates inside its capture call counted from 0, the TOTAL line names the graph pool itself,
    and the per-shape pool deltas must sum to it (2 = 2); a row cut from them fails the check."""
    text = (ROOT / "docs_internal" / "gpu_runs_2026-12-06.md").read_text()
    text = text.split("The plugin's tables from SGLang's real decode capture", 1)[1].split("```", 2)[1]
    dec = served.cg_mem_report(text)["decode"]
    assert dec["buffers"] == 12 and dec["whole_counter"] == "pool" and dec["whole_mib"] == 2.0
    assert dec["shape_pool_mib"] == [2.0, 0.0, 0.0] and dec["pool_mib"] == 2.0 and dec["sums_to_pool"] is True
    cut = text.replace("  bs=4                           +2.00", "  bs=4                           +1.00", 1)
    assert served.cg_mem_report(cut)["decode"]["sums_to_pool"] is False
