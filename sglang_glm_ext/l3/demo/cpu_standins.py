"""CPU stand-ins for what SGLang's HiCache needs a GPU for: the sgl_kernel KV copy ops and pinned host pools.

DEMO/TEST-ONLY. Declared in the ledger with ``Tier.DEMO`` (``l3/patches.py``), which ``register()``
never applies; only :func:`install` does, and it refuses where it could touch serving:

* a CUDA (or other accelerator) device is visible: the real kernels exist there and must be what runs;
* this process launched (or is) an SGLang server: a published ``ServerArgs`` carries ``_launch_command``
  (set by ``prepare_server_args`` for the CLI and by ``Engine(...)``), or the plugin's server-args hook has
  already seen a launch. The same hook refuses a launch in a process where the stand-ins are installed.

The copy functions themselves are the CPU serving mode's (``sglang_glm_ext/cpu_serve/kernels.py``, tested there
against references); this module is only the demo's guarded installer of them. What they are
(``../../../../shared/research/hicache_cpu.md``): 0.5.23's host pools import the kvcacheio ops only
under ``if _is_cuda or _is_hip`` / ``elif _is_xpu``, so on a CPU the names are unbound and any D2H/H2D raises
NameError. :func:`install` binds pure-torch / numpy copies with the same keyword signatures into
``sglang.srt.mem_cache.pool_host.{mla,dsa,mha}`` (only names that are not bound), and wraps the host pools'
``__init__`` so ``pin_memory=False`` (pinning calls cudaHostRegister). They reproduce sgl-kernel semantics for
page-aligned index lists; they do NOT validate the CUDA kernels (a GPU job does).
"""

from __future__ import annotations

import functools
import threading

__all__ = ["install", "installed", "uninstall", "StandinRefused", "KVCACHEIO_NAMES", "UNPINNED_POOLS",
           "refusal_reason"]

_MODULES = ("sglang.srt.mem_cache.pool_host.mla", "sglang.srt.mem_cache.pool_host.dsa",
            "sglang.srt.mem_cache.pool_host.mha")
# Direct-I/O ops (tensor lists) and the MLA kernel-I/O ops (pointer tables); the copies themselves are the CPU
# serving mode's pure core (cpu_serve/kernels.py; the one import this folder makes outside l3/, named in
# tests/test_layering.py). MHA kernel-I/O ops are not stood in here: MHA flows here run with direct I/O.
from ...cpu_serve import kernels as _kernels  # noqa: E402

KVCACHEIO_NAMES = _kernels.MLA_KVCACHEIO_NAMES
UNPINNED_POOLS = (
    ("sglang.srt.mem_cache.pool_host.mla", "MLATokenToKVPoolHost"),
    ("sglang.srt.mem_cache.pool_host.dsa", "DSAIndexerPoolHost"),
    ("sglang.srt.mem_cache.pool_host.mha", "MHATokenToKVPoolHost"),
)

_lock = threading.Lock()
_installed: dict = {}  # (module, name) -> previous value (None: was unbound) ; ("init", cls) -> original __init__


class StandinRefused(RuntimeError):
    """install() was asked where the stand-ins could end up under a real server or next to real kernels."""


# ---------------------------------------------------------------------------------------------- the ops
_OPS = {name: getattr(_kernels, name) for name in KVCACHEIO_NAMES}


# ---------------------------------------------------------------------------------------------- guard
def refusal_reason() -> str:
    """'' when installing here is safe (CPU-only, no server launched in this process), else why not."""
    try:
        import torch
    except Exception as exc:  # noqa: BLE001
        return f"torch does not import: {exc}"
    if torch.cuda.is_available():
        return "a CUDA device is visible: the real sgl_kernel ops must run here, never the CPU stand-ins"
    for name in ("xpu", "npu", "musa"):
        mod = getattr(torch, name, None)
        try:
            if mod is not None and mod.is_available():
                return f"a {name} device is visible: the stand-ins are for CPU-only machines"
        except Exception:  # noqa: BLE001 - a backend that cannot answer is not a device we can use
            pass
    try:
        from sglang.srt.runtime_context import get_server_args

        published = get_server_args()
    except Exception:  # noqa: BLE001 - nothing published: not a server
        published = None
    if published is not None and getattr(published, "_launch_command", None):
        return ("an SGLang server or Engine was launched in this process "
                f"({published._launch_command}); the stand-ins are demo/test-only")
    from .. import hooks

    if hooks.server_launched():
        return "an SGLang server or Engine launch was resolved in this process; the stand-ins are demo/test-only"
    return ""


def installed() -> bool:
    return bool(_installed)


# ---------------------------------------------------------------------------------------------- install
def _unpinned_init(original):
    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        kwargs["pin_memory"] = False
        return original(self, *args, **kwargs)

    __init__._glm_ext_cpu_standin = True
    return __init__


def install() -> None:
    """Bind the kvcacheio stand-ins and unpin host pools in this process. Idempotent. Raises StandinRefused
    where that would be unsafe (see module docstring). The ledger keeps showing the DEMO patches as skipped by
    register() (this folder does not reach the plugin's ledger); :func:`installed` says whether they are in."""
    import importlib

    with _lock:
        why = refusal_reason()
        if why:
            raise StandinRefused(f"sglang-glm-ext CPU stand-ins refused: {why}")
        if _installed:
            return
        done: dict = {}
        try:
            for mod_name in _MODULES:
                mod = importlib.import_module(mod_name)
                for name, fn in _OPS.items():
                    if getattr(mod, name, None) is None:
                        done[(mod_name, name)] = None
                        setattr(mod, name, fn)
            for mod_name, cls_name in UNPINNED_POOLS:
                cls = getattr(importlib.import_module(mod_name), cls_name)
                init = cls.__dict__["__init__"]
                if not getattr(init, "_glm_ext_cpu_standin", False):
                    done[("init", cls)] = init
                    cls.__init__ = _unpinned_init(init)
        except Exception:
            _undo(done)
            raise
        _installed.update(done)


def _undo(done: dict) -> None:
    import importlib

    for key, prev in done.items():
        if key[0] == "init":
            key[1].__init__ = prev
        else:
            mod = importlib.import_module(key[0])
            if prev is None:
                mod.__dict__.pop(key[1], None)
            else:
                setattr(mod, key[1], prev)


def uninstall() -> None:
    """Undo :func:`install` (tests)."""
    with _lock:
        _undo(_installed)
        _installed.clear()
