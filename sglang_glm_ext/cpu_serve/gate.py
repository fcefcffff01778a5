"""Whether the CPU serving mode may run in this process, and making the ``sgl_kernel`` stand-in reachable (pure core).

Why ``sys.path``: SGLang starts each scheduler with ``multiprocessing`` spawn, and the child imports
``managers/scheduler.py`` -> ``disaggregation/checksum.py`` -> ``mem_cache/memory_pool.py`` ->
``kernels/ops/kvcache/cache_move.py``, which does ``from sgl_kernel import copy_all_layer_kv_cache_cpu`` under
``SGLANG_USE_CPU_ENGINE=1``, before the child's first line (``load_plugins()``) runs: no hook inside the child can
supply the module. Spawn copies the parent's ``sys.path`` into the child before it unpickles its target
(``multiprocessing.spawn.prepare``), so a directory the launching process put at the front of ``sys.path`` is there
in every child when that import runs. :func:`activate` puts ``cpu_serve/_shadow`` (which holds only the stand-in
package) there, from ``register()`` in the launching process, and only when the mode is on and
:func:`refusal_reason` is empty. No ``.pth`` file, no ``sitecustomize``, no top-level ``sgl_kernel`` in the wheel:
with the mode off (every GPU node) nothing can import the stand-in.
"""

from __future__ import annotations

import os
import sys

from .. import declare

USE_CPU_ENGINE = "SGLANG_USE_CPU_ENGINE"  # SGLang's own switch (utils/common.py is_cpu())
CPU_SERVE = declare.EnvVar(
    "SGLANG_GLM_EXT_CPU_SERVE", "0",
    "1 = serve on a CPU-only machine (--device cpu, SGLANG_USE_CPU_ENGINE=1): an sgl_kernel stand-in, pageable host "
    "pools and torch copies for HiCache, GLM-5's indexer K cache and MLA dispatch (docs_internal/cpu_serve.md). "
    "Refused where an accelerator or a real sgl_kernel is present.",
)

SHADOW_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_shadow")
STANDIN_MODULE = "sgl_kernel"


def mode_on() -> bool:
    """``SGLANG_GLM_EXT_CPU_SERVE`` is set to a true value (a bad value counts as off; validate says so)."""
    return declare.switch_on(CPU_SERVE)


def visible_accelerator() -> str:
    """'' when torch sees no accelerator, else its name (cuda, xpu, npu, musa, mps)."""
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - no torch: SGLang cannot run either
        return f"torch does not import ({exc})"
    try:
        if torch.cuda.is_available():
            return "cuda"
    except Exception:  # noqa: BLE001
        pass
    for name in ("xpu", "npu", "musa", "mps"):
        mod = getattr(torch, name, None) if name != "mps" else getattr(torch.backends, "mps", None)
        try:
            if mod is not None and mod.is_available():
                return name
        except Exception:  # noqa: BLE001 - a backend that cannot answer is not a device we can use
            pass
    return ""


real_sgl_kernel = declare.real_sgl_kernel  # '' when none but the plugin's stand-ins can be imported, else where

def refusal_reason() -> str:
    """'' when the CPU serving mode may run in this process, else one line saying why not."""
    acc = visible_accelerator()
    if acc:
        return (f"a {acc} device is visible: the real kernels must serve there; the CPU serving mode is for "
                "machines without an accelerator (unset SGLANG_GLM_EXT_CPU_SERVE)")
    real = real_sgl_kernel()
    if real:
        return (f"a real sgl_kernel is installed ({real}); the CPU serving mode never shadows it "
                "(unset SGLANG_GLM_EXT_CPU_SERVE, or use that sgl_kernel's own CPU build)")
    if os.environ.get(USE_CPU_ENGINE) != "1":
        return (f"it needs {USE_CPU_ENGINE}=1 in the environment (without it SGLang 0.5.23's is_cpu() is false "
                "and its CUDA imports run); set it and pass --device cpu")
    return ""


def device_refusal(device) -> str:
    """'' when the launch's ``--device`` is ``cpu``, else why the mode refuses it."""
    if device == "cpu":
        return ""
    return (f"it serves only --device cpu (got --device {device or 'auto'}); pass --device cpu, or unset "
            "SGLANG_GLM_EXT_CPU_SERVE")


def standin_reachable() -> bool:
    """Whether ``import sgl_kernel`` in this process (or a child spawned from it) reaches the stand-in."""
    return declare.standin_reachable(SHADOW_DIR)


def activate() -> str:
    """Put the stand-in's directory at the front of ``sys.path`` when the mode is on and may run here. Returns ''
    when the stand-in is reachable now, else why not (the mode is off, or :func:`refusal_reason`)."""
    return declare.activate_standin(SHADOW_DIR, CPU_SERVE, refusal_reason)


def _probe_child(queue) -> None:
    """Test helper, run as a spawn child's target: what `import sgl_kernel` reaches there (tests/cpu_serve)."""
    import sgl_kernel

    queue.put({"standin": bool(getattr(sgl_kernel, "GLM_EXT_CPU_STANDIN", False)),
               "first": os.path.abspath(sys.path[0]) == SHADOW_DIR})
