"""Contract check: does the installed SGLang still have each patch target as the hook expects it?

Used by tests/patching/test_contract.py (CPU, every declared patch). An SGLang upgrade that moves, renames or
re-signs a target, or changes its code, shows up here by name instead of as a silently inert hook.
"""

from __future__ import annotations

import inspect

from .ledger import Patch, resolve_original, source_sha


def check(patch: Patch) -> list[str]:
    """Problems with `patch`'s target in the installed SGLang; [] when the contract holds."""
    if patch.hook_type == "bind":  # --- l3 backend ---
        return _check_bind(patch)
    try:
        fn = resolve_original(patch.target)
    except Exception as exc:
        return [f"{patch.id}: target {patch.target} not found ({type(exc).__name__}: {exc})"]
    problems = []
    try:
        params = tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError) as exc:
        return [f"{patch.id}: cannot read the signature of {patch.target}: {exc}"]
    if params != patch.signature:
        problems.append(f"{patch.id}: {patch.target} has parameters {params}, the hook expects {patch.signature}")
    if patch.source_sha:
        got = source_sha(fn)
        if got != patch.source_sha:
            problems.append(
                f"{patch.id}: source of {patch.target} changed (digest {got}, declared {patch.source_sha}); "
                "review the hook against the new code, then update source_sha in its feature's patches.py"
            )
    return problems


# --- l3 backend ---
def _check_bind(patch: Patch) -> list[str]:
    """A "bind" patch fills module globals SGLang leaves unbound on this platform (demo/test stand-ins): the module
    must still exist and still call each name, else the stand-in would be inert."""
    import importlib

    try:
        module = importlib.import_module(patch.target)
        src = inspect.getsource(module)
    except Exception as exc:
        return [f"{patch.id}: module {patch.target} not found or unreadable ({type(exc).__name__}: {exc})"]
    return [f"{patch.id}: {patch.target} no longer calls {name}; the stand-in would never run"
            for name in patch.signature if f"{name}(" not in src]
