"""register(): what SGLang's entry point runs in every SGLang process (load_plugins()).

It checks the SGLang version, applies the declared patches and verifies each one landed, and keeps the resulting
ledger for this process (`ledger_state()`: the flag hooks and `doctor` read it).
"""

from __future__ import annotations

import logging
import sys

from ..patching.ledger import Ledger, State, apply_all
from . import __version__, compat, envs
from .registry import PATCHES

logger = logging.getLogger("sglang_glm_ext")

_LEDGER: Ledger | None = None
_DISABLED = False


def ledger_state() -> Ledger | None:
    """The ledger of this process's register() call, or None when the plugin has not registered."""
    return _LEDGER


def is_disabled() -> bool:
    return _DISABLED


def register(argv: list[str] | None = None) -> Ledger | None:
    """SGLang plugin entry point. Idempotent: a second call returns the first call's ledger."""
    global _LEDGER, _DISABLED
    if _LEDGER is not None or _DISABLED:
        return _LEDGER
    if envs.DISABLE.get_bool():
        _DISABLED = True
        logger.warning("sglang-glm-ext: disabled by %s=1; no patch applied, no flag registered", envs.DISABLE.name)
        return None

    status = compat.version_status()
    if not status.patches_allowed:
        refuse_feature_usage(status, argv)
        logger.warning(
            "sglang-glm-ext: %s; feature patches are not applied (supported: %s)",
            status.describe(), ", ".join(compat.SUPPORTED_SGLANG),
        )
    why = f"{status.describe()}; supported: {', '.join(compat.SUPPORTED_SGLANG)}"
    ledger = apply_all(Ledger(PATCHES), allow_features=status.patches_allowed, why_skipped=why)
    _LEDGER = ledger
    applied = sum(s.state is State.APPLIED for s in ledger.status.values())
    failed = ledger.failed()
    logger.info("sglang-glm-ext %s: %d/%d patches applied on %s", __version__, applied, len(PATCHES),
                status.describe())
    if failed:
        logger.error("sglang-glm-ext: %d patch(es) failed; features that need them refuse to start: %s",
                     len(failed), ", ".join(s.patch.id for s in failed))
    return ledger


def refuse_feature_usage(status: compat.VersionStatus, argv: list[str] | None = None) -> None:
    """On an unsupported SGLang, a user who asked for a plugin feature gets one clear error, now.

    Raised as SystemExit because load_plugins() swallows Exception. Flags are found in argv here since the
    parser hooks may not be installable on an SGLang we do not know.
    """
    from .flags import asked_at_launch

    asked = asked_at_launch(sys.argv[1:] if argv is None else argv)
    if asked:
        raise compat.UnsupportedSGLangError(status.unsupported_message(", ".join(asked)))


def _reset_for_tests() -> None:
    global _LEDGER, _DISABLED
    _LEDGER, _DISABLED = None, False
