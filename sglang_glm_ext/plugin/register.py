"""register(): what SGLang's entry point runs in every SGLang process (load_plugins()).

It checks the SGLang version, applies the declared patches and verifies each one landed, and keeps the resulting
ledger for this process (`ledger_state()`: the flag hooks and `doctor` read it).
"""

from __future__ import annotations

import logging
import sys
from typing import Sequence

from ..cpu_serve import gate as cpu_serve_gate
from ..gpu_bringup import gate as gpu_bringup_gate
from ..patching.ledger import Ledger, State, apply_all
from . import __version__, compat, envs
from .flags import asked_at_launch
from .registry import PATCHES

logger = logging.getLogger("sglang_glm_ext")

_LEDGER: Ledger | None = None
_DISABLED = False


def ledger_state() -> Ledger | None:
    """The ledger of this process's register() call, or None when the plugin has not registered."""
    return _LEDGER


def is_disabled() -> bool:
    return _DISABLED


def register(argv: Sequence[str] | None = None) -> Ledger | None:
    """SGLang plugin entry point. Idempotent: a second call returns the first call's ledger.

    `argv` is the launch to check for plugin flags on an unsupported SGLang: SGLang's load_plugins() passes
    nothing, so this process's own command line (sys.argv[1:]) is checked; doctor passes () because its argv
    holds the flags it reports on, not a launch.
    """
    global _LEDGER, _DISABLED
    if _LEDGER is not None or _DISABLED:
        return _LEDGER
    if envs.DISABLE.get_bool():
        _DISABLED = True
        logger.warning("sglang-glm-ext: disabled by %s=1; no patch applied, no flag registered", envs.DISABLE.name)
        return None

    status = compat.version_status()
    if not status.patches_allowed:
        compat.refuse_unsupported(asked_at_launch(sys.argv[1:] if argv is None else argv), status)
        logger.warning(
            "sglang-glm-ext: %s; feature patches are not applied (supported: %s)",
            status.describe(), ", ".join(compat.SUPPORTED_SGLANG),
        )
    unsupported = "" if status.supported else f"{status.describe()}; supported: {', '.join(compat.SUPPORTED_SGLANG)}"
    # CPU serving mode: the sgl_kernel stand-in's directory goes on sys.path (inherited by spawned schedulers) only
    # when SGLANG_GLM_EXT_CPU_SERVE=1 and no accelerator / real sgl_kernel is here; '' = its patches go in.
    cpu_serve_off = cpu_serve_gate.activate() if status.patches_allowed else status.describe()
    # GPU bring-up tier: likewise its stand-in's directory, when SGLANG_GLM_EXT_GPU_BRINGUP=1 may run here.
    gpu_bringup_off = gpu_bringup_gate.activate() if status.patches_allowed else status.describe()
    ledger = apply_all(Ledger(PATCHES), installed=status.installed, forced=status.forced, unsupported=unsupported,
                       cpu_serve_off=cpu_serve_off, gpu_bringup_off=gpu_bringup_off)
    if not gpu_bringup_off:  # never on a production node unnoticed: one line, at SGLang's default log level
        logger.warning("%s", gpu_bringup_gate.warning_line())
    _LEDGER = ledger
    applied = sum(s.state is State.APPLIED for s in ledger.status.values())
    failed = ledger.failed()
    # Shown at SGLang's default level (info) in every process: the launching process runs register() before SGLang
    # configures logging, while the root level is still Python's WARNING, so there the line goes out at WARNING.
    level = logging.INFO if logger.isEnabledFor(logging.INFO) else logging.WARNING
    logger.log(level, "sglang-glm-ext %s: %d/%d patches applied on %s", __version__, applied, len(PATCHES),
               status.describe())
    if failed:
        logger.error("sglang-glm-ext: %d patch(es) failed; features that need them refuse to start: %s",
                     len(failed), ", ".join(s.patch.id for s in failed))
    return ledger


def _reset_for_tests() -> None:
    global _LEDGER, _DISABLED
    _LEDGER, _DISABLED = None, False
