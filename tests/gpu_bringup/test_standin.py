"""The GPU bring-up tier's sgl_kernel stand-in: it defines exactly the names SGLang 0.5.23 imports at module level on
the CUDA path (derived here from the installed SGLang's source) plus the one it fetches by name at the first MoE
forward; each called name is implemented, every other one raises naming the op; no torch.ops.sgl_kernel op; it
never shadows the CPU serving mode's stand-in."""

import importlib
import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

import sglang_source
from sglang_glm_ext import declare
from sglang_glm_ext.gpu_bringup import gate, kernels

SHADOW = pathlib.Path(gate.SHADOW_DIR)
# A CUDA machine (SM90): SGLang's device predicates as they evaluate there.
_CUDA = {"_is_cuda": True, "is_cuda": True, "_is_cuda_alike": True, "is_cuda_alike": True, "_is_cpu": False,
         "is_cpu": False, "_is_hip": False, "is_hip": False, "_is_npu": False, "is_npu": False, "_is_xpu": False,
         "is_xpu": False, "_is_musa": False, "is_musa": False, "_is_cpu_amx_available": False,
         "cpu_has_amx_support": False, "_use_aiter": False}
# Not imported at module level: SGLang's AOT kernel registry fetches it with getattr at the first MoE forward
# (kernels/ops/moe/__init__.py ~146).
FETCHED_BY_NAME = {("sgl_kernel", "moe_align_block_size")}


@pytest.fixture
def standin(monkeypatch):
    for name in [m for m in sys.modules if m == "sgl_kernel" or m.startswith("sgl_kernel.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(SHADOW))
    yield lambda module: importlib.import_module(module)
    for name in [m for m in sys.modules if m == "sgl_kernel" or m.startswith("sgl_kernel.")]:
        sys.modules.pop(name, None)


def _names(dotted):
    out = set()
    for n in dotted:
        mod, _, name = n.rpartition(".")
        out.add((f"sgl_kernel.{mod}" if mod else "sgl_kernel", name))
    return out


@pytest.mark.slow  # parses every module of the installed SGLang
def test_standin_defines_exactly_what_sglang_imports_on_the_cuda_path():
    root = pathlib.Path(importlib.util.find_spec("sglang").submodule_search_locations[0])
    wanted = {(m, n) for m, names in sglang_source.device_path_imports(root, "sgl_kernel", _CUDA).items()
              for n in names}
    assert {("sgl_kernel", "rmsnorm"), ("sgl_kernel.utils", "is_arch_support_pdl"),
            ("sgl_kernel.kvcacheio", "transfer_kv_per_layer_mla_pf_lf")} <= wanted
    have = _names(kernels.STANDIN_NAMES) | _names(kernels.UNAVAILABLE_NAMES)
    assert have == wanted | FETCHED_BY_NAME, (sorted(wanted - have), sorted(have - wanted - FETCHED_BY_NAME))


def test_each_name_resolves_implemented_ones_run_the_others_raise_naming_the_op(standin):
    top = standin("sgl_kernel")
    assert top.GLM_EXT_STANDIN and top.GLM_EXT_GPU_STANDIN and not declare.real_sgl_kernel()
    for module, name in _names(kernels.STANDIN_NAMES):
        fn = getattr(standin(module), name)
        assert callable(fn) and not getattr(fn, "_glm_ext_unavailable", False), (module, name)
    for module, name in _names(kernels.UNAVAILABLE_NAMES):
        with pytest.raises(top.StandinOpNotImplemented, match=name):
            getattr(standin(module), name)(1, 2, key=3)
    with pytest.raises(ImportError):
        exec("from sgl_kernel import flash_mla_with_kvcache", {})  # SGLang's own fallbacks still see an ImportError
    with pytest.raises(ModuleNotFoundError):
        standin("sgl_kernel.allreduce")


def test_a_missing_name_is_logged_once_with_what_asked(standin, caplog):
    top = standin("sgl_kernel")
    top._asked.discard("fast_topk_v2")
    with caplog.at_level("WARNING", logger="sglang_glm_ext"):
        for _ in range(2):
            with pytest.raises(AttributeError, match="fast_topk_v2"):
                top.fast_topk_v2  # noqa: B018
    assert [r.getMessage() for r in caplog.records].count(
        "sglang-glm-ext GPU bring-up: SGLang asked the sgl_kernel stand-in for 'fast_topk_v2', which it lacks") == 1


@pytest.mark.slow
def test_standin_registers_no_torch_op():
    code = ("import sys; sys.path.insert(0, %r); import torch, sgl_kernel, sgl_kernel.kvcacheio\n"
            "print(hasattr(torch.ops.sgl_kernel, 'convert_weight_packed'), hasattr(torch.ops.sgl_kernel, "
            "'get_device_accessible_ptr'), sgl_kernel.GLM_EXT_GPU_STANDIN)" % str(SHADOW))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["False", "False", "True"]


def test_the_two_stand_ins_never_take_each_other_for_a_real_sgl_kernel(monkeypatch):
    from sglang_glm_ext.cpu_serve import gate as cpu_gate

    assert set(declare.STANDIN_DIRS) == {cpu_gate.SHADOW_DIR, gate.SHADOW_DIR}
    for d in declare.STANDIN_DIRS:
        monkeypatch.syspath_prepend(d)
    assert declare.real_sgl_kernel() == ""
