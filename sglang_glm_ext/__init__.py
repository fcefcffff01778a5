"""sglang-glm-ext: what a private GLM-5.x SGLang fork gave its users, as a plugin for stock SGLang.

SGLang discovers this package through the `sglang.srt.plugins` entry point `glm_ext` (= `sglang_glm_ext:register`)
and calls `register()` in every SGLang process (load_plugins()). The machinery behind it lives in `plugin/`; each
feature has a folder of its own. Importing this package loads nothing else (no SGLang, no torch).
"""

from __future__ import annotations

from .plugin import __version__


def register(argv=None):
    """SGLang plugin entry point; see sglang_glm_ext.plugin.register.register."""
    from .plugin.register import register as _register

    return _register(argv)


def ledger_state():
    from .plugin.register import ledger_state as _ledger_state

    return _ledger_state()


def is_disabled() -> bool:
    from .plugin.register import is_disabled as _is_disabled

    return _is_disabled()


def _reset_for_tests() -> None:
    from .plugin.register import _reset_for_tests as _reset

    _reset()
