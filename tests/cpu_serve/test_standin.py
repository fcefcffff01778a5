"""The sgl_kernel stand-in: its names are exactly those SGLang imports on the CPU path (derived here from the
installed SGLang's source), the called ones are implemented, every other one raises naming the op, no catch-all,
no torch.ops.sgl_kernel op; the wheel has no top-level sgl_kernel, no .pth and no sitecustomize."""

import importlib
import importlib.util
import os
import pathlib
import subprocess
import sys
import zipfile

import pytest

import sglang_source
from sglang_glm_ext.cpu_serve import gate

SHADOW = pathlib.Path(gate.SHADOW_DIR)
ROOT = pathlib.Path(__file__).resolve().parents[2]

# A CPU-engine machine without AMX: SGLang's device predicates as they evaluate there (names and zero-argument calls).
_PREDICATES = {"_is_cpu": True, "is_cpu": True, "_is_cuda": False, "is_cuda": False, "_is_hip": False,
               "is_hip": False, "_is_npu": False, "is_npu": False, "_is_xpu": False, "is_xpu": False,
               "_is_musa": False, "is_musa": False, "_is_cpu_amx_available": False, "cpu_has_amx_support": False,
               "_use_aiter": False, "_is_cuda_alike": False}


def cpu_path_imports(root: pathlib.Path) -> dict[str, set[str]]:
    return sglang_source.device_path_imports(root, "sgl_kernel", _PREDICATES)


def _sglang_root() -> pathlib.Path:
    return pathlib.Path(importlib.util.find_spec("sglang").submodule_search_locations[0])


def _standin(module: str):
    """Import the stand-in module `sgl_kernel[.sub]` from the shadow directory, as a served process does."""
    sys.path.insert(0, str(SHADOW))
    try:
        return importlib.import_module(module)
    finally:
        sys.path.remove(str(SHADOW))


@pytest.fixture
def standin(monkeypatch):
    for name in [m for m in sys.modules if m == "sgl_kernel" or m.startswith("sgl_kernel.")]:
        monkeypatch.delitem(sys.modules, name)
    yield _standin
    for name in [m for m in sys.modules if m == "sgl_kernel" or m.startswith("sgl_kernel.")]:
        sys.modules.pop(name, None)


@pytest.mark.slow  # parses every module of the installed SGLang
def test_standin_exports_exactly_the_names_sglang_imports_on_the_cpu_path(standin):
    wanted = cpu_path_imports(_sglang_root())
    assert wanted.get("sgl_kernel", set()) >= {"copy_all_layer_kv_cache_cpu", "assign_req_to_token_pool_cpu"}
    have = {}
    top = standin("sgl_kernel")
    have["sgl_kernel"] = set(top.IMPLEMENTED) | set(top.UNAVAILABLE)
    for sub in top.SUBMODULES:
        mod = standin(f"sgl_kernel.{sub}")
        have[f"sgl_kernel.{sub}"] = set(mod.IMPLEMENTED) | set(mod.UNAVAILABLE)
    assert have == wanted, "the stand-in's explicit list drifted from the installed SGLang's CPU-path imports"


def test_each_called_name_is_implemented_and_every_other_raises_naming_the_op(standin):
    top = standin("sgl_kernel")
    from sglang_glm_ext.cpu_serve import kernels

    for name in top.IMPLEMENTED:
        assert getattr(top, name) is getattr(kernels, name)  # tested against references in test_kernels.py
    for module in ["sgl_kernel", *(f"sgl_kernel.{s}" for s in top.SUBMODULES)]:
        mod = standin(module)
        for name in mod.UNAVAILABLE:
            with pytest.raises(top.StandinOpNotImplemented, match=name):
                getattr(mod, name)(1, 2, key=3)
        assert "__getattr__" not in vars(mod), f"{module} has a catch-all"
    with pytest.raises(ImportError):
        exec("from sgl_kernel import rmsnorm", {})  # SGLang's try/except fallbacks see an ImportError
    with pytest.raises(ModuleNotFoundError):
        standin("sgl_kernel.allreduce")


@pytest.mark.slow
def test_standin_registers_no_torch_op_so_amx_detection_stays_false():
    code = ("import sys; sys.path.insert(0, %r); import torch, sgl_kernel, sgl_kernel.mamba, sgl_kernel.speculative\n"
            "print(hasattr(torch.ops.sgl_kernel, 'convert_weight_packed'), sgl_kernel.GLM_EXT_CPU_STANDIN)\n"
            "from sglang.srt.utils.common import _is_intel_amx_backend_available as f; print(f())" % str(SHADOW))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "SGLANG_USE_CPU_ENGINE": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["False", "True", "False"]


@pytest.mark.slow
def test_wheel_has_no_top_level_sgl_kernel_pth_or_sitecustomize(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = tmp_path.glob("sglang_glm_ext-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "sglang_glm_ext/cpu_serve/_shadow/sgl_kernel/__init__.py" in names  # shipped, but only inside the package
    tops = {n.split("/", 1)[0] for n in names}
    assert all(t == "sglang_glm_ext" or t.endswith(".dist-info") for t in tops), tops
    assert not [n for n in names if n.endswith(".pth") or "sitecustomize" in n or "usercustomize" in n]


def test_kvcacheio_bindings_cover_every_copy_each_host_pool_calls():
    # Every kvcacheio op a host-pool module calls, but those of layouts L3 does not serve (page_head) and the
    # Ascend exchange, is bound by that module's cpu_serve.kvcacheio_* patch (else a layout would NameError).
    import re

    from sglang_glm_ext.plugin.registry import PATCHES

    for kind in ("mha", "mla", "dsa"):
        src = (_sglang_root() / "srt" / "mem_cache" / "pool_host" / f"{kind}.py").read_text()
        called = {n for n in re.findall(r"\b(transfer_kv_\w+)\(", src)
                  if not n.endswith(("_ph", "_ph_lf", "lf_ph")) and n != "transfer_kv_dim_exchange"}
        (patch,) = [p for p in PATCHES if p.id == f"cpu_serve.kvcacheio_{kind}"]
        assert called == set(patch.signature), (kind, called ^ set(patch.signature))
